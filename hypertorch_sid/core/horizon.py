"""Horizon damping: the hypergradient looks ahead as far as the training still runs.

The implicit hypergradient (eq. hypergrad) is the derivative of E at the *fixed point* w(λ) of the
inner problem; a training of T more steps never reaches it. Linearised at w_t (H = ∇²₁₁ℓ, the
training's step size η), T more gradient steps move the weights by

    ∂w_{t+T}/∂λ = −η Σ_{k<T} (I − ηH)^k ∇²₂₁ℓᵀ = −Σ_T(H) ∇²₂₁ℓᵀ,                 (eq. horizon)
    Σ_T(h) = (1 − (1 − ηh)^T) / h      (per eigenvalue h of H; Σ_T(0) = ηT),

so the hypergradient of E after the remaining T steps is ∇₂E − ∇²₂₁ℓ Σ_T(H) ∇₁E, whose T → ∞
limit (0 < ηh < 2) is the implicit one, Σ_∞(h) = 1/h. The damped adjoint system
α(H + δI)v = ∇₁E (:mod:`.damping`) has the filter 1/(h + δ). With

    δ_T = 1 / (η T)                                                             (eq. horizondelta)

it equals Σ_T at both ends: ηT along flat directions (h → 0, where the implicit filter 1/h blows
up: the fixed point the training never reaches) and 1/h along sharp ones (ηhT ≫ 1, which the
training has already converged along). In between, with x = ηhT and (1 − ηh)^T ≈ e^{−x}, their
ratio x / ((1 + x)(1 − e^{−x})) stays in [0.77, 1] (its minimum 0.770 near x = 1.8).

:class:`HorizonDamping` adds δ_T to another damping strategy's δ (by default
:class:`~.damping.CurvatureDamping`, which covers negative curvature), with T the training steps
that remain and η the training's step size, both set by whoever runs the training
(:meth:`HorizonDamping.observe`; the Lightning callback knows ``max_epochs``/``max_steps`` and
reads η from the training optimizers, :func:`effective_step_size`: with momentum μ a persistent
force moves w by lr/(1 − μ) per step, not lr, and the horizon is about such forces). As training
ends, T → 0 and δ_T grows: the hypergradient anneals to the short-horizon one, because a change of
λ has fewer steps left to act. Before anything is observed (or with an
unknown length) δ is the base strategy's alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from .damping import CurvatureDamping, Damping
from .errors import ConfigurationError
from .estimation import CurvatureEstimate
from .validation import check_nonnegative


def horizon_filter(h: float, step_size: float, steps: int) -> float:
    """Σ_T(h) of eq. horizon: the T-step response of gradient descent with step ``step_size``
    along an eigenvalue ``h`` of the Hessian (ηT at h = 0)."""
    if steps <= 0:
        return 0.0
    if h == 0.0:
        return step_size * steps
    return (1.0 - (1.0 - step_size * h) ** steps) / h


def horizon_delta(step_size: float, steps: int) -> float:
    """δ_T = 1/(ηT) of eq. horizondelta (∞ with no step left)."""
    return math.inf if steps <= 0 else 1.0 / (step_size * steps)


@dataclass
class HorizonDamping(Damping):
    """δ = base δ + scale / (η T): the damped adjoint system looks ahead over the T training steps
    that remain (see the module docstring; eq. horizondelta).

    Parameters
    ----------
    base: the damping the horizon term is added to (default :class:`CurvatureDamping`: a shift
        past negative curvature, 0 on convex problems).
    scale: a multiplier of δ_T (1: the horizon of eq. horizondelta; < 1 looks further ahead).
    step_size: η fixed by the user; ``None``: the one :meth:`observe` reports (the Lightning
        callback reads it from the optimizers, :func:`effective_step_size`, else measures it).
    max_delta: an upper bound of the horizon term (at the last steps δ_T → ∞; the hypergradient
        then goes to ∇₂E, the damped system to v → 0).
    """

    base: Damping = field(default_factory=CurvatureDamping)
    scale: float = 1.0
    step_size: float | None = None
    max_delta: float = 1e6
    #: the training steps that remain and the step size last observed (None: not yet known)
    remaining_steps: int | None = field(default=None, init=False)
    observed_step_size: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.base, Damping):
            raise ConfigurationError(
                f"HorizonDamping: base must be a Damping strategy (e.g. CurvatureDamping()), got "
                f"{type(self.base).__name__}."
            )
        check_nonnegative("HorizonDamping scale", self.scale)
        check_nonnegative("HorizonDamping max_delta", self.max_delta)
        if self.step_size is not None:
            check_nonnegative("HorizonDamping step_size", self.step_size)

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        """The training's state: steps still to run (None: unknown) and its step size η (the
        length of the last update along the gradient, ⟨Δw, −g⟩/‖g‖², where measured)."""
        self.remaining_steps = None if remaining_steps is None else max(int(remaining_steps), 0)
        if step_size is not None and math.isfinite(step_size) and step_size > 0:
            self.observed_step_size = float(step_size)

    @property
    def eta(self) -> float | None:
        """η of eq. horizondelta: the user's ``step_size``, else the observed one."""
        return self.step_size if self.step_size is not None else self.observed_step_size

    def horizon_term(self) -> float:
        """scale · δ_T, capped at ``max_delta``; 0 while T or η is unknown."""
        eta, steps = self.eta, self.remaining_steps
        if eta is None or steps is None or eta == 0:
            return 0.0
        return min(self.scale * horizon_delta(eta, steps), self.max_delta)

    def delta(self, curvature: CurvatureEstimate | None) -> float:
        return self.base.delta(curvature) + self.horizon_term()

    def escalate(self, delta: float, curvature: CurvatureEstimate | None) -> float:
        return self.base.escalate(delta, curvature)


