"""``SIDHyperOptimizer``: Algorithm 1 (SID) with an outer torch optimizer, optimizer-style.

For every outer step, with w warm-started from the previous step:

1. inner solve  — w_t: t steps of w ← w + η_t (Φ̂(w, λ, ζ_t) − w)            (eq. inneralg)
2. adjoint solve — v_k: k steps of v ← v + η_k (∂₁Φ̂(w_t, λ, ζ̂_k)ᵀv + ∇₁E − v)  (eq. backalg)
   on fresh minibatches ζ̂ (drawn after the inner ones), warm-started from the last v;
3. assemble     — ∇̂f(λ) = ∇₂E(w_t, λ) + mean_j ∂₂Φ̂(w_t, λ, ζ_j)ᵀ v_k      (eq. gradestim)
4. outer step   — λ.grad ← ∇̂f(λ); ``outer_optimizer.step()``; λ ← P_Λ(λ).

Nothing non-finite is ever written to λ: a diverging solve raises :class:`DivergenceError` (or,
with ``backoff > 0``, is retried from its starting point with halved step sizes). A hypergradient
that fails for any reason (divergence, a bad batch, an interrupt) leaves w where it started.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .batches import BatchStream, batch_size, repeat
from .cost import Cost
from .damping import CurvatureDamping, Damping
from .divergence import BackOff, DivergenceGuard, DivergencePolicy, RaiseOnDivergence
from .errors import ConfigurationError, DivergenceError
from .estimation import (
    Curvature,
    CurvatureEstimate,
    EstimatedCurvature,
    KnownCurvature,
    estimate_curvature,
)
from .maps import (
    AveragedMap,
    ContractionMap,
    FixedPointMap,
    GradientDescentMap,
    ProximalGradientMap,
)
from .modes import frozen_mode
from .outer import outer_gradients
from .presets import get_preset
from .schedules import (
    StepSchedule,
    check_positive,
    check_schedule_kind,
    make_schedule,
    theory_constants,
)
from .solvers import (
    AdjointSolver,
    FixedPointIteration,
    SolveResult,
    assemble_hypergradient,
    inner_solve,
    norm,
)
from .validation import (
    as_tensor_list,
    check_batch_dtype,
    check_contraction,
    check_dependencies,
    check_not_compiled,
    check_outer_optimizer,
    check_parameters,
    check_steps,
    estimate_contraction,
)

log = logging.getLogger("hypertorch_sid")

Tensors = list[Tensor]


class SIDHyperOptimizer:
    """Stochastic implicit differentiation (Algorithm 1) driving a torch optimizer on λ.

    Parameters
    ----------
    hyperparameters, inner_parameters:
        λ and w: leaf tensors with ``requires_grad=True`` (lists, single tensors or
        ``module.parameters()``). The losses read them as closures.
    inner_loss:
        ``inner_loss(batch) -> scalar``: ℓ̂(w, λ; ζ) on a training minibatch. Defines the GD map
        Φ̂ = w − α∇₁ℓ̂. Not needed when ``fixed_point_map`` is given.
    outer_loss:
        ``outer_loss(batch) -> scalar``: E(w, λ) on validation data.
    outer_optimizer:
        Any ``torch.optim.Optimizer`` over the hyperparameters (may be None for
        :meth:`hypergradient` only).
    inner_steps, adjoint_steps:
        t ≥ 0 and k ≥ 1 of Algorithm 1.
    step_size, adjoint_step_size:
        ``"constant"`` (Thm 4.1), ``"decreasing"`` (Thm 4.2), ``"two_phase"`` or a
        :class:`StepSchedule`; the adjoint solve uses ``step_size`` unless told otherwise.
    alpha, eta, beta, gamma, switch:
        α of the GD map, η of constant steps, β, γ of decreasing steps, t₀ of two-phase steps
        (default: :func:`~hypertorch_sid.core.schedules.auto_switch`, min(t/2, ⌈7β⌉) per solve).
        Missing α, β, γ come from the theory (α = 2/(L+μ), β = 2/(1−q²), γ = β(1+σ₂)).
    L, mu, q, sigma2:
        Known constants. For the GD map, L and μ are estimated by power iteration when missing
        (logged); a general map needs ``q`` (or ``beta``) for decreasing steps.
    fixed_point_map:
        A :class:`FixedPointMap` or a callable ``phi(batch) -> list of tensors`` (a general
        contraction) to use instead of the GD map.
    penalty:
        ``penalty() -> list of tensors``: coefficients cᵢ(λ) ≥ 0 of a weighted L2 penalty
        ½ Σᵢ ⟨cᵢ, wᵢ²⟩ that ``inner_loss`` then leaves out. The map becomes the proximal gradient
        map Φ̂ = (w − α∇ĝ)/(1 + αc) (:class:`ProximalGradientMap`): same w(λ) and hypergradient,
        but α (estimated from ĝ's curvature alone) no longer has to shrink as λ grows.
    hvp:
        ``"reverse"`` or ``"forward"`` Hessian–vector products for the GD map (forward needs
        ``module``).
    module:
        The ``nn.Module`` owning w, if any: the adjoint solve then runs in ``mode`` with its
        buffers restored (see :mod:`hypertorch_sid.core.modes`), and ``hvp="forward"`` works.
    d2_batches:
        J, the number of fresh minibatches averaged in the ∂₂Φ̂ term, or ``"full"`` to use
        ``full_train_batch`` (the exact ∂₂Φ, removing Thm 3.4's variance floor).
    full_train_batch:
        One batch holding the whole training set: the deterministic map Φ for GD ("Batch")
        solves and ``d2_batches="full"``.
    inner_batches, adjoint_batches:
        ``"stochastic"`` (minibatches from ``train_batches``) or ``"full"`` (``full_train_batch``).
    warm_start_adjoint:
        Start each adjoint solve from the previous v_k (True) or from 0.
    projection:
        ``projection(hyperparameters)`` called in ``no_grad`` after each outer step to keep λ in
        Λ (e.g. ``lambda hs: hs[0].clamp_(min=0)``).
    feasible:
        ``feasible(hyperparameters) -> bool``, the membership test of Λ (e.g.
        ``lambda hs: bool((hs[0] >= 0).all())``). Checked on the initial λ and on loaded states
        (:class:`ConfigurationError` if outside) and after every outer step and projection (λ is
        restored and :class:`ConfigurationError` raised if the step left Λ).
    adjoint_solver:
        How the adjoint system is solved: :class:`~hypertorch_sid.core.solvers.FixedPointIteration`
        (default, the paper's eq. backalg with ``adjoint_step_size``) or
        :class:`~hypertorch_sid.core.solvers.ConjugateGradient`.
    curvature:
        Where L, μ, λ_min come from: :class:`~hypertorch_sid.core.estimation.KnownCurvature` or
        :class:`~hypertorch_sid.core.estimation.EstimatedCurvature` (Lanczos; the default, built
        from ``estimate_batches``, ``estimate_iters``, ``reestimate_every``; ``L=``/``mu=`` give a
        known one).
    damping:
        The shift δ of the damped adjoint system α(∇²₁₁ℓ + δI)v = ∇₁E
        (:mod:`~hypertorch_sid.core.damping`): :class:`CurvatureDamping` (default: δ from the
        estimated negative curvature — 0 on convex problems, so the paper's exact system; a
        contraction by construction on non-convex ones), :class:`NoDamping` or
        :class:`FixedDamping`.
    on_divergence:
        A :class:`~hypertorch_sid.core.divergence.DivergencePolicy`: ``RaiseOnDivergence()``
        (default), ``BackOff(n)`` (what ``backoff=n`` builds) or ``Recover(n)``. Divergence is
        detected within each solve and across hyper steps (:class:`DivergenceGuard`); λ is never
        written from a diverged step and the warm-start v is reset.
    backoff:
        Short for ``on_divergence=BackOff(backoff)``: retries with α (or η) halved; 0 raises.
    divergence_factor:
        A residual this many times larger than the first ones counts as divergence.
    estimate_batches, estimate_iters:
        Minibatches and power iterations used to estimate L, μ.
    reestimate_every:
        Re-estimate L, μ (hence α, q, β, γ) every this many outer steps, for λ that change the
        curvature (weight decay does: L and μ grow with λ). None: estimate once.
    mean_across_processes:
        For data parallel runs, a function averaging a tensor over processes (an all-reduce
        mean). Every Φ̂, Jacobian product and ∇E is averaged, so each process's minibatch is a
        shard of one global batch and λ stays identical everywhere.
    """

    def __init__(
        self,
        hyperparameters: Iterable[Tensor] | Tensor,
        inner_parameters: Iterable[Tensor] | Tensor,
        inner_loss: Callable[[Any], Tensor] | None = None,
        outer_loss: Callable[[Any], Tensor] | None = None,
        outer_optimizer: torch.optim.Optimizer | None = None,
        inner_steps: int = 100,
        adjoint_steps: int = 100,
        step_size: str | StepSchedule = "decreasing",
        adjoint_step_size: str | StepSchedule | None = None,
        *,
        alpha: float | None = None,
        eta: float | None = None,
        beta: float | None = None,
        gamma: float | None = None,
        switch: int | None = None,
        L: float | None = None,
        mu: float | None = None,
        q: float | None = None,
        sigma2: float = 0.0,
        fixed_point_map: FixedPointMap | Callable[[Any], Sequence[Tensor]] | None = None,
        penalty: Callable[[], Sequence[Tensor]] | None = None,
        hvp: str = "reverse",
        module: torch.nn.Module | None = None,
        mode: str = "train",
        d2_batches: int | str = 1,
        full_train_batch: Any = None,
        inner_batches: str = "stochastic",
        adjoint_batches: str = "stochastic",
        warm_start_adjoint: bool = True,
        projection: Callable[[Tensors], None] | None = None,
        feasible: Callable[[Tensors], bool] | None = None,
        backoff: int = 0,
        divergence_factor: float = 1e4,
        estimate_batches: int = 4,
        estimate_iters: int = 20,
        mean_across_processes: Callable[[Tensor], Tensor] | None = None,
        reestimate_every: int | None = None,
        adjoint_solver: AdjointSolver | None = None,
        curvature: Curvature | None = None,
        damping: Damping | None = None,
        on_divergence: DivergencePolicy | None = None,
    ) -> None:
        self.hyperparameters = as_tensor_list(hyperparameters, "hyperparameters")
        self.inner_parameters = as_tensor_list(inner_parameters, "inner_parameters")
        check_parameters(self.inner_parameters, self.hyperparameters)
        if outer_loss is None or not callable(outer_loss):
            raise ConfigurationError("outer_loss must be a callable outer_loss(batch) -> scalar.")
        self.outer_loss = outer_loss
        self.inner_loss = inner_loss
        if outer_optimizer is not None:
            check_outer_optimizer(outer_optimizer, self.inner_parameters, self.hyperparameters)
        self.outer_optimizer = outer_optimizer
        self.inner_steps = check_steps("inner_steps (t)", inner_steps, 0)
        self.adjoint_steps = check_steps("adjoint_steps (k)", adjoint_steps, 1)
        check_schedule_kind("step_size", step_size)
        if adjoint_step_size is not None:
            check_schedule_kind("adjoint_step_size", adjoint_step_size)
        self._step_kinds = (step_size, adjoint_step_size or step_size)
        self._schedule_args = dict(eta=eta, beta=beta, gamma=gamma, switch=switch, sigma2=sigma2)
        self.estimate_batches = check_steps("estimate_batches", estimate_batches, 1)
        self.estimate_iters = check_steps("estimate_iters", estimate_iters, 1)
        if reestimate_every is not None:
            check_steps("reestimate_every", reestimate_every, 1)
        self.reestimate_every = reestimate_every
        self.curvature = _curvature_strategy(
            curvature, L, mu, estimate_batches, estimate_iters, reestimate_every
        )
        self.damping = _check_strategy("damping", damping, Damping, CurvatureDamping())
        self.adjoint_solver = _check_strategy(
            "adjoint_solver", adjoint_solver, AdjointSolver, FixedPointIteration()
        )
        #: the one owner of α, L, μ, λ_min, q and the damping δ (see :meth:`constants`)
        self.alpha, self.L, self.mu, self.q = alpha, L, mu, q
        self.lambda_min: float | None = mu
        self.delta = 0.0
        self._given = (alpha, L, mu, q)
        if module is not None:
            check_not_compiled(module)
        self.module, self.mode = module, mode
        frozen_mode(None, mode).__enter__()  # validates ``mode``
        self.penalty = penalty
        self.phi = self._build_map(fixed_point_map, hvp)
        self.mean_across_processes = mean_across_processes
        self._solver_map: FixedPointMap = (
            AveragedMap(self.phi, mean_across_processes) if mean_across_processes else self.phi
        )
        self._check_batch_modes(d2_batches, full_train_batch, inner_batches, adjoint_batches)
        self.d2_batches = d2_batches
        self.full_train_batch = full_train_batch
        self.inner_batches, self.adjoint_batches = inner_batches, adjoint_batches
        self.warm_start_adjoint = warm_start_adjoint
        self.projection = projection
        self.feasible = feasible
        if feasible is not None and not self._is_feasible(self.hyperparameters):
            raise ConfigurationError(
                "the initial hyperparameters are outside the feasible set: "
                "feasible(hyperparameters) returned False. Initialise λ inside it (e.g. a weight "
                "decay ≥ 0), or learn an unconstrained parameterisation such as log λ."
            )
        self.backoff = check_steps("backoff", backoff, 0)
        default_policy = BackOff(self.backoff) if self.backoff else RaiseOnDivergence()
        if on_divergence is not None and self.backoff:
            raise ConfigurationError("give backoff=N or on_divergence=..., not both.")
        self.on_divergence = _check_strategy(
            "on_divergence", on_divergence, DivergencePolicy, default_policy
        )
        if not (isinstance(divergence_factor, (int, float)) and divergence_factor > 1):
            raise ConfigurationError(
                f"divergence_factor must be a number > 1, got {divergence_factor!r}."
            )
        self.divergence_factor = float(divergence_factor)
        self.guard = DivergenceGuard()
        self.curvature_estimate: CurvatureEstimate | None = None
        self._stream_now: BatchStream | None = None
        self.v: Tensors | None = None
        self.hyper_step = 0
        self.cost = Cost()
        self.last: dict[str, float] = {}
        self._checked = False
        self._resolved = False
        self._streams: dict[int, BatchStream] = {}

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_preset(
        cls,
        preset: str,
        *,
        total_epochs: float,
        n_train: int,
        batch_size: int,
        **kwargs: Any,
    ) -> SIDHyperOptimizer:
        """One of the paper's variants (``"batch"``, ``"stoch_dec"``, ... see ``PRESETS``).

        t and k follow the appendix's rule for ``total_epochs`` epochs of the hypergradient
        budget; full-batch (GD) phases need ``full_train_batch`` in ``kwargs``.
        """
        p = get_preset(preset)
        t, k = p.steps(total_epochs, n_train, batch_size)
        kwargs.update(
            inner_steps=t,
            adjoint_steps=k,
            step_size=p.inner.step_size,
            adjoint_step_size=p.adjoint.step_size,
            inner_batches="full" if p.inner.full_batch else "stochastic",
            adjoint_batches="full" if p.adjoint.full_batch else "stochastic",
        )
        if p.inner.step_size == "constant" or p.adjoint.step_size == "constant":
            kwargs.setdefault("eta", 1.0)
        return cls(**kwargs)

    def _build_map(self, fixed_point_map: Any, hvp: str) -> FixedPointMap:
        if fixed_point_map is None:
            if self.inner_loss is None or not callable(self.inner_loss):
                raise ConfigurationError(
                    "give inner_loss(batch) (for the gradient-descent map) or fixed_point_map."
                )
            # α may still be unknown: it is fixed (or estimated) at the first hypergradient.
            alpha = self.alpha if self.alpha is not None else 1.0
            if self.penalty is not None:
                return ProximalGradientMap(
                    self.inner_loss,
                    self.penalty,
                    self.inner_parameters,
                    self.hyperparameters,
                    alpha=alpha,
                    hvp=hvp,
                    module=self.module,
                )
            return GradientDescentMap(
                self.inner_loss,
                self.inner_parameters,
                self.hyperparameters,
                alpha=alpha,
                hvp=hvp,
                module=self.module,
            )
        if self.penalty is not None:
            raise ConfigurationError(
                "penalty builds the proximal gradient map; it cannot be combined with "
                "fixed_point_map (put the penalty inside your map instead)."
            )
        if isinstance(fixed_point_map, FixedPointMap):
            return fixed_point_map
        if callable(fixed_point_map):
            return ContractionMap(fixed_point_map, self.inner_parameters, self.hyperparameters)
        raise ConfigurationError("fixed_point_map must be a FixedPointMap or a callable.")

    def _check_batch_modes(self, d2: Any, full: Any, inner: str, adjoint: str) -> None:
        for name, value in (("inner_batches", inner), ("adjoint_batches", adjoint)):
            if value not in ("stochastic", "full"):
                raise ConfigurationError(f"{name} must be 'stochastic' or 'full', got {value!r}.")
        if d2 != "full":
            check_steps("d2_batches (J)", d2, 1)
        needs_full = d2 == "full" or "full" in (inner, adjoint)
        if needs_full and full is None:
            raise ConfigurationError(
                "full-batch solves (inner_batches/adjoint_batches='full', d2_batches='full' or a "
                "Batch preset) need full_train_batch=<one batch holding the whole training set>."
            )

    # ------------------------------------------------------------------ Algorithm 1
    def _stream(self, train_batches: Iterable[Any]) -> BatchStream:
        if isinstance(train_batches, BatchStream):
            return train_batches
        stream = self._streams.get(id(train_batches))
        if stream is None or stream.source is not train_batches:
            stream = BatchStream(train_batches, "train_batches")
            self._streams = {id(train_batches): stream}
        return stream

    def _source(self, kind: str, stream: BatchStream) -> BatchStream:
        if kind == "full":
            return BatchStream(repeat(self.full_train_batch), "full_train_batch")
        return stream

    def _needs_q(self) -> bool:
        kinds = [k for k in self._step_kinds if isinstance(k, str)]
        return self._schedule_args["beta"] is None and any(k != "constant" for k in kinds)

    def _estimate(self, stream: BatchStream) -> CurvatureEstimate:
        """L, λ_min at the current w, λ by Lanczos (:func:`estimate_curvature`), cost counted."""
        assert isinstance(self.curvature, EstimatedCurvature)
        batches = (
            [self.full_train_batch]
            if self.full_train_batch is not None
            else stream.take(self.curvature.batches)
        )
        known_mu = self.curvature_known_mu()
        phi: Any = self.phi
        if self.mean_across_processes is not None:  # Lanczos on the global (averaged) Hessian
            phi = _GlobalHessian(self.phi, self.mean_across_processes)
        with frozen_mode(self.module, self.mode):  # no BatchNorm statistics update
            est = estimate_curvature(
                phi,
                batches,
                self.curvature.iters,
                mu=known_mu,
                mu_floor=self.curvature.mu_floor,
                seed=self.hyper_step,
            )
        n = sum(batch_size(b) for b in batches)
        self.cost.curvature_samples += n * est.iterations
        self.cost.curvature_products += len(batches) * est.iterations
        self.cost.samples += n * est.iterations
        if est.uncertain and not est.convex:
            log.warning(
                "hypertorch_sid: the sign of lambda_min is uncertain (%.3g ± %.2g after %d Lanczos "
                "steps); raise EstimatedCurvature(iters=...) for a firmer estimate.",
                est.lambda_min,
                est.lambda_min_error,
                est.iterations,
            )
        return est

    def curvature_known_mu(self) -> float | None:
        """μ given by the user (``mu=`` alone), which the estimate then keeps."""
        return self._given[2]

    def _resolve_constants(self, stream: BatchStream, fresh: bool = False) -> None:
        """Fix α, q and the damping δ of the GD map from the user's values or the estimate.

        With L̂, λ̂_min from the curvature strategy and δ from the damping strategy, the damped
        system has spectrum [λ_min + δ, L + δ] and α = 2/(L + λ_min + 2δ), q from Cor. 4.3 on
        it. Without damping (δ = 0) on a convex problem this is the paper's α = 2/(L+μ).
        """
        self._resolved = True
        if not isinstance(self.phi, GradientDescentMap):
            self.delta = self.phi.damping = self.damping.delta(None)
            if self._needs_q() and self.q is None:
                raise ConfigurationError(
                    "decreasing step sizes for a general fixed-point map need its contraction "
                    "constant: pass q=... (or beta=... and gamma=...)."
                )
            return
        known = self.alpha is not None and (self.q is not None or not self._needs_q())
        if known and not fresh:
            self.phi.alpha = self.alpha
            self.delta = self.phi.damping = self.damping.delta(self.curvature_estimate)
            return
        if isinstance(self.curvature, KnownCurvature) and self.curvature.mu is not None:
            given = self.curvature
            est = CurvatureEstimate(
                given.L, max(given.mu, 1e-12 * given.L), given.mu <= 0, 0, given.mu
            )
        elif self.L is not None and self.mu is not None and not fresh:
            est = CurvatureEstimate(self.L, self.mu, False, 0, self.lambda_min)
        else:
            if isinstance(self.curvature, KnownCurvature):  # L known, μ estimated
                est = self._estimate_with(EstimatedCurvature(), stream)
                est = CurvatureEstimate(
                    self.curvature.L,
                    est.mu,
                    est.mu_floored,
                    est.iterations,
                    est.lambda_min,
                    est.lambda_min_error,
                )
            else:
                est = self._estimate(stream)
        self.curvature_estimate = est
        self.delta = (
            self.damping.delta(est) if not fresh else max(self.delta, self.damping.delta(est))
        )
        self._set_from_spectrum(est)

    def _estimate_with(
        self, curvature: EstimatedCurvature, stream: BatchStream
    ) -> CurvatureEstimate:
        saved, self.curvature = self.curvature, curvature
        try:
            return self._estimate(stream)
        finally:
            self.curvature = saved

    def _set_from_spectrum(self, est: CurvatureEstimate) -> None:
        """α, q of the (damped) GD map from L̂, λ̂_min and δ (Cor. 4.3 on [λ_min + δ, L + δ])."""
        assert isinstance(self.phi, GradientDescentMap)
        delta = self.delta
        lam_min = est.lambda_min if est.lambda_min is not None else est.mu
        low = (lam_min if delta > 0 else est.mu) + delta
        floor = self.curvature.mu_floor if isinstance(self.curvature, EstimatedCurvature) else 1e-4
        low = max(low, floor * (est.L + delta))
        consts = theory_constants(
            est.L + delta, min(low, est.L + delta), self._schedule_args["sigma2"], self._given[0]
        )
        self.L, self.mu, self.lambda_min = est.L, est.mu, lam_min
        self.alpha, self.q = consts.alpha, consts.q
        self.phi.alpha, self.phi.damping = consts.alpha, delta
        log.info(
            "hypertorch_sid: alpha = %.4g, q = %.4g (L = %.4g, lambda_min = %.4g, "
            "damping = %.4g)%s",
            self.alpha,
            self.q,
            self.L,
            lam_min,
            delta,
            " - the damped hypergradient, not the exact implicit one" if delta > 0 else "",
        )

    def set_constants(
        self,
        *,
        L: float | None = None,
        mu: float | None = None,
        alpha: float | None = None,
        q: float | None = None,
    ) -> None:
        """Replace the GD map's constants from the next hypergradient on.

        Use it when λ changes the curvature of ℓ(·, λ), so that L_λ, μ_λ and the contraction
        constant q_λ (assumption ass:aid (i)) move with λ — e.g. ``L = L_data + max λ``,
        ``mu = min λ`` for a weight decay λ:

        - ``L`` and ``mu``: α = 2/(L+μ), q = (L−μ)/(L+μ) and β, γ of the decreasing steps follow
          from the theory (Cor. 4.3); with ``alpha`` as well, q = max|1 − αμ|, |1 − αL|;
        - ``alpha`` (and ``q`` for decreasing steps) alone: used as given;
        - nothing: L and μ are re-estimated by power iteration at the current w.

        Checked at once (:class:`ConfigurationError` for a non-contraction). It replaces the
        constants until the next :meth:`set_constants` or ``reestimate_every`` refresh, which
        goes back to the constructor's values.
        """
        if not isinstance(self.phi, GradientDescentMap):
            raise ConfigurationError(
                "set_constants sets α, L, μ of the gradient-descent map; this optimizer uses a "
                "general fixed_point_map, whose contraction constant is fixed at construction."
            )
        if L is not None and mu is not None:
            consts = theory_constants(L, mu, self._schedule_args["sigma2"], alpha)
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
            if q is not None and not (isinstance(q, (int, float)) and 0 <= q < 1):
                raise ConfigurationError(f"q must be a contraction constant in [0, 1), got {q!r}.")
        self.alpha, self.L, self.mu, self.q = alpha, L, mu, q
        if alpha is not None:
            self.phi.alpha = alpha
        self._resolved = False

    def _schedules(self) -> tuple[StepSchedule, StepSchedule]:
        return tuple(  # type: ignore[return-value]
            make_schedule(kind, q=self.q, steps=steps, **self._schedule_args)
            for kind, steps in zip(self._step_kinds, (self.inner_steps, self.adjoint_steps))
        )

    def hypergradient(self, train_batches: Iterable[Any], val_batch: Any) -> Tensors:
        """∇̂f(λ) by Algorithm 1; updates w (warm start) and v, never λ.

        Parameters
        ----------
        train_batches:
            Training minibatches (a DataLoader, a list, an endless generator): the inner steps
            draw ζ_1..ζ_t, then the adjoint steps draw fresh ζ̂_1..ζ̂_k, then J more for ∂₂Φ̂.
        val_batch:
            A validation batch for E, or a DataLoader over the whole validation set (averaged).

        Returns
        -------
        A list of tensors shaped like the hyperparameters.
        """
        stream = self._stream(train_batches)
        if not self._checked:
            self._first_checks(stream)
            self._checked = True
        if self.curvature.needs_refresh(self.hyper_step):
            self.alpha, self.L, self.mu, self.q = self._given
            self._resolved = False
        if not self._resolved:
            self._resolve_constants(stream)
        self._stream_now = stream
        attempts = self.on_divergence.retries + 1
        for attempt in range(attempts):
            try:
                return self._algorithm1(stream, val_batch)
            except DivergenceError as err:
                if "adjoint" in err.quantity:  # a diverged v must not warm-start the next solve
                    self._reset_adjoint()
                if attempt == attempts - 1:
                    raise
                what = self.on_divergence.adapt(self, err)
                log.warning("hypertorch_sid: %s; v reset, %s; retrying", err, what)
        raise AssertionError("unreachable")  # pragma: no cover

    def _first_checks(self, stream: BatchStream) -> None:
        """Checks needing data, once: λ reaches ℓ̂, dtypes agree, a general map contracts."""
        first = self.full_train_batch if self.full_train_batch is not None else stream.take(1)[0]
        check_batch_dtype(first, self.inner_parameters)
        with frozen_mode(self.module, self.mode):  # no BatchNorm statistics update
            if isinstance(self.phi, GradientDescentMap):
                check_dependencies(
                    self.phi.loss, first, self.inner_parameters, self.hyperparameters
                )
            elif isinstance(self.phi, ContractionMap) and self.phi.damping == 0:
                q = estimate_contraction(
                    lambda b, v: self.phi.vjp(b, v)[0], self.inner_parameters, [first], iters=10
                )
                check_contraction(q, "fixed_point_map")
                self.cost.curvature_products += 10

    def _reset_adjoint(self) -> None:
        """Forget the warm-start v (and its growth budget): the next solve starts from 0."""
        self.v = None
        self.guard.reset()

    def _algorithm1(self, stream: BatchStream, val_batch: Any) -> Tensors:
        inner_schedule, adjoint_schedule = self._schedules()
        w0 = [w.detach().clone() for w in self.inner_parameters]
        try:
            inner = inner_solve(
                self._solver_map,
                self._source(self.inner_batches, stream),
                self.inner_steps,
                inner_schedule,
                self.cost,
                self.divergence_factor,
            )
            with frozen_mode(self.module, "eval"):
                g_w, g_lam, value = outer_gradients(
                    self.outer_loss, val_batch, self.inner_parameters, self.hyperparameters
                )
            if self.mean_across_processes is not None:
                g_w = [self.mean_across_processes(g) for g in g_w]
                g_lam = [self.mean_across_processes(g) for g in g_lam]
                value = float(self.mean_across_processes(torch.tensor(value, dtype=g_w[0].dtype)))
            warm = self.warm_start_adjoint and self.v is not None
            v0 = self.v if warm else [torch.zeros_like(g) for g in g_w]
            with frozen_mode(self.module, self.mode):
                v, adjoint = self.adjoint_solver.solve(
                    self._solver_map,
                    g_w,
                    v0,
                    self._source(self.adjoint_batches, stream),
                    self.adjoint_steps,
                    adjoint_schedule,
                    self.cost,
                    self.divergence_factor,
                    self.full_train_batch,
                )
                d2_batches = (
                    [self.full_train_batch]
                    if self.d2_batches == "full"
                    else stream.take(int(self.d2_batches))
                )
                hypergrad = assemble_hypergradient(
                    self._solver_map, v, g_lam, d2_batches, self.cost
                )
            if not all(torch.isfinite(g).all() for g in hypergrad):
                raise DivergenceError(
                    "hypergradient",
                    None,
                    norm(hypergrad),
                    "λ was left unchanged. The solves' residuals were finite, so ∂₂Φ̂ᵀv or ∇₂E "
                    "overflowed: check the losses and the training data for NaN/Inf.",
                )
            etas = (
                sum(adjoint_schedule(t) for t in range(self.adjoint_steps))
                if isinstance(self.adjoint_solver, FixedPointIteration)
                else math.inf  # CG's v = A⁻¹∇₁E has no non-expansive budget
            )
            self.guard.check(
                v_norm=norm(v),
                v0_norm=norm(v0),
                grad_norm=norm(g_w),
                etas=etas,
                residual=adjoint.residual,
                first_residual=adjoint.first_residual,
                hypergradient_norm=norm(hypergrad),
            )
        except BaseException:  # w as it was: a failed hypergradient leaves no partial state
            with torch.no_grad():
                for w, w_start in zip(self.inner_parameters, w0):
                    w.copy_(w_start)
            raise
        self.v = v
        self.guard.accept(norm(hypergrad))
        self.cost.hypergradients += 1
        self._record(inner, adjoint, hypergrad, value, norm(g_w), norm(v))
        return hypergrad

    def _halve_step(self) -> str:
        """BackOff: halve α of the GD map (or η of the schedules of a general map)."""
        if isinstance(self.phi, GradientDescentMap):
            self.alpha = self.phi.alpha = self.phi.alpha / 2
            return f"backing off: halving alpha to {self.alpha:.3g}"
        eta = self._schedule_args.get("eta") or 1.0
        self._schedule_args["eta"] = eta / 2
        self._step_kinds = tuple(  # type: ignore[assignment]
            s.scaled(0.5) if isinstance(s, StepSchedule) else s for s in self._step_kinds
        )
        return f"backing off: halving eta to {eta / 2:.3g}"

    def _recover(self) -> str:
        """Recover: re-estimate L, λ_min at the current w and raise the damping δ."""
        if not isinstance(self.phi, GradientDescentMap):
            return self._halve_step()
        est = self.curvature_estimate
        if isinstance(self.curvature, EstimatedCurvature):
            est = self._estimate(self._stream_now)
        elif est is None:
            est = CurvatureEstimate(self.L or 1.0 / self.phi.alpha, self.mu or 1e-4, True, 0)
        self.curvature_estimate = est
        self.delta = max(self.damping.escalate(self.delta, est), self.damping.delta(est))
        self._set_from_spectrum(est)
        return f"damping raised to {self.delta:.3g} (alpha {self.alpha:.3g})"

    def _record(
        self,
        inner: SolveResult,
        adjoint: SolveResult,
        g: Tensors,
        value: float,
        grad_norm: float,
        v_norm: float,
    ) -> None:
        est = self.curvature_estimate
        self.last = {
            "relative_adjoint_residual": adjoint.residual / max(grad_norm, 1e-30),
            "v_norm": v_norm,
            "damping": float(self.delta),
            "L": float(self.L) if self.L is not None else math.nan,
            "lambda_min": float(est.lambda_min) if est and est.lambda_min is not None else math.nan,
            "outer_loss": value,
            "hypergradient_norm": norm(g),
            "inner_residual": inner.residual,
            "adjoint_residual": adjoint.residual,
            "inner_eta": inner.eta,
            "adjoint_eta": adjoint.eta,
            "alpha": float(self.alpha) if self.alpha is not None else math.nan,
            "samples": float(self.cost.samples),
        }

    def step(self, train_batches: Iterable[Any], val_batch: Any) -> Tensors:
        """Compute ∇̂f(λ), write it to ``λ.grad``, step the outer optimizer, project λ."""
        if self.outer_optimizer is None:
            raise ConfigurationError("step() needs outer_optimizer; use hypergradient() without.")
        hypergrad = self.hypergradient(train_batches, val_batch)
        self.apply(hypergrad)
        return hypergrad

    def apply(self, hypergrad: Sequence[Tensor]) -> None:
        """λ.grad ← ∇̂f(λ), outer step, projection; λ is restored if the step is not finite.

        A non-finite ``hypergrad`` raises :class:`DivergenceError` before the outer optimizer
        sees it (its state, e.g. Adam's moments, stays finite); a step that leaves the feasible
        set (``feasible``) restores λ and raises :class:`ConfigurationError`.
        """
        if self.outer_optimizer is None:
            raise ConfigurationError("apply() needs outer_optimizer (the optimizer over λ).")
        if not all(torch.isfinite(g).all() for g in hypergrad):
            raise DivergenceError(
                "hypergradient",
                self.hyper_step,
                norm(hypergrad),
                "λ and the outer optimizer were left unchanged. Check the losses for NaN/Inf.",
            )
        before = [h.detach().clone() for h in self.hyperparameters]
        for h, g in zip(self.hyperparameters, hypergrad):
            h.grad = g.detach().clone()
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            if self.projection is not None:
                self.projection(self.hyperparameters)
            if not all(torch.isfinite(h).all() for h in self.hyperparameters):
                for h, b in zip(self.hyperparameters, before):
                    h.copy_(b)
                raise DivergenceError(
                    "hyperparameters",
                    self.hyper_step,
                    math.inf,
                    "The outer step produced non-finite λ; λ was restored. Lower the outer "
                    "learning rate.",
                )
            if self.feasible is not None and not self._is_feasible(self.hyperparameters):
                for h, b in zip(self.hyperparameters, before):
                    h.copy_(b)
                raise ConfigurationError(
                    f"the outer step {self.hyper_step} left the feasible set (feasible("
                    "hyperparameters) returned False); λ was restored. Pass a projection onto the "
                    "set (e.g. projection=lambda hs: hs[0].clamp_(min=0)) or learn an "
                    "unconstrained parameterisation such as log λ."
                )
        self.hyper_step += 1

    def _is_feasible(self, hyperparameters: Sequence[Tensor]) -> bool:
        assert self.feasible is not None
        with torch.no_grad():
            return bool(self.feasible(list(hyperparameters)))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: λ, outer optimizer state, warm-start v, constants, cost."""
        return {
            "hyperparameters": [h.detach().clone() for h in self.hyperparameters],
            "outer_optimizer": (
                copy.deepcopy(self.outer_optimizer.state_dict())
                if self.outer_optimizer is not None
                else None
            ),
            "v": [x.clone() for x in self.v] if self.v is not None else None,
            "hyper_step": self.hyper_step,
            "constants": {
                "alpha": self.alpha,
                "L": self.L,
                "mu": self.mu,
                "q": self.q,
                "lambda_min": self.lambda_min,
                "delta": self.delta,
            },
            "guard": self.guard.state_dict(),
            "cost": self.cost.as_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (λ in place, on their current device).

        Every entry is validated before anything changes: a truncated, corrupted or foreign state
        raises :class:`ConfigurationError` and leaves this optimizer (λ, v, the outer optimizer,
        constants, cost) exactly as it was.
        """
        if not isinstance(state, dict):
            raise ConfigurationError(
                f"a SIDHyperOptimizer state is a dict, got {type(state).__name__}."
            )
        required = {"hyperparameters", "outer_optimizer", "v", "hyper_step", "constants", "cost"}
        missing = required - set(state)
        if missing:
            raise ConfigurationError(
                f"not a SIDHyperOptimizer state: keys {sorted(missing)} are missing (truncated or "
                "foreign checkpoint?)."
            )
        saved = _saved_tensors("hyperparameters", state["hyperparameters"], self.hyperparameters)
        if self.feasible is not None and not self._is_feasible(saved):
            raise ConfigurationError(
                "the saved hyperparameters are outside the feasible set (feasible() returned "
                "False): the checkpoint does not belong to this problem."
            )
        v = (
            _saved_tensors("v", state["v"], self.inner_parameters)
            if state["v"] is not None
            else None
        )
        hyper_step = state["hyper_step"]
        if isinstance(hyper_step, bool) or not isinstance(hyper_step, int) or hyper_step < 0:
            raise ConfigurationError(
                f"the saved hyper_step must be an integer ≥ 0, got {hyper_step!r}."
            )
        constants = state["constants"]
        names = ("alpha", "L", "mu", "q")
        if (
            not isinstance(constants, dict)
            or not set(names) <= set(constants)
            or not all(c is None or (_is_real(c) and math.isfinite(c)) for c in constants.values())
        ):
            raise ConfigurationError(
                f"the saved constants must be a dict of {names} holding finite numbers or None, "
                f"got {constants!r}."
            )
        cost = state["cost"]
        fields = set(Cost().as_dict())
        if (
            not isinstance(cost, dict)
            or not set(cost) <= fields
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in cost.values())
        ):
            raise ConfigurationError(
                f"the saved cost must be a dict of integer counters among {sorted(fields)}, got "
                f"{cost!r}."
            )
        if "guard" in state:
            DivergenceGuard().load_state_dict(state["guard"])  # validates only
        if state["outer_optimizer"] is not None and self.outer_optimizer is not None:
            self._load_outer_optimizer(state["outer_optimizer"])
        with torch.no_grad():
            for h, x in zip(self.hyperparameters, saved):
                h.copy_(x)
        like = self.inner_parameters
        self.v = (
            [x.to(device=w.device, dtype=w.dtype) for x, w in zip(v, like)]
            if v is not None
            else None
        )
        self.hyper_step = hyper_step
        if "guard" in state:
            self.guard.load_state_dict(state["guard"])
        self.alpha, self.L, self.mu, self.q = (constants[n] for n in names)
        self.lambda_min = constants.get("lambda_min", self.mu)
        self.delta = float(constants.get("delta") or 0.0)
        self.phi.damping = self.delta
        if self.L is not None and self.mu is not None:
            self.curvature_estimate = CurvatureEstimate(
                self.L, self.mu, False, 0, self.lambda_min if self.lambda_min is not None else None
            )
        if isinstance(self.phi, GradientDescentMap) and self.alpha is not None:
            self.phi.alpha = self.alpha
        self.cost.load(cost)
        # the saved run checked inner_loss's dependencies at its first hypergradient; checking
        # again would draw one more batch (and dropout mask) than the uninterrupted run did
        self._checked = self._checked or self.cost.hypergradients > 0

    def _load_outer_optimizer(self, saved: Any) -> None:
        """Load the outer optimizer's state, or raise with the optimizer as it was."""
        assert self.outer_optimizer is not None
        tensors = [
            x
            for per_param in (saved.get("state", {}) if isinstance(saved, dict) else {}).values()
            if isinstance(per_param, dict)
            for x in per_param.values()
            if isinstance(x, Tensor)
        ]
        if not all(torch.isfinite(x).all() for x in tensors):
            raise ConfigurationError(
                "the saved outer_optimizer state holds non-finite values (NaN/Inf); refusing to "
                "load it."
            )
        _check_outer_state_shapes(self.outer_optimizer, saved)
        backup = copy.deepcopy(self.outer_optimizer.state_dict())
        try:
            self.outer_optimizer.load_state_dict(saved)
        except Exception as err:
            self.outer_optimizer.load_state_dict(backup)
            raise ConfigurationError(
                f"the saved outer_optimizer state does not fit outer_optimizer "
                f"({type(self.outer_optimizer).__name__} over these hyperparameters): {err}"
            ) from err


def _check_outer_state_shapes(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """torch's own optimizers keep scalars or tensors shaped like the parameter per parameter.

    ``Optimizer.load_state_dict`` does not check these shapes: a moment of another shape loads and
    fails (or broadcasts) only at the next outer step. Optimizers from elsewhere, and torch's
    ``LBFGS``/``Adafactor`` (other per-parameter shapes), are not checked here.
    """
    kind = type(optimizer)
    if not kind.__module__.startswith("torch.optim.") or kind.__name__ in ("LBFGS", "Adafactor"):
        return
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return  # load_state_dict reports it
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return
    ids = [i for g in groups for i in g.get("params", [])]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(ids) != len(params):
        return  # load_state_dict reports it
    shapes = dict(zip(ids, (p.shape for p in params)))
    for i, per_param in saved["state"].items():
        if i not in shapes or not isinstance(per_param, dict):
            continue
        for name, x in per_param.items():
            if isinstance(x, Tensor) and x.dim() > 0 and x.shape != shapes[i]:
                raise ConfigurationError(
                    f"the saved outer_optimizer state {name!r} of hyperparameter {i} has shape "
                    f"{tuple(x.shape)}, the hyperparameter {tuple(shapes[i])}: the checkpoint is "
                    "corrupted or belongs to another model."
                )


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _saved_tensors(name: str, saved: Any, like: Sequence[Tensor]) -> Tensors:
    """``saved`` as a list of finite tensors shaped like ``like``, or ConfigurationError."""
    if not isinstance(saved, (list, tuple)) or not all(isinstance(x, Tensor) for x in saved):
        raise ConfigurationError(
            f"the saved {name} must be a list of tensors, got {type(saved).__name__}."
        )
    shapes, expected = [tuple(x.shape) for x in saved], [tuple(x.shape) for x in like]
    if shapes != expected:
        raise ConfigurationError(
            f"the saved {name} have shapes {shapes}, these have {expected}: the checkpoint is "
            "truncated or belongs to another model."
        )
    if not all(torch.isfinite(x).all() for x in saved):
        raise ConfigurationError(f"the saved {name} hold non-finite values (NaN/Inf).")
    return list(saved)


def _check_strategy(name: str, value: Any, kind: type, default: Any) -> Any:
    """``value`` if it is a ``kind`` strategy object, ``default`` if None, else a clear error."""
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ConfigurationError(
            f"{name} must be a {kind.__name__} object (e.g. {type(default).__name__}()), got "
            f"{type(value).__name__}."
        )
    return value


def _curvature_strategy(
    curvature: Curvature | None,
    L: float | None,
    mu: float | None,
    batches: int,
    iters: int,
    every: int | None,
) -> Curvature:
    """The curvature strategy: the object given, or the one the flat arguments describe."""
    if curvature is not None:
        if L is not None or mu is not None:
            raise ConfigurationError("give L=/mu= or curvature=..., not both.")
        return _check_strategy("curvature", curvature, Curvature, None)
    if L is not None:
        check_positive("L", L)
        if mu is not None:
            check_positive("mu", mu)
        return KnownCurvature(L, mu)
    return EstimatedCurvature(batches=batches, iters=iters, every=every)


class _GlobalHessian:
    """Hessian–vector products averaged across processes: one curvature estimate everywhere."""

    def __init__(self, phi: GradientDescentMap, mean: Callable[[Tensor], Tensor]) -> None:
        self.phi, self.mean = phi, mean
        self.inner_parameters = phi.inner_parameters

    def hessian_vector_product(self, batch: Any, v: Sequence[Tensor]) -> Tensors:
        return [self.mean(h) for h in self.phi.hessian_vector_product(batch, v)]
