"""Curvature of ℓ(·, λ): the extreme eigenvalues of ∇²₁₁ℓ by Lanczos, and when to re-estimate.

L = λ_max(∇²₁₁ℓ) and μ = λ_min(∇²₁₁ℓ) set the step α = 2/(L+μ) and the contraction constant
q = (L−μ)/(L+μ) of the GD map (Corollary 4.3), hence β, γ of the decreasing steps (Thm 4.2). On a
non-convex model (a neural network) λ_min < 0 and Φ̂ = w − α∇ℓ̂ is *not* a contraction for any α:
the adjoint system is then damped (:mod:`.damping`) by a shift δ read from the same estimate.

**Lanczos** (:func:`lanczos_extremes`): m steps of the Lanczos recurrence with Hessian–vector
products build the tridiagonal T_m; its extreme eigenvalues
θ_min ≤ θ_max (Ritz values) converge to λ_min and λ_max at a rate set by √κ — far faster than the
power iteration (rate κ) — and both come from the same m products. Ritz values lie *inside* the
spectrum, so θ_max ≤ L and θ_min ≥ λ_min; the residual bound r = |β_m s_m| (s the Ritz vector's last
component) says how far an eigenvalue may be. The estimate reports

* ``L = θ_max + r_max`` — an upper estimate (a safety margin on α),
* ``lambda_min = θ_min`` and its bound ``lambda_min_error = r_min``; ``uncertain`` when
  r_min > |θ_min| (the sign of λ_min is not settled by m steps),
* ``mu = max(θ_min, mu_floor·L)`` — the strong-convexity constant the schedules use.

**Per minibatch, or their mean** (``minibatches=``). A stochastic adjoint step applies *one*
minibatch's Hessian H_ζ, and it contracts only where that H_ζ's spectrum lies in [λ_min, L]; the
mean of B minibatch Hessians is flatter at both ends (λ_max is convex, λ_min concave). With
``"each"`` (an option) the estimate reads the union of the B batches'
spectra, by Lanczos on the block-diagonal diag(H_1, …, H_B) acting on
B stacked copies of w: the same B products per iteration as on their mean (3B vectors of memory).
Measured on the main job (``examples/lightning_digits.py``, ``benchmarks/curvature_trace.py``):
at the refresh at step 320 the mean of 2 batches read L = 0.98 (converged: 40 steps give 0.97),
the whole training set 1.42, single batches of 32 a median 2.0 and up to 3.8; the adjoint solve
at α ≈ 2/L then diverged and Recover's re-estimate and retry took the budget of the last hyper
steps. Per minibatch the refresh reads L = 1.45–3.06; a retry at or after step 290 came in 6 of
36 runs, against 27 of 36 (docs/weight_decay_budget.md, "Session 44"). Not the default: with
no budget the main job's final test loss was worse on 11 of 12 seeds (a larger L, a smaller α,
less progress per adjoint step), the benchmark's settings within noise; and where ℓ draws fresh
randomness at every product, the blocks' Lanczos reads a spurious
negative λ_min (:class:`EstimatedCurvature`).

**Warm-started refreshes** (``EstimatedCurvature(warm_start=True, tol=...)``, an option). The top
and the bottom of the spectrum move slowly between estimates, so a re-estimate (the scheduled
refresh, ``Recover``'s, a guard's) may start Lanczos from the last estimate's extreme Ritz vectors
y_max, y_min (:attr:`CurvatureEstimate.ritz`) instead of a random vector:

    q₁ ∝ y_max + y_min + ρ·√2·r,   r a random unit vector, ρ = 0.1                (eq. lanczoswarm)

(y_min keeps λ_min in the Krylov space; r lets a direction the last estimate missed in), and stop
after the m-th step (m ≥ 2) as soon as both extreme Ritz values are settled to ``tol`` of L̂:

    max(r_max, r_min) ≤ tol · (θ_max + r_max)                                      (eq. lanczosstop)

(r the residual bounds |β_{m+1} s_m| above; θ_max + r_max is the reported L). A refresh then costs
the few products the moved spectrum needs instead of ``iters`` per batch, and the budget spends the
rest on hyper steps. A small residual says θ is near *an* eigenvalue, not that none lies beyond it
(as for a cold start after ``iters`` steps); the random part is what lets a new extreme in. The
vectors are kept only with ``warm_start`` (the Lanczos basis is then held, ``iters`` vectors,
and fully re-orthogonalised); they move with the preconditioner S as v does
(:meth:`CurvatureProbe.set_scale`), and are not checkpointed: after a resume the first estimate is
cold. Only for ``minibatches="mean"`` (the blocks of ``"each"`` are fresh minibatches each time).

Strategies (passed as ``curvature=`` to :class:`~hypertorch_sid.SIDHyperOptimizer`):

* :class:`KnownCurvature` — the user's L, μ;
* :class:`EstimatedCurvature` — Lanczos on ``batches`` minibatches (or the full batch), re-estimated
  every ``every`` hyper steps (the sharpness of a network grows during training), and whenever a
  divergence guard asks for it. Its products are counted in ``cost``.

The strategies decide *when* and *what* to estimate (before the first solve, at w_t, after a
divergence); a :class:`CurvatureProbe` does the reading for them, on the optimizer's data and with
its bookkeeping: the batches an estimate reads, Lanczos in the module's solve mode (averaged
across processes, counted in the cost), and the diagonal P = S² of the GD map from the
preconditioner strategy (a change of S moves the warm-start v into the new coordinates).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .batches import BatchStream, batch_size
from .budget import UNLIMITED, Allowance
from .errors import ConfigurationError
from .modes import frozen_mode
from .validation import check_integer, check_positive, check_real, is_integer

if TYPE_CHECKING:
    from .config import SIDConfig
    from .cost import Cost
    from .maps import GradientDescentMap

log = logging.getLogger("hypertorch_sid")

Tensors = list[Tensor]
MatVec = Callable[[Sequence[Tensor]], Tensors]


@dataclass(frozen=True)
class CurvatureEstimate:
    """L, μ of ℓ(·, λ) at the current w, λ.

    Attributes
    ----------
    L: an upper estimate of λ_max(∇²₁₁ℓ).
    mu: the strong-convexity constant used by the schedules: max(λ_min, mu_floor·L).
    mu_floored: whether μ hit its floor (λ_min ≤ mu_floor·L: barely convex or non-convex).
    iterations: Hessian–vector products per batch used.
    lambda_min: the estimate of λ_min(∇²₁₁ℓ) itself (negative on a non-convex model).
    lambda_min_error: its residual bound (0 when exact or known).
    ritz: the extreme Ritz vectors (y_min, y_max), unit, in the map's coordinates, kept for a
        warm-started re-estimate (eq. lanczoswarm); None where not kept (not asked, not
        estimated, or restored from a checkpoint).
    """

    L: float
    mu: float
    mu_floored: bool
    iterations: int
    lambda_min: float | None = None
    lambda_min_error: float = 0.0
    ritz: tuple[Tensors, Tensors] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.lambda_min is None:
            object.__setattr__(self, "lambda_min", self.mu)

    def union(self, other: CurvatureEstimate) -> CurvatureEstimate:
        """The estimate covering both spectra: L = max, λ_min (with its error) and μ = min.

        Steps set from it are safe for both points: α is no larger, the damping δ no smaller.
        """
        assert self.lambda_min is not None and other.lambda_min is not None
        lowest = self if self.lambda_min <= other.lambda_min else other
        return CurvatureEstimate(
            max(self.L, other.L),
            min(self.mu, other.mu),
            self.mu_floored or other.mu_floored,
            other.iterations,
            lowest.lambda_min,
            lowest.lambda_min_error,
            other.ritz if other.ritz is not None else self.ritz,
        )

    @property
    def convex(self) -> bool:
        """λ_min > 0 by the estimate."""
        assert self.lambda_min is not None
        return self.lambda_min > 0

    @property
    def uncertain(self) -> bool:
        """The sign of λ_min is not settled: its error bound exceeds its size."""
        assert self.lambda_min is not None
        return self.lambda_min_error > abs(self.lambda_min)


def _dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b)))


def _random_unit(like: Sequence[Tensor], seed: int) -> Tensors:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    v = [torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device) for x in like]
    n = math.sqrt(_dot(v, v))
    return [x / n for x in v]


@dataclass(frozen=True)
class LanczosResult:
    """Extreme Ritz values of m Lanczos steps and their residual bounds."""

    theta_min: float
    theta_max: float
    error_min: float
    error_max: float
    steps: int
    #: (y_min, y_max), unit: the extreme Ritz vectors where asked (``vectors=True``), else None
    vectors: tuple[Tensors, Tensors] | None = field(default=None, compare=False, repr=False)


def ritz_pairs(alphas: Sequence[float], betas: Sequence[float]) -> tuple[Tensor, Tensor]:
    """Eigenpairs (θ, S) of the Lanczos tridiagonal T_m = tridiag(β, α, β), in float64: the Ritz
    values θ (ascending) and T_m's eigenvectors S as columns. ``betas`` may hold β_{m+1} last."""
    m = len(alphas)
    T = torch.diag(torch.tensor(list(alphas), dtype=torch.float64))
    if m > 1:
        off = torch.tensor(list(betas[: m - 1]), dtype=torch.float64)
        T += torch.diag(off, 1) + torch.diag(off, -1)
    return torch.linalg.eigh(T)


