"""``LearnedWeightDecay``: drop-in learned weight decay for any ``LightningModule``.

A module whose optimizer used ``weight_decay=1e-4`` switches to a weight decay learned from its
validation loss with three changed lines::

    +from hypertorch_sid import LearnedWeightDecay
     ...
    -        return torch.optim.SGD(self.parameters(), lr=0.1, weight_decay=1e-4)
    +        return torch.optim.SGD(self.parameters(), lr=0.1)
     ...
    -trainer = pl.Trainer(max_epochs=10)
    +trainer = pl.Trainer(max_epochs=10, callbacks=[LearnedWeightDecay(1e-4)])

(``LearnedWeightDecay(1e-4, granularity="per_layer")`` learns one value per layer.) The module's
code (``training_step``, ``configure_optimizers``) stays as it is: the callback
applies the decay itself right before every optimizer step (``on_before_optimizer_step``, after
the backward and after AMP unscaling), and tunes λ by SID (see
:class:`~hypertorch_sid.lightning.HyperOptimizationCallback`).

What is learned
---------------
Write ℓ(w; ζ) for the user's training loss (what ``training_step`` returns) and λ ≥ 0 for the
decay (one value, one per parameter group / layer / tensor, or one per element).

* **Coupled** (``decoupled=False``; what ``SGD``/``Adam``'s ``weight_decay=`` do): before each
  step ``w.grad += λ ⊙ w``, the gradient of ½ Σ λ ⊙ w². The training minimises

      ℓ̂(w, λ; ζ) = ℓ(w; ζ) + ½ Σ_p Σ_i λ_{p,i} w_{p,i}²,

  whatever the optimizer (its fixed points are the stationary points of ℓ̂), and this ℓ̂ is the
  inner loss of the hypergradient. With a fixed λ the training is exactly the optimizer's own
  ``weight_decay=λ`` (tested).
* **Decoupled** (``decoupled=True``; what ``AdamW`` does): before each step ``w ← w ⊙ (1 − lr·λ)``
  with the parameter group's current ``lr``; the optimizer then adds its own update, so with a
  fixed λ the training is exactly ``AdamW(weight_decay=λ)`` (tested). Its fixed points solve
  P⁻¹∇ℓ(w) + λ ⊙ w = 0 for the optimizer's preconditioner P: for Adam/AdamW P = diag(√v̂ + ε)
  (v̂ the bias-corrected second moment, ``max_exp_avg_sq`` with amsgrad); for SGD with momentum
  μ and dampening d, P = (1 − d)/(1 − μ); otherwise P = 1. With P frozen at its current value these
  are the minimisers of ℓ(w) + ½ Σ (P λ) ⊙ w², so the hypergradient is computed for the inner loss

      ℓ̂(w, λ; ζ) = ℓ(w; ζ) + ½ Σ_p Σ_i P_{p,i} λ_{p,i} w_{p,i}²   (P read at each hyper step),

  i.e. λ is learned as AdamW's decoupled coefficient through the effective L2 coefficient
  P ⊙ λ. This is exact for the fixed point with the current preconditioner; it ignores how P
  itself would change with λ.

The outer objective E is the same training loss ℓ evaluated on validation batches (without the
penalty), unless ``validation_loss`` is given.

Positivity: ``parameterization="log"`` learns ρ with λ = exp(ρ) (λ > 0 always);
``"projection"`` learns λ directly and projects onto λ ≥ 0 after each outer step.

Caveats: the decay is added before Lightning's gradient clipping (so clipping sees ``g + λw``,
unlike the optimizer's own ``weight_decay``); with AMP a skipped (non-finite) step still applies
decoupled decay; by default ℓ is obtained by calling ``training_step`` with ``self.log`` muted, so
a ``training_step`` with other side effects (metric updates, manual optimisation) needs
``training_loss=``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from torch import Tensor

from ..core.errors import ConfigurationError
from .callback import HyperOptimizationCallback, _Problem

__all__ = ["LearnedWeightDecay"]

_GRANULARITIES = ("global", "per_group", "per_layer", "per_tensor", "per_element")


@dataclass
class _Decayed:
    """One decayed parameter tensor: where it lives and which λ slot it reads."""

    name: str
    param: Tensor
    optimizer: torch.optim.Optimizer
    group_index: int
    slot: int

    @property
    def group(self) -> dict[str, Any]:
        """The parameter group now (``load_state_dict`` and schedulers replace/alter groups)."""
        return self.optimizer.param_groups[self.group_index]


@contextmanager
def _muted_logging(module: pl.LightningModule) -> Iterator[None]:
    """``self.log``/``self.log_dict`` do nothing inside (the hyper step must not overwrite logs)."""

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    module.__dict__["log"] = noop
    module.__dict__["log_dict"] = noop
    try:
        yield
    finally:
        del module.__dict__["log"]
        del module.__dict__["log_dict"]


class LearnedWeightDecay(HyperOptimizationCallback):
    """Weight decay learned by SID for any ``LightningModule`` (see the module docstring).

    Parameters
    ----------
    weight_decay:
        The initial λ (the value the optimizer's ``weight_decay=`` had). Must be > 0 with the log
        parameterisation, ≥ 0 with projection.
    granularity:
        ``"global"`` (one λ), ``"per_group"`` (one per optimizer parameter group),
        ``"per_layer"`` (one per module owning parameters), ``"per_tensor"`` (one per parameter
        tensor) or ``"per_element"`` (λ shaped like each parameter: one per weight, per feature).
    decoupled:
        False: coupled decay ``grad += λ w`` (SGD/Adam ``weight_decay``). True: decoupled decay
        ``w *= 1 − lr λ`` (AdamW); see "What is learned".
    parameterization:
        ``"log"`` (λ = exp(ρ), ρ learned) or ``"projection"`` (λ learned, clamped at 0).
    apply_to:
        ``"all"`` trainable parameters of the optimizers, or only ``"weights"`` (tensors with
        ≥ 2 dimensions: no biases, no normalisation scales).
    training_loss:
        ``training_loss(module, batch) -> scalar``: ℓ. ``None``: ``module.training_step(batch, 0)``
        (its ``loss``), with logging muted.
    validation_loss:
        ``validation_loss(module, batch) -> scalar``: E. ``None``: ℓ on validation batches.
    proximal:
        Solve the adjoint system with the proximal gradient map Φ̂ = (w − α∇ĝ)/(1 + αPλ)
        (:class:`~hypertorch_sid.ProximalGradientMap`) instead of the GD map of ĝ + ½Σ Pλw²:
        the same hypergradient, with α limited by the data term's curvature only — for decays
        that grow large (per-element λ). Training itself is unchanged.
    **kwargs:
        Settings of :class:`~hypertorch_sid.lightning.HyperOptimizationCallback`
        (``every_n_steps``, ``adjoint_steps``, ``outer_lr``, ``val``, ``preset``, ...).
    """

    def __init__(
        self,
        weight_decay: float = 1e-4,
        granularity: Literal[
            "global", "per_group", "per_layer", "per_tensor", "per_element"
        ] = "global",
        decoupled: bool = False,
        parameterization: Literal["log", "projection"] = "log",
        apply_to: Literal["all", "weights"] = "all",
        training_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        validation_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        proximal: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if granularity not in _GRANULARITIES:
            raise ConfigurationError(
                f"LearnedWeightDecay: granularity must be one of {list(_GRANULARITIES)}, got "
                f"{granularity!r}."
            )
        if parameterization not in ("log", "projection"):
            raise ConfigurationError(
                "LearnedWeightDecay: parameterization must be 'log' or 'projection', got "
                f"{parameterization!r}."
            )
        if apply_to not in ("all", "weights"):
            raise ConfigurationError(
                f"LearnedWeightDecay: apply_to must be 'all' or 'weights', got {apply_to!r}."
            )
        if (
            isinstance(weight_decay, bool)
            or not isinstance(weight_decay, (int, float))
            or not math.isfinite(weight_decay)
            or weight_decay < 0
            or (parameterization == "log" and weight_decay == 0)
        ):
            need = "> 0 (λ = exp(ρ))" if parameterization == "log" else "≥ 0"
            raise ConfigurationError(
                f"LearnedWeightDecay: weight_decay must be a finite number {need}, got "
                f"{weight_decay!r}."
            )
        for name, fn in (("training_loss", training_loss), ("validation_loss", validation_loss)):
            if fn is not None and not callable(fn):
                raise ConfigurationError(
                    f"LearnedWeightDecay: {name} must be a callable (module, batch) -> scalar."
                )
        if not isinstance(proximal, bool):
            raise ConfigurationError(
                f"LearnedWeightDecay: proximal must be a bool, got {proximal!r}."
            )
        if not isinstance(decoupled, bool):
            raise ConfigurationError(
                f"LearnedWeightDecay: decoupled must be a bool, got {decoupled!r}."
            )
        self.weight_decay = float(weight_decay)
        self.granularity = granularity
        self.decoupled = decoupled
        self.proximal = proximal
        self.parameterization = parameterization
        self.apply_to = apply_to
        self.training_loss = training_loss
        self.validation_loss = validation_loss
        #: the learned tensors: ρ (log) or λ (projection); one vector of slots, or one per tensor
        self.rho: list[Tensor] = []
        #: names of the λ slots (scalar granularities)
        self.slot_names: list[str] = []
        self._entries: list[_Decayed] = []
        self._inner: list[Tensor] = []
        self._scales: list[Tensor | float] = []

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Find the decayed parameters in the trainer's optimizers and create λ."""
        self._check_module(pl_module)
        self._collect(trainer, pl_module)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Apply the decay: ``grad += λ w`` (coupled) or ``w *= 1 − lr λ`` (decoupled)."""
        self._apply_decay(optimizer)

    # ------------------------------------------------------------------ λ
    def _transform(self, rho: Tensor) -> Tensor:
        return rho.exp() if self.parameterization == "log" else rho

    def _initial(self) -> float:
        return math.log(self.weight_decay) if self.parameterization == "log" else self.weight_decay

    def _lambda_of(self, entry: _Decayed) -> Tensor:
        if self.granularity == "per_element":
            return self._transform(self.rho[entry.slot])
        return self._transform(self.rho[0])[entry.slot]

    def decay_values(self) -> dict[str, Tensor]:
        """The current λ of every decayed parameter, by parameter name (detached)."""
        with torch.no_grad():
            return {e.name: self._lambda_of(e).detach().clone() for e in self._entries}

    # ------------------------------------------------------------------ setup
    def _check_module(self, pl_module: pl.LightningModule) -> None:
        if not pl_module.automatic_optimization and self.training_loss is None:
            raise ConfigurationError(
                "LearnedWeightDecay: with manual optimization, training_step cannot be called to "
                "evaluate the training loss: pass training_loss=lambda module, batch: ..."
            )

    def _slot_key(self, name: str, opt_index: int, group_index: int) -> str:
        if self.granularity == "global":
            return "all"
        if self.granularity == "per_group":
            return f"optimizer{opt_index}/group{group_index}"
        if self.granularity == "per_layer":
            return name.rpartition(".")[0] or "(root)"
        return name

    def _collect(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        names = {id(p): n for n, p in pl_module.named_parameters()}
        order = {id(p): i for i, (_, p) in enumerate(pl_module.named_parameters())}
        entries: list[_Decayed] = []
        inner: dict[int, Tensor] = {}
        keys: dict[str, int] = {}
        for oi, opt in enumerate(trainer.optimizers):
            for gi, group in enumerate(opt.param_groups):
                for p in group["params"]:
                    if not p.requires_grad:
                        continue
                    inner[id(p)] = p
                    if self.apply_to == "weights" and p.dim() < 2:
                        continue
                    if group.get("weight_decay", 0) != 0:
                        raise ConfigurationError(
                            f"LearnedWeightDecay: the optimizer {type(opt).__name__} (group {gi}) "
                            f"already applies weight_decay={group['weight_decay']}: remove it "
                            "(pass weight_decay=0 — AdamW's default is 0.01); the callback "
                            "applies the learned decay itself."
                        )
                    name = names.get(id(p), f"optimizer{oi}.param{len(entries)}")
                    key = self._slot_key(name, oi, gi)
                    if self.granularity == "per_element":
                        slot = len(entries)
                    else:
                        slot = keys.setdefault(key, len(keys))
                    entries.append(_Decayed(name, p, opt, gi, slot))
        if not entries:
            which = " with ≥ 2 dimensions" if self.apply_to == "weights" else ""
            raise ConfigurationError(
                "LearnedWeightDecay: no parameter to decay: the training optimizers hold no "
                f"trainable parameter{which}."
            )
        old = [(id(e.param), e.slot) for e in self._entries]
        same = bool(self.rho) and old == [(id(e.param), e.slot) for e in entries]
        self._entries = entries
        self._inner = sorted(inner.values(), key=lambda p: order.get(id(p), len(order)))
        self.slot_names = list(keys)
        if not same:
            self.rho = self._new_rho(entries, len(keys))

    def _new_rho(self, entries: list[_Decayed], n_slots: int) -> list[Tensor]:
        like = entries[0].param
        fill = self._initial()
        if self.granularity == "per_element":
            return [
                torch.full_like(e.param, fill, memory_format=torch.contiguous_format)
                .detach()
                .requires_grad_(True)
                for e in entries
            ]
        return [torch.full((n_slots,), fill, dtype=like.dtype, device=like.device).requires_grad_()]

    # ------------------------------------------------------------------ decay in training
    @torch.no_grad()
    def _apply_decay(self, optimizer: torch.optim.Optimizer) -> None:
        entries = [e for e in self._entries if e.optimizer is optimizer]
        if not entries:
            return
        scalars = None
        if self.granularity != "per_element":
            scalars = self._transform(self.rho[0]).tolist()
        for e in entries:
            p = e.param
            if p.grad is None:
                continue
            lam: Any = scalars[e.slot] if scalars is not None else self._lambda_of(e)
            if self.decoupled:
                p.mul_(1 - e.group["lr"] * lam)
            elif scalars is not None:
                p.grad.add_(p, alpha=lam)
            else:
                p.grad.add_(lam * p)

    # ------------------------------------------------------------------ the bilevel problem
    def _preconditioner(self, e: _Decayed) -> Tensor | float:
        """P of the decoupled fixed point P⁻¹∇ℓ + λw = 0, from the optimizer's state."""
        state = e.optimizer.state.get(e.param, {})
        group = e.group
        if "exp_avg_sq" in state:
            v = state["exp_avg_sq"]
            if group.get("amsgrad") and "max_exp_avg_sq" in state:
                v = state["max_exp_avg_sq"]
            step = float(state["step"])
            beta2 = float(group["betas"][1])
            return ((v / (1 - beta2**step)).sqrt() + group["eps"]).detach()
        momentum = float(group.get("momentum", 0.0) or 0.0)
        dampening = float(group.get("dampening", 0.0) or 0.0)
        if momentum > 0 and dampening < 1:
            return (1 - momentum) / (1 - dampening)
        return 1.0

    def stable_bound(self, e: _Decayed) -> float:
        """The largest λ the training optimizer can train with, halved for a margin.

        Coupled decay adds λw to the gradient: SGD with learning rate η and momentum m is stable
        on the quadratic ½λw² only for λ < 2(1 + m)/η, so λ ≤ (1 + m)/η; other optimizers
        (Adam: the decay is preconditioned, the step bounded by η) λ ≤ 1/η. Decoupled decay
        multiplies w by 1 − ηλ each step, so λ ≤ 0.5/η keeps that factor in [0.5, 1].
        """
        lr = float(e.group.get("lr", 0.0) or 0.0)
        if lr <= 0:
            return math.inf
        if self.decoupled:
            return 0.5 / lr
        momentum = float(e.group.get("momentum", 0.0) or 0.0)
        if "momentum" in e.group and not e.group.get("nesterov", False):
            return (1 + momentum) / lr
        return 1.0 / lr

    @torch.no_grad()
    def project_stable(self) -> None:
        """Keep every λ in [0, stable_bound]: never past what the user's optimizer can train."""
        bounds: dict[int, float] = {}
        for e in self._entries:
            bounds[e.slot] = min(bounds.get(e.slot, math.inf), self.stable_bound(e))
        if self.parameterization == "projection":
            for r in self.rho:
                r.clamp_(min=0)
        if self.granularity == "per_element":
            for slot, bound in bounds.items():
                self._clamp(self.rho[slot], bound)
        else:
            for slot, bound in bounds.items():
                self._clamp(self.rho[0][slot], bound)

    def _clamp(self, x: Tensor, bound: float) -> None:
        if math.isfinite(bound):
            x.clamp_(max=math.log(bound) if self.parameterization == "log" else bound)

    def _before_hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scales = [self._preconditioner(e) if self.decoupled else 1.0 for e in self._entries]

    def penalty(self) -> Tensor:
        """½ Σ P λ ⊙ w² (P = 1 for coupled decay), differentiable in w and λ."""
        scales = self._scales or [1.0] * len(self._entries)
        total = None
        for e, s in zip(self._entries, scales):
            term = 0.5 * (s * self._lambda_of(e) * e.param.pow(2)).sum()
            total = term if total is None else total + term
        assert total is not None
        return total

    def coefficients(self) -> list[Tensor]:
        """c(λ) = P λ of every inner parameter (0 for undecayed ones), so that the penalty is
        ½ Σ ⟨c, w²⟩: the ``penalty`` of the proximal gradient map."""
        scales = self._scales or [1.0] * len(self._entries)
        by_param = {id(e.param): s * self._lambda_of(e) for e, s in zip(self._entries, scales)}
        return [
            by_param.get(id(p), torch.zeros((), dtype=p.dtype, device=p.device))
            for p in self._inner
        ]

    def _data_loss(self, pl_module: pl.LightningModule, batch: Any, which: str) -> Tensor:
        fn = self.validation_loss if which == "validation" else None
        fn = fn or self.training_loss
        if fn is not None:
            out = fn(pl_module, batch)
        else:
            with _muted_logging(pl_module):
                out = pl_module.training_step(batch, 0)
        if isinstance(out, Mapping):
            out = out.get("loss")
        if not isinstance(out, Tensor) or out.numel() != 1:
            raise ConfigurationError(
                "LearnedWeightDecay: the training loss must be a scalar tensor (training_step "
                "returned " + type(out).__name__ + "); pass training_loss=lambda module, batch: ..."
            )
        return out.reshape(())

    def _problem(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> _Problem:
        if not self.rho:
            self._collect(trainer, pl_module)

        def inner_loss(batch: Any) -> Tensor:
            data = self._data_loss(pl_module, batch, "training")
            return data if self.proximal else data + self.penalty()

        def outer_loss(batch: Any) -> Tensor:
            return self._data_loss(pl_module, batch, "validation")

        def summary() -> dict[str, Tensor]:
            with torch.no_grad():
                return {"weight_decay": torch.cat([self._transform(r).flatten() for r in self.rho])}

        def project(hs: list[Tensor]) -> None:
            self.project_stable()

        return _Problem(
            hyperparameters=self.rho,
            inner_parameters=list(self._inner),
            inner_loss=inner_loss,
            outer_loss=outer_loss,
            summary=summary,
            projection=project,
            penalty=self.coefficients if self.proximal else None,
        )

    def _check_optimizers(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """λ lives in the callback, so no optimizer can hold it (checked by construction)."""
