"""Never a silent wrong answer: what is watched while Algorithm 1 runs, and what is checked once.

The paper's guarantees rest on assumptions (a contraction Φ̂, solves long enough to approach w(λ)
and v(λ), a feasible λ) that the first checks can test only where they look: one minibatch, the
starting w. These helpers watch them where they can fail, for the price of a few scalar
operations per solver step:

* :class:`ResidualWatch` — every residual ‖T̂(x) − x‖ of a solve: a residual that grows 100× past
  the first ones, or grows steadily (≥ 80 % of steps, 2× overall), is a map that is not a
  contraction on these batches (eq. inneralgo needs ‖∂₁Φ̂‖ < 1 on average; one minibatch checked
  at the start cannot say so), so the hyper step raises :class:`DivergenceError` and λ is not
  written. At the end of a solve it says whether the solve visibly has not converged: its steps
  still point one way (‖Σ δ_t‖ ≥ ½ Σ ‖δ_t‖, a drift rather than minibatch noise) and its residual
  did not halve (:class:`ConvergenceWarning`, naming the setting);
* :func:`check_loaded_constants` — α, L, μ, q, δ of a loaded state, validated like given ones and
  against each other (q must be the contraction factor α gives on [μ + δ, L + δ]);
* :func:`warn_if_lambda_stuck` — an outer step that left λ bitwise unchanged although ∇̂f ≠ 0
  (Adam's ε above the hypergradient, λ₀ = 1e-30 on log λ);
* :func:`check_initial_projection`, :func:`check_map_output`, :func:`check_full_batch`,
  :func:`check_penalty_not_in_loss` — inputs that contradict each other or the solve;
* :class:`Buffers` — the buffers (BatchNorm statistics) of modules the losses call when no
  ``module=`` was given, restored after each hyper step.

What cannot be checked is said in ``docs/failures.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigurationError, ConvergenceWarning, DivergenceError

Tensors = list[Tensor]

#: a residual this many times the first two of its solve: expansion, not noise (a warm-started
#: stochastic solve starts at its noise floor, from which one minibatch rose 11-13x on convex
#: ridge and a damped network; geometric expansion is also caught by the steady-growth rule)
GROWTH = 100.0
#: steady growth: this fraction of steps increased the residual, and it ended 2× the first
STEADY, STEADY_GROWTH, STEADY_MIN_STEPS = 0.8, 2.0, 6
#: not converged: the steps' directions agree this much (‖Σδ‖/Σ‖δ‖) and, at the rate the
#: residual fell, at least this fraction of the distance moved is left to go
DRIFT, NOT_HALVED = 0.5, 0.5


def _norm(xs: Sequence[Tensor]) -> float:
    """‖(x₁, …, xₖ)‖ in float64: each tensor's norm on its device, all read in one wait for
    it (a launch-bound GPU pays for each), combined on the host."""
    if not xs:
        return 0.0
    with torch.no_grad():
        norms = [torch.linalg.vector_norm(x.double()) for x in xs]
    if len({n.device for n in norms}) == 1:
        values = torch.stack(norms).tolist()
    else:
        values = [float(n) for n in norms]
    return math.sqrt(sum(n**2 for n in values))


class ResidualWatch:
    """Watches the residuals δ_t = T̂(x_t) − x_t of one solve (see the module docstring).

    :meth:`see` is called with each step's residual norm (and, to measure drift, the residual
    itself); :meth:`converged` at the end says whether the solve visibly converged.
    """

    def __init__(self, quantity: str, hint: str, growth: bool = True) -> None:
        self.quantity, self.hint, self.growth = quantity, hint, growth
        self.first: list[float] = []
        self.steps = 0
        self.rises = 0
        self.previous = math.nan
        self.last = math.nan
        self.sum: Tensors | None = None
        self.lengths = 0.0

    def see(self, step: int, residual: float, delta: Sequence[Tensor] | None = None) -> None:
        """One step's residual ‖δ_t‖; raises :class:`DivergenceError` on growth."""
        if not math.isfinite(residual):
            return  # the divergence monitor names non-finite values
        self.steps += 1
        if len(self.first) < 2:
            self.first.append(residual)
        elif self.growth and residual > GROWTH * max(self.first) and residual > 1e-8:
            raise DivergenceError(
                self.quantity,
                step,
                residual,
                f"The residual grew {residual / max(max(self.first), 1e-300):.3g}× within the "
                f"solve (from {max(self.first):.3g}): the map is not a contraction on these "
                f"batches, although it may have been where it was checked. {self.hint}",
            )
        if residual > self.previous:
            self.rises += 1
        self.previous = self.last = residual
        if delta is not None:
            if self.sum is None:
                self.sum = [d.detach().clone() for d in delta]
            else:
                for s, d in zip(self.sum, delta):
                    s.add_(d)
            self.lengths += residual

    def finish(self) -> None:
        """At the end of the solve: raise on steady growth."""
        n = self.steps
        if n < STEADY_MIN_STEPS or not self.first or not self.growth:
            return
        if self.rises >= STEADY * (n - 1) and self.last > STEADY_GROWTH * self.first[0] > 0:
            raise DivergenceError(
                self.quantity,
                n - 1,
                self.last,
                f"The residual grew steadily within the solve (in {self.rises} of {n - 1} steps, "
                f"from {self.first[0]:.3g} to {self.last:.3g}): the map expands on these "
                f"batches, although it may have contracted where it was checked. {self.hint}",
            )

    def drift(self) -> float:
        """‖Σ δ_t‖ / Σ ‖δ_t‖: 1 when every step pushed the same way, ~1/√k for noise."""
        if self.sum is None or self.lengths <= 0:
            return 0.0
        return _norm(self.sum) / self.lengths

    def remaining(self) -> float:
        """The distance still to go relative to the distance moved, for a linearly converging
        iteration: rate ρ = (r_last/r_first)^(1/(n−1)) per step, so Σ_{s>n} r_s ≈ r_last/(1−ρ),
        against ‖Σ δ_t‖ moved (both in units of the step size)."""
        moved = self.drift() * self.lengths
        if moved <= 0 or self.first[0] <= 0:
            return 0.0
        rate = (self.last / self.first[0]) ** (1.0 / max(self.steps - 1, 1))
        return self.last / max(1.0 - rate, 1e-12) / moved

    def converged(self, floor: float = 0.0) -> bool:
        """False when the solve visibly has not converged: its steps drift one way (not
        minibatch noise) and, at the rate its residual fell, at least half as far again is left
        to go as it moved. A residual at the rounding floor (``floor``: a few ulps of ‖x‖) is
        converged, however its rounding errors line up."""
        if self.steps < 2 or not self.first or self.last <= floor:
            return True
        return not (self.drift() >= DRIFT and self.remaining() >= NOT_HALVED)


