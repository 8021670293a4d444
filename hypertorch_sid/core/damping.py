"""Damping of the adjoint system: a well-posed linear system on non-convex models.

The paper's adjoint system (eq. linsystem) (I − ∂₁Φ(w, λ)ᵀ) v = ∇₁E is, for the GD map,
α ∇²₁₁ℓ v = ∇₁E. On a neural network ∇²₁₁ℓ has negative eigenvalues (measured: λ_min = −3.6
against λ_max = 4.7 on a small MLP early in training), so no α makes Φ̂ a contraction and the
fixed-point iteration (eq. backalg) diverges — slowly, and across warm-started hyper steps.

Damping solves instead the Levenberg–Marquardt system

    α (∇²₁₁ℓ + δI) v = ∇₁E,     ∇̂f(λ) = ∇₂E − ∇²₂₁ℓ (∇²₁₁ℓ + δI)⁻¹ ∇₁E,

which is the exact implicit hypergradient of the *proximally regularised* inner problem
ℓ(w, λ) + (δ/2)‖w − w̄‖² at its fixed point w̄ = w_t (the current weights): the GD map of that
problem has ∂₁Φ̂_δ = I − α(∇²₁₁ℓ + δI), and with δ > −λ_min and α = 2/(L + λ_min + 2δ) it is a
contraction with q_δ = (L − λ_min)/(L + λ_min + 2δ) < 1 *by construction*. For a general map the
damped map is Φ̂_δ = (Φ̂ + δ w̄)/(1 + δ) (∂₁Φ̂_δ = ∂₁Φ̂/(1 + δ)).

Strategies (passed as ``damping=``):

* :class:`NoDamping` — the paper's system, exact; for strongly convex ℓ;
* :class:`FixedDamping` — a fixed δ;
* :class:`CurvatureDamping` — δ = (1 + margin)·max(0, −λ̂_min) + relative·L̂ from the curvature
  estimate: **0 on a convex problem** (λ̂_min > 0; the exact hypergradient, every oracle holds), a
  shift past the most negative curvature otherwise. A divergence guard that still detects growth
  raises δ (:meth:`Damping.escalate`).

Where δ > 0 the hypergradient is not the exact implicit one of ℓ: it is logged (``damping``) and
said in :attr:`SIDHyperOptimizer.last`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .estimation import CurvatureEstimate
from .validation import check_nonnegative


class Damping:
    """δ ≥ 0 of the damped adjoint system α(∇²₁₁ℓ + δI)v = ∇₁E (see the module docstring)."""

    def delta(self, curvature: CurvatureEstimate | None) -> float:
        """δ for the current curvature estimate (None when no estimate exists)."""
        return 0.0

    def observe(self, remaining_steps: int | None, step_size: float | None) -> None:
        """The training's state before each hyper step: the optimizer steps that remain (None:
        unknown) and its step size η (None: not measured). Ignored here;
        :class:`~.horizon.HorizonDamping` derives δ from it."""

    def escalate(self, delta: float, curvature: CurvatureEstimate | None) -> float:
        """A larger δ after a detected divergence (``Recover``): past the estimated negative
        curvature, max(2δ, 1.5·max(0, −λ̂_min), 0.01·L̂)."""
        if curvature is None:
            return max(2 * delta, 1e-3)
        assert curvature.lambda_min is not None
        return max(2 * delta, 1.5 * max(0.0, -curvature.lambda_min), 0.01 * curvature.L)

    def remedy(
        self,
        delta: float,
        retries: int,
        estimate: CurvatureEstimate | None,
        retry_hint: str,
    ) -> str:
        """What to change after the GD map's adjoint solve diverged with this damping at δ.

        "Use damping" is the fix only where the system was undamped (δ = 0); where δ > 0 already
        (``CurvatureDamping`` on a network, escalated by ``Recover``), the damping was too small
        for the curvature met since it was estimated. ``retry_hint`` says how to make the
        divergence policy retry ("" where it already re-estimates).
        """
        name = type(self).__name__
        if delta > 0:
            tried = f", raised by {retries} retries" if retries else ""
            return (
                f"The system was already damped ({name}, δ = {delta:.3g}{tried}) and "
                "still did not contract: the curvature grew past the estimate. Allow more "
                "retries (on_divergence=Recover(4)), damp further (damping=CurvatureDamping("
                "margin=2.0) or FixedDamping(δ)), re-estimate more often "
                "(EstimatedCurvature(every=...)), leave α room for minibatches sharper than the "
                "estimate (EstimatedCurvature(margin=2.0)), or use positive semi-definite "
                "curvature (hvp=GaussNewton(...))."
            )
        seen = (
            "no curvature was estimated (alpha was given)"
            if estimate is None or estimate.lambda_min is None
            else "the curvature estimate saw no negative curvature (λ̂_min = "
            f"{estimate.lambda_min:.3g})"
        )
        return (
            f"{name} set δ = 0: {seen}, but the map expanded. Pass damping=FixedDamping(δ) or "
            f"a smaller alpha{retry_hint}."
        )


@dataclass(frozen=True)
class NoDamping(Damping):
    """δ = 0: the paper's adjoint system, exact when ℓ(·, λ) is strongly convex."""

    def remedy(
        self,
        delta: float,
        retries: int,
        estimate: CurvatureEstimate | None,
        retry_hint: str,
    ) -> str:
        if delta > 0:  # raised by Recover
            return super().remedy(delta, retries, estimate, retry_hint)
        return (
            "The system was not damped (NoDamping, δ = 0): use damping=CurvatureDamping() (δ "
            f"past the most negative estimated curvature) or a smaller alpha{retry_hint}."
        )


@dataclass(frozen=True)
class FixedDamping(Damping):
    """A fixed shift δ (curvature units: an eigenvalue h of ∇²₁₁ℓ becomes h + δ)."""

    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", check_nonnegative("FixedDamping.value", self.value))

    def delta(self, curvature: CurvatureEstimate | None) -> float:
        return float(self.value)


@dataclass(frozen=True)
class CurvatureDamping(Damping):
    """δ = (1 + margin)·max(0, −λ̂_min) + relative·L̂, doubled (at least) on each escalation.

    Parameters
    ----------
    margin: how far past the most negative estimated curvature to shift (Lanczos' λ̂_min lies
        above the true λ_min, so a margin is needed).
    relative: a floor δ ≥ relative·L̂ (0: exact on convex problems; > 0 also bounds the adjoint
        along the near-zero curvature of over-parameterised networks, where (∇²₁₁ℓ)⁻¹∇₁E is huge).
    """

    margin: float = 0.5
    relative: float = 0.0

    def __post_init__(self) -> None:
        for name in ("margin", "relative"):
            value = check_nonnegative(f"CurvatureDamping.{name}", getattr(self, name))
            object.__setattr__(self, name, value)

    def delta(self, curvature: CurvatureEstimate | None) -> float:
        if curvature is None:
            return 0.0
        assert curvature.lambda_min is not None
        negative = max(0.0, -curvature.lambda_min)
        return (1 + self.margin) * negative + self.relative * curvature.L