def effective_step_size(optimizers: Iterable[torch.optim.Optimizer]) -> float | None:
    """η of eq. horizondelta read from the training optimizers: how far the weights move per step
    under a force that persists (the flat directions the horizon is about), not one step's reach.

    * SGD with momentum μ and dampening d (heavy ball): a constant gradient's steps grow to
      lr·(1 − d)/(1 − μ) each (eq. heavyball: b_t = μ b_{t−1} + (1 − d) g → (1 − d) g/(1 − μ)),
      ten times lr at μ = 0.9. Plain SGD: lr.
    * Adam/AdamW (and any optimizer keeping ``exp_avg_sq``): per coordinate lr/(√v̂ + ε), v̂ the
      bias-corrected second moment (β₁'s average adds no gain: m̂ → g); one η as the mean weighted
      by v̂ (≈ g²), lr·Σ v̂/(√v̂ + ε) / Σ v̂.

    Parameter groups and optimizers are pooled by their number of elements (SGD) or v̂ (Adam).
    Tensors an optimizer has no reading for are left out; None where none could be read (another
    optimizer, e.g. RMSprop; Adam before its first step): the callback then uses the measured
    one-step response (:class:`StepSizeProbe`).
    """
    num = den = 0.0
    for optimizer in optimizers:
        heavy_ball = isinstance(optimizer, torch.optim.SGD)
        for group in optimizer.param_groups:
            lr = float(group.get("lr", 0.0) or 0.0)
            mu = float(group.get("momentum", 0.0) or 0.0)
            damp = float(group.get("dampening", 0.0) or 0.0) if mu > 0 else 0.0
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if heavy_ball:
                    d = float(p.numel())
                    n = d * lr * (1.0 - damp) / (1.0 - mu)
                elif "exp_avg_sq" in state and "step" in state:
                    n, d = _adam_step(state, group, lr)
                else:
                    continue  # not stepped yet, or an optimizer whose step is not read here
                num, den = num + n, den + d
    eta = num / den if den > 0 else math.nan
    return eta if math.isfinite(eta) and eta > 0 else None


def _adam_step(state: dict, group: dict, lr: float) -> tuple[float, float]:
    """(Σ v̂·lr/(√v̂ + ε), Σ v̂) of one Adam tensor (``max_exp_avg_sq`` with amsgrad)."""
    v = state["max_exp_avg_sq"] if group.get("amsgrad") and "max_exp_avg_sq" in state else None
    v = state["exp_avg_sq"] if v is None else v
    step = float(state["step"])
    v_hat = v.detach().double() / (1.0 - float(group["betas"][1]) ** step)
    return float((v_hat * lr / (v_hat.sqrt() + float(group["eps"]))).sum()), float(v_hat.sum())


class StepSizeProbe:
    """η̂ = ⟨w_before − w_after, g⟩ / ‖g‖²: how far one optimizer update went along its gradient
    g, in the units of eq. horizondelta (SGD: its lr; momentum μ: about lr/(1 − μ); Adam: lr
    over the typical √v̂). Two float64 dot products per probe, no copy of the weights; the
    gradients must be the ones the update used (read before the optimizer step, unchanged by it).
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = [p for p in params if p.grad is not None]
        self.grads = [p.grad for p in self.params]
        self.before = self._dot()
        self.grad_sq = sum(float(g.double().pow(2).sum()) for g in self.grads)

    def _dot(self) -> float:
        with torch.no_grad():
            return sum(
                float((p.double() * g.double()).sum()) for p, g in zip(self.params, self.grads)
            )

    def step_size(self) -> float | None:
        """η̂ after the update (None without gradients, or a non-positive measurement)."""
        if not self.params or self.grad_sq <= 0:
            return None
        eta = (self.before - self._dot()) / self.grad_sq
        return eta if math.isfinite(eta) and eta > 0 else None
