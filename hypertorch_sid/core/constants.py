"""``StepConstants``: the one owner of α, L, μ, q, λ_min and δ of Algorithm 1.

The step α of the GD map, its contraction constant q and the damping δ come from the curvature
of ℓ̂ (Corollary 4.3): with L̂, λ̂_min from the curvature strategy and δ from the damping strategy,
the damped system has spectrum [λ_min + δ, L + δ] and

    α = 2/(L + λ_min + 2δ),   q = (L − λ_min)/(L + λ_min + 2δ)

(the paper's α = 2/(L+μ), q = (L−μ)/(L+μ) without damping on a convex problem). They are set
here and nowhere else; every change is handed to the map at once (:meth:`FixedPointMap.set_step
<hypertorch_sid.core.maps.FixedPointMap.set_step>`). The map chooses how its constants are fitted
(:meth:`fit_gradient_map` from the curvature, :meth:`fit_general_map` as given) and what a
divergence halves (α, or the schedules' η).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from .budget import MIN_LANCZOS
from .config import SIDConfig
from .errors import ConfigurationError
from .estimation import CurvatureEstimate, CurvatureProbe
from .gauss_newton import linearised_note
from .maps import FixedPointMap
from .schedules import StepSchedule, make_schedule, theory_constants
from .validation import check_positive, check_real, is_real
from .watch import check_loaded_constants

log = logging.getLogger("hypertorch_sid")

NAMES = ("alpha", "L", "mu", "q")


class StepConstants:
    """α, L, μ, q, λ_min, δ and the curvature estimate they came from (module docstring).

    ``probe`` reads the curvature for the curvature strategy; ``first_hypergradient`` says whether
    the first estimate (at w₀) is to be read again at w_t.
    """

    def __init__(self, config: SIDConfig) -> None:
        self.config = config
        self.alpha, self.L, self.mu, self.q = self.given
        self.lambda_min: float | None = self.mu
        self.delta = 0.0
        self.estimate: CurvatureEstimate | None = None
        self.step_scale = 1.0  # BackOff's halvings of η for a general map
        self.top_tried = False  # Recover doubled L in this hyper step
        self.resolved = False
        self.pending_at_w_t = False  # the first estimate was at w₀: read again at w_t
        self._first = False
        self.phi: FixedPointMap | None = None
        self.probe: CurvatureProbe | None = None

    def bind(self, phi: FixedPointMap, probe: CurvatureProbe) -> None:
        """The map whose constants these are, and the probe reading its curvature."""
        self.phi, self.probe = phi, probe

    @property
    def given(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(α, L, μ, q) as configured: what a curvature refresh goes back to."""
        L, mu = self.config.curvature.given()
        return self.config.alpha, L, mu, self.config.q

    def _push(self) -> None:
        assert self.phi is not None
        self.phi.set_step(self.alpha, self.delta)

    # ------------------------------------------------------------------ before the solves
    def prepare(self, hyper_step: int, first_hypergradient: bool) -> None:
        """Go back to the given constants when the curvature strategy refreshes, and fit them
        where they are not set (before the first solve of a hyper step). A refresh the hyper
        step's allowance cannot pay for (a compute budget's) keeps the current estimate."""
        self.top_tried = False
        if self.config.curvature.needs_refresh(hyper_step) and self._refresh_fits():
            self.alpha, self.L, self.mu, self.q = self.given
            self.resolved = False
        if not self.resolved:
            self._first = first_hypergradient
            assert self.phi is not None
            self.phi.fit_constants(self)
            self.resolved = True  # once fitted: a fit that failed is tried again (session 64)

    def _refresh_fits(self) -> bool:
        """Whether the allowance pays for a refresh: its fewest Lanczos products (one batch)
        and the adjoint steps after it."""
        assert self.probe is not None
        products = MIN_LANCZOS + self.config.adjoint_steps
        return self.probe.allowance.affords(products)

    def fit_general_map(self) -> None:
        """A general map: δ without an estimate; q must be given for decreasing steps."""
        self.delta = self.config.damping.delta(None)
        self._push()
        if self.config.needs_q and self.q is None:
            raise ConfigurationError(
                "decreasing step sizes for a general fixed-point map need its contraction "
                "constant: pass q=... (or beta=... and gamma=...)."
            )

    def fit_gradient_map(self) -> None:
        """α, q, δ of the GD map from the given constants or the curvature strategy's estimate."""
        c = self.config
        if self.alpha is not None and (self.q is not None or not c.needs_q):
            self.delta = c.damping.delta(self.estimate)
            self._push()
            return
        current = None
        if self.L is not None and self.mu is not None:
            current = CurvatureEstimate(self.L, self.mu, False, 0, self.lambda_min)
        assert self.probe is not None
        est = c.curvature.estimate(self.probe, current)
        self.pending_at_w_t = est is not current and self._first and c.inner_steps > 0
        self.estimate = est
        self.delta = c.damping.delta(est)
        self.set_from_spectrum(est)

    def at_w_t(self) -> bool:
        """After the first inner solve: the curvature read again at w_t, merged so that α can
        only shrink and δ only grow (:meth:`Curvature.estimate_at_w_t`). Whether they changed."""
        if not self.pending_at_w_t:
            return False
        self.pending_at_w_t = False
        assert self.probe is not None
        est = self.config.curvature.estimate_at_w_t(self.probe, self.estimate)
        if est is None:
            return False
        self.estimate = est
        self.delta = max(self.delta, self.config.damping.delta(est))
        self.set_from_spectrum(est)
        return True

    def refresh_damping(self) -> None:
        """δ from the damping strategy again, for one whose δ follows the training
        (:class:`~.horizon.HorizonDamping`): as at :meth:`at_w_t` it only grows (an escalation by
        ``Recover`` is kept) and α, q follow it. Nothing before the first estimate."""
        est = self.estimate
        if est is None or not self.resolved:
            return
        delta = max(self.delta, self.config.damping.delta(est))
        if delta != self.delta:
            self.delta = delta
            self.set_from_spectrum(est)

    def set_from_spectrum(self, est: CurvatureEstimate) -> None:
        """α, q of the (damped) GD map from L̂, λ̂_min and δ (Cor. 4.3 on [λ_min + δ, L + δ])."""
        delta = self.delta
        lam_min = est.lambda_min if est.lambda_min is not None else est.mu
        low = (lam_min if delta > 0 else est.mu) + delta
        low = max(low, self.config.curvature.mu_floor * (est.L + delta))
        consts = theory_constants(
            est.L + delta, min(low, est.L + delta), self.config.sigma2, self.given[0]
        )
        self.L, self.mu, self.lambda_min = est.L, est.mu, lam_min
        self.alpha, self.q = consts.alpha, consts.q
        self._push()
        notes = ["the damped hypergradient, not the exact implicit one"] if delta > 0 else []
        notes += [n for n in [linearised_note(self.config.hvp)] if n]
        log.info(
            "hypertorch_sid: alpha = %.4g, q = %.4g (L = %.4g, lambda_min = %.4g, "
            "damping = %.4g)%s",
            self.alpha,
            self.q,
            self.L,
            lam_min,
            delta,
            "".join(f" - {note}" for note in notes),
        )

    def schedules(self) -> tuple[StepSchedule, StepSchedule]:
        """η_t of the inner and the adjoint solve (BackOff's halvings of η applied)."""
        c = self.config
        schedules = (
            make_schedule(kind, q=self.q, steps=steps, **c.schedule_args)
            for kind, steps in zip(c.schedule_kinds, (c.inner_steps, c.adjoint_steps))
        )
        return tuple(  # type: ignore[return-value]
            s if self.step_scale == 1.0 else s.scaled(self.step_scale) for s in schedules
        )

    # ------------------------------------------------------------------ after a divergence
    def halve_alpha(self) -> str:
        """BackOff on the GD map: α halved."""
        assert self.phi is not None
        self.alpha = self.phi.gradient_step_size() / 2  # type: ignore[operator]
        self._push()
        return f"backing off: halving alpha to {self.alpha:.3g}"

    def halve_eta(self) -> str:
        """BackOff on a general map: the schedules' η halved."""
        self.step_scale /= 2
        return f"backing off: halving the step sizes eta_t (now x{self.step_scale:.3g})"

    def recover(self) -> str:
        """Recover on the GD map: the curvature read again at the current w, then the remedy for
        the end of the spectrum that expanded.

        * The damping does not cover the new estimate's negative curvature (λ̂_min + δ ≤ 0), or
          nothing was estimated: δ raised (:meth:`~.damping.Damping.escalate`).
        * It does: the map expanded at the top — minibatches sharper than L̂ (on the digits MLP
          of ``examples/lightning_digits.py``: L̂ = 2.6, single minibatches up to 11.5) — so L is
          doubled (α halved) and δ kept, once per hyper step (a second retry raises δ: the
          estimate may have missed negative curvature). Raising δ there instead shortened the
          hypergradient's look-ahead for nothing (MNIST MLP, seeds 3 and 5: test loss +0.009).
        """
        assert self.phi is not None and self.probe is not None
        est = self.config.curvature.recover(self.probe, self.estimate)
        if est is None:
            alpha = self.phi.gradient_step_size()
            assert alpha is not None
            est = CurvatureEstimate(self.L or 1.0 / alpha, self.mu or 1e-4, True, 0)
        damping = self.config.damping
        covered = (
            self.estimate is not None
            and est.lambda_min is not None
            and est.lambda_min + max(self.delta, damping.delta(est)) > 0
        )
        if covered and not self.top_tried:  # once per hyper step; a second retry raises δ
            self.top_tried = True
            est = dataclasses.replace(est, L=2 * max(est.L, self.L or est.L))
            self.delta = max(self.delta, damping.delta(est))
            what = f"L doubled to {est.L:.3g} (minibatches sharper than the estimate)"
        else:
            self.delta = max(damping.escalate(self.delta, est), damping.delta(est))
            what = f"damping raised to {self.delta:.3g}"
        self.estimate = est
        self.set_from_spectrum(est)
        return f"{what}; alpha {self.alpha:.3g}"

    # ------------------------------------------------------------------ the user's constants
    def set_user(
        self, L: float | None, mu: float | None, alpha: float | None, q: float | None
    ) -> None:
        """:meth:`SIDHyperOptimizer.set_constants`, checked (see there)."""
        assert self.phi is not None and self.probe is not None
        self.phi.require_gradient_map("set_constants")
        if L is not None and mu is not None:
            consts = theory_constants(L, mu, self.config.sigma2, alpha)
            if q is not None and abs(q - consts.q) > 1e-12:
                raise ConfigurationError(
                    f"q={q!r} contradicts L, mu and alpha (which give q={consts.q:.6g}); "
                    "pass L and mu, or alpha and q, not both."
                )
            L, mu, alpha, q = consts.L, consts.mu, consts.alpha, consts.q
        else:
            for name, value in (("L", L), ("mu", mu), ("alpha", alpha)):
                if value is not None:
                    check_positive(name, value)
            contraction = "a contraction constant in [0, 1)"
            q = check_real("q", q, lambda x: 0 <= x < 1, contraction, allow_none=True)
            if alpha is not None and q is None and self.config.needs_q:  # was dropped (s56)
                raise ConfigurationError(
                    f"set_constants(alpha={alpha!r}) without q: the decreasing steps of "
                    f"step_size={self.config.step_size!r} need the contraction constant q as well, "
                    "and without it α would be replaced by the curvature estimate's at the next "
                    "hypergradient. Pass q= with alpha= (q = max|1 − αμ|, |1 − αL|), or L= and "
                    "mu= (α and q follow), or use step_size='constant'."
                )
        self.alpha, self.L, self.mu, self.q = alpha, L, mu, q
        if alpha is not None:
            self.phi.set_step(alpha, self.phi.damping)
        if L is not None or alpha is not None:  # the user's constants: the unpreconditioned map
            self.probe.set_scale(None)
        self.resolved = False

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "L": self.L,
            "mu": self.mu,
            "q": self.q,
            "lambda_min": self.lambda_min,
            "delta": self.delta,
        }

    @staticmethod
    def check_state(constants: Any) -> None:
        """Raise unless ``constants`` is a saved :meth:`state_dict`."""
        if (
            not isinstance(constants, dict)
            or not set(NAMES) <= set(constants)
            or not all(c is None or (is_real(c) and math.isfinite(c)) for c in constants.values())
        ):
            raise ConfigurationError(
                f"the saved constants must be a dict of {NAMES} holding finite numbers or None, "
                f"got {constants!r}."
            )
        check_loaded_constants(constants)  # in range and consistent, like given ones

    def load_state_dict(self, constants: dict[str, Any]) -> None:
        """Take checked constants (:meth:`check_state`)."""
        self.alpha, self.L, self.mu, self.q = (constants[n] for n in NAMES)
        self.lambda_min = constants.get("lambda_min", self.mu)
        self.delta = float(constants.get("delta") or 0.0)
        if self.probe is not None:  # Ritz vectors are not saved: the next estimate starts cold
            self.probe.forget()
        if self.L is not None and self.mu is not None:
            self.estimate = CurvatureEstimate(
                self.L, self.mu, False, 0, self.lambda_min if self.lambda_min is not None else None
            )
        self._push()
