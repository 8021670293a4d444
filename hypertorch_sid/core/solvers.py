"""The two stochastic fixed-point solves of Algorithm 1 and the hypergradient assembly.

Both solves are the stochastic Krasnoselskii–Mann iteration (eq. inneralgo)

    x_{t+1} = x_t + η_t (T̂(x_t, ζ_t) − x_t)

* inner solve (eq. inneralg): T̂ = Φ̂(·, λ, ζ_t), x = w, updated **in place** (warm start: the next
  call starts from the last w);
* adjoint solve (eq. backalg): T̂ = Ψ̂_w(v) = ∂₁Φ̂(w, λ, ζ̂_k)ᵀ v + ∇₁E(w, λ), on fresh batches ζ̂.

The inner solve is a strategy (:class:`InnerSolver`): :class:`LastIterate` is the paper's,
:class:`AveragedMomentum` (the default) adds heavy-ball momentum to the constant phase and averages
the decreasing phase (an :class:`Acceleration` of the kernel); so is the adjoint solve
(:class:`AdjointSolver`).

Then (eq. gradestim) ∇̂f(λ) = ∇₂E(w_t, λ) + ∂₂Φ̂(w_t, λ, ζ)ᵀ v_k, where the last term may average
J batches (or all the data) to remove the floor 2 m₂ B²/(1−q)² of Thm 3.4.

Every iteration checks its residual ‖T̂(x) − x‖: non-finite values, growth by more than
``divergence_factor`` over the first residuals, 100× growth past the first two or steady growth
(:class:`~hypertorch_sid.core.watch.ResidualWatch`) raise :class:`DivergenceError`; a solve that
ends visibly unconverged warns (:class:`~hypertorch_sid.core.errors.ConvergenceWarning`).
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import rows
from .batches import BatchStream, batch_size, join
from .context import SolveContext
from .cost import Cost
from .errors import ConfigurationError, DivergenceError
from .maps import FixedPointMap
from .schedules import StepSchedule
from .validation import check_choice, check_fraction, check_integer, check_real, is_integer
from .watch import ResidualWatch, rounding_floor, unconverged_message, warn_not_converged

log = logging.getLogger("hypertorch_sid")

Tensors = list[Tensor]

#: iterations whose residuals set the reference for the growth test
_REFERENCE_STEPS = 5


@dataclass
class SolveResult:
    """What a solve reports: steps taken, the first and last residual ‖T̂(x) − x‖, last η, and
    where it visibly has not converged, what to say (:func:`~hypertorch_sid.core.watch.
    unconverged_message`; "" where it has)."""

    steps: int
    first_residual: float
    residual: float
    eta: float
    unconverged: str = ""


def norm(xs: Sequence[Tensor]) -> float:
    """Euclidean norm of a list of tensors (as one vector).

    Each tensor's norm is taken in its own precision (float32 and float64; half types in float32,
    whose squares would overflow at 256), then combined in float64: a float64 copy of a large w
    at every solver step would cost more than the step itself (50× the norm's time on a 2.6M
    weight matrix).
    """
    return float(_norm_tensor(xs)) if xs else 0.0


def _norm_tensor(xs: Sequence[Tensor]) -> Tensor:
    """:func:`norm` of a non-empty list, as a tensor on the device, not read."""
    if len(xs) == 1:  # no stack, no float64 copy: this runs at every solver step
        x = rows.stored(xs[0].detach())  # a sparse tensor's rows (no SparseCUDA norm kernel)
        return torch.linalg.vector_norm(x, dtype=_NORM_DTYPE.get(x.dtype))
    per_tensor = [
        torch.linalg.vector_norm(x, dtype=_NORM_DTYPE.get(x.dtype)).to(torch.float64)
        for x in (rows.stored(x.detach()) for x in xs)
    ]
    return torch.linalg.vector_norm(torch.stack(per_tensor))


def norms(*groups: Sequence[Tensor], also: Sequence[Tensor] = ()) -> list[float]:
    """:func:`norm` of each group, then the values of the 0-dim tensors ``also``, read in one
    wait for the device where they share one (a launch-bound GPU pays for each read); each
    number is the one :func:`norm` or ``float`` gives."""
    found = [_norm_tensor(g) if g else None for g in groups]
    tensors = [t for t in found if t is not None] + list(also)
    if tensors and len({t.device for t in tensors}) == 1:
        read = iter(torch.stack([t.detach().double() for t in tensors]).tolist())
    else:
        read = iter([float(t) for t in tensors])
    out = [0.0 if t is None else next(read) for t in found]
    return out + [next(read) for _ in also]


_NORM_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class _DivergenceMonitor:
    """Raises DivergenceError on non-finite or exploding residuals of one solve.

    The error names the cause it saw: residuals that grew before turning non-finite mean a map
    that is not a contraction (not bad data); a first residual already non-finite means NaN/Inf in
    the data, the losses or the starting point.
    """

    def __init__(
        self, quantity: str, factor: float, hint: str, fix: str = "", growth: bool = True
    ) -> None:
        self.quantity, self.factor, self.hint = quantity, factor, hint
        self.reference = 0.0
        self.first = math.nan
        self.largest = 0.0
        #: growth and drift of the residuals (:mod:`~hypertorch_sid.core.watch`); ``fix`` is
        #: what the not-converged warning tells the user to change
        self.watch, self.fix = ResidualWatch(quantity, hint, growth), fix

    def finish(self, x: Sequence[Tensor]) -> str:
        """End of the solve at ``x``: raise on steady growth; what to say where the solve
        visibly has not converged ("" where it has)."""
        self.watch.finish()
        if not self.fix or self.watch.converged():
            return ""
        return unconverged_message(self.quantity, self.watch, self.fix, rounding_floor(x))

    def check(self, step: int, residual: float, delta: Sequence[Tensor] | None = None) -> None:
        if step == 0:
            self.first = residual
        if not math.isfinite(residual):
            if step > 0 and math.isfinite(self.first) and self.largest > 1e3 * self.first:
                hint = (
                    f"The residual grew from {self.first:.3g} to {self.largest:.3g} before turning "
                    "non-finite: the map is not a contraction here (not a data problem). "
                )
            else:  # data, not the solver: retries cannot help (DivergenceError.data)
                hint = (
                    "Non-finite values from the first iteration: check the training data, the "
                    "losses and the starting point for NaN/Inf. "
                )
                raise DivergenceError(self.quantity, step, residual, hint + self.hint, True)
            raise DivergenceError(self.quantity, step, residual, hint + self.hint)
        self.largest = max(self.largest, residual)
        self.watch.see(step, residual, delta)
        if step < _REFERENCE_STEPS:
            self.reference = max(self.reference, residual)
        elif residual > self.factor * max(self.reference, 1e-30) and residual > 1e-8:
            raise DivergenceError(self.quantity, step, residual, self.hint)


def _count(cost: Cost | None, batch: Any, solve: str) -> None:
    if cost is None:
        return
    n = batch_size(batch)
    cost.samples += n
    if solve == "inner":
        cost.inner_samples += n
        cost.gradient_evals += 1
    else:
        cost.adjoint_samples += n
        cost.jacobian_vector_products += 1


@dataclass(frozen=True)
class Acceleration:
    """How :func:`km_iteration` departs from the paper's steps: heavy-ball ``momentum`` m in the
    schedule's constant phase, and the polynomial-decay average (c = ``decay``) of the last
    ``averaged_steps`` iterates. ``Acceleration()`` is the paper's iteration."""

    momentum: float = 0.0
    averaged_steps: int = 0
    decay: float = 0.0

    @classmethod
    def two_phase(
        cls,
        phi: FixedPointMap,
        schedule: StepSchedule,
        steps: int,
        momentum: float,
        decay: float | None,
    ) -> Acceleration:
        """Momentum m (symmetric maps only) in the constant phase t < t₀ and the average of the
        whole decreasing phase (``decay`` None: no average), where the schedule has both phases
        within ``steps``; the paper's iteration otherwise."""
        t0 = schedule.constant_phase()
        if not 0 < t0 < steps:
            return cls()
        averaged = steps - int(t0) if decay is not None else 0
        return cls(momentum if phi.symmetric else 0.0, averaged, decay or 0.0)