def lanczos(
    matvec: MatVec,
    q: Sequence[Tensor],
    iters: int,
    more: Callable[[int], bool] | None = None,
    basis: list[Tensors] | None = None,
    converged: Callable[[list[float], list[float]], bool] | None = None,
) -> tuple[list[float], list[float]]:
    """``iters`` steps of the Lanczos recurrence β_{j+1} q_{j+1} = A q_j − α_j q_j − β_j q_{j−1}
    from the unit vector ``q``: T_m's diagonal α_1..α_m and off-diagonal β_2..β_{m+1} (the last,
    β_{m+1}, is the truncation's size). Stops early on an invariant subspace (β ≈ 0: exact).

    ``more(done)``, where given, is asked before every step after the first: False stops there;
    so is ``converged(alphas, betas)`` (after ``more``, on T_m so far): True stops there.
    ``basis``, where given (a list), receives q_1..q_m, and each residual is re-orthogonalised
    against the earlier q (full re-orthogonalisation, for a function of T_m read through the whole
    basis); without it the memory stays at three vectors.
    """
    q_prev = [torch.zeros_like(x) for x in q]
    alphas: list[float] = []
    betas: list[float] = []
    beta = 0.0
    for step in range(iters):
        if step and more is not None and not more(step):
            break
        if step and converged is not None and converged(alphas, betas):
            break
        aq = matvec(q)
        a = _dot(q, aq)
        r = [x - a * qi - beta * qp for x, qi, qp in zip(aq, q, q_prev)]
        for p in basis if basis is not None else ():
            c = _dot(p, r)
            r = [ri - c * pi for ri, pi in zip(r, p)]
        if basis is not None:
            basis.append(q)
        alphas.append(a)
        beta = math.sqrt(max(_dot(r, r), 0.0))
        betas.append(beta)
        if not math.isfinite(beta) or beta <= 1e-12 * max(1.0, abs(a)):
            break
        q_prev, q = q, [x / beta for x in r]
    return alphas, betas


