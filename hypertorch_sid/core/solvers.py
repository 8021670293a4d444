"""The two stochastic fixed-point solves of Algorithm 1 and the hypergradient assembly.

Both solves are the stochastic Krasnoselskii–Mann iteration (eq. inneralgo)

    x_{t+1} = x_t + η_t (T̂(x_t, ζ_t) − x_t)

* inner solve (eq. inneralg): T̂ = Φ̂(·, λ, ζ_t), x = w, updated **in place** (warm start: the next
  call starts from the last w);
* adjoint solve (eq. backalg): T̂ = Ψ̂_w(v) = ∂₁Φ̂(w, λ, ζ̂_k)ᵀ v + ∇₁E(w, λ), on fresh batches ζ̂.

Then (eq. gradestim) ∇̂f(λ) = ∇₂E(w_t, λ) + ∂₂Φ̂(w_t, λ, ζ)ᵀ v_k, where the last term may average
J batches (or all the data) to remove the floor 2 m₂ B²/(1−q)² of Thm 3.4.

Every iteration checks its residual ‖T̂(x) − x‖: non-finite values or growth by more than
``divergence_factor`` over the first residuals raise :class:`DivergenceError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .batches import BatchStream, batch_size
from .cost import Cost
from .errors import DivergenceError
from .maps import FixedPointMap
from .schedules import StepSchedule

Tensors = list[Tensor]

#: iterations whose residuals set the reference for the growth test
_REFERENCE_STEPS = 5


@dataclass
class SolveResult:
    """What a solve reports: steps taken, the first and last residual ‖T̂(x) − x‖, last η."""

    steps: int
    first_residual: float
    residual: float
    eta: float


def norm(xs: Sequence[Tensor]) -> float:
    """Euclidean norm of a list of tensors (as one vector).

    Each tensor's norm is taken in its own precision (float32 and float64; half types in float32,
    whose squares would overflow at 256), then combined in float64: a float64 copy of a large w
    at every solver step would cost more than the step itself (50× the norm's time on a 2.6M
    weight matrix).
    """
    if not xs:
        return 0.0
    per_tensor = [
        torch.linalg.vector_norm(x.detach(), dtype=_NORM_DTYPE.get(x.dtype)).to(torch.float64)
        for x in xs
    ]
    return float(torch.linalg.vector_norm(torch.stack(per_tensor)))


_NORM_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class _DivergenceMonitor:
    """Raises DivergenceError on non-finite or exploding residuals of one solve."""

    def __init__(self, quantity: str, factor: float, hint: str) -> None:
        self.quantity, self.factor, self.hint = quantity, factor, hint
        self.reference = 0.0
        self.first = math.nan

    def check(self, step: int, residual: float) -> None:
        if step == 0:
            self.first = residual
        if not math.isfinite(residual):
            hint = "Non-finite values: check the training data and the losses for NaN/Inf. "
            raise DivergenceError(self.quantity, step, residual, hint + self.hint)
        if step < _REFERENCE_STEPS:
            self.reference = max(self.reference, residual)
        elif residual > self.factor * max(self.reference, 1e-30) and residual > 1e-8:
            raise DivergenceError(self.quantity, step, residual, self.hint)


def inner_solve(
    phi: FixedPointMap,
    batches: BatchStream,
    steps: int,
    schedule: StepSchedule,
    cost: Cost | None = None,
    divergence_factor: float = 1e4,
) -> SolveResult:
    """t steps of eq. inneralg, w ← w + η_t (Φ̂(w, λ, ζ_t) − w), updating w in place."""
    monitor = _DivergenceMonitor(
        "inner solve w_t",
        divergence_factor,
        "The fixed-point map is probably not a contraction: lower the inner step size (alpha "
        "< 2/L for a gradient map) or eta, or enable backoff.",
    )
    w = phi.inner_parameters
    residual, eta = math.nan, math.nan
    for t in range(steps):
        batch = next(batches)
        target = phi.value(batch)
        eta = schedule(t)
        with torch.no_grad():
            delta = [p - wi for p, wi in zip(target, w)]
            residual = norm(delta)
            monitor.check(t, residual)
            for wi, d in zip(w, delta):
                wi.add_(d, alpha=eta)
        if cost is not None:
            n = batch_size(batch)
            cost.samples += n
            cost.inner_samples += n
            cost.gradient_evals += 1
    return SolveResult(steps, monitor.first, residual, eta)


def adjoint_solve(
    phi: FixedPointMap,
    grad_w_E: Sequence[Tensor],
    v0: Sequence[Tensor],
    batches: BatchStream,
    steps: int,
    schedule: StepSchedule,
    cost: Cost | None = None,
    divergence_factor: float = 1e4,
) -> tuple[Tensors, SolveResult]:
    """k steps of eq. backalg, v ← v + η_k (∂₁Φ̂(w, λ, ζ̂_k)ᵀ v + ∇₁E − v), from v₀.

    Solves (I − ∂₁Φ(w, λ)ᵀ) v = ∇₁E(w, λ) (eq. linsystem). Returns v_k and the solve's report;
    the residual is ‖Ψ̂_w(v) − v‖.
    """
    monitor = _DivergenceMonitor(
        "adjoint solve v_k",
        divergence_factor,
        "The adjoint iteration inherits the contraction constant of the map: lower alpha or "
        "eta, or enable backoff.",
    )
    v = [x.detach().clone() for x in v0]
    residual, eta = math.nan, math.nan
    for k in range(steps):
        batch = next(batches)
        jtv, _ = phi.vjp(batch, v)
        eta = schedule(k)
        with torch.no_grad():
            delta = [j + g - vi for j, g, vi in zip(jtv, grad_w_E, v)]
            residual = norm(delta)
            monitor.check(k, residual)
            for vi, d in zip(v, delta):
                vi.add_(d, alpha=eta)
        if cost is not None:
            n = batch_size(batch)
            cost.samples += n
            cost.adjoint_samples += n
            cost.jacobian_vector_products += 1
    return v, SolveResult(steps, monitor.first, residual, eta)


def assemble_hypergradient(
    phi: FixedPointMap,
    v: Sequence[Tensor],
    grad_lam_E: Sequence[Tensor],
    batches: Iterable[Any],
    cost: Cost | None = None,
) -> Tensors:
    """∇̂f(λ) = ∇₂E(w, λ) + mean_j ∂₂Φ̂(w, λ, ζ_j)ᵀ v (eq. gradestim, J batches averaged)."""
    batches = list(batches)
    total = [g.detach().clone() for g in grad_lam_E]
    if not batches:
        return total
    for batch in batches:
        _, d2 = phi.vjp(batch, v, wrt_hyper=True)
        assert d2 is not None
        for acc, d in zip(total, d2):
            acc.add_(d.detach(), alpha=1.0 / len(batches))
        if cost is not None:
            cost.samples += batch_size(batch)
            cost.jacobian_vector_products += 1
    return total
