"""Step sizes η_t of the stochastic Krasnoselskii–Mann iteration (eq. inneralgo, section 4).

    x_{t+1} = x_t + η_t (T̂(x_t, ζ_t) − x_t)

* :class:`ConstantStep` — η_t = η with η ≤ 1/(1+σ₂) (Thm 4.1): linear rate to a noise floor
  η σ₁ / (1 − q²).
* :class:`DecreasingStep` — η_t = β/(γ + t) with β > 1/(1−q²), γ ≥ β(1+σ₂) (Thm 4.2): O(1/(γ+t)).
* :class:`TwoPhaseStep` — constant η = 1/(1+σ₂) first, then β/(γ + t − t₀) (the recommendation
  after Thm 4.2).

:func:`theory_constants` computes α = 2/(L+μ), q = (L−μ)/(L+μ) (Corollary 4.3), β = 2/(1−q²) and
γ = β(1+σ₂).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .errors import ConfigurationError
from .validation import check_positive, is_real

#: the schedules :func:`make_schedule` builds by name
SCHEDULE_NAMES = ("constant", "decreasing", "two_phase")


class StepSchedule(ABC):
    """A step-size schedule t ↦ η_t. Subclasses implement :meth:`__call__`."""

    @abstractmethod
    def __call__(self, t: int) -> float:
        """η_t."""

    def constant_phase(self) -> float:
        """t₀: η_t is constant for t < t₀ (0 when it never is, ``inf`` when always). Momentum
        (:class:`~hypertorch_sid.core.solvers.AveragedMomentum`) runs only there. A schedule that
        does not say has none."""
        return 0.0

    def scaled(self, factor: float) -> StepSchedule:
        """The same schedule with every η_t multiplied by ``factor`` (used by step back-off)."""
        return _Scaled(self, factor)


@dataclass(frozen=True)
class ConstantStep(StepSchedule):
    """η_t = η (Thm 4.1). ``eta = 1`` with the GD map is plain (S)GD with step α."""

    eta: float = 1.0

    def __post_init__(self) -> None:
        check_positive("eta", self.eta)

    def __call__(self, t: int) -> float:
        return self.eta

    def constant_phase(self) -> float:
        return math.inf


@dataclass(frozen=True)
class DecreasingStep(StepSchedule):
    """η_t = β/(γ + t) (Thm 4.2); converges almost surely and in mean square at rate O(1/(γ+t))."""

    beta: float
    gamma: float

    def __post_init__(self) -> None:
        check_positive("beta", self.beta)
        check_positive("gamma", self.gamma)

    def __call__(self, t: int) -> float:
        return self.beta / (self.gamma + t)


@dataclass(frozen=True)
class TwoPhaseStep(StepSchedule):
    """Constant η for t < t₀, then β/(γ + t − t₀) (section 4, after Thm 4.2)."""

    eta: float
    switch: int
    beta: float
    gamma: float

    def __post_init__(self) -> None:
        check_positive("eta", self.eta)
        check_positive("beta", self.beta)
        check_positive("gamma", self.gamma)
        if self.switch < 0:
            raise ConfigurationError(f"switch must be ≥ 0, got {self.switch}.")

    def __call__(self, t: int) -> float:
        if t < self.switch:
            return self.eta
        return self.beta / (self.gamma + t - self.switch)

    def constant_phase(self) -> float:
        return float(self.switch)


@dataclass(frozen=True)
class _Scaled(StepSchedule):
    base: StepSchedule
    factor: float

    def __call__(self, t: int) -> float:
        return self.factor * self.base(t)

    def constant_phase(self) -> float:
        return self.base.constant_phase()


@dataclass(frozen=True)
class TheoryConstants:
    """Constants of the GD map Φ̂(w) = w − α∇ℓ̂(w) for an L-smooth, μ-strongly convex ℓ.

    Attributes
    ----------
    L, mu: smoothness and strong-convexity constants of ℓ(·, λ).
    alpha: 2/(L+μ), the step that minimises the contraction constant (Corollary 4.3).
    q: (L−μ)/(L+μ), the contraction constant of Φ with that α.
    sigma2: σ₂ of Assumption 4.1(iii) (0 when the noise does not grow with ‖T(x) − x‖).
    eta_max: 1/(1+σ₂), the largest constant η of Thm 4.1.
    beta: 2/(1−q²), the β minimising the constant of Thm 4.2.
    gamma: β(1+σ₂).
    """

    L: float
    mu: float
    alpha: float
    q: float
    sigma2: float
    eta_max: float
    beta: float
    gamma: float


def theory_constants(
    L: float, mu: float, sigma2: float = 0.0, alpha: float | None = None
) -> TheoryConstants:
    """α, q, β, γ from L, μ and σ₂ (Corollary 4.3 and the remark after Thm 4.2).

    With a user-given ``alpha`` the contraction constant is q = max(|1 − αμ|, |1 − αL|).
    """
    check_positive("L", L)
    check_positive("mu", mu)
    if mu > L:
        raise ConfigurationError(f"mu ({mu:.3g}) must not exceed L ({L:.3g}).")
    if alpha is None:
        alpha = 2.0 / (L + mu)
    check_positive("alpha", alpha)
    q = max(abs(1.0 - alpha * mu), abs(1.0 - alpha * L))
    if q >= 1.0:
        raise ConfigurationError(
            f"the gradient-descent map with alpha={alpha:.3g} is not a contraction for L={L:.3g}, "
            f"mu={mu:.3g} (q={q:.3g} ≥ 1). Use alpha < 2/L = {2 / L:.3g}, e.g. 2/(L+mu)."
        )
    beta = 2.0 / (1.0 - q * q)
    return TheoryConstants(
        L=L,
        mu=mu,
        alpha=alpha,
        q=q,
        sigma2=sigma2,
        eta_max=1.0 / (1.0 + sigma2),
        beta=beta,
        gamma=beta * (1.0 + sigma2),
    )


def make_schedule(
    kind: str | StepSchedule,
    *,
    q: float | None = None,
    sigma2: float = 0.0,
    eta: float | None = None,
    beta: float | None = None,
    gamma: float | None = None,
    switch: int | None = None,
    steps: int | None = None,
) -> StepSchedule:
    """Build a schedule by name: ``"constant"``, ``"decreasing"`` or ``"two_phase"``.

    Missing β, γ are taken from the theory (β = 2/(1−q²), γ = β(1+σ₂)); they need ``q``.
    A two-phase schedule without ``switch`` for a solve of ``steps`` steps switches at
    :func:`auto_switch` (0, i.e. purely decreasing, when ``steps`` is unknown).
    A :class:`StepSchedule` instance is returned unchanged.
    """
    if isinstance(kind, StepSchedule):
        return kind
    if kind == "constant":
        return ConstantStep(eta if eta is not None else 1.0 / (1.0 + sigma2))
    check_schedule_kind("step_size", kind)
    if beta is None:
        if q is None:
            raise ConfigurationError(
                f"step_size={kind!r} needs beta (or the contraction constant q to derive it)."
            )
        beta = 2.0 / (1.0 - q * q)
    if gamma is None:
        gamma = beta * (1.0 + sigma2)
    if kind == "decreasing":
        return DecreasingStep(beta, gamma)
    if switch is None:
        switch = auto_switch(steps, beta) if steps is not None else 0
    return TwoPhaseStep(eta if eta is not None else 1.0 / (1.0 + sigma2), switch, beta, gamma)


def auto_switch(steps: int, beta: float) -> int:
    """t₀ = min(⌊steps/2⌋, ⌈7β⌉): the constant phase of a two-phase schedule.

    With η = 1 the error's bias shrinks like q^t (Thm 4.1) and β = 2/(1−q²) ≈ 1/(1−q) when q → 1,
    so 7β ≥ ln(10³)/(1−q) steps shrink the initial error ~10³-fold, to the constant step's noise
    floor; after that the decreasing phase β/(γ + t − t₀) removes the floor (Thm 4.2). At most
    half the steps go to the constant phase.
    """
    return min(steps // 2, math.ceil(7 * beta))


def check_schedule_kind(name: str, kind: object) -> None:
    """``kind`` must be one of :data:`SCHEDULE_NAMES` or a :class:`StepSchedule`."""
    if not isinstance(kind, StepSchedule) and kind not in SCHEDULE_NAMES:
        # a number read as the step's size (session 62): it is η (or α, the map's step)
        size = (
            f" {name} names the schedule, not the step: a constant step η is "
            f"{name}='constant' with eta={kind!r} (α, the gradient map's step, is alpha=)."
            if is_real(kind)
            else ""
        )
        raise ConfigurationError(
            f"unknown {name} {kind!r}: use 'constant', 'decreasing', 'two_phase' or a "
            f"StepSchedule instance.{size}"
        )