def lanczos_extremes(
    matvec: MatVec,
    like: Sequence[Tensor],
    iters: int,
    seed: int = 0,
    more: Callable[[int], bool] | None = None,
    *,
    start: Sequence[Tensor] | None = None,
    tol: float | None = None,
    vectors: bool = False,
) -> LanczosResult:
    """Extreme eigenvalue estimates of a symmetric operator from ``iters`` Lanczos steps.

    ``more(done)``, where given, is asked before every step after the first: False stops there
    (a compute budget's allowance; the residual bounds then say how far the Ritz values are).
    ``start``: the first Lanczos vector (normalised here; None: a random one from ``seed``).
    ``tol``: stop after m ≥ 2 steps once both ends are settled (eq. lanczosstop); None: all
    ``iters``. ``vectors``: also return the extreme Ritz vectors (the basis is then kept and
    fully re-orthogonalised: ``iters`` vectors of memory).

    :func:`lanczos` without re-orthogonalisation (it does not affect the extreme Ritz values, and
    keeps the memory at three vectors) gives T_m = tridiag(β, α, β); its eigenpairs (θ, s) are the
    Ritz values, with residual ‖A y − θ y‖ = |β_{m+1} s_m|.
    """
    q = _random_unit(like, seed) if start is None else _unit(start)
    basis: list[Tensors] | None = [] if vectors else None
    stop = None if tol is None else functools.partial(_settled, tol=tol)
    alphas, betas = lanczos(matvec, q, iters, more, basis, stop)
    m = len(alphas)
    theta, S = ritz_pairs(alphas, betas)
    tail = abs(betas[-1]) if math.isfinite(betas[-1]) else math.inf
    err = (tail * S[-1, :].abs()).tolist()
    ys = None
    if basis is not None:
        ys = tuple(_combine(basis, S[:, k].tolist()) for k in (0, -1))
    return LanczosResult(float(theta[0]), float(theta[-1]), err[0], err[-1], m, ys)  # type: ignore[arg-type]


def _settled(alphas: list[float], betas: list[float], tol: float) -> bool:
    """Eq. lanczosstop on T_m so far: both extreme residual bounds within ``tol`` of L̂ (m ≥ 2)."""
    if len(alphas) < 2 or not math.isfinite(betas[-1]):
        return False
    theta, S = ritz_pairs(alphas, betas)
    r_min, r_max = (abs(betas[-1] * float(S[-1, k])) for k in (0, -1))
    return max(r_min, r_max) <= tol * (float(theta[-1]) + r_max)


