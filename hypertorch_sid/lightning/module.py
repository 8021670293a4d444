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

from collections.abc import Iterable, Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn

from ..core.errors import ConfigurationError
from ..core.validation import check_inner_optimizers, check_unchanged, is_real

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
        """The inner parameters w: what ``configure_optimizers`` must optimise."""
        for _, param in self.named_inner_parameters():
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
        self.log("train/inner_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Logs ``outer_loss(batch)`` as ``val/outer_loss``."""
        loss = self.outer_loss(batch)
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
        and a training that ignores λ is refused (see :meth:`_first_training_step`)."""
        if self.__dict__.get("_check_lambda_read"):
            self._check_lambda_read = False
            self.__dict__["training_step"] = self._first_training_step

    def _first_training_step(self, *args: Any, **kwargs: Any) -> Any:
        """``training_step`` once, watching which λ it reads; then the method is itself again."""
        del self.__dict__["training_step"]
        hyper = list(self.hyperparameters())
        before = [h.detach().clone() for h in hyper]
        reads = _Reads(hyper)
        with reads:
            out = self.training_step(*args, **kwargs)
        check_unchanged(hyper, before, "training_step")
        if not reads.found:
            names = ", ".join(self._hyperparameter_names)
            raise ConfigurationError(
                f"{type(self).__name__}.training_step does not read any hyperparameter ({names}), "
                "while the hypergradient differentiates inner_loss, which reads them: λ would "
                "move although the training it tunes does not depend on it. Make training_step "
                "return self.inner_loss(batch) (the default training_step does), or use λ in it "
                "as inner_loss does."
            )
        return out


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