def km_iteration(
    T: Callable[[Any, Sequence[Tensor]], Sequence[Tensor]],
    x: Sequence[Tensor],
    batches: Iterator[Any],
    steps: int,
    schedule: StepSchedule,
    monitor: _DivergenceMonitor,
    count: Callable[[Any], None],
    acceleration: Acceleration = Acceleration(),
) -> SolveResult:
    """The stochastic Krasnoselskii–Mann iteration (eq. inneralgo), x updated in place:

        x_{t+1} = x_t + η_t (T̂(x_t, ζ_t) − x_t) + m_t (x_t − x_{t−1}),

    with m_t = ``acceleration.momentum`` while η_t is in the schedule's constant phase (t < t₀)
    and 0 after (plain KM steps: m = 0 is the paper's iteration). With
    ``acceleration.averaged_steps`` = s > 0, x ends as the polynomial-decay average of the last s
    iterates (Shamir & Zhang, 2013),

        x̄_0 = y_0,   x̄_j = x̄_{j−1} + (c+1)/(j+c+1) (y_j − x̄_{j−1}),   c = ``acceleration.decay``,

    over the last s iterates y_0..y_{s−1}: the uniform mean for c = 0; c > 0 weights recent
    iterates more, so the average does not lag behind an iteration that is still converging.

    Both solves of Algorithm 1 are this kernel: T̂ = Φ̂(·, λ, ζ) (eq. inneralg) and
    T̂ = Ψ̂_w(·, ζ̂) (eq. backalg). Every residual ‖T̂(x) − x‖ goes through ``monitor``.
    """
    residual, eta = math.nan, math.nan
    momentum, averaged_steps, decay = (
        acceleration.momentum,
        acceleration.averaged_steps,
        acceleration.decay,
    )
    heavy_ball = min(steps, schedule.constant_phase()) if momentum > 0 else 0
    velocity = [torch.zeros_like(xi) for xi in x] if heavy_ball else []  # x_t − x_{t−1}
    mean: list[Tensor] = []
    for t in range(steps):
        batch = next(batches)
        target = T(batch, x)
        eta = schedule(t)
        with torch.no_grad():
            delta = [p - xi for p, xi in zip(target, x)]
            residual = norm(delta)
            monitor.check(t, residual, delta)
            if t < heavy_ball:
                for xi, d, u in zip(x, delta, velocity):
                    xi.add_(u.mul_(momentum).add_(d, alpha=eta))
            else:
                for xi, d in zip(x, delta):
                    xi.add_(d, alpha=eta)
            j = t - steps + averaged_steps  # j-th averaged iterate, from 0
            if j >= 0:
                if not mean:
                    mean = [xi.clone() for xi in x]
                for m, xi in zip(mean, x):
                    m.lerp_(xi, (decay + 1) / (j + decay + 1))
        count(batch)
    unconverged = monitor.finish(x)
    with torch.no_grad():
        for xi, m in zip(x, mean):
            xi.copy_(m)
    return SolveResult(steps, monitor.first, residual, eta, unconverged)


