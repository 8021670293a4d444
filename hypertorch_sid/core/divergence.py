"""Divergence that cannot hide: growth tracked *across* hyper steps, and what to do about it.

A solve's own residual test (growth by ``divergence_factor`` within one solve) misses slow growth
in short solves: with k = 10 steps, an expansion of 1.5× per step is never flagged, and the
warm-started v carries it to the next hyper step (measured: a ridge with α·L = 2.5 took the
hypergradient norm from 0.05 to 1e18 over twelve steps, λ updated each time).

:class:`DivergenceGuard` checks every hyper step against what a *non-expansive* adjoint map allows:
the KM iteration v ← v + η(Ψ̂(v) − v) with ‖∂₁Φ̂‖ ≤ 1 satisfies ‖v_k‖ ≤ ‖v_0‖ + Σ_t η_t ‖∇₁E‖,
and so, summed over the hyper steps since v was last reset,

    ‖v‖ ≤ Σ_s Σ_t η_t ‖∇₁E_s‖                         (the budget of a non-expansive map).

An expansive map (q > 1: a non-convex ℓ, an α past 2/L) outgrows this linear budget geometrically,
however slowly. Also flagged: an adjoint residual that grew within the solve to more than
``residual_factor``·‖∇₁E‖, and a hypergradient norm ``growth`` times the median of the last
accepted ones. On detection the hyper step raises :class:`DivergenceError` naming the cause and
the numbers; λ is never written (the optimizer says so, and what to change, when it gives up).

Policies (``on_divergence=``) decide what a detected divergence does inside the optimizer:

* :class:`RaiseOnDivergence` — raise at once (v is reset, so the next call starts clean);
* :class:`BackOff` — halve α (or η), reset v, retry (``BackOff(n)``);
* :class:`Recover` — reset v, re-estimate the curvature, then halve α where the damping covers
  the estimated negative curvature (the map expanded at the top), else raise δ, retry; after
  ``retries`` failures raise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, DivergenceError
from .validation import check_integer, is_real
from .watch import warn_not_converged


@dataclass
class DivergenceGuard:
    """Tracks ‖v‖, the adjoint residual and ‖∇̂f‖ across hyper steps (see the module docstring).

    Parameters
    ----------
    slack: ‖v‖ may exceed the non-expansive budget by this factor (minibatch maps are only
        contractive on average).
    residual_factor: an adjoint residual that grew within the solve past this many ‖∇₁E‖ (a v
        worse than v = 0 by that much). Was 1000: on the digits MLP of
        ``examples/lightning_digits.py`` a warm-started k = 3 solve diverged over four hyper
        steps with relative residuals 14, 35, 102, 133, all accepted (healthy ones: 0.17–3).
    growth: a hypergradient norm this many times the median of the last ``window`` accepted ones.
    window: accepted hyper steps in that median.
    """

    slack: float = 4.0
    residual_factor: float = 10.0
    growth: float = 1e3
    window: int = 5
    budget: float = 0.0
    norms: list[float] = field(default_factory=list)
    #: consecutive hyper steps whose warm-started adjoint solve has not converged
    unconverged: int = 0
    #: that many in a row warn (a warm start continues the solve at the next hyper step)
    patience: int = 3
    #: hyper steps seen, and those whose unconverged adjoint solve passed the patience gate
    hyper_steps: int = 0
    reported: int = 0
    #: whether the caller runs more hyper steps that carry v on (the Lightning callbacks, with
    #: ``warm_start_adjoint``): a cold solve (the first, or one after a reset) is then continued
    #: too and waits for the patience; a one-off ``hypergradient()`` call says so at once
    continued: bool = False

    def note_convergence(self, message: str, warm: bool) -> None:
        """Warn (:class:`~hypertorch_sid.core.errors.ConvergenceWarning`) where the adjoint solve
        visibly has not converged (``message``, see :func:`~hypertorch_sid.core.watch.
        unconverged_message`): at once without a warm start, else after ``patience`` hyper steps
        in a row (SID's warm start carries v on; one short solve is not a failure). A cold solve
        that later hyper steps continue (``continued``: the drop-ins) waits for the patience too:
        with the drop-ins' k = 3 the first hyper step's solve from v = 0 was said on every fit
        (29 of 32 fits of session 48's unseen recipes), with "raise adjoint_steps" as the fix.

        Said at the 1st, 10th, 100th, … such hyper step, each time with the count so far: a
        warning every hyper step (15 in the 20 hyper steps of the digits main job) buries the
        first one and every other warning of the fit; the relative residual of every hyper step
        is logged (``hyper/relative_adjoint_residual``) where it must be followed."""
        self.hyper_steps += 1
        self.unconverged = self.unconverged + 1 if message else 0
        if not message or ((warm or self.continued) and self.unconverged < self.patience):
            return
        self.reported += 1
        if math.log10(self.reported).is_integer():
            warn_not_converged(f"{message}{self._count()}", stacklevel=5)

    def _count(self) -> str:
        """The tally appended to a repeated unconverged-solve warning."""
        n, nxt = self.reported, 10 * self.reported
        return (
            f" [{n} of {self.hyper_steps} hyper steps so far had a visibly unconverged adjoint "
            f"solve; said again at the {nxt}th]"
        )

    def reset(self) -> None:
        """v was reset to 0: its budget starts again."""
        self.budget = 0.0

    def check(
        self,
        *,
        v_norm: float,
        v0_norm: float,
        grad_norm: float,
        etas: float,
        residual: float,
        first_residual: float,
        hypergradient_norm: float,
    ) -> None:
        """Raise :class:`DivergenceError` if this hyper step's numbers show divergence.

        ``etas`` is Σ_t η_t of this adjoint solve (k for CG-type solvers); ``v0_norm`` the norm
        of its warm start.
        """
        budget = (self.budget if self.budget > 0 else v0_norm) + etas * grad_norm
        if v_norm > self.slack * budget + 1e-12:
            raise DivergenceError(
                "adjoint v (across hyper steps)",
                None,
                residual,
                f"‖v‖ = {v_norm:.3g} exceeds {self.slack:g}× what a non-expansive adjoint map can "
                f"reach ({budget:.3g} = Σ η‖∇₁E‖ since v was reset): the map is not a "
                "contraction at this w — a non-convex inner loss (negative curvature) or a step "
                "α above 2/L.",
            )
        if residual > first_residual and residual > self.residual_factor * grad_norm > 0:
            raise DivergenceError(
                "adjoint solve v_k",
                None,
                residual,
                f"the adjoint residual grew within the solve from {first_residual:.3g} to "
                f"{residual:.3g}, above {self.residual_factor:g}·‖∇₁E‖ = "
                f"{self.residual_factor * grad_norm:.3g}: the adjoint map is expansive (not a "
                "contraction).",
            )
        if len(self.norms) >= 3:
            reference = statistics.median(self.norms[-self.window :])
            # a median of 0 (E's gradient exactly 0: losses fitted to 0 in float32) is no scale
            # to grow from; it raised ZeroDivisionError in the message below (session 50)
            if reference > 0 and hypergradient_norm > self.growth * reference:
                raise DivergenceError(
                    "hypergradient (across hyper steps)",
                    None,
                    hypergradient_norm,
                    f"‖∇̂f‖ = {hypergradient_norm:.3g} is {hypergradient_norm / reference:.3g}× "
                    f"the median of the last accepted ones ({reference:.3g}).",
                )
        self.budget = budget

    def accept(self, hypergradient_norm: float) -> None:
        self.norms = (self.norms + [hypergradient_norm])[-self.window :]

    def state_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "norms": list(self.norms)}

    def load_state_dict(self, state: Any) -> None:
        if (
            not isinstance(state, dict)
            or not is_real(state.get("budget"))
            or not isinstance(state.get("norms"), list)
            or not all(is_real(x) and math.isfinite(x) for x in state["norms"])
        ):
            raise ConfigurationError(
                f"the saved divergence-guard state must be {{'budget': number, 'norms': [numbers]}}"
                f", got {state!r}."
            )
        self.budget, self.norms = float(state["budget"]), [float(x) for x in state["norms"]]


class DivergencePolicy:
    """What a detected divergence does: ``retries`` attempts, each preceded by :meth:`adapt`."""

    retries: int = 0

    def adapt(self, optimizer: Any, err: DivergenceError) -> str:
        """Change the optimizer before a retry; returns what was changed (for the log)."""
        return "nothing"

    #: how to make a diverged adjoint solve retry with more damping (for the error's remedy)
    retry_hint: str = (
        "; on_divergence=Recover(2) re-estimates the curvature, halves α or raises δ, retries"
    )


def _check_retries(policy: DivergencePolicy) -> None:
    retries = check_integer(f"{type(policy).__name__}.retries", policy.retries, 0)
    object.__setattr__(policy, "retries", retries)


@dataclass(frozen=True)
class RaiseOnDivergence(DivergencePolicy):
    """Raise :class:`DivergenceError` at once (v is reset; λ untouched)."""

    retries: int = 0

    def __post_init__(self) -> None:  # retries=-1 was an AssertionError "unreachable" (s53)
        _check_retries(self)


@dataclass(frozen=True)
class BackOff(DivergencePolicy):
    """Retry up to ``retries`` times with α (GD map) or η (general map) halved, v reset."""

    retries: int = 1

    def __post_init__(self) -> None:
        _check_retries(self)

    def adapt(self, optimizer: Any, err: DivergenceError) -> str:
        return optimizer.back_off()


@dataclass(frozen=True)
class Recover(DivergencePolicy):
    """Retry up to ``retries`` times after resetting v, re-estimating L, λ_min and raising δ."""

    retries: int = 2
    retry_hint = ""  # it already does

    def __post_init__(self) -> None:
        _check_retries(self)

    def adapt(self, optimizer: Any, err: DivergenceError) -> str:
        return optimizer.recover()
