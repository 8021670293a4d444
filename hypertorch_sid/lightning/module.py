"""``BilevelModule``: a ``LightningModule`` with hyperparameters declared beside its parameters.

The module states the bilevel problem of the paper (eq. mainprobopt)

    min_λ f(λ) = E(w(λ), λ)   subject to   w(λ) = argmin_w E_ζ[ℓ̂(w, λ, ζ)],

through two methods the user writes:

* :meth:`BilevelModule.inner_loss` — ℓ̂(w, λ; ζ) on a training minibatch (may use λ);
* :meth:`BilevelModule.outer_loss` — E(w, λ) on validation data.

Lightning's ordinary training steps with the module's own optimizer minimise ``inner_loss``: they
are the warm-started inner solver of Algorithm 1 (step 1). The
:class:`~hypertorch_sid.lightning.HyperOptimizationCallback` does steps 2–4 (adjoint solve,
hypergradient assembly eq. gradestim, outer step on λ).

Example
-------
.. code-block:: python

    class Ridge(BilevelModule):
        def __init__(self, d):
            super().__init__()
            self.linear = torch.nn.Linear(d, 1, bias=False)
            self.register_hyperparameter("log_lam", torch.zeros(d))  # λ = exp(log_lam)

        def inner_loss(self, batch):
            x, y = batch
            fit = 0.5 * ((self.linear(x).squeeze(-1) - y) ** 2).mean()
            return fit + 0.5 * (self.log_lam.exp() * self.linear.weight[0] ** 2).sum()

        def outer_loss(self, batch):
            x, y = batch
            return 0.5 * ((self.linear(x).squeeze(-1) - y) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.inner_parameters(), lr=0.1)  # never self.parameters()

Hyperparameters are ``nn.Parameter`` objects registered on the module, so they are in its
``state_dict`` (checkpoints hold them) and move with ``.to()``; :meth:`inner_parameters` leaves
them out, and fitting with an optimizer that holds one raises a
:class:`~hypertorch_sid.core.errors.ConfigurationError`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn

from ..core.errors import ConfigurationError
from ..core.validation import check_inner_optimizers, check_scalar_loss, check_unchanged, is_real

__all__ = ["Bilevel", "BilevelModule"]


class _Reads(torch.overrides.TorchFunctionMode):
    """Records whether any torch operation reads one of ``watched`` (by identity)."""

    def __init__(self, watched: list[Tensor]) -> None:
        super().__init__()
        self.ids = {id(t) for t in watched}
        self.found = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not self.found:
            self.found = any(id(a) in self.ids for a in (*args, *kwargs.values()))
        return func(*args, **kwargs)


class Bilevel:
    """What makes a ``LightningModule`` bilevel, for either Lightning namespace: hyperparameters
    λ kept apart from the parameters w, the two objectives, the default steps. It is mixed into
    :class:`BilevelModule` (``pytorch_lightning``) and into
    :class:`hypertorch_sid.lightning.unified.BilevelModule` (``lightning.pytorch``, for
    ``import lightning as L``); the callbacks recognise a bilevel module by this class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hyperparameter_names: list[str] = []
        #: set by the callback at fit start: check that the first training step reads λ
        self._check_lambda_read = False

    # ------------------------------------------------------------------ declaring λ
    def register_hyperparameter(self, name: str, value: Tensor | float) -> nn.Parameter:
        """Declare a hyperparameter λ called ``name`` with initial ``value``.

        Parameters
        ----------
        name:
            Attribute name (``self.<name>`` then reads it) and ``state_dict`` key.
        value:
            Initial value: a floating-point tensor (copied) or a Python number (a scalar tensor of
            the default dtype). Positivity, if needed, is the user's parameterisation, e.g. store
            ``log_lam`` and use ``log_lam.exp()`` in the losses.

        Returns
        -------
        The registered ``nn.Parameter`` (also available as ``self.<name>``).
        """
        if "_hyperparameter_names" not in self.__dict__:
            raise ConfigurationError(
                "call super().__init__() before register_hyperparameter() in your BilevelModule."
            )
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigurationError(f"hyperparameter name must be an identifier, got {name!r}.")
        if name in self._hyperparameter_names:
            raise ConfigurationError(f"hyperparameter {name!r} is already registered.")
        if name in self._parameters:  # register_parameter replaced the weight w silently (s56)
            raise ConfigurationError(
                f"cannot register hyperparameter {name!r}: the module already has a parameter "
                f"{name!r} (a weight w the training optimizes), which it would replace. Give the "
                "hyperparameter another name (e.g. 'log_lam')."
            )
        if hasattr(self, name):
            raise ConfigurationError(
                f"cannot register hyperparameter {name!r}: the module already has an attribute "
                "with that name."
            )
        if isinstance(value, Tensor):
            tensor = value.detach().clone()
        elif is_real(value):  # a Python or NumPy number (np.float32(0.1) was refused)
            tensor = torch.tensor(float(value), dtype=torch.get_default_dtype())
        else:
            raise ConfigurationError(
                f"hyperparameter {name!r} must be a tensor or a number, got {type(value).__name__}."
            )
        if not tensor.is_floating_point():
            raise ConfigurationError(
                f"hyperparameter {name!r} has dtype {tensor.dtype}; use a floating-point tensor."
            )
        if not bool(torch.isfinite(tensor).all()):  # was refused only at the fit's start (s56)
            raise ConfigurationError(
                f"hyperparameter {name!r} has non-finite entries (NaN or ±inf; log 0 = −inf for a "
                "decay of 0 learned as log λ): start it at a finite value, e.g. log 1e-4."
            )
        if tensor.numel() == 0:  # was refused at the first hyper step as "read by neither loss"
            raise ConfigurationError(
                f"hyperparameter {name!r} has no entries (shape {tuple(tensor.shape)}): there is "
                "nothing to tune in it. Give it its size (e.g. torch.zeros(d)), or leave it out."
            )
        param = nn.Parameter(tensor, requires_grad=True)
        self.register_parameter(name, param)
        self._hyperparameter_names.append(name)
        return param

    def named_hyperparameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name, λ)`` for every declared hyperparameter, in declaration order."""
        for name in self._hyperparameter_names:
            param = self._parameters.get(name)
            if param is None:
                raise ConfigurationError(
                    f"hyperparameter {name!r} was registered but is no longer a parameter of "
                    "the module (was the attribute reassigned to a plain tensor?)."
                )
            yield name, param

    def hyperparameters(self) -> Iterator[nn.Parameter]:
        """The hyperparameters λ (for the outer optimizer; never give them to the inner one)."""
        for _, param in self.named_hyperparameters():
            yield param

    def named_inner_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name, w)`` for every trainable parameter that is not a hyperparameter."""
        hyper = {id(p) for p in self.hyperparameters()}
        for name, param in self.named_parameters():
            if id(param) not in hyper and param.requires_grad:
                yield name, param

    def inner_parameters(self) -> Iterator[nn.Parameter]:
        """The inner parameters w: what ``configure_optimizers`` must optimise. None left (every
        weight frozen) is refused, naming the frozen ones: torch's optimizer said only "got an
        empty parameter list" (session 61)."""
        named = list(self.named_inner_parameters())
        if not named:
            hyper = {id(p) for p in self.hyperparameters()}
            frozen = [n for n, p in self.named_parameters() if id(p) not in hyper]
            listed = ", ".join(frozen[:5]) + (" …" if len(frozen) > 5 else "")
            raise ConfigurationError(
                f"{type(self).__name__} has no inner parameter to train: "
                + (
                    f"every weight ({listed}) is frozen (requires_grad=False). Unfreeze "
                    "those the training must fit (e.g. self.head.requires_grad_(True) after "
                    "self.requires_grad_(False)); frozen layers stay out of inner_parameters()."
                    if frozen
                    else "it holds no parameter besides its hyperparameters. Build the model's "
                    "layers in __init__ (as attributes), before the fit."
                )
            )
        for _, param in named:
            yield param

    def hyperparameter_summary(self) -> dict[str, Tensor]:
        """Tensors summarised (mean/min/max) in the ``hyper/*`` logs and the progress bar.

        Defaults to the raw hyperparameters; override to report transformed values, e.g.
        ``{"lam": self.log_lam.exp()}``.
        """
        return {name: param.detach() for name, param in self.named_hyperparameters()}

    # ------------------------------------------------------------------ the bilevel problem
    def inner_loss(self, batch: Any) -> Tensor:
        """ℓ̂(w, λ; ζ): the training objective on a minibatch ζ (a scalar). Must be overridden."""
        raise ConfigurationError(
            f"{type(self).__name__} must implement inner_loss(batch) -> scalar tensor (the "
            "training objective, which may use the hyperparameters)."
        )

    def outer_loss(self, batch: Any) -> Tensor:
        """E(w, λ): the validation objective on validation data (a scalar); must be overridden.

        The hyper steps call it with the module in eval mode, as validation does (dropout off,
        BatchNorm's running statistics), whatever mode the training is in."""
        raise ConfigurationError(
            f"{type(self).__name__} must implement outer_loss(batch) -> scalar tensor (the "
            "validation objective)."
        )

    # ------------------------------------------------------------------ Lightning defaults
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """One inner step: returns ``inner_loss(batch)`` (logged as ``train/inner_loss``) for
        Lightning's automatic optimisation. Under manual optimisation nothing would step the
        optimizers with it: the fit trained nothing and ran no hyper step, silently (session
        52), so it is refused there."""
        if not self.automatic_optimization:
            raise ConfigurationError(
                f"{type(self).__name__}: automatic_optimization is False, and the default "
                "training_step only returns inner_loss(batch), which Lightning does not step "
                "under manual optimisation: nothing would train. Either keep automatic "
                "optimisation, or write a training_step that steps the optimizer itself: "
                "opt = self.optimizers(); opt.zero_grad(); "
                "self.manual_backward(self.inner_loss(batch)); opt.step()."
            )
        loss = self.inner_loss(batch)
        check_scalar_loss(f"{type(self).__name__}.inner_loss", loss, "the training objective")
        self.log("train/inner_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Logs ``outer_loss(batch)`` as ``val/outer_loss``."""
        loss = self.outer_loss(batch)
        check_scalar_loss(f"{type(self).__name__}.outer_loss", loss, "the validation objective")
        self.log("val/outer_loss", loss, prog_bar=True)
        return loss

    def check_optimizers(self, optimizers: Iterable[torch.optim.Optimizer] | None = None) -> None:
        """Raise if a training optimizer holds a hyperparameter (default: the trainer's)."""
        if optimizers is None:
            optimizers = self.trainer.optimizers if self._trainer is not None else []
        named = list(self.named_hyperparameters())
        check_inner_optimizers(list(optimizers), [h for _, h in named], [n for n, _ in named])

    def on_fit_start(self) -> None:
        """Validates the training optimizers (see :meth:`check_optimizers`); says when no
        hyper-optimization callback tunes λ in this fit (it would stay at its registered value
        with no word: a forgotten ``callbacks=[HyperOptimizationCallback()]``)."""
        self.check_optimizers()
        if not self.__dict__.get("_check_lambda_read"):  # set by the callback's on_fit_start
            names = ", ".join(self._hyperparameter_names)
            rank_zero_warn(
                f"{type(self).__name__}: no HyperOptimizationCallback tunes this fit, so its "
                f"hyperparameters ({names}) stay at their registered values while the weights "
                "train. Pass pl.Trainer(callbacks=[HyperOptimizationCallback(...)]) to learn "
                "them (or ignore this where fixed λ is meant, e.g. a baseline)."
            )

    # ------------------------------------------------------------------ λ reaches the training
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """At the first batch of a fit tuned by a hyper-optimization callback: the training step
        runs once under a ``TorchFunctionMode`` that records whether it reads λ (no extra pass),
        and a training that ignores λ is refused; an overridden step's loss is compared with
        ``inner_loss`` (see :meth:`_first_training_step`)."""
        if self.__dict__.get("_check_lambda_read"):
            self._check_lambda_read = False
            self.__dict__["training_step"] = self._first_training_step

    def _first_training_step(self, *args: Any, **kwargs: Any) -> Any:
        """``training_step`` once, watching which λ it reads and comparing the loss it returns
        with ``inner_loss`` on the same batch (:meth:`_check_same_objective`); then the method is
        itself again. A skipped step (``None``) leaves both checks to the next batch."""
        del self.__dict__["training_step"]
        draws = _RandomState(self.device)  # what the step draws from
        hyper = list(self.hyperparameters())
        before = [h.detach().clone() for h in hyper]
        reads = _Reads(hyper)
        with reads:
            out = self.training_step(*args, **kwargs)
        check_unchanged(hyper, before, "training_step")
        if out is None:  # Lightning skips this batch: nothing to check yet
            self._check_lambda_read = True
            return out
        if not reads.found and type(self).training_step is Bilevel.training_step:
            names = ", ".join(self._hyperparameter_names)
            raise ConfigurationError(  # it said "inner_loss, which reads them" (session 63)
                f"{type(self).__name__}.inner_loss does not read any hyperparameter ({names}): "
                "the training it defines does not depend on λ, so there is nothing for the "
                "hypergradient to tune. Use λ in inner_loss, e.g. add the penalty it weighs "
                f"(+ 0.5 * (self.{self._hyperparameter_names[0]}.exp() * w ** 2).sum() for a "
                "log-decay)."
            )
        if not reads.found:
            names = ", ".join(self._hyperparameter_names)
            raise ConfigurationError(
                f"{type(self).__name__}.training_step does not read any hyperparameter ({names}), "
                "while the hypergradient differentiates inner_loss, which reads them: λ would "
                "move although the training it tunes does not depend on it. Make training_step "
                "return self.inner_loss(batch) (the default training_step does), or use λ in it "
                "as inner_loss does."
            )
        loss = out.get("loss") if isinstance(out, dict) else out
        if isinstance(loss, Tensor) and loss.numel() == 1:
            batch = args[0] if args else kwargs.get("batch")
            self._check_same_objective(loss, self._reference_inner_loss(batch, draws))
        return out

    def _reference_inner_loss(self, batch: Any, draws: _RandomState) -> Tensor | None:
        """ℓ̂(w, λ; ζ) on the step's batch, detached, after the user's ``training_step`` and
        before the optimizer step: same w, same λ, same train mode, and the same random draws
        (the torch, Python and NumPy generators are rewound to ``draws``, their state before the
        step, then set back, so dropout draws what the step drew and the fit's random stream is
        untouched); the forward updates copies of the buffers (BatchNorm's running statistics)
        and ``self.log`` is silenced, so the fit's numbers do not change. Detached rather than
        under ``no_grad`` (its graph is freed at once): an ``inner_loss`` calling
        ``torch.autograd.grad``, a gradient penalty, needs the graph. ``None`` where there is
        nothing to compare: the default ``training_step`` (it returns ``inner_loss``) or manual
        optimisation (the step returns no loss that Lightning minimises)."""
        if type(self).training_step is Bilevel.training_step or not self.automatic_optimization:
            return None
        buffers = [
            (m, k, b) for m in self.modules() for k, b in m._buffers.items() if b is not None
        ]
        for m, k, b in buffers:  # the forward updates copies: the step's graph saved the originals
            m._buffers[k] = b.clone()
        after = _RandomState(self.device)
        draws.restore()
        self.__dict__["log"] = self.__dict__["log_dict"] = _silent
        try:
            reference = self.inner_loss(batch)
        finally:
            del self.__dict__["log"], self.__dict__["log_dict"]
            after.restore()
            for m, k, b in buffers:
                m._buffers[k] = b
        return reference.detach() if isinstance(reference, Tensor) else None

    def _check_same_objective(self, loss: Tensor, reference: Tensor | None) -> None:
        """Warn where the ``loss`` ``training_step`` returned is not ``reference``, ``inner_loss``
        on the same batch.

        The hyper steps differentiate ``inner_loss`` as the objective Lightning's training
        minimises; a step returning ``inner_loss + extra`` (an auxiliary loss, a penalty, another
        reduction or scale, label smoothing, augmented inputs) trains for another objective, and
        λ is tuned for a training that is not the one run (session 56). A warning, not an error:
        an extra term that does not depend on λ can be meant. Randomness drawn in the step apart
        from ``inner_loss`` (an augmentation before it) also makes the two values differ: that
        randomness is then part of the objective and belongs in ``inner_loss`` too."""
        if reference is None or reference.numel() != 1:
            return
        a, b = float(loss.detach()), float(reference)
        if abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-6:
            return
        rank_zero_warn(
            f"{type(self).__name__}.training_step returned the loss {a:.6g} on the first batch, "
            f"while inner_loss on the same batch (same w, λ and random draws) is {b:.6g}: the "
            "training minimises another objective than the inner_loss the hypergradient "
            "differentiates, so λ is tuned for a training that is not the one run. Put the "
            "whole training objective (auxiliary terms, penalties, reduction, scaling, label "
            "smoothing, augmentation) in inner_loss and let training_step return "
            "self.inner_loss(batch) (the default training_step does)."
        )


class _RandomState:
    """The states of the random generators a step may draw from (torch's CPU one and the
    module's CUDA device's, Python's ``random``, NumPy's global one), to set back later."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.index or 0 if device.type == "cuda" else None
        self.cpu = torch.get_rng_state()
        self.gpu = torch.cuda.get_rng_state(self.cuda) if self.cuda is not None else None
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.gpu is not None:
            torch.cuda.set_rng_state(self.gpu, self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


def _silent(*args: Any, **kwargs: Any) -> None:
    """``self.log`` during the reference ``inner_loss`` forward: it logs nothing."""


class BilevelModule(Bilevel, pl.LightningModule):
    """A ``LightningModule`` with hyperparameters λ kept apart from its parameters w.

    Subclasses declare λ with :meth:`register_hyperparameter` (in ``__init__``, after
    ``super().__init__()``), write :meth:`inner_loss` and :meth:`outer_loss`, and build their
    optimizers over :meth:`inner_parameters`. The default :meth:`training_step` returns
    ``inner_loss(batch)`` and the default :meth:`validation_step` logs ``outer_loss(batch)``.

    During ``trainer.fit`` with a :class:`~hypertorch_sid.lightning.HyperOptimizationCallback`,
    λ has ``requires_grad=False`` except inside the callback's hyper steps: the training backward
    then computes no ∂ℓ̂/∂λ, and under DDP λ is not part of the gradient all-reduce (λ changes
    only through the callback, identically on every rank). The methods are :class:`Bilevel`'s.

    This one is a ``pytorch_lightning.LightningModule`` (for ``pytorch_lightning.Trainer``); with
    the unified package's ``lightning.Trainer`` subclass
    :class:`hypertorch_sid.lightning.unified.BilevelModule` instead.
    """