def inner_solve(
    phi: FixedPointMap,
    batches: BatchStream,
    steps: int,
    schedule: StepSchedule,
    cost: Cost | None = None,
    divergence_factor: float = 1e4,
    acceleration: Acceleration = Acceleration(),
    watch: bool = True,
) -> SolveResult:
    """t steps of eq. inneralg, w ← w + η_t (Φ̂(w, λ, ζ_t) − w), updating w in place (with
    ``acceleration`` as in :func:`km_iteration`). ``watch``: residual growth means expansion
    and a drift means an unconverged solve (a convex problem; not a network, whose gradient
    grows as w leaves a flat start and whose training drifts for long)."""
    monitor = _DivergenceMonitor(
        "inner solve w_t",
        divergence_factor,
        "The fixed-point map is probably not a contraction: lower the inner step size (alpha "
        "< 2/L for a gradient map) or eta, or enable backoff (on_divergence=BackOff(2)).",
        "Raise inner_steps, or the step size (alpha, eta) if it is far below 2/L." if watch else "",
        growth=watch,
    )
    return km_iteration(
        lambda batch, w: phi.value(batch),
        phi.inner_parameters,
        batches,
        steps,
        schedule,
        monitor,
        lambda batch: _count(cost, batch, "inner"),
        acceleration,
    )


class InnerSolver(ABC):
    """How the t warm-started inner steps of Algorithm 1 (eq. inneralg) approach w(λ): a
    strategy object. ``solve`` updates ``phi.inner_parameters`` in place."""

    def solve(self, ctx: SolveContext) -> SolveResult:
        """``ctx.steps`` steps on the minibatches of ``ctx.batches`` (``ctx.q``: the map's
        contraction constant where the inner problem is convex, else None); the solve's report."""
        acceleration = self.acceleration(ctx.phi, ctx.schedule, ctx.steps, ctx.q)
        result = inner_solve(
            ctx.phi, ctx.batches, ctx.steps, ctx.schedule, ctx.cost, ctx.divergence_factor,
            acceleration, ctx.watch_growth,
        )  # fmt: skip
        warn_not_converged(result.unconverged)  # w is where this solve left it: say so now
        return result

    @abstractmethod
    def acceleration(
        self, phi: FixedPointMap, schedule: StepSchedule, steps: int, q: float | None
    ) -> Acceleration:
        """How this solve departs from the paper's iteration (``Acceleration()``: not at all)."""


@dataclass(frozen=True)
class LastIterate(InnerSolver):
    """The paper's inner iteration (eq. inneralg): t KM steps, w_t is the last iterate (the
    presets' inner solve)."""

    def acceleration(
        self, phi: FixedPointMap, schedule: StepSchedule, steps: int, q: float | None
    ) -> Acceleration:
        return Acceleration()


@dataclass(frozen=True)
class AveragedMomentum(InnerSolver):
    """eq. inneralg with heavy-ball momentum in the constant phase and an averaged decreasing
    phase (the default inner solve). For a schedule with a constant phase t < t₀ followed by
    decreasing steps (``"two_phase"``, the default):

        w_{s+1} = w_s + η (Φ̂(w_s, λ, ζ_s) − w_s) + m (w_s − w_{s−1})   for s < t₀,
        w_{s+1} = w_s + η_s (Φ̂(w_s, λ, ζ_s) − w_s)                     after (Thm 4.2's steps),

    and w is the polynomial-decay average (``decay`` = c, see :func:`km_iteration`) of the
    iterates of the decreasing phase.

    For the GD map, momentum m divides the constant phase's rate on the low-curvature directions,
    1 − αμ, into 1 − αμ/(1−m) (stable for αL < 2(1+m), so wherever plain steps are); the
    decreasing phase then removes the noise it adds, and averaging its iterates removes most of
    the rest (Polyak–Juditsky). Same fixed point, same samples per step. A uniform mean of the
    last half lagged behind the still-converging iterates at long budgets (4.2e-4 against c = 3's
    1.2e-4 at E = 200 below), c = 3 weights the recent ones more.

    * It needs q, the contraction constant of a convex inner problem (given, or estimated with
      λ̂_min > 0) solved on minibatches; without it — full-batch (deterministic) steps, which
      have no noise to average, or a network, where the curvature estimate finds negative
      curvature — the paper's iteration runs. The theory of both is for convex problems, and on
      small MLPs momentum lowered the training progress per step (train loss 1.17 against 0.93
      after 100 steps), as the faster steps reached sharper regions and the estimate at w_t
      lowered α.
    * m is capped at q²: the heavy-ball rate is then never slower than the plain one (√m ≤ q),
      so well-conditioned problems lose nothing.
    * Momentum needs a symmetric Jacobian (gradient maps: ``phi.symmetric``); other maps
      (proximal, general contractions) get the averaging only.
    * A schedule without both phases in these steps runs the paper's iteration, unchanged:
      constant steps (no decreasing phase to remove momentum's noise; deterministic, full-batch
      solves converge linearly, and an average would only lag behind) and purely decreasing
      steps (no constant phase to accelerate; averaging their iterates moved the warm-started
      digits demo from val loss 0.1812 to 0.1846).

    Measured on MNIST odd/even (``benchmarks/bench_peers.py``, n_tr = 5000, 784 λ, 3 minibatch
    orders; relative error of the hypergradient at E epochs, E/2 inner), against the last iterate:
    E = 20: 0.088–0.099 against 0.12–0.16; E = 40: 0.0057–0.0082 against 0.011–0.024; E = 80:
    2.7e-4–3.7e-4 against 3.4e-3–4.4e-3; E = 200: 1.2e-4–2.4e-4 against 2.4e-4–1.3e-3.
    """

    momentum: float = 0.5
    decay: float = 3.0

    def __post_init__(self) -> None:
        for name in ("momentum", "decay"):
            check_real(f"AveragedMomentum.{name}", getattr(self, name), _any, "a number")
        momentum = check_real("AveragedMomentum.momentum", self.momentum, _fraction, "in [0, 1)")
        decay = check_real(
            "AveragedMomentum.decay (c of the polynomial-decay average; 0: the uniform mean)",
            self.decay, _finite_nonnegative, "a finite number ≥ 0",
        )  # fmt: skip
        object.__setattr__(self, "momentum", momentum)
        object.__setattr__(self, "decay", decay)

    def acceleration(
        self, phi: FixedPointMap, schedule: StepSchedule, steps: int, q: float | None
    ) -> Acceleration:
        if q is None:
            return Acceleration()
        return Acceleration.two_phase(phi, schedule, steps, min(self.momentum, q * q), self.decay)