def _unit(v: Sequence[Tensor]) -> Tensors:
    n = math.sqrt(_dot(v, v))
    return [x / n for x in v]


def _combine(basis: Sequence[Sequence[Tensor]], coefficients: Sequence[float]) -> Tensors:
    """Σ_j c_j q_j, normalised: a Ritz vector from the Lanczos basis and T_m's eigenvector."""
    out = [torch.zeros_like(x) for x in basis[0]]
    for c, q in zip(coefficients, basis):
        for o, x in zip(out, q):
            o.add_(x, alpha=c)
    return _unit(out)


def warm_start_vector(ritz: tuple[Tensors, Tensors], seed: int) -> Tensors:
    """q₁ of a warm-started Lanczos run (eq. lanczoswarm): y_max + y_min + ρ√2·r, unit."""
    y_min, y_max = ritz
    r = _random_unit(y_max, seed)
    c = WARM_RANDOM * math.sqrt(2.0)
    return _unit([a + b + c * x for a, b, x in zip(y_max, y_min, r)])


#: ρ of eq. lanczoswarm: the random part of a warm-started Lanczos run's first vector
WARM_RANDOM = 0.1


def estimate_curvature(
    phi: object,
    batches: Sequence[object],
    iters: int = 20,
    mu: float | None = None,
    mu_floor: float = 1e-4,
    seed: int = 0,
    margin: float = 1.0,
    more: Callable[[int], bool] | None = None,
    minibatches: str = "mean",
    *,
    start: Sequence[Tensor] | None = None,
    tol: float | None = None,
    keep_ritz: bool = False,
) -> CurvatureEstimate:
    """Estimate L and λ_min of ℓ at the current w, λ by Lanczos on ``batches``' Hessians: their
    mean's, or (``minibatches="each"``) the ends of the union of their spectra (module docstring).

    Parameters
    ----------
    phi: a map with ``hessian_vector_product(batch, v)`` and ``inner_parameters`` (the GD map).
    batches: minibatches whose Hessians stand for those of ℓ̂'s minibatches.
    iters: Lanczos steps (Hessian–vector products per batch).
    mu: a known μ (e.g. the smallest weight decay); then λ_min is not estimated.
    mu_floor: μ is at least ``mu_floor × L``.
    margin: L is ``margin`` × the upper estimate θ_max + r (:class:`EstimatedCurvature`).
    more: asked before each Lanczos step after the first (:func:`lanczos_extremes`).
    minibatches: ``"each"``: the union of the batches' spectra; ``"mean"``: their mean Hessian's.
    start, tol: Lanczos' first vector (None: random) and its stopping rule (eq. lanczosstop;
        None: ``iters`` steps), :func:`lanczos_extremes`.
    keep_ritz: keep the extreme Ritz vectors in the estimate (:attr:`CurvatureEstimate.ritz`).
    """
    params = list(phi.inner_parameters)  # type: ignore[attr-defined]
    n = len(params)

    def mean(v: Sequence[Tensor]) -> Tensors:
        acc = [torch.zeros_like(x) for x in v]
        for b in batches:
            for a, h in zip(acc, phi.hessian_vector_product(b, v)):  # type: ignore[attr-defined]
                a.add_(h.detach(), alpha=1.0 / len(batches))
        return acc

    def per_batch(v: Sequence[Tensor]) -> Tensors:  # diag(H_1, …, H_B) on B stacked copies of w
        out: Tensors = []
        for i, b in enumerate(batches):
            block = v[i * n : (i + 1) * n]
            out += [h.detach() for h in phi.hessian_vector_product(b, block)]  # type: ignore[attr-defined]
        return out

    warm = dict(start=start, tol=tol, vectors=keep_ritz)
    if minibatches == "mean":
        res = lanczos_extremes(mean, params, iters, seed, more, **warm)  # type: ignore[arg-type]
    else:
        stacked = params * len(batches)
        res = lanczos_extremes(per_batch, stacked, iters, seed, more, **warm)  # type: ignore[arg-type]
    L = margin * (res.theta_max + res.error_max)
    if not math.isfinite(L) or L <= 0:
        log.warning("hypertorch_sid: Lanczos gave no positive L (%.3g); using L = 1.", L)
        L = 1.0
    if mu is not None:
        est = CurvatureEstimate(L, float(mu), False, res.steps, float(mu), 0.0, res.vectors)
    else:
        lam_min = res.theta_min
        floored = not math.isfinite(lam_min) or lam_min < mu_floor * L
        est = CurvatureEstimate(
            L=L,
            mu=mu_floor * L if floored else lam_min,
            mu_floored=floored,
            iterations=res.steps,
            lambda_min=lam_min if math.isfinite(lam_min) else -L,
            lambda_min_error=res.error_min,
            ritz=res.vectors,
        )
    log.info(
        "hypertorch_sid: estimated L = %.4g, lambda_min = %.4g (± %.2g), mu = %.4g%s by %d "
        "Lanczos steps on %d batches%s",
        est.L,
        est.lambda_min,
        est.lambda_min_error,
        est.mu,
        " (floored)" if est.mu_floored else "",
        res.steps,
        len(batches),
        " (warm start)" if start is not None else "",
    )
    return est


