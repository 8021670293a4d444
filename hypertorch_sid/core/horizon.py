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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .context import SolveContext
from .damping import CurvatureDamping, Damping
from .errors import ConfigurationError, DivergenceError
from .estimation import CurvatureEstimate, lanczos, ritz_pairs
from .solvers import AdjointSolver, SolveResult, _anchor_batches, norm, sampled_operator
from .validation import check_integer, check_nonnegative, check_positive, class_given

Tensors = list[Tensor]


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
                f"{type(self.base).__name__}." + class_given(self.base, Damping)
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


def effective_step_size(
    optimizers: Iterable[torch.optim.Optimizer],
    share: Callable[[torch.optim.Optimizer], float] | None = None,
) -> float | None:
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

    ``share``: each optimizer's share of the steps T counts (None: 1). Where several optimizers
    step in turn, T (the fit's steps) counts all of theirs and a tensor moves only in its own
    optimizer's, so its η per step of T is its optimizer's η times that share (eq. stepshare;
    session 61: two optimizers stepped once a batch each, every tensor's ηT read twice over).
    """
    num = den = 0.0
    for optimizer in optimizers:
        part = 1.0 if share is None else share(optimizer)
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
                num, den = num + n * part, den + d
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

    def moved(self) -> float:
        """⟨w_before − w_after, g⟩ after the update (0 without gradients)."""
        return self.before - self._dot() if self.params else 0.0

    def step_size(self) -> float | None:
        """η̂ after the update (None without gradients, or a non-positive measurement)."""
        if not self.params or self.grad_sq <= 0:
            return None
        eta = self.moved() / self.grad_sq
        return eta if math.isfinite(eta) and eta > 0 else None


class PooledStepSizeProbe:
    """η̂ of several updates, each made by another optimizer on its own tensors (manual
    optimisation with one optimizer per layer):

        η̂ = Σ_o share_o ⟨w_o,before − w_o,after, g_o⟩ / Σ_o ‖g_o‖²,

    each optimizer's part measured over its own step (:meth:`open` before it, :meth:`close`
    right after it, by a :class:`StepSizeProbe` on the tensors it steps), so that another
    optimizer's update or a later backward into its gradients does not enter it. One optimizer
    gives :class:`StepSizeProbe`'s η̂; several, the ‖g‖²-weighted mean of theirs, as one
    optimizer whose parameter groups held their tensors at their step sizes would (SGD with
    learning rates lr_o: Σ_o lr_o ‖g_o‖² / Σ_o ‖g_o‖²), each times its optimizer's share of the
    steps R counts (eq. stepshare: η per step of R, as :func:`effective_step_size` reads it;
    ``share`` of :meth:`step_size`, None: 1).
    """

    def __init__(self) -> None:
        #: per optimizer (the key :meth:`open` was given): [moved, ‖g‖²] of its updates closed
        self.parts: dict[Any, list[float]] = {}
        self._open: tuple[Any, StepSizeProbe] | None = None

    @property
    def moved(self) -> float:
        return sum(m for m, _ in self.parts.values())

    @property
    def grad_sq(self) -> float:
        return sum(g for _, g in self.parts.values())

    def open(self, params: list[torch.Tensor], optimizer: Any = None) -> None:
        """Start measuring the update ``optimizer`` is about to make to ``params`` (their
        gradients final). A probe opened and not closed (an LBFGS step evaluating its closure
        again) is replaced: the update follows the last evaluation."""
        self._open = (optimizer, StepSizeProbe(params))

    def close(self) -> None:
        """The update opened last has been made: add its part."""
        opened, self._open = self._open, None
        if opened is not None and opened[1].params:
            part = self.parts.setdefault(opened[0], [0.0, 0.0])
            part[0] += opened[1].moved()
            part[1] += opened[1].grad_sq

    def step_size(self, share: Callable[[Any], float] | None = None) -> float | None:
        """η̂ of the updates closed so far, per step of R with each optimizer's ``share`` of
        them (None: 1; eq. stepshare); None without gradients, or a non-positive
        measurement."""
        grad_sq = self.grad_sq
        if grad_sq <= 0:
            return None
        moved = sum(m * (1.0 if share is None else share(o)) for o, (m, _) in self.parts.items())
        eta = moved / grad_sq
        return eta if math.isfinite(eta) and eta > 0 else None


def horizon_filters(h: torch.Tensor, step_size: float, steps: float) -> torch.Tensor:
    """Σ_T(h) of eq. horizon for a tensor of eigenvalues h of the Hessian, where the training's
    T steps of step η are stable along h (0 < ηh < 2); ηT along h ≤ 0 (negative curvature read
    as flat: the linearised training is not followed into exponential growth) and 1/h where
    ηh ≥ 2. T = ∞ (unknown): the implicit 1/h."""
    if math.isinf(steps):
        return 1.0 / h
    if steps <= 0:  # nothing left to act on: the hypergradient is ∇₂E alone
        return torch.zeros_like(h)
    x = step_size * h
    stable = (x > 0) & (x < 2)
    safe_h = torch.where(stable, h, torch.ones_like(h))
    safe_x = torch.where(stable, x, torch.zeros_like(x))
    # (1 − (1 − ηh)^T)/h: by log1p/expm1 for ηh ≤ 1 (no cancellation at small ηh), by the power
    # of a negative base 1 − ηh ∈ (−1, 0) above (T is a whole number of steps)
    below = -torch.expm1(steps * torch.log1p(-safe_x.clamp(max=1.0)))
    above = 1.0 - (1.0 - safe_x.clamp(min=1.0)).pow(steps)
    sigma = torch.where(safe_x <= 1.0, below, above) / safe_h
    flat = torch.full_like(h, step_size * steps)
    return torch.where(stable, sigma, torch.where(x <= 0, flat, 1.0 / h))


@dataclass
class HorizonSolver(AdjointSolver):
    """The adjoint solve of the remaining training: v = Σ_T(H)∇₁E/α by Lanczos (eq. horizonsolve).

    The damped system A v = ∇₁E with A = α(∇²₁₁ℓ + δI) has the implicit solution A⁻¹∇₁E, the
    derivative at a fixed point the training never reaches. The T remaining steps of step size η
    (linearised at w_t) reach only

        v_T = Σ_T(A/α) ∇₁E / α,      Σ_T(h) = (1 − (1 − ηh)^T) / h               (eq. horizonsolve)

    so the hypergradient ∇₂E − α∇²₂₁ℓ v_T is eq. horizon's: dE(w_{t+T})/dλ through the remaining
    steps (:func:`horizon_filters`: ηT along flat and negative curvature, 1/h along sharp). v_T
    is computed by ``iters`` Lanczos steps on A from ∇₁E (the Krylov approximation of a matrix
    function, f(A)g ≈ ‖g‖ Q_m f(T_m) e₁), on ``batches`` minibatches drawn once per solve
    (``"full"`` / ``"epoch"``: the full training batch, or one pass joined ``chunk`` minibatches
    at a time, as :class:`~hypertorch_sid.core.solvers.ConjugateGradient`). No
    fixed point is iterated to: a k-step warm-started fixed-point iteration reaches only about
    k·α of the look-ahead ηT along the flat directions (3 steps of α ≈ 0.2–0.7 per hyper step on
    the digits MLP, against ηT = 200), so its hypergradient is short-sighted whatever the damping
    says. Use ``damping=NoDamping()`` (and positive semi-definite curvature, ``hvp=GaussNewton``,
    where λ̂_min < 0) for the pure horizon: a damping δ shifts h.

    T and η come from :meth:`observe` (the Lightning callback: the steps left in the fit, and η
    from the optimizers, :func:`effective_step_size`), else from ``steps`` / ``step_size``;
    ``fraction`` looks ahead over that share of them (1: the whole remaining training);
    where neither is known T = ∞ (the implicit solution, which needs A positive definite).

    Memory: ``iters`` vectors the size of w (the Lanczos basis). The reported residual is the
    Lanczos truncation's, β_m·|e_mᵀ y| (y the coefficients of v in the basis).
    """

    batches: int | str = 2
    iters: int = 10
    step_size: float | None = None
    steps: int | None = None
    fraction: float = 1.0
    chunk: int = 8
    remaining_steps: int | None = field(default=None, init=False)
    observed_step_size: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.batches not in ("full", "epoch"):
            self.batches = check_integer("HorizonSolver.batches", self.batches, 1)
        self.chunk = check_integer("HorizonSolver.chunk", self.chunk, 1)
        self.iters = check_integer("HorizonSolver.iters", self.iters, 1)
        self.steps = check_integer("HorizonSolver.steps", self.steps, 0, True)
        if self.step_size is not None:
            check_positive("HorizonSolver.step_size", self.step_size)
        check_positive("HorizonSolver.fraction", self.fraction)

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        """The training's steps still to run and its step size η (as :class:`HorizonDamping`)."""
        self.remaining_steps = None if remaining_steps is None else max(int(remaining_steps), 0)
        if step_size is not None and math.isfinite(step_size) and step_size > 0:
            self.observed_step_size = float(step_size)

    def _alpha(self, phi: Any) -> float:
        alpha = phi.gradient_step_size() if phi.symmetric else None
        if alpha is None:
            raise ConfigurationError(
                "HorizonSolver needs the gradient-descent map (a symmetric adjoint system "
                f"α(∇²₁₁ℓ + δI)); {type(phi).__name__} is not. Use FixedPointIteration()."
            )
        return float(alpha)

    def _steps_and_eta(self) -> tuple[float, float]:
        steps = self.remaining_steps if self.remaining_steps is not None else self.steps
        eta = self.step_size if self.step_size is not None else self.observed_step_size
        if steps is None or eta is None:
            return math.inf, math.nan
        return float(max(round(self.fraction * steps), 0)), eta

    def _operator_batches(self, ctx: SolveContext) -> list[Any]:
        """The batches whose mean product is A for this solve."""
        if self.batches in ("full", "epoch"):
            kind = str(self.batches)
            return _anchor_batches(kind, ctx.batches, ctx.full_batch, self.chunk, "HorizonSolver")
        return ctx.batches.take(int(self.batches))

    def solve(
        self, ctx: SolveContext, grad_w_E: Sequence[Tensor], v0: Sequence[Tensor]
    ) -> tuple[Tensors, SolveResult]:
        alpha = self._alpha(ctx.phi)
        steps, eta = self._steps_and_eta()
        A = sampled_operator(ctx.phi, self._operator_batches(ctx), ctx.cost)
        g_norm = norm(grad_w_E)
        if g_norm == 0.0:
            return [torch.zeros_like(g) for g in grad_w_E], SolveResult(0, 0.0, 0.0, math.nan)
        basis: list[Tensors] = []
        q = [x.detach() / g_norm for x in grad_w_E]
        alphas, betas = lanczos(A, q, self.iters, basis=basis)
        m = len(alphas)
        theta, S = ritz_pairs(alphas, betas)
        if math.isinf(steps) and float(theta[0]) <= 0:
            raise DivergenceError(
                "adjoint solve v_k (horizon)",
                m,
                g_norm,
                f"the system has a non-positive eigenvalue {float(theta[0]):.3g} and no horizon "
                "(the training's remaining steps and step size are unknown): pass steps= and "
                "step_size= to HorizonSolver, or damp the system (damping=CurvatureDamping()).",
            )
        f = horizon_filters(theta / alpha, eta, steps) / alpha
        y = S @ (f * S[0, :]) * g_norm
        v = [torch.zeros_like(g) for g in grad_w_E]
        with torch.no_grad():
            for coefficient, q in zip(y.tolist(), basis):
                for vi, qi in zip(v, q):
                    vi.add_(qi, alpha=coefficient)
        residual = abs(betas[-1] * float(y[-1])) if math.isfinite(betas[-1]) else math.inf
        return v, SolveResult(m, g_norm, residual, math.nan)

    def step_budget(self, ctx: SolveContext) -> float:
        """‖v‖ ≤ ηT/α·‖∇₁E‖ (Σ_T ≤ ηT): the guard's budget."""
        steps, eta = self._steps_and_eta()
        return math.inf if math.isinf(steps) else eta * steps / self._alpha(ctx.phi)


@dataclass
class StepReads:
    """What a look-ahead may read at the hyper step, each only if it asks (the hyper step of
    :class:`~hypertorch_sid.core.optimizer.SIDHyperOptimizer` passes them)."""

    #: ``train_gradient(n, curvature)``: the mean ∇₁ℓ̂(w_t) over n fresh training minibatches
    #: and, with ``curvature``, its Rayleigh quotient ⟨g, Hg⟩/⟨g, g⟩ (else None)
    train_gradient: Callable[[int, bool], tuple[Tensors, float | None]]
    #: ``validation_product(u)``: ∇²₁₁E(w_t)·u on the hyper step's validation batch
    validation_product: Callable[[Sequence[Tensor]], Tensors] | None = None
    #: ``train_product(u)``: H·u on the training minibatch ``train_gradient`` read first
    train_product: Callable[[Sequence[Tensor]], Tensors] | None = None
    #: the weights w_t
    weights: Sequence[Tensor] | None = None


class LookAhead:
    """Which validation gradient the adjoint system α(∇²₁₁ℓ̂ + δI)v = ∇₁E is solved for: *where*
    the hypergradient looks at E (the damping and the adjoint solver set *how far* along the
    training it looks). The hyper step calls :meth:`target` with ∇₁E(w_t) and what the strategy
    may read (:class:`StepReads`: ∇₁ℓ̂(w_t) on fresh training minibatches, Hessian–vector
    products of ℓ̂ and E, the weights; each read only if it asks); :meth:`observe` gets the
    training's remaining steps T and step size η, :meth:`start` the weights it starts from."""

    #: training minibatches the strategy reads per hyper step (the compute budget plans them)
    train_batches: int = 0

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        """The training's steps still to run and its step size η (unused here)."""

    def start(self, weights: Sequence[Tensor]) -> None:
        """The weights the training starts from (the hyper-optimizer's construction; unused
        here)."""

    def target(self, grad_w_E: Sequence[Tensor], reads: StepReads) -> Tensors:
        """The right-hand side of the adjoint system (here ∇₁E(w_t) itself)."""
        return [g.detach() for g in grad_w_E]


class CurrentWeights(LookAhead):
    """∇₁E(w_t): the validation gradient at the current weights (the default; eq. hypergrad)."""

    def __repr__(self) -> str:
        return "CurrentWeights()"


@dataclass
class TrainedWeights(LookAhead):
    """∇₁E at the weights the training will reach, not at the current (underfit) ones.

    Linearised at w_t, the T remaining gradient steps of step size η on ℓ̂ (Hessian H) move the
    weights by −Σ_T(H)∇₁ℓ̂(w_t) (eq. horizon) and so the validation gradient to

        ∇₁E(w_{t+T}) = ∇₁E(w_t) − H_E Σ_T(H) ∇₁ℓ̂(w_t)
                     = ∇₁E(w_t) − (I − (I − ηH)^T) ∇₁ℓ̂(w_t)      (H_E = H)   (eq. trainedgrad)

    where the validation loss has the training loss's curvature (both are the expected loss's,
    up to sampling). The part of the validation gradient that the training shares with its own
    gradient — the fit it is still making — is what the remaining steps remove; what is left is
    the *gap* between the two (plus λw through ℓ̂), the direction the training will not fix. A
    hypergradient from ∇₁E(w_t) answers "does more decay lower E now?", which while a network
    still fits is no (decay slows the fit), and so pushes λ down for the first 30–50 % of a
    training whose late, overfitting weights want more decay; from eq. trainedgrad it answers
    for the trained weights.

    The filter I − (I − ηH)^T is taken along the curvature of ∇₁ℓ̂ itself,
    h_g = ⟨g, Hg⟩/⟨g, g⟩ (``filter="rayleigh"``: one Hessian–vector product; 1 − (1 − ηh_g)^T,
    clipped to [0, 1]; 0 with no step left, T = 0: the current weights are the trained ones; 1
    before T and η are known), or as 1 (``filter="converged"``: the training converges along
    every direction its gradient has, T ≫ 1/(ηh); no product, and no dependence on the
    training's length, so a fit resumed to a longer one repeats a straight one).

    Parameters
    ----------
    batches: training minibatches whose mean ∇₁ℓ̂ is subtracted (fresh draws; as many as the
        validation gradient's batches keeps the two equally noisy).
    filter: ``"converged"`` or ``"rayleigh"`` (see above).
    """

    batches: int = 1
    filter: str = "converged"
    remaining_steps: int | None = field(default=None, init=False)
    step_size: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.batches = check_integer("TrainedWeights.batches", self.batches, 1)
        if self.filter not in ("converged", "rayleigh"):
            raise ConfigurationError(
                f"TrainedWeights(filter={self.filter!r}): use 'converged' (I − (I − ηH)^T ≈ I) "
                "or 'rayleigh' (along the Rayleigh quotient of ∇₁ℓ̂, one product)."
            )

    @property
    def train_batches(self) -> int:  # type: ignore[override]
        return self.batches

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        self.remaining_steps = None if remaining_steps is None else max(int(remaining_steps), 0)
        if step_size is not None and math.isfinite(step_size) and step_size > 0:
            self.step_size = float(step_size)

    def shrink(self, h: float | None) -> float:
        """The filter 1 − (1 − ηh)^T of eq. trainedgrad along a curvature h (always 1 for
        ``filter="converged"``; for ``"rayleigh"`` 1 while T or η is unknown, 0 with no step
        left)."""
        steps, eta = self.remaining_steps, self.step_size
        if self.filter == "converged" or steps is None or eta is None:
            return 1.0
        if steps == 0:
            return 0.0
        if h is None:
            return 1.0
        x = eta * h
        if x <= 0:
            return 0.0  # flat or negative curvature: the training does not remove it
        if x >= 1:
            return 1.0
        return float(-math.expm1(steps * math.log1p(-x)))

    def target(self, grad_w_E: Sequence[Tensor], reads: StepReads) -> Tensors:
        """∇₁E(w_t) − c ∇₁ℓ̂(w_t) (eq. trainedgrad, c the filter; ∇₁ℓ̂ and its Rayleigh
        quotient h_g from ``reads.train_gradient``)."""
        g, h = reads.train_gradient(self.batches, self.filter == "rayleigh")
        c = self.shrink(h)
        return [e.detach() - c * gi for e, gi in zip(grad_w_E, g)]


@dataclass
class ValidationCurvature(TrainedWeights):
    """∇₁E at the weights the training will reach, moved there by the *validation* curvature:
    the validation loss E itself after the training, not the gap E − ℓ̂ that
    :class:`TrainedWeights` follows.

    Linearised at w_t, the T remaining steps move the weights by Δw = −Σ_T(H)g, g = ∇₁ℓ̂(w_t)
    (eq. horizon, H the training Hessian), and the validation gradient by H_E Δw, H_E = ∇²₁₁E:

        ∇₁E(w_{t+T}) ≈ ∇₁E(w_t) − H_E Σ_T(H) g,   Σ_T(h) = (1 − (1 − ηh)^T)/h    (eq. valcurvgrad)

    Σ_T(H)g is read from ``iters`` Lanczos steps on H from g (the Krylov approximation of a
    matrix function, ‖g‖ Q_m Σ_T(T_m) e₁; ``iters=1``: along g's Rayleigh quotient h_g =
    ⟨g, Hg⟩/⟨g, g⟩, Σ_T(h_g)·g), H_E times it by one Hessian–vector product of E on the hyper
    step's validation batch. Where E has ℓ̂'s curvature (H_E = H) it is eq. trainedgrad, (I − (I −
    ηH)^T)g removed; where the training moves the weights along directions E curves along less
    (memorising) it removes less, and where it moves them far along directions ℓ̂ is nearly
    flat but E is not, more — decay's case.

    Per Ritz value θ the filter is :meth:`TrainedWeights.shrink`(θ)/θ: 1/θ while T or η is
    unknown and where ηθ ≥ 1, 0 with no step left or where θ ≤ 0 (the linearisation is not
    followed into negative curvature). Per hyper step: ``batches`` training gradients, ``iters``
    training and one validation Hessian–vector products (none with no step left).
    """

    filter: str = "rayleigh"
    iters: int = 4

    def __post_init__(self) -> None:
        self.batches = check_integer("ValidationCurvature.batches", self.batches, 1)
        self.iters = check_integer("ValidationCurvature.iters", self.iters, 1)
        if self.filter != "rayleigh":
            raise ConfigurationError(
                f"ValidationCurvature(filter={self.filter!r}): it always filters along the "
                "Lanczos Ritz values of H (leave filter out); TrainedWeights() has the "
                "'converged' filter."
            )

    def displacement(self, g: Sequence[Tensor], train_product: Any) -> Tensors:
        """Σ_T(H)g of eq. valcurvgrad by ``iters`` Lanczos steps on H from g."""
        g_norm = norm(g)
        if g_norm == 0.0:
            return [torch.zeros_like(x) for x in g]
        basis: list[Tensors] = []
        alphas, betas = lanczos(train_product, [x / g_norm for x in g], self.iters, basis=basis)
        theta, S = ritz_pairs(alphas, betas)
        f = torch.tensor(
            [self.shrink(t) / t if t > 0 else 0.0 for t in theta.tolist()], dtype=S.dtype
        )
        y = S @ (f * S[0, :]) * g_norm
        out = [torch.zeros_like(x) for x in g]
        for coefficient, q in zip(y.tolist(), basis):
            for o, qi in zip(out, q):
                o.add_(qi, alpha=coefficient)
        return out

    def target(self, grad_w_E: Sequence[Tensor], reads: StepReads) -> Tensors:
        """∇₁E(w_t) − H_E Σ_T(H) g (eq. valcurvgrad; H from ``reads.train_product`` on the
        training batch of g, H_E from ``reads.validation_product`` on the validation batch)."""
        if reads.validation_product is None or reads.train_product is None:
            raise ConfigurationError(
                "ValidationCurvature needs the training and validation curvature "
                "(train_product and validation_product functions); the hyper step of "
                "SIDHyperOptimizer passes them."
            )
        g, _ = reads.train_gradient(self.batches, False)
        if self.remaining_steps == 0:
            return [e.detach() for e in grad_w_E]  # no step left: the current weights
        moved = self.displacement(g, reads.train_product)
        if norm(moved) == 0.0:
            return [e.detach() for e in grad_w_E]
        return [e.detach() - x for e, x in zip(grad_w_E, reads.validation_product(moved))]

    def __repr__(self) -> str:
        return f"ValidationCurvature(batches={self.batches}, iters={self.iters})"


@dataclass
class TrajectoryWeights(TrainedWeights):
    """Eq. trainedgrad with its filter read along the path the training actually takes.

    The T remaining steps remove the share 1 − (1 − ηh)^T of ∇₁ℓ̂ along a curvature h. Where the
    training converges (ηhT ≫ 1) the whole g = ∇₁ℓ̂(w_t) goes (:class:`TrainedWeights`); where it
    still moves along flat directions at the end of the fit (underfit: ηhT ≲ 1) it removes only
    that share, and ∇₁E at the trained weights stays close to ∇₁E(w_t). The curvature that
    decides is the one along the weights' own recent movement d = w_t − w_{t−k} (since the last
    hyper step, the optimizer's momentum and preconditioning included), not along g (whose
    Rayleigh quotient is dominated by the sharp directions the training has already settled):

        ∇₁E(w_{t+T}) ≈ ∇₁E(w_t) − (1 − (1 − η|h_d|)^T)·g,   h_d = ⟨d, Hd⟩/⟨d, d⟩  (eq. pathgrad)

    (:meth:`TrainedWeights.shrink`: 1 where η|h_d| ≥ 1, 0 with no step left). Along negative
    curvature (the first steps away from the initial weights, a saddle: h_d < 0 there on 3 of 4
    seeds of the digits recipe and 3 of 3 of the 20 Newsgroups one) the linearised training does
    not converge but
    leaves it; |h_d| still sets the time scale 1/(η|h_d|) of that movement against the T steps
    left: short on the digits MLP (η|h_d|T ≈ 5–10), long on the 20 Newsgroups MLP (≈ 0.02–0.1),
    whose 12-epoch training is still fitting when it ends. The first hyper step's path starts at
    the weights the hyper-optimizer was built with (:meth:`start`; the Lightning callback builds
    it as the training starts); without them it keeps ∇₁E(w_t). Per hyper step: ``batches``
    training gradients and one Hessian–vector product; memory: one copy of the weights.

    Measured (docs/weight_decay_budget.md, ``look_ahead_candidates.md``): on the 20 Newsgroups
    recipe it is the default's equal where :class:`TrainedWeights` was 0.11–0.16 worse; on the
    main job's recipe it keeps only part of TrainedWeights' gain. An option.
    """

    filter: str = "rayleigh"
    #: the weights at the last hyper step, and the filter and h_d used at this one
    previous: Tensors | None = field(default=None, init=False, repr=False)
    last_filter: float | None = field(default=None, init=False)
    last_curvature: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.batches = check_integer("TrajectoryWeights.batches", self.batches, 1)
        if self.filter != "rayleigh":
            raise ConfigurationError(
                f"TrajectoryWeights(filter={self.filter!r}): its filter is always read along "
                "the weights' movement (leave filter out)."
            )

    def start(self, weights: Sequence[Tensor]) -> None:
        """The training's first weights: the first hyper step's path starts there."""
        self.previous = [w.detach().clone() for w in weights]

    def target(self, grad_w_E: Sequence[Tensor], reads: StepReads) -> Tensors:
        """∇₁E(w_t) − (1 − (1 − ηh_d)^T)·∇₁ℓ̂(w_t) (eq. pathgrad)."""
        weights, train_product = reads.weights, reads.train_product
        if weights is None or train_product is None:
            raise ConfigurationError(
                "TrajectoryWeights needs the weights and the training curvature (weights and "
                "train_product); the hyper step of SIDHyperOptimizer passes them."
            )
        previous, self.previous = self.previous, [w.detach().clone() for w in weights]
        if previous is None or self.remaining_steps == 0:
            self.last_filter = 0.0
            return [e.detach() for e in grad_w_E]
        g, _ = reads.train_gradient(self.batches, False)
        d = [w.detach() - p for w, p in zip(weights, previous)]
        dd = sum(float(x.double().pow(2).sum()) for x in d)
        if dd == 0.0:  # the same weights again (a retried hyper step): the filter it read
            c = self.last_filter or 0.0
            return [e.detach() - c * x for e, x in zip(grad_w_E, g)]
        hd = train_product(d)
        h = sum(float((x.double() * y.double()).sum()) for x, y in zip(d, hd)) / dd
        self.last_curvature, self.last_filter = h, self.shrink(abs(h))
        return [e.detach() - self.last_filter * x for e, x in zip(grad_w_E, g)]