_ADJOINT_FIX = "Raise adjoint_steps (or the adjoint step size, eta)."
_ADJOINT_HINT = (
    "The adjoint iteration inherits the contraction constant of the map: it is not a contraction "
    "at this w (negative curvature of a non-convex model, or alpha above 2/L)."
)


def adjoint_map(
    phi: FixedPointMap, grad_w_E: Sequence[Tensor]
) -> Callable[[Any, Sequence[Tensor]], Tensors]:
    """Ψ̂_w(v, ζ̂) = ∂₁Φ̂(w, λ, ζ̂)ᵀ v + ∇₁E(w, λ): the map of the adjoint solve (eq. backalg)."""

    def psi(batch: Any, v: Sequence[Tensor]) -> Tensors:
        jtv, _ = phi.vjp(batch, v)
        return [j + g for j, g in zip(jtv, grad_w_E)]

    return psi


def adjoint_solve(
    phi: FixedPointMap,
    grad_w_E: Sequence[Tensor],
    v0: Sequence[Tensor],
    batches: BatchStream,
    steps: int,
    schedule: StepSchedule,
    cost: Cost | None = None,
    divergence_factor: float = 1e4,
    acceleration: Acceleration = Acceleration(),
) -> tuple[Tensors, SolveResult]:
    """k steps of eq. backalg, v ← v + η_k (Ψ̂_w(v, ζ̂_k) − v), from v₀ (with ``acceleration`` as
    in :func:`km_iteration`).

    Solves (I − ∂₁Φ(w, λ)ᵀ) v = ∇₁E(w, λ) (eq. linsystem). Returns v_k and the solve's report;
    the residual is ‖Ψ̂_w(v) − v‖.
    """
    monitor = _DivergenceMonitor(
        "adjoint solve v_k", divergence_factor, _ADJOINT_HINT, _ADJOINT_FIX
    )
    v = [x.detach().clone() for x in v0]
    result = km_iteration(
        adjoint_map(phi, grad_w_E),
        v,
        batches,
        steps,
        schedule,
        monitor,
        lambda batch: _count(cost, batch, "adjoint"),
        acceleration,
    )
    return v, result


class AdjointSolver(ABC):
    """How the adjoint system (I − ∂₁Φᵀ) v = ∇₁E (eq. linsystem) is solved: a strategy object."""

    def plan(self, ctx: SolveContext) -> tuple[AdjointSolver, SolveContext]:
        """The solver that runs this solve and its context: ``(self, ctx)`` unless the strategy
        chooses (:class:`Automatic`, which may also change the step count)."""
        return self, ctx

    @abstractmethod
    def solve(
        self, ctx: SolveContext, grad_w_E: Sequence[Tensor], v0: Sequence[Tensor]
    ) -> tuple[Tensors, SolveResult]:
        """v_k from v₀ in ``ctx.steps`` iterations; ``ctx.schedule`` is the KM step size (if
        used)."""

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        """The training's steps still to run and its step size η, before each hyper step (as
        :meth:`~.damping.Damping.observe`). Ignored here; :class:`~.horizon.HorizonSolver`
        looks ahead over them."""
        del remaining_steps, step_size

    def step_budget(self, ctx: SolveContext) -> float:
        """How far v can move in a non-expansive solve, in units of ‖∇₁E‖ (the divergence guard's
        budget): unbounded for solvers that are not KM iterations (CG's v = A⁻¹∇₁E)."""
        return math.inf


@dataclass(frozen=True)
class FixedPointIteration(AdjointSolver):
    """The paper's stochastic fixed-point iteration (eq. backalg) with the optimizer's schedule.

    One fresh minibatch ζ̂_k per step; converges with decreasing steps (Thm 4.2) at a rate set by
    the contraction constant q (the condition number κ for the GD map).

    ``FixedPointIteration()`` is the paper's. With ``momentum`` m > 0 and/or ``decay`` c, and a
    schedule with a constant phase k < t₀ followed by decreasing steps within the k steps, it is
    accelerated as :class:`AveragedMomentum` accelerates the inner solve: heavy-ball momentum
    m(v_k − v_{k−1}) in the constant phase (symmetric systems only, i.e. the GD map's
    A = α(S∇²ℓS + δI); the system is linear, so the heavy-ball analysis holds exactly, on
    networks too once damped), then the polynomial-decay average of the decreasing phase's
    iterates. ``Automatic`` falls back to it with m = min(0.5, q²), c = 3: on MNIST odd/even from
    a one-shot stream (n_tr = 5000, 3 minibatch orders) the hypergradient error at E = 30 fell
    from 0.026–0.032 to 0.011–0.013, at E = 50 from 4.7e-3–6.3e-3 to 1.6e-3–2.1e-3, at the same
    cost per step (averaging alone, m = 0, was 10–20 % worse than the plain iteration).
    """

    momentum: float = 0.0
    decay: float | None = None

    def __post_init__(self) -> None:
        momentum = check_fraction("FixedPointIteration momentum", self.momentum)
        decay = check_real(
            "FixedPointIteration decay", self.decay, _finite_nonnegative,
            "None (no averaging) or a finite number ≥ 0", allow_none=True,
        )  # fmt: skip
        object.__setattr__(self, "momentum", momentum)
        object.__setattr__(self, "decay", decay)

    def acceleration(self, phi: FixedPointMap, schedule: StepSchedule, steps: int) -> Acceleration:
        return Acceleration.two_phase(phi, schedule, steps, self.momentum, self.decay)

    def step_budget(self, ctx: SolveContext) -> float:
        """How far v can move in a non-expansive solve, in units of ‖∇₁E‖: Σ_k η_k, with the
        momentum steps counted 1/(1−m) times (the velocity sums them geometrically)."""
        schedule = ctx.schedule
        momentum = self.acceleration(ctx.phi, schedule, ctx.steps).momentum
        t0 = schedule.constant_phase() if momentum else 0
        return sum(schedule(k) / (1 - momentum if k < t0 else 1) for k in range(ctx.steps))

    def solve(
        self, ctx: SolveContext, grad_w_E: Sequence[Tensor], v0: Sequence[Tensor]
    ) -> tuple[Tensors, SolveResult]:
        return adjoint_solve(
            ctx.phi, grad_w_E, v0, ctx.batches, ctx.steps, ctx.schedule, ctx.cost,
            ctx.divergence_factor, self.acceleration(ctx.phi, ctx.schedule, ctx.steps),
        )  # fmt: skip