def rounding_floor(x: Sequence[Tensor]) -> float:
    """A residual this small is rounding: 64 ulps of ‖x‖ in x's precision."""
    if not x:
        return 0.0
    return 64 * torch.finfo(x[0].dtype).eps * _norm(x)


#: a residual that ends within this fraction above where it started did not grow, it stayed
STALLED_RTOL = 0.01


def _apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` to 3 significant digits, or as many more (up to 6) as tell them apart."""
    for digits in range(3, 7):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


def unconverged_message(what: str, watch: ResidualWatch, fix: str, floor: float = 0.0) -> str:
    """What a :class:`ConvergenceWarning` says of a solve :meth:`ResidualWatch.converged`
    denies ("" where it converged). A residual that ended above where it started is said to
    have grown, with the map's cause (``watch.hint``), not ``fix``: a k = 3 adjoint solve of a
    depthwise-separable CNN went "only from 48.4 to 2.18e+03" and was told to raise
    adjoint_steps or its step size (session 48), which would take it further away."""
    if watch.converged(floor):
        return ""
    if watch.last >= watch.first[0]:  # no nearer its answer: more steps do not converge
        first, last = _apart(watch.first[0], watch.last)
        if watch.last > watch.first[0] * (1 + STALLED_RTOL):  # moved away: more go further
            went = f"grew from {first} to {last}"
            where = "solve moving away from its answer"
        else:  # it stayed where it was: "grew from 1.64 to 1.64" (session 49) read as noise
            went = f"did not fall ({first} to {last})"
            where = "solve that stays where it started"
        return (
            f"hypertorch_sid: the {what} has not converged: its residual {went} in "
            f"{watch.steps} steps ({watch.drift():.0%} aligned), so more steps of it, or larger "
            f"ones, would not converge: the hypergradient is that of a {where}. "
            f"{watch.hint} If it recurs, damp the map (damping=CurvatureDamping(margin=2.0)) "
            "or use positive semi-definite curvature (hvp=GaussNewton(...))."
        )
    left = watch.remaining()
    left_text = f"about {left:.2g}×" if left < 100 else "more than 100×"
    return (
        f"hypertorch_sid: the {what} has not converged: its residual went only from "
        f"{watch.first[0]:.3g} to {watch.last:.3g} in {watch.steps} steps while its steps kept "
        f"one direction ({watch.drift():.0%} aligned); at that rate {left_text} the distance "
        f"it moved is left: the hypergradient is that of an unconverged solve. {fix}"
    )


def warn_not_converged(message: str, stacklevel: int = 4) -> None:
    """Warn with ``message`` (from :func:`unconverged_message`), if any."""
    if message:
        warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel)


def check_unsolved_start(phi: Any, batch: Any, w: Sequence[Tensor]) -> None:
    """With no inner steps (t = 0), w must already be near a fixed point: warn when one step of
    the map would move it by more than its own size (w = 0 untrained: an exact zero ∂₂Φ̂ term)."""
    moved = _norm([p.detach() - x.detach() for p, x in zip(phi.value(batch), w)])
    size = _norm(w)
    if moved > size:
        alpha = getattr(phi, "alpha", None)
        step = f" of step α = {alpha:.3g}" if isinstance(alpha, float) else ""
        warnings.warn(
            f"hypertorch_sid: inner_steps=0, but w is far from a fixed point of the map: one step"
            f"{step} would move it by {moved:.3g}, more than its size {size:.3g}. The "
            "hypergradient holds only at w = w(λ) (an untrained w = 0 gives exactly 0 for "
            "ridge). Run inner steps (inner_steps=...), train w first, or under Lightning start "
            "the hyper steps later (start_step=...). Where w is trained and α is large "
            "(α ≈ 2/L, a curvature estimate L near the regulariser's own), the loss has almost "
            "no curvature of its own — a hinge (nn.MultiMarginLoss), an L1 loss, a "
            "piecewise-linear model —: one stochastic gradient step moves w far although it is "
            "trained, and neither later hyper steps nor inner steps change that.",
            ConvergenceWarning,
            stacklevel=4,
        )


def check_loaded_constants(constants: dict[str, Any]) -> None:
    """α, L, μ, q, δ of a loaded state: in range, and consistent with each other.

    Given constants are checked at construction; loaded ones must pass the same checks, and
    since q, α are derived from L, μ, δ (Cor. 4.3), an edited α (1e-9 loaded, giving a result
    2e8× too small) shows as a q that α does not give.
    """
    alpha, L, mu, q = (constants.get(k) for k in ("alpha", "L", "mu", "q"))
    delta = constants.get("delta") or 0.0
    for name, value, low in (("alpha", alpha, 0.0), ("L", L, 0.0)):
        if value is not None and not value > low:
            raise ConfigurationError(
                f"the saved constant {name} = {value!r} must be > 0: the checkpoint is corrupted "
                "or was edited."
            )
    if q is not None and not 0 <= q < 1:
        raise ConfigurationError(
            f"the saved contraction constant q = {q!r} must be in [0, 1): the checkpoint is "
            "corrupted or was edited."
        )
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta >= 0):
        raise ConfigurationError(f"the saved damping delta = {delta!r} must be a number ≥ 0.")
    if mu is not None and L is not None and not mu <= L * (1 + 1e-9):
        raise ConfigurationError(f"the saved constants have mu = {mu!r} > L = {L!r}.")
    if alpha is not None and L is not None and q is not None:
        factor = abs(1 - alpha * (L + delta))  # what α does to the top of the spectrum
        if factor > q + 1e-6:
            raise ConfigurationError(
                f"the saved alpha = {alpha:.6g} does not fit the saved L = {L:.6g} and q = "
                f"{q:.6g}: a step α on curvature L + δ contracts by {factor:.6g}, not by q "
                f"(α(L + δ) = {alpha * (L + delta):.3g}; α = 2/(L + μ) gives q). The checkpoint "
                "is corrupted or was edited."
            )


def warn_if_lambda_stuck(
    before: Sequence[Tensor],
    after: Sequence[Tensor],
    hypergrad: Sequence[Tensor],
    optimizer: torch.optim.Optimizer,
) -> bool:
    """An outer step that left λ bitwise unchanged although ∇̂f ≠ 0: say why. True if stuck."""
    g = _norm(hypergrad)
    if getattr(optimizer, "held_back", False):  # it held λ on purpose (e.g. SignalGatedAdam)
        return False
    if g == 0 or not all(torch.equal(b, a) for b, a in zip(before, after)):
        return False
    eps = [grp.get("eps") for grp in optimizer.param_groups if isinstance(grp.get("eps"), float)]
    why = (
        f"{type(optimizer).__name__}'s eps = {max(eps):.3g} is above the hypergradient, so its "
        "step m/(√v + eps) is ~0. Lower eps (eps=1e-30 or 0 in the optimizer), or start λ where "
        "the hypergradient is not vanishing (on log λ it scales with λ: λ₀ = 1e-30 gives ~1e-31)"
        if eps and max(eps) > g
        else "the step is below the floating-point resolution of λ. Raise the outer learning "
        "rate, or learn log λ from a λ₀ where the hypergradient is not vanishing"
    )
    warnings.warn(
        f"hypertorch_sid: the outer step left λ exactly unchanged although the hypergradient "
        f"is {g:.3g}: {why}.",
        ConvergenceWarning,
        stacklevel=4,
    )
    return True


def check_initial_projection(
    hyperparameters: Sequence[Tensor], project: Callable[[Tensors], Any] | None
) -> None:
    """λ₀ must be a fixed point of the projection P_Λ (else it starts outside Λ, and the first
    solve runs at an infeasible λ: a negative decay made it fail as an 'inner divergence')."""
    if project is None:
        return
    copies = [h.detach().clone() for h in hyperparameters]
    with torch.no_grad():
        project_in_place(project, copies)
    moved = [i for i, (h, c) in enumerate(zip(hyperparameters, copies)) if not torch.equal(h, c)]
    if moved:
        i = moved[0]
        raise ConfigurationError(
            f"the initial hyperparameters are outside the feasible set: the projection moves "
            f"hyperparameter {i} from {_brief(hyperparameters[i])} to {_brief(copies[i])}. "
            "Initialise λ inside it (e.g. a weight decay ≥ 0), or learn an unconstrained "
            "parameterisation such as log λ."
        )


def project_in_place(project: Callable[[Tensors], Any], hyperparameters: Sequence[Tensor]) -> None:
    """``project`` on a copy of the list, checked to have written λ in place: a projection
    that returns the projected values (``hs[0].clamp(min=0)``) or rebinds them
    (``hs[0] = ...``) left λ where the step put it (a negative decay, silently; a rebinding
    swapped in a tensor without grad: "no longer require grad"), session 53."""
    given = list(hyperparameters)
    out = project(given)
    returned = [out] if isinstance(out, Tensor) else out
    rebound = len(given) != len(hyperparameters) or any(
        a is not b for a, b in zip(given, hyperparameters)
    )
    apart = isinstance(returned, (list, tuple)) and any(
        isinstance(r, Tensor)
        and r is not h
        and (r.shape != h.shape or not torch.equal(r.to(h.dtype), h))
        for r, h in zip(returned, hyperparameters)
    )
    if rebound or apart:
        how = "replaced items of the list" if rebound else "returned new values"
        raise ConfigurationError(
            f"FeasibleSet.project {how} instead of writing λ in place, so λ stayed where the "
            "outer step put it (outside the set). Write into the tensors with in-place "
            "operations, e.g. project=lambda hs: hs[0].clamp_(min=0), or hs[i].copy_(value)."
        )


def _brief(x: Tensor) -> str:
    x = x.detach()
    if x.numel() == 1:
        return f"{float(x):.4g}"
    return f"[{float(x.min()):.4g}, {float(x.max()):.4g}]"


def check_map_output(outputs: Any, where: str) -> None:
    """Φ̂(w) must be differentiable in w: a map computed under ``torch.no_grad()`` (or from
    detached tensors) returns values that do not require grad, and autograd's bare error would
    come from inside the adjoint solve."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if not all(isinstance(o, Tensor) for o in outputs):
        raise ConfigurationError(f"{where} must return a list of tensors shaped like w.")
    if not any(o.requires_grad for o in outputs):
        raise ConfigurationError(
            f"{where} returned tensors that do not require grad: it was computed under "
            "torch.no_grad() or from detached tensors, so its Jacobians (the adjoint solve, "
            "∂₂Φ̂ᵀv) cannot be taken. Compute it with autograd enabled, from w and λ themselves."
        )


def check_full_batch(full_batch: Any, source: Any, size: Callable[[Any], int]) -> None:
    """``full_train_batch`` must hold the training set: compared by size with the training
    source's dataset where it has one (a DataLoader)."""
    dataset = getattr(source, "dataset", None)
    try:
        n = len(dataset) if dataset is not None else None  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n is None:
        return
    m = size(full_batch)
    if m != n:
        raise ConfigurationError(
            f"full_train_batch holds {m} samples but the training DataLoader's dataset has {n}: "
            "the deterministic map Φ (full-batch solves, d2_batches='full', the curvature "
            "estimate) would be that of other data than the minibatches. Pass the whole "
            "training set as full_train_batch (e.g. dataset.tensors)."
        )


def check_penalty_not_in_loss(
    data_loss: Callable[[Any], Tensor],
    penalty: Callable[[], Sequence[Tensor]],
    batch: Any,
    inner: Sequence[Tensor],
    hyper: Sequence[Tensor],
) -> None:
    """With ``penalty=`` (the proximal map), ``inner_loss`` must leave the penalty out: where
    ∂ℓ̂/∂λ of ``inner_loss`` equals that of ½Σ⟨c(λ), w²⟩, the penalty is in both (the answer was
    that of a doubled penalty)."""
    saved = [w.detach().clone() for w in inner]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # at w = 0 both are 0: compare at w + u, u random (w restored after)
        for w in inner:
            u = torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w)
            w.add_(u, alpha=max(float(w.detach().abs().max()) if w.numel() else 0.0, 1.0) * 0.1)
    try:
        loss = data_loss(batch)
        if not loss.requires_grad:
            return
        g_loss = torch.autograd.grad(loss, list(hyper), allow_unused=True)
        if all(g is None for g in g_loss):
            return
        c = penalty()
        c = [c] if isinstance(c, Tensor) else list(c)
        reg = 0.5 * sum((ci * w.detach() ** 2).sum() for ci, w in zip(c, inner))
        if not isinstance(reg, Tensor) or not reg.requires_grad:
            return
        g_pen = torch.autograd.grad(reg, list(hyper), allow_unused=True)
    finally:
        with torch.no_grad():
            for w, x in zip(inner, saved):
                w.copy_(x)
    a = [x if x is not None else torch.zeros_like(h) for x, h in zip(g_loss, hyper)]
    b = [x if x is not None else torch.zeros_like(h) for x, h in zip(g_pen, hyper)]
    scale = max(_norm(a), _norm(b))
    if scale > 0 and _norm([x - y for x, y in zip(a, b)]) <= 1e-6 * scale:
        raise ConfigurationError(
            "the penalty is both inside inner_loss and given as penalty=: inner_loss's ∂/∂λ "
            "equals the penalty's ½Σ c(λ) w², so the problem solved would be that of a doubled "
            "penalty. With penalty=, inner_loss is the data term alone; or drop penalty= and "
            "keep the penalty in inner_loss."
        )


class Buffers:
    """Buffers of the modules the losses call (BatchNorm running statistics), found by a
    forward pre-hook during the first checks, restored after each hyper step when no
    ``module=`` was given (with ``module=`` :func:`~hypertorch_sid.core.modes.frozen_mode`
    restores them): ``num_batches_tracked`` went 0 → 13 in one ``hypergradient()``."""

    def __init__(self) -> None:
        self.modules: list[torch.nn.Module] = []
        #: the buffers as they were before the first call of each module (the first checks')
        self.initial: list[tuple[Tensor, Tensor]] = []

    def discover(self, run: Callable[[], Any]) -> Any:
        """Run ``run()``, remembering the modules with buffers it calls (and their buffers
        before the call); returns what ``run`` returns."""
        seen: dict[int, torch.nn.Module] = {}
        initial: list[tuple[Tensor, Tensor]] = []

        def hook(module: torch.nn.Module, args: Any) -> None:
            if id(module) in seen:
                return
            buffers = list(module.buffers(recurse=False))
            if buffers:
                seen[id(module)] = module
                initial.extend((b, b.detach().clone()) for b in buffers)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
        try:
            return run()
        finally:
            handle.remove()
            self.modules, self.initial = list(seen.values()), initial

    def snapshot(self) -> list[tuple[Tensor, Tensor]]:
        """The buffers now (empty before :meth:`discover`)."""
        return [(b, b.detach().clone()) for m in self.modules for b in m.buffers(recurse=False)]

    @staticmethod
    def restore(saved: list[tuple[Tensor, Tensor]]) -> None:
        with torch.no_grad():
            for b, copy in saved:
                b.copy_(copy)