class Curvature(ABC):
    """Where L, μ (and λ_min) come from: a strategy passed as ``curvature=``.

    The optimizer asks it for the spectrum that sets α, q and δ (Cor. 4.3 on the damped system)
    before the first solve (:meth:`estimate`), again at w_t after the first inner solve
    (:meth:`estimate_at_w_t`) and after a divergence (:meth:`recover`); a
    :class:`CurvatureProbe` reads the Hessian of ℓ̂ for it.
    """

    #: μ ≥ mu_floor·L for the schedules
    mu_floor: float = 1e-4

    @property
    def reads_full_batch(self) -> bool:
        """Whether its estimates read ``full_train_batch``."""
        return False

    def needs_refresh(self, hyper_step: int) -> bool:
        """Whether to estimate again before hyper step ``hyper_step`` (> 0)."""
        return False

    def given(self) -> tuple[float | None, float | None]:
        """(L, μ) as given by the user (None: estimated)."""
        return None, None

    @abstractmethod
    def estimate(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate:
        """The spectrum before the solves: ``current`` (constants already known), else read."""

    def estimate_at_w_t(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate | None:
        """The spectrum at w_t after the first inner solve (None: keep the constants)."""
        return None

    def recover(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate | None:
        """The spectrum after a divergence (None: none known, the optimizer assumes one)."""
        return current


@dataclass(frozen=True)
class KnownCurvature(Curvature):
    """The user's constants: L (and μ, possibly ≤ 0 for a non-convex ℓ; None to estimate μ)."""

    L: float
    mu: float | None = None

    def __post_init__(self) -> None:
        L = check_positive("KnownCurvature.L", self.L)
        below_L = f"a finite number ≤ L = {L:g}"
        mu = check_real("KnownCurvature.mu", self.mu, lambda m: m <= L, below_L, allow_none=True)
        object.__setattr__(self, "L", L)
        object.__setattr__(self, "mu", mu)

    def given(self) -> tuple[float | None, float | None]:
        return self.L, self.mu

    def estimate(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate:
        """L, μ as given; with μ unknown, λ_min by Lanczos (unpreconditioned) and the given L."""
        if self.mu is not None:
            return CurvatureEstimate(self.L, max(self.mu, 1e-12 * self.L), self.mu <= 0, 0, self.mu)
        if current is not None:
            return current
        default = EstimatedCurvature()
        est = probe.lanczos(probe.batches(default), default.iters, None, default.mu_floor)
        return CurvatureEstimate(
            self.L, est.mu, est.mu_floored, est.iterations, est.lambda_min, est.lambda_min_error
        )


@dataclass(frozen=True)
class EstimatedCurvature(Curvature):
    """L and λ_min estimated by Lanczos (:func:`estimate_curvature`).

    Parameters
    ----------
    batches: minibatches whose spectra the estimate covers (each one's, not their mean's; the
        full batch where these would read as many samples), or ``"full"``: the full training
        batch (``full_train_batch``), exact but ``iters`` epochs per estimate.
    iters: Lanczos steps per estimate.
    every: re-estimate every this many hyper steps (None: once, and when a guard asks).
    mu_floor: μ ≥ mu_floor·L for the schedules.
    mu: a known μ (e.g. the smallest weight decay): only L is estimated.
    minibatches: ``"mean"`` (default): L̂, λ̂_min of the ``batches``' mean Hessian; ``"each"``:
        the ends of the union of their spectra (each minibatch's: a stochastic adjoint step
        applies one; module docstring), an option. Not the default
        (module docstring): where ℓ draws fresh randomness at every product (noise injection
        not replayed, dropout), Lanczos runs on a changing operator, and per block it read
        λ̂_min = −1.8 on a least-squares problem whose Hessian's spectrum is [1.3, 1.7]: the
        damping that followed biased the hypergradient by 34–64 %
        (``test_fresh_gaussian_noise_in_inner_loss_gives_the_expected_objectives_hypergradient``;
        the mean of the batches: within 3 %). The same where the estimate reads one batch (or
        the full batch).
    margin: L = ``margin`` × the estimate (≥ 1), so α = 2/(L + μ) leaves room for minibatches
        sharper than the ``batches`` the estimate read (it covers those: a stochastic adjoint
        step applies *one* minibatch's Hessian). Measured, when the estimate read the batches'
        mean, on the digits MLP of ``examples/lightning_digits.py`` at step 220: L̂ = 2.6 (2
        batches), λ_max = 3.9 on all 300 training images and 1.4–11.5 on single batches of 32;
        at α = 2/(L̂ + μ) the warm-started adjoint solve diverged (relative residual 14 → 133).
    warm_start: start each re-estimate from the last estimate's extreme Ritz vectors (eq.
        lanczoswarm; module docstring), an option; the first estimate (and the first after a
        resume) starts cold. Needs ``minibatches="mean"``.
    tol: stop Lanczos once both extreme Ritz values are within ``tol`` · L̂ (eq. lanczosstop),
        at most ``iters`` steps; None (default): always ``iters`` steps.
    """

    batches: int | str = 4
    iters: int = 20
    every: int | None = None
    mu_floor: float = 1e-4
    mu: float | None = None
    margin: float = 1.0
    minibatches: str = "mean"
    warm_start: bool = False
    tol: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.minibatches not in ("each", "mean"):
            raise ConfigurationError(
                "EstimatedCurvature.minibatches must be 'each' (the union of the minibatches' "
                f"spectra) or 'mean' (their mean Hessian's), got {self.minibatches!r}."
            )
        if not isinstance(self.warm_start, bool):
            raise ConfigurationError(
                f"EstimatedCurvature.warm_start must be True or False, got {self.warm_start!r}."
            )
        if self.warm_start and self.minibatches != "mean":
            raise ConfigurationError(
                "EstimatedCurvature(warm_start=True) needs minibatches='mean': the blocks of "
                "'each' are fresh minibatches at every estimate, so the last Ritz vectors say "
                "nothing about them. Pass minibatches='mean' or warm_start=False."
            )
        in_0_1 = "a number in (0, 1), or None for all iters steps"
        tol = check_real("EstimatedCurvature.tol", self.tol, lambda x: 0 < x < 1, in_0_1, True)
        set_(self, "tol", tol)
        if self.batches != "full":
            if not is_integer(self.batches) or self.batches < 1:
                raise ConfigurationError(
                    "EstimatedCurvature.batches must be an integer ≥ 1 or 'full', got "
                    f"{self.batches!r}."
                )
            set_(self, "batches", int(self.batches))
        set_(self, "iters", check_integer("EstimatedCurvature.iters", self.iters, 1))
        set_(self, "every", check_integer("EstimatedCurvature.every", self.every, 1, True))
        floor = check_real("mu_floor", self.mu_floor, lambda x: 0 < x < 1, "in (0, 1)")
        set_(self, "mu_floor", floor)
        set_(self, "mu", check_positive("EstimatedCurvature.mu", self.mu, allow_none=True))
        at_least_1 = "a finite number ≥ 1"
        margin = check_real("EstimatedCurvature.margin", self.margin, _at_least_1, at_least_1)
        set_(self, "margin", margin)

    def needs_refresh(self, hyper_step: int) -> bool:
        return self.every is not None and hyper_step > 0 and hyper_step % self.every == 0

    def given(self) -> tuple[float | None, float | None]:
        return None, self.mu

    @property
    def reads_full_batch(self) -> bool:
        return self.batches == "full"

    def estimate(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate:
        """P from the preconditioner, then L, λ_min of S∇²₁₁ℓS on the same batches.

        P only where α, L, μ are all estimated (they are then those of S∇²₁₁ℓS). On a
        non-convex estimate (λ̂_min ≤ 0) P is dropped and the curvature estimated again
        unpreconditioned: S amplifies negative curvature (on a CNN with BatchNorm λ̂_min went
        from −1.5 to −327), and the inner steps w − αP∇ℓ̂, which damping does not reach,
        then diverge (2 of 3 seeds measured).
        """
        if current is not None:
            return current
        batches = probe.batches(self)
        if probe.alpha_given is None and self.mu is None:
            probe.precondition(batches)
        return self._in_convex_coordinates(probe, batches)

    def estimate_at_w_t(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate | None:
        """Re-read at w_t, where the adjoint system (eq. linsystem) is posed.

        The first estimate was taken at the user's starting w₀; on a network the inner steps then
        move w into sharper regions (measured on a digits MLP: the adjoint solve diverged within
        20 steps on 4 of 6 runs with the w₀ constants, on none with these). The merged estimate
        only ever makes the solve safer: L̂ = max(L̂(w₀), L̂(w_t)), λ̂_min = min(...) (so α does
        not grow past the one the t inner steps just ran stably with, and the damping δ covers
        the sharper negative curvature). P stays the one the inner solve used.
        """
        scale = probe.scale
        est = self._in_convex_coordinates(probe, probe.batches(self))
        if current is not None and probe.scale is scale:  # same coordinates
            est = current.union(est)
        return est

    def recover(
        self, probe: CurvatureProbe, current: CurvatureEstimate | None
    ) -> CurvatureEstimate | None:
        """Estimate again at the current w (preconditioned as before the first step)."""
        return self.estimate(probe, None)

    def _in_convex_coordinates(
        self, probe: CurvatureProbe, batches: list[object]
    ) -> CurvatureEstimate:
        """L, λ_min in the map's coordinates; P dropped (and re-estimated) when non-convex."""
        args = (batches, self.iters, self.mu, self.mu_floor, self.margin, self.minibatches)
        warm = dict(warm_start=self.warm_start, tol=self.tol)
        est = probe.lanczos(*args, **warm)  # type: ignore[arg-type]
        if probe.scale is not None and not est.convex:
            log.info(
                "hypertorch_sid: lambda_min of the preconditioned Hessian is %.3g (non-convex): "
                "no preconditioner",
                est.lambda_min,
            )
            probe.set_scale(None)
            est = probe.lanczos(*args, **warm)  # type: ignore[arg-type]
        return est


def _at_least_1(x: float) -> bool:
    return math.isfinite(x) and x >= 1


# ---------------------------------------------------------------------- reading the curvature
class CurvatureProbe:
    """Reads the curvature of the GD map ``phi`` for a curvature strategy (module docstring).

    ``stream`` (the training minibatches) and ``hyper_step`` (the Lanczos seed) are set by the
    optimizer at each hypergradient.
    """

    def __init__(
        self,
        phi: GradientDescentMap,
        config: SIDConfig,
        cost: Cost,
        *,
        module: torch.nn.Module | None,
        full_batch: Any,
        mean: Callable[[Tensor], Tensor] | None,
        on_rescale: Callable[[Tensors | None, Tensors | None], None],
    ) -> None:
        self.phi, self.config, self.cost = phi, config, cost
        self.module, self.full_batch, self.mean = module, full_batch, mean
        self.on_rescale = on_rescale
        self.stream: BatchStream | None = None
        self.hyper_step = 0
        #: the last estimate read with its Ritz vectors kept: a warm start's q₁ (eq. lanczoswarm)
        self.last: CurvatureEstimate | None = None
        #: what the current hyper step may spend (a compute budget's; set by the optimizer)
        self.allowance: Allowance = UNLIMITED

    @property
    def alpha_given(self) -> float | None:
        """α as configured (P applies only where α, L, μ are all estimated)."""
        return self.config.alpha

    @property
    def scale(self) -> Tensors | None:
        """S of the preconditioned map (None: P = I)."""
        return self.phi.scale

    def batches(self, curvature: EstimatedCurvature) -> list[Any]:
        """The batches an estimate reads: ``curvature.batches`` fresh minibatches, or the full
        batch where those would read as many samples or ``batches="full"`` asks for it (20
        Lanczos products on the full batch cost 20 epochs: more than a whole solve at n = 5000
        in ``benchmarks/bench_peers.py``)."""
        if curvature.batches == "full":
            return [self.full_batch]
        assert self.stream is not None
        full = self.full_batch
        batches: list[Any] = []
        samples = 0
        for _ in range(self.allowance.curvature_batches(int(curvature.batches))):
            batches.append(next(self.stream))
            samples += batch_size(batches[-1])
            if full is not None and samples >= batch_size(full):
                return [full]
        return batches

    def lanczos(
        self,
        batches: list[Any],
        iters: int,
        mu: float | None,
        mu_floor: float,
        margin: float = 1.0,
        minibatches: str = "mean",
        *,
        warm_start: bool = False,
        tol: float | None = None,
    ) -> CurvatureEstimate:
        """L, λ_min at the current w, λ by Lanczos (:func:`estimate_curvature`), cost counted
        product by product; as many iterations as the allowance lets (at least
        :data:`~.budget.MIN_LANCZOS`, at most ``iters``), fewer where ``tol`` is met (eq.
        lanczosstop). ``warm_start``: start from the last estimate's Ritz vectors (eq.
        lanczoswarm; cold where there are none) and keep this one's."""
        phi: Any = _CountedHessian(self.phi, self.cost)
        if self.mean is not None:  # Lanczos on the global (averaged) Hessian
            phi = _GlobalHessian(phi, self.mean)
        allowance, started = self.allowance, self.allowance.clock_reading()

        def more(done: int) -> bool:
            return allowance.lanczos_continues(started, done, len(batches))

        last = self.last.ritz if warm_start and self.last is not None else None
        start = None if last is None else warm_start_vector(last, self.hyper_step)
        with frozen_mode(self.module, self.config.mode):  # no BatchNorm statistics update
            est = estimate_curvature(
                phi, batches, iters, mu=mu, mu_floor=mu_floor, seed=self.hyper_step,
                margin=margin, more=more, minibatches=minibatches, start=start, tol=tol,
                keep_ritz=warm_start,
            )  # fmt: skip
        if warm_start:
            self.last = est
        if est.uncertain and not est.convex:
            fix = (
                f"the compute budget (max_overhead) allowed {est.iterations} of the {iters} asked"
                if est.iterations < iters and allowance is not UNLIMITED
                else "raise EstimatedCurvature(iters=...) for a firmer estimate"
            )
            log.warning(
                "hypertorch_sid: the sign of lambda_min is uncertain (%.3g ± %.2g after %d Lanczos "
                "steps); %s.",
                est.lambda_min,
                est.lambda_min_error,
                est.iterations,
                fix,
            )
        return est

    def precondition(self, batches: list[Any]) -> None:
        """P = D⁻¹ of the GD map from the preconditioner strategy, on the estimate's batches."""
        self.set_scale(None)
        if self.config.mode == "train" and _has_batchnorm(self.module):
            log.info(
                "hypertorch_sid: no preconditioner: BatchNorm in train mode has no per-sample map"
            )
            return
        with frozen_mode(self.module, self.config.mode):
            D = self.config.preconditioner.diagonal(self.phi, batches)
        if D is None:
            return
        values = D.values
        if self.mean is not None:  # one P on every process
            values = [self.mean(d) for d in values]
        self.cost.curvature_samples += D.samples
        self.cost.samples += D.samples
        self.set_scale([d.rsqrt() for d in values])

    def set_scale(self, scale: Tensors | None) -> None:
        """S of the preconditioned map; the warm-start v follows (``on_rescale(old, new)``), and
        so do the last estimate's Ritz vectors: an eigenvector u of S∇²ℓS is S⁻¹ of a direction
        of w, which the new S' reads as S'⁻¹Su (normalised)."""
        old = self.phi.scale
        self.on_rescale(old, scale)
        self.phi.scale = scale
        last = self.last
        if last is not None and last.ritz is not None and (old is not None or scale is not None):
            ones = [torch.ones_like(x) for x in last.ritz[0]]
            moved = tuple(
                _unit([x * o / s for x, o, s in zip(y, old or ones, scale or ones)])
                for y in last.ritz
            )
            self.last = dataclasses.replace(last, ritz=moved)  # type: ignore[arg-type]

    def forget(self) -> None:
        """Drop the last estimate's Ritz vectors (a resume: the next estimate starts cold)."""
        self.last = None


def _has_batchnorm(module: torch.nn.Module | None) -> bool:
    return module is not None and any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()
    )


class _CountedHessian:
    """Hessian–vector products counted in the cost as they are made (a budget's clock may read
    the counters, and a Lanczos run stopped by its allowance is counted as far as it ran)."""

    def __init__(self, phi: GradientDescentMap, cost: Cost) -> None:
        self.phi, self.cost = phi, cost
        self.inner_parameters = phi.inner_parameters

    def hessian_vector_product(self, batch: Any, v: Any) -> Tensors:
        n = batch_size(batch)
        self.cost.curvature_samples += n
        self.cost.curvature_products += 1
        self.cost.samples += n
        return self.phi.hessian_vector_product(batch, v)


class _GlobalHessian:
    """Hessian–vector products averaged across processes: one curvature estimate everywhere."""

    def __init__(self, phi: Any, mean: Callable[[Tensor], Tensor]) -> None:
        self.phi, self.mean = phi, mean
        self.inner_parameters = phi.inner_parameters

    def hessian_vector_product(self, batch: Any, v: Any) -> Tensors:
        return [self.mean(h) for h in self.phi.hessian_vector_product(batch, v)]