def sampled_operator(
    phi: FixedPointMap, fixed: Sequence[Any], cost: Cost | None
) -> Callable[[Sequence[Tensor]], Tensors]:
    """A v = v − Σ_b ω_b ∂₁Φ̂(w, λ, ζ_b)ᵀv on the fixed batches ζ_b, ω_b ∝ their sample counts
    (each sample counts once): the adjoint system's operator I − ∂₁Φᵀ on those samples."""
    samples = [batch_size(b) for b in fixed]
    total = sum(samples)
    weights = [n / total for n in samples]

    def A(v: Sequence[Tensor]) -> Tensors:
        acc = [x.detach().clone() for x in v]
        for b, weight in zip(fixed, weights):
            jtv, _ = phi.vjp(b, v)
            for a, j in zip(acc, jtv):
                a.sub_(j.detach(), alpha=weight)
            _count(cost, b, "adjoint")
        return acc

    return A


def _anchor_batches(
    kind: str, batches: BatchStream, full_batch: Any, chunk: int, who: str
) -> list[Any]:
    """All the training data as a fixed operator: the full batch or one pass, joined by chunk."""
    if kind == "full":
        if full_batch is None:
            raise ConfigurationError(
                f"{who}(batches='full') needs full_train_batch=<the whole training set as one "
                "batch>."
            )
        return [full_batch]
    return join(batches.next_pass(), chunk)


#: what ``ConjugateGradient.tol`` must be (a relative residual: 0 runs every step)
_TOL = "a relative residual in [0, 1) (‖r‖ ≤ tol·‖∇₁E‖ stops; 1 or more stops before any step)"


@dataclass(frozen=True)
class ConjugateGradient(AdjointSolver):
    """Conjugate gradients on A v = ∇₁E with A = I − ∂₁Φᵀ = α(∇²₁₁ℓ + δI) (GD map).

    A is fixed for the whole solve, the sample-weighted mean of its products over

    * ``batches`` minibatches drawn once at its start (an integer);
    * the full training batch (``"full"``, needs ``full_train_batch``);
    * one whole pass of the training source (``"epoch"``, a ``DataLoader`` or a list: every
      sample once), its minibatches joined ``chunk`` at a time — the full-batch operator without
      a full batch in memory at once. (A BatchNorm module in train mode normalises a joined
      batch, or the full batch, by its own statistics, not by those of a training minibatch.)

    CG converges at a rate set by √κ instead of κ, but to the solution of the *sampled* system:
    its error keeps the sampling noise of those batches (none for the full batch or an epoch; no
    noise floor removal, unlike decreasing KM steps). A must be symmetric positive definite: the
    GD map, convex or damped (a non-positive curvature pᵀAp ≤ 0 raises :class:`DivergenceError`
    naming damping as the fix).

    Parameters
    ----------
    batches: minibatches of the fixed operator, ``"full"`` or ``"epoch"``.
    tol: stop when ‖r‖ ≤ tol·‖∇₁E‖.
    chunk: minibatches per product with ``"epoch"`` (the memory of a product on ``chunk``
        minibatches against fewer, larger tensor operations).
    """

    batches: int | str = 8
    tol: float = 1e-10
    chunk: int = 8

    def __post_init__(self) -> None:
        if self.batches not in ("full", "epoch") and not _is_count(self.batches):
            raise ConfigurationError(
                "ConjugateGradient batches must be an integer ≥ 1, 'full' or 'epoch', got "
                f"{self.batches!r}."
            )
        object.__setattr__(self, "chunk", check_integer("ConjugateGradient chunk", self.chunk, 1))
        # NaN or < 0 never stopped early, ≥ 1 stopped before any step (v = v₀, e.g. 0): s56
        tol = check_real("ConjugateGradient tol", self.tol, lambda t: 0 <= t < 1, _TOL)
        object.__setattr__(self, "tol", tol)

    def operator_batches(self, batches: BatchStream, full_batch: Any = None) -> list[Any]:
        """The batches whose mean product is A for this solve."""
        if self.batches in ("full", "epoch"):
            return _anchor_batches(
                str(self.batches), batches, full_batch, self.chunk, "ConjugateGradient"
            )
        return batches.take(int(self.batches))

    def solve(
        self, ctx: SolveContext, grad_w_E: Sequence[Tensor], v0: Sequence[Tensor]
    ) -> tuple[Tensors, SolveResult]:
        phi, steps = ctx.phi, ctx.steps
        if not phi.symmetric:
            raise ConfigurationError(
                "ConjugateGradient needs a symmetric adjoint system (the gradient-descent map: "
                f"I − ∂₁Φᵀ = α∇²₁₁ℓ); {type(phi).__name__} is not. Use FixedPointIteration()."
            )
        A = sampled_operator(phi, self.operator_batches(ctx.batches, ctx.full_batch), ctx.cost)
        v = [x.detach().clone() for x in v0]
        b_norm = norm(grad_w_E)
        Av = A(v)
        r = [g - a for g, a in zip(grad_w_E, Av)]
        p = [x.clone() for x in r]
        rr = _dot(r, r)
        first = math.sqrt(rr)
        for k in range(steps):
            if math.sqrt(rr) <= self.tol * max(b_norm, 1e-30):
                break
            Ap = A(p)
            pAp = _dot(p, Ap)
            if not math.isfinite(pAp) or pAp <= 0:
                raise DivergenceError(
                    "adjoint solve v_k (conjugate gradients)",
                    k,
                    math.sqrt(rr),
                    f"pᵀAp = {pAp:.3g} ≤ 0: the adjoint system is not positive definite (a "
                    "non-convex inner loss: negative curvature the damping does not cover).",
                )
            step = rr / pAp
            for vi, pi, ri, api in zip(v, p, r, Ap):
                vi.add_(pi, alpha=step)
                ri.sub_(api, alpha=step)
            rr_new = _dot(r, r)
            for pi, ri in zip(p, r):
                pi.mul_(rr_new / rr).add_(ri)
            rr = rr_new
        return v, SolveResult(steps, first, math.sqrt(rr), math.nan)


@dataclass(frozen=True)
class VarianceReduced(AdjointSolver):
    """The stochastic fixed-point iteration (eq. backalg) with SVRG variance reduction.

    At an anchor ṽ (the current v, every ``anchor_every`` steps) the residual of the whole
    system r̃ = ∇₁E − Aṽ, A = I − ∂₁Φᵀ, is taken on all the training data (``batches="epoch"``:
    one pass of a re-iterable source, its minibatches joined ``chunk`` at a time; ``"full"``:
    ``full_train_batch``). Each step then corrects one fresh minibatch's residual by it:

        v ← v + η (r̃ − Â_ζ (v − ṽ)),   Â_ζ u = u − ∂₁Φ̂(w, λ, ζ)ᵀ u,

    an unbiased estimate of the residual ∇₁E − Av whose variance vanishes as v and ṽ approach
    the solution: the iteration converges linearly at a constant step to the solution of the
    whole system, with no noise floor and no decreasing steps (the paper's future work;
    SVRG/SABA in the literature). The step is η = ``eta_scale``·η₀ (η₀: the schedule's first
    step, the KM iteration's own). Where minibatches are small and their curvature varies much
    more than the full batch's (which α was set by), a smaller step converges faster (ridge,
    d = 6, b = 10, 600 steps: relative error 2e-6 at η₀, 6e-16 at η₀/4); on MNIST odd/even
    (b = 50, 784 weight decays) η₀ was best (4e-3 at 100 epochs, against 3e-2 at η₀/2).

    A step is one minibatch product, as in :class:`FixedPointIteration`; each anchor reads an
    epoch instead, so k steps read about twice the samples when ``anchor_every`` is an epoch of
    minibatches (the default, ``None``). It needs no symmetry (any contractive map), but all the
    data as an operator: not for one-shot streams.

    Measured against the default (``benchmarks/bench_peers.py``, MNIST odd/even): behind CG on
    an epoch at n = 5000 up to 100 epochs (CG's √κ rate; 4.0e-3 against 1.3e-3), ahead only at
    200 (1.4e-4 with a full-batch anchor against 1.9e-4); level with the fixed-point iteration
    at n = 30000 (1.1e-3 against 1.4e-3 at 20 epochs, 2.7e-4 against 2.2e-4 at 50, in 10–30 %
    fewer seconds), so :class:`Automatic` does not choose it.
    """

    batches: str = "epoch"
    anchor_every: int | None = None
    chunk: int = 8
    eta_scale: float = 1.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        check_choice("VarianceReduced batches", self.batches, ("epoch", "full"))
        set_(self, "chunk", check_integer("VarianceReduced chunk", self.chunk, 1))
        every = check_integer("VarianceReduced anchor_every", self.anchor_every, 1, True)
        set_(self, "anchor_every", every)
        eta = check_real(
            "VarianceReduced eta_scale", self.eta_scale, lambda e: 0 < e <= 1, "in (0, 1]"
        )
        set_(self, "eta_scale", eta)

    def solve(
        self, ctx: SolveContext, grad_w_E: Sequence[Tensor], v0: Sequence[Tensor]
    ) -> tuple[Tensors, SolveResult]:
        phi, batches, full_batch, cost = ctx.phi, ctx.batches, ctx.full_batch, ctx.cost
        monitor = _DivergenceMonitor(
            "adjoint solve v_k (variance-reduced)",
            ctx.divergence_factor,
            _ADJOINT_HINT,
            _ADJOINT_FIX,
        )
        eta = self.eta_scale * ctx.schedule(0)
        every = self.anchor_every or self._epoch_minibatches(batches, full_batch)
        v = [x.detach().clone() for x in v0]
        anchor: Tensors = []
        r_anchor: Tensors = []
        residual = math.nan
        for t in range(ctx.steps):
            if t % every == 0:  # a new anchor ṽ = v: the step is the whole residual r̃
                anchor = [x.clone() for x in v]
                data = _anchor_batches(
                    self.batches, batches, full_batch, self.chunk, "VarianceReduced"
                )
                r_anchor = [
                    g - a for g, a in zip(grad_w_E, sampled_operator(phi, data, cost)(anchor))
                ]
                delta = r_anchor
            else:  # r̃ − Â_ζ(v − ṽ) = r̃ − (v − ṽ) + ∂₁Φ̂(ζ)ᵀ(v − ṽ)
                batch = next(batches)
                diff = [x - a for x, a in zip(v, anchor)]
                jtv, _ = phi.vjp(batch, diff)
                delta = [r - d + j.detach() for r, d, j in zip(r_anchor, diff, jtv)]
                _count(cost, batch, "adjoint")
            with torch.no_grad():
                residual = norm(delta)
                monitor.check(t, residual, delta)
                for x, d in zip(v, delta):
                    x.add_(d, alpha=eta)
        unconverged = monitor.finish(v)
        return v, SolveResult(ctx.steps, monitor.first, residual, eta, unconverged)

    def _epoch_minibatches(self, batches: BatchStream, full_batch: Any) -> int:
        """Minibatches in an epoch: the source's length, or n/b beside a full batch."""
        if self.batches == "full":
            data = _anchor_batches("full", batches, full_batch, 1, "VarianceReduced")
            if batches.batches_drawn == 0:
                batches.take(1)
            return max(1, round(batch_size(data[0]) / (batches.mean_batch_size or 1)))
        m = batches.batches_per_pass
        if m is None:
            raise ConfigurationError(
                "VarianceReduced(batches='epoch') reads one pass of the training data at each "
                "anchor: pass a DataLoader or a list (not a one-shot iterator or a source "
                "without a length), or full_train_batch with batches='full'."
            )
        return m


@dataclass(frozen=True)
class Automatic(AdjointSolver):
    """The default: conjugate gradients on all the training data where they are faster, else the
    paper's stochastic fixed-point iteration.

    The KM iteration at the optimal α contracts by q = (κ−1)/(κ+1) ≈ 1 − 2/κ per minibatch step,
    so by about exp(−2m/κ) per epoch of m = n/b minibatches; CG contracts by about 1 − 2/√κ per
    full-batch product, one per epoch. CG is chosen when

    * the system is symmetric (the GD map, preconditioned and/or damped: A = α(S∇²₁₁ℓS + δI), so
      this is preconditioned CG), the run is on one process, and all the training data can be
      read as a fixed operator: ``full_batch`` (``full_train_batch``) is given, or the training
      source is a re-iterable, sized one (a ``DataLoader``, a list) whose epoch holds at most
      ``max_epoch_bytes`` of tensors (estimated from the minibatches drawn) — then each solve
      reads one fresh pass of it (:class:`ConjugateGradient` ``batches="epoch"``);
    * an epoch holds fewer than ``minibatches_per_sqrt_kappa``·√κ̂ minibatches (κ̂ = (1+q)/(1−q)
      from the estimated or given constants). By the rates above CG is faster per epoch below
      m = √κ; measured with minibatch noise (MNIST odd/even logistic regression, 784 weight
      decays, κ̂ ≈ 2000, b = 50): CG better at m = 100, the KM iteration far better at m = 600.
      (Since the fixed-point iteration is accelerated, it is the more accurate one per epoch at
      m = 100 too — 0.013 against 0.021 at 30 epochs — but a CG epoch is one full-batch product,
      about 1.7× cheaper than 100 minibatch products, so CG still reaches each error first in
      seconds, which is what it is chosen for);
    * the k minibatch steps it replaces buy at least ``min_iterations`` full-batch products: it
      reads the same samples, ⌈k·b/n⌉ products (measured: 5 products lose to 500 KM steps,
      10 win).

    Otherwise :class:`FixedPointIteration`, accelerated on a symmetric system with a known q:
    momentum min(``momentum``, q²) in the constant phase of a two-phase schedule and the
    polynomial-decay average (c = ``decay``) of its decreasing phase (the paper's iteration
    where the schedule is constant or purely decreasing, as in the Lightning callback).
    ``benchmarks/bench_peers.py`` has the numbers.
    """

    minibatches_per_sqrt_kappa: float = 4.0
    min_iterations: int = 10
    max_epoch_bytes: int = 2**30
    chunk: int = 8
    momentum: float = 0.5
    decay: float = 3.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("min_iterations", "max_epoch_bytes", "chunk"):
            set_(self, name, check_integer(f"Automatic {name}", getattr(self, name), 1))
        FixedPointIteration(self.momentum, self.decay)  # checks both
        m = self.minibatches_per_sqrt_kappa
        m = check_real("Automatic minibatches_per_sqrt_kappa", m, lambda x: x > 0, "a number > 0")
        set_(self, "minibatches_per_sqrt_kappa", m)

    def plan(self, ctx: SolveContext) -> tuple[AdjointSolver, SolveContext]:
        """CG or the (accelerated) fixed-point iteration, by the rules above; ``ctx.q`` None (no
        constant to choose with) or a distributed run: the paper's fixed-point iteration."""
        q, steps, batches, full_batch = ctx.q, ctx.steps, ctx.batches, ctx.full_batch
        if ctx.distributed or not ctx.phi.symmetric or q is None or not 0 <= q < 1:
            return FixedPointIteration(), ctx
        kmi = FixedPointIteration(min(self.momentum, q * q), self.decay), ctx
        if full_batch is None and batches.batches_per_pass is None:
            return kmi
        if batches.batches_drawn == 0:
            batches.take(1)
        b = batches.mean_batch_size
        assert b is not None
        if full_batch is not None:
            minibatches, cg = batch_size(full_batch) / b, ConjugateGradient(batches="full")
        else:
            minibatches = batches.batches_per_pass
            cg = ConjugateGradient(batches="epoch", chunk=self.chunk)
            if minibatches * batches.bytes_drawn / batches.batches_drawn > self.max_epoch_bytes:
                return kmi
        iterations = math.ceil(steps / minibatches)
        sqrt_kappa = math.sqrt((1 + q) / (1 - q))
        if (
            minibatches >= self.minibatches_per_sqrt_kappa * sqrt_kappa
            or iterations < self.min_iterations
        ):
            return kmi
        return cg, ctx.replace(steps=iterations)

    #: called without :meth:`plan` (no q to choose with): the fixed-point iteration
    solve = FixedPointIteration.solve


def _is_count(x: object) -> bool:
    return is_integer(x) and x >= 1  # type: ignore[operator]


def _any(x: float) -> bool:
    return True


def _unit(x: float) -> bool:
    return 0 < x <= 1


def _fraction(x: float) -> bool:
    return 0 <= x < 1


def _finite_nonnegative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


def check_exact_hyper_vjp(
    phi: FixedPointMap,
    v: Sequence[Tensor],
    batch: Any,
    cost: Cost | None = None,
    rtol: float = 1e-3,
) -> None:
    """Raise unless ``phi.exact_hyper_vjp(v)`` (from R alone) is ∂₂Φ̂ᵀv on ``batch``: the claim
    that ℓ̂ = ℓ(w; ζ) + R(w, λ) with ℓ not reading λ, checked once on a real minibatch."""
    exact = phi.exact_hyper_vjp(v)
    if exact is None:
        return
    _, sampled = phi.vjp(batch, v, wrt_hyper=True)
    assert sampled is not None
    if cost is not None:
        cost.samples += batch_size(batch)
        cost.jacobian_vector_products += 1
    sampled = [s.detach() for s in sampled]
    gap = norm([a - b for a, b in zip(exact, sampled)])
    scale = max(norm(exact), norm(sampled))
    if gap > rtol * scale + 1e-12:
        raise ConfigurationError(
            "regularizer() is not the only part of inner_loss that reads λ: ∂₂Φ̂ᵀv from R alone "
            f"has norm {norm(exact):.4g}, on a minibatch {scale:.4g} (difference {gap:.3g}). "
            "Leave regularizer unset (the cross term is then sampled on d2_batches), or make "
            "inner_loss(batch) = data_loss(batch) + regularizer() with data_loss not reading λ."
        )


def assemble_hypergradient(
    phi: FixedPointMap,
    v: Sequence[Tensor],
    grad_lam_E: Sequence[Tensor],
    batches: Iterable[Any],
    cost: Cost | None = None,
) -> Tensors:
    """∇̂f(λ) = ∇₂E(w, λ) + mean_j ∂₂Φ̂(w, λ, ζ_j)ᵀ v (eq. gradestim, J batches averaged).

    Where ∂₂Φ̂ᵀv does not depend on ζ (``phi.exact_hyper_vjp``: only a batch-independent R(w, λ)
    in ℓ̂ reads λ, as with weight decay) it is computed once from R and ``batches`` are not read:
    the same value as any J, without J forward passes.
    """
    total = [g.detach() for g in grad_lam_E]  # sums below are new tensors (row-sparse: .rows)
    exact = phi.exact_hyper_vjp(v)
    if exact is not None:
        if cost is not None:
            cost.jacobian_vector_products += 1
        return [rows.add(acc, d) for acc, d in zip(total, exact)]
    batches = list(batches)
    if not batches:
        return [g.clone() for g in total]
    for batch in batches:
        _, d2 = phi.vjp(batch, v, wrt_hyper=True)
        assert d2 is not None
        total = [rows.add(acc, d.detach(), 1.0 / len(batches)) for acc, d in zip(total, d2)]
        if cost is not None:
            cost.samples += batch_size(batch)
            cost.jacobian_vector_products += 1
    return total


#: a stalled first inner solve: steps shrank this many times, ℓ̂ fell by less than this fraction
_STALL_SHRINK, _STALL_DROP = 10.0, 0.1


def warn_if_stalled(
    before: float, after: float | None, inner: SolveResult, alpha: float | None
) -> None:
    """Warn when the first inner solve's steps shrank ≥ 10× while ℓ̂ on a probe batch fell
    by < 10 % (``before`` → ``after``): the iteration stopped without fitting, which is not
    convergence.

    Seen on a CNN with BatchNorm in eval mode (digits, seed 2): at the estimated α = 0.45 the
    first steps switched off the ReLUs; the residual fell from 2.2 to 0.062 while ℓ̂ went
    from 2.39 to 2.30 = ln 10 (uniform predictions), and the run ended at that validation
    loss with no error. Healthy runs fall by 85-97 % there.

    Not said where the start was already (nearly) solved: a first step r = α‖∇ℓ̂‖ can lower ℓ̂
    by only about r²/α, and where that is < 10 % of ℓ̂ a small fall is what convergence looks
    like (before: w warm-started at w(λ) got this warning).
    """
    if after is None or not (math.isfinite(before) and math.isfinite(after)):
        return
    shrank = inner.first_residual / max(inner.residual, 1e-30)
    room = inner.first_residual**2 / alpha if alpha else math.inf  # ℓ̂ the steps could shed
    if (
        shrank >= _STALL_SHRINK
        and before - after < _STALL_DROP * abs(before)
        and room >= _STALL_DROP * abs(before)
    ):
        log.warning(
            "hypertorch_sid: the inner solve's steps shrank %.0fx but the training loss on a "
            "probe batch only went from %.4g to %.4g: the inner iteration stalled rather than "
            "converged (e.g. ReLUs switched off by a step alpha = %.3g too large for this "
            "network). Pass alpha=<the learning rate your training uses, or smaller>.",
            shrank, before, after, alpha if alpha is not None else math.nan,
        )  # fmt: skip
