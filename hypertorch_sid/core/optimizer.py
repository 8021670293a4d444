"""``SIDHyperOptimizer``: Algorithm 1 (SID) with an outer torch optimizer, optimizer-style.

For every outer step, with w warm-started from the previous step:

1. inner solve  — w_t: t steps of w ← w + η_t (Φ̂(w, λ, ζ_t) − w)            (eq. inneralg)
2. adjoint solve — v_k: k steps of v ← v + η_k (∂₁Φ̂(w_t, λ, ζ̂_k)ᵀv + ∇₁E − v)  (eq. backalg)
   on fresh minibatches ζ̂ (drawn after the inner ones), warm-started from the last v;
   at the first step the estimated curvature is read again at w_t, where this system is posed
   (the estimate before step 1 was at the user's w₀), and merged so that α can only shrink;
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

from .batches import BatchStream, batch_size, head, repeat
from .config import SIDConfig
from .cost import Cost
from .damping import NoDamping
from .divergence import DivergenceGuard, Recover
from .errors import ConfigurationError, DivergenceError
from .estimation import (
    CurvatureEstimate,
    EstimatedCurvature,
    KnownCurvature,
    estimate_curvature,
)
from .gauss_newton import GaussNewton
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
    make_schedule,
    theory_constants,
)
from .second_order import (
    NO_SECOND_DERIVATIVE,
    check_second_derivatives,
    not_twice_differentiable,
    twice_differentiable,
)
from .solvers import (
    AdjointSolver,
    FixedPointIteration,
    SolveResult,
    assemble_hypergradient,
    check_exact_hyper_vjp,
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
    estimate_contraction,
)

log = logging.getLogger("hypertorch_sid")

#: samples of a given full batch the first checks run on (≥ 2: BatchNorm in train mode)
_CHECK_SAMPLES = 8
#: a stalled first inner solve: steps shrank this many times, ℓ̂ fell by less than this fraction
_STALL_SHRINK, _STALL_DROP = 10.0, 0.1

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
    config:
        A :class:`~hypertorch_sid.core.config.SIDConfig`: how Algorithm 1 runs (t, k, schedules,
        constants, and the strategies ``curvature``, ``damping``, ``adjoint_solver``,
        ``on_divergence``, ``feasible_set``, ``batches``). Default: ``SIDConfig()``.
    fixed_point_map:
        A :class:`FixedPointMap` or a callable ``phi(batch) -> list of tensors`` (a general
        contraction) to use instead of the GD map.
    penalty:
        ``penalty() -> list of tensors``: coefficients cᵢ(λ) ≥ 0 of a weighted L2 penalty
        ½ Σᵢ ⟨cᵢ, wᵢ²⟩ that ``inner_loss`` then leaves out. The map becomes the proximal gradient
        map Φ̂ = (w − α∇ĝ)/(1 + αc) (:class:`ProximalGradientMap`): same w(λ) and hypergradient,
        but α (estimated from ĝ's curvature alone) no longer has to shrink as λ grows.
    regularizer:
        ``regularizer() -> scalar``: R(w, λ), the part of ``inner_loss`` through which λ enters,
        when the rest of it does not read λ (ℓ̂ = ℓ(w; ζ) + R(w, λ): weight decay). The cross
        term of eq. gradestim is then exact from R alone, ∂₂Φ̂ᵀv = −α∇²₂₁R v: no minibatch is
        read for it and ``d2_batches`` are not used. Checked against one minibatch at the first
        hypergradient (a :class:`ConfigurationError` if the data term reads λ after all).
    module:
        The ``nn.Module`` owning w, if any: the solves then run in ``config.mode`` with its
        buffers restored (see :mod:`hypertorch_sid.core.modes`), and ``hvp="forward"`` works.
    full_train_batch:
        One batch holding the whole training set: the deterministic map Φ for GD ("Batch")
        solves, ``d2_batches="full"`` and the curvature estimate.
    mean_across_processes:
        For data parallel runs, a function averaging a tensor over processes (an all-reduce
        mean). Every Φ̂, Jacobian product and ∇E is averaged, so each process's minibatch is a
        shard of one global batch and λ stays identical everywhere.
    **settings:
        Fields of :class:`SIDConfig` changed from ``config`` — the short path of the README:
        ``inner_steps=``, ``adjoint_steps=``, ``step_size=``, ``alpha=`` ... — and the flat names
        of version 0.1 (``L``, ``mu``, ``backoff``, ``projection``, ``feasible``,
        ``d2_batches``, ``estimate_batches`` ...), each turned into its strategy by
        :meth:`SIDConfig.from_settings`. Validated once, at construction.

    Divergence is detected within each solve and across hyper steps (:class:`DivergenceGuard`);
    λ is never written from a diverged step and the warm-start v is reset.
    """

    def __init__(
        self,
        hyperparameters: Iterable[Tensor] | Tensor,
        inner_parameters: Iterable[Tensor] | Tensor,
        inner_loss: Callable[[Any], Tensor] | None = None,
        outer_loss: Callable[[Any], Tensor] | None = None,
        outer_optimizer: torch.optim.Optimizer | None = None,
        *,
        config: SIDConfig | None = None,
        fixed_point_map: FixedPointMap | Callable[[Any], Sequence[Tensor]] | None = None,
        penalty: Callable[[], Sequence[Tensor]] | None = None,
        regularizer: Callable[[], Tensor] | None = None,
        module: torch.nn.Module | None = None,
        full_train_batch: Any = None,
        mean_across_processes: Callable[[Tensor], Tensor] | None = None,
        **settings: Any,
    ) -> None:
        self.config = SIDConfig.from_settings(config, **settings)
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
        #: the one owner of α, L, μ, λ_min, q and the damping δ (set from the config, the
        #: curvature estimate, :meth:`set_constants` or a loaded state)
        self.alpha, self.L, self.mu, self.q = self._given
        self.lambda_min: float | None = self.mu
        self.delta = 0.0
        self._step_scale = 1.0  # BackOff's halvings of η for a general map
        if module is not None:
            check_not_compiled(module)
            check_second_derivatives(module, self.inner_parameters)
        self.module = module
        self.penalty = penalty
        self.regularizer = regularizer
        self.phi = self._build_map(fixed_point_map)
        self.mean_across_processes = mean_across_processes
        self._solver_map: FixedPointMap = (
            AveragedMap(self.phi, mean_across_processes) if mean_across_processes else self.phi
        )
        if self.config.batches.needs_full and full_train_batch is None:
            raise ConfigurationError(
                "full-batch solves (inner_batches/adjoint_batches='full', d2_batches='full' or a "
                "Batch preset) need full_train_batch=<one batch holding the whole training set>."
            )
        self.full_train_batch = full_train_batch
        curvature = self.config.curvature
        if isinstance(curvature, EstimatedCurvature) and curvature.batches == "full":
            if full_train_batch is None:
                raise ConfigurationError(
                    "EstimatedCurvature(batches='full') needs full_train_batch=<one batch holding "
                    "the whole training set>; or give a number of minibatches."
                )
        if not self._is_feasible(self.hyperparameters):
            raise ConfigurationError(
                "the initial hyperparameters are outside the feasible set: "
                "feasible(hyperparameters) returned False. Initialise λ inside it (e.g. a weight "
                "decay ≥ 0), or learn an unconstrained parameterisation such as log λ."
            )
        self.guard = DivergenceGuard()
        self.curvature_estimate: CurvatureEstimate | None = None
        self._stream_now: BatchStream | None = None
        self.v: Tensors | None = None
        self.hyper_step = 0
        self.cost = Cost()
        self.last: dict[str, float] = {}
        self._checked = False
        self._resolved = False
        self._estimate_at_w_t_pending = False  # the first estimate was at w₀: read again at w_t
        self._probe_batch: Any = None  # the first checks' batch: ℓ̂ before/after the first solve
        self._streams: dict[int, BatchStream] = {}
        #: the solver that ran the last adjoint solve (``config.adjoint_solver`` or, for
        #: ``Automatic``, the one it chose)
        self.adjoint_solver_used: AdjointSolver | None = None

    # ------------------------------------------------------------------ the configuration
    @property
    def _given(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(α, L, μ, q) as configured: what a curvature refresh goes back to."""
        c = self.config
        L = c.curvature.L if isinstance(c.curvature, KnownCurvature) else None
        mu = getattr(c.curvature, "mu", None)
        return c.alpha, L, mu, c.q

    @property
    def inner_steps(self) -> int:
        """t of Algorithm 1 (``config.inner_steps``)."""
        return self.config.inner_steps

    @property
    def adjoint_steps(self) -> int:
        """k of Algorithm 1 (``config.adjoint_steps``)."""
        return self.config.adjoint_steps

    @property
    def inner_batches(self) -> str:
        """Where the inner solve draws its batches (``config.batches.inner``)."""
        return self.config.batches.inner

    @property
    def adjoint_batches(self) -> str:
        """Where the adjoint solve draws its batches (``config.batches.adjoint``)."""
        return self.config.batches.adjoint

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
        budget; full-batch (GD) phases need ``full_train_batch`` in ``kwargs``. Settings in
        ``kwargs`` override the preset's.
        """
        settings = get_preset(preset).settings(total_epochs, n_train, batch_size)
        for name, value in settings.items():
            kwargs.setdefault(name, value)
        return cls(**kwargs)

    def _build_map(self, fixed_point_map: Any) -> FixedPointMap:
        if fixed_point_map is None:
            if self.inner_loss is None or not callable(self.inner_loss):
                raise ConfigurationError(
                    "give inner_loss(batch) (for the gradient-descent map) or fixed_point_map."
                )
            # α may still be unknown: it is fixed (or estimated) at the first hypergradient.
            alpha = self.alpha if self.alpha is not None else 1.0
            if self.penalty is not None:
                if self.regularizer is not None:
                    raise ConfigurationError(
                        "penalty (the proximal map's c(λ), left out of inner_loss) and regularizer "
                        "(the λ-dependent part of inner_loss) exclude each other: give one."
                    )
                return ProximalGradientMap(
                    self.inner_loss,
                    self.penalty,
                    self.inner_parameters,
                    self.hyperparameters,
                    alpha=alpha,
                    hvp=self.config.hvp,
                    module=self.module,
                )
            return GradientDescentMap(
                self.inner_loss,
                self.inner_parameters,
                self.hyperparameters,
                alpha=alpha,
                hvp=self.config.hvp,
                module=self.module,
                regularizer=self.regularizer,
            )
        if self.regularizer is not None:
            raise ConfigurationError(
                "regularizer is the λ-dependent part of inner_loss (the gradient-descent map); "
                "it cannot be combined with fixed_point_map."
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

    def _curvature_batches(self, stream: BatchStream, curvature: EstimatedCurvature) -> list[Any]:
        """The batches a curvature estimate reads: ``curvature.batches`` fresh minibatches, or the
        full batch where those would read as many samples or ``batches="full"`` asks for it (20
        Lanczos products on the full batch cost 20 epochs: more than a whole solve at n = 5000
        in ``benchmarks/bench_peers.py``)."""
        if curvature.batches == "full":
            return [self.full_train_batch]
        full = self.full_train_batch
        batches: list[Any] = []
        samples = 0
        for _ in range(int(curvature.batches)):
            batches.append(next(stream))
            samples += batch_size(batches[-1])
            if full is not None and samples >= batch_size(full):
                return [full]
        return batches

    def _estimate(
        self,
        stream: BatchStream,
        curvature: EstimatedCurvature | None = None,
        batches: list[Any] | None = None,
    ) -> CurvatureEstimate:
        """L, λ_min at the current w, λ by Lanczos (:func:`estimate_curvature`), cost counted."""
        curvature = curvature or self.config.curvature
        assert isinstance(curvature, EstimatedCurvature)
        if batches is None:
            batches = self._curvature_batches(stream, curvature)
        known_mu = self._given[2]
        phi: Any = self.phi
        if self.mean_across_processes is not None:  # Lanczos on the global (averaged) Hessian
            phi = _GlobalHessian(self.phi, self.mean_across_processes)
        with frozen_mode(self.module, self.config.mode):  # no BatchNorm statistics update
            est = estimate_curvature(
                phi,
                batches,
                curvature.iters,
                mu=known_mu,
                mu_floor=curvature.mu_floor,
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

    def _resolve_constants(self, stream: BatchStream, fresh: bool = False) -> None:
        """Fix α, q and the damping δ of the GD map from the user's values or the estimate.

        With L̂, λ̂_min from the curvature strategy and δ from the damping strategy, the damped
        system has spectrum [λ_min + δ, L + δ] and α = 2/(L + λ_min + 2δ), q from Cor. 4.3 on
        it. Without damping (δ = 0) on a convex problem this is the paper's α = 2/(L+μ).
        """
        self._resolved = True
        damping, curvature = self.config.damping, self.config.curvature
        if not isinstance(self.phi, GradientDescentMap):
            self.delta = self.phi.damping = damping.delta(None)
            if self.config.needs_q and self.q is None:
                raise ConfigurationError(
                    "decreasing step sizes for a general fixed-point map need its contraction "
                    "constant: pass q=... (or beta=... and gamma=...)."
                )
            return
        known = self.alpha is not None and (self.q is not None or not self.config.needs_q)
        if known and not fresh:
            self.phi.alpha = self.alpha
            self.delta = self.phi.damping = damping.delta(self.curvature_estimate)
            return
        if isinstance(curvature, KnownCurvature) and curvature.mu is not None:
            given = curvature
            est = CurvatureEstimate(
                given.L, max(given.mu, 1e-12 * given.L), given.mu <= 0, 0, given.mu
            )
        elif self.L is not None and self.mu is not None and not fresh:
            est = CurvatureEstimate(self.L, self.mu, False, 0, self.lambda_min)
        else:
            if isinstance(curvature, KnownCurvature):  # L known, μ estimated
                est = self._estimate(stream, EstimatedCurvature())
                est = CurvatureEstimate(
                    curvature.L,
                    est.mu,
                    est.mu_floored,
                    est.iterations,
                    est.lambda_min,
                    est.lambda_min_error,
                )
            else:
                est = self._estimate_preconditioned(stream, curvature)
                self._estimate_at_w_t_pending = (
                    self.cost.hypergradients == 0 and self.config.inner_steps > 0
                )
        self.curvature_estimate = est
        self.delta = damping.delta(est) if not fresh else max(self.delta, damping.delta(est))
        self._set_from_spectrum(est)

    def _estimate_preconditioned(
        self, stream: BatchStream, curvature: EstimatedCurvature
    ) -> CurvatureEstimate:
        """P from the preconditioner, then L, λ_min of S∇²₁₁ℓS on the same batches.

        On a non-convex estimate (λ̂_min ≤ 0) P is dropped and the curvature estimated again
        unpreconditioned: S amplifies negative curvature (on a CNN with BatchNorm λ̂_min went
        from −1.5 to −327), and the inner steps w − αP∇ℓ̂, which damping does not reach,
        then diverge (2 of 3 seeds measured).
        """
        batches = self._curvature_batches(stream, curvature)
        self._precondition(batches, curvature)
        return self._estimate_in_convex_coordinates(stream, curvature, batches)

    def _estimate_in_convex_coordinates(
        self, stream: BatchStream, curvature: EstimatedCurvature, batches: list[Any]
    ) -> CurvatureEstimate:
        """L, λ_min in the map's coordinates; P dropped (and re-estimated) when non-convex."""
        est = self._estimate(stream, curvature, batches)
        if self.phi.scale is not None and not est.convex:
            log.info(
                "hypertorch_sid: lambda_min of the preconditioned Hessian is %.3g (non-convex): "
                "no preconditioner",
                est.lambda_min,
            )
            self._set_scale(None)
            est = self._estimate(stream, curvature, batches)
        return est

    def _precondition(self, batches: list[Any], curvature: EstimatedCurvature) -> None:
        """P = D⁻¹ of the GD map from the preconditioner strategy, on the estimate's batches.

        Only where α, L, μ are all estimated (they are then those of S∇²₁₁ℓS); the warm-start v,
        which lives in the coordinates z = S⁻¹w, follows the change of S.
        """
        assert isinstance(self.phi, GradientDescentMap)
        if self.config.alpha is not None or curvature.mu is not None:
            return
        self._set_scale(None)
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
        if self.mean_across_processes is not None:  # one P on every process
            values = [self.mean_across_processes(d) for d in values]
        self.cost.curvature_samples += D.samples
        self.cost.samples += D.samples
        self._set_scale([d.rsqrt() for d in values])

    def _set_scale(self, scale: Tensors | None) -> None:
        """S of the preconditioned map; v_z = S⁻¹v_w carried over to the new coordinates."""
        assert isinstance(self.phi, GradientDescentMap)
        old = self.phi.scale
        if self.v is not None and (old is not None or scale is not None):
            ones = [torch.ones_like(x) for x in self.v]
            self.v = [x * o / s for x, o, s in zip(self.v, old or ones, scale or ones)]
            self.guard.reset()  # its growth budget was in the old coordinates
        self.phi.scale = scale

    def _set_from_spectrum(self, est: CurvatureEstimate) -> None:
        """α, q of the (damped) GD map from L̂, λ̂_min and δ (Cor. 4.3 on [λ_min + δ, L + δ])."""
        assert isinstance(self.phi, GradientDescentMap)
        delta = self.delta
        lam_min = est.lambda_min if est.lambda_min is not None else est.mu
        low = (lam_min if delta > 0 else est.mu) + delta
        curvature = self.config.curvature
        floor = curvature.mu_floor if isinstance(curvature, EstimatedCurvature) else 1e-4
        low = max(low, floor * (est.L + delta))
        consts = theory_constants(
            est.L + delta, min(low, est.L + delta), self.config.sigma2, self._given[0]
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
            _inexact(delta, self.config.hvp),
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
            if q is not None and not (isinstance(q, (int, float)) and 0 <= q < 1):
                raise ConfigurationError(f"q must be a contraction constant in [0, 1), got {q!r}.")
        self.alpha, self.L, self.mu, self.q = alpha, L, mu, q
        if alpha is not None:
            self.phi.alpha = alpha
        if L is not None or alpha is not None:  # the user's constants: the unpreconditioned map
            self._set_scale(None)
        self._resolved = False

    def _schedules(self) -> tuple[StepSchedule, StepSchedule]:
        """η_t of the inner and the adjoint solve (BackOff's halvings of η applied)."""
        c = self.config
        schedules = (
            make_schedule(kind, q=self.q, steps=steps, **c.schedule_args)
            for kind, steps in zip(c.schedule_kinds, (c.inner_steps, c.adjoint_steps))
        )
        return tuple(  # type: ignore[return-value]
            s if self._step_scale == 1.0 else s.scaled(self._step_scale) for s in schedules
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
        try:
            with twice_differentiable(self.module):
                return self._hypergradient(train_batches, val_batch)
        except (NotImplementedError, RuntimeError) as err:
            if not any(s in str(err) for s in NO_SECOND_DERIVATIVE):
                raise
            raise not_twice_differentiable(err) from err

    def _hypergradient(self, train_batches: Iterable[Any], val_batch: Any) -> Tensors:
        stream = self._stream(train_batches)
        if not self._checked:
            self._first_checks(stream)
            self._checked = True
        if self.config.curvature.needs_refresh(self.hyper_step):
            self.alpha, self.L, self.mu, self.q = self._given
            self._resolved = False
        if not self._resolved:
            self._resolve_constants(stream)
        self._stream_now = stream
        policy = self.config.on_divergence
        attempts = policy.retries + 1
        for attempt in range(attempts):
            try:
                hypergrad = self._algorithm1(stream, val_batch)
                self.last["retries"] = attempt  # divergences recovered from in this step
                return hypergrad
            except DivergenceError as err:
                adjoint = "adjoint" in err.quantity
                if adjoint:  # a diverged v must not warm-start the next solve
                    self._reset_adjoint()
                if attempt == attempts - 1:
                    done = "v was reset; λ was not updated." if adjoint else "λ was not updated."
                    remedy = self._adjoint_remedy(policy.retries) if adjoint else ""
                    said = err.with_remedy(f"{done} {remedy}".strip())
                    raise said.with_traceback(err.__traceback__) from None  # where it was seen
                what = policy.adapt(self, err)
                log.warning(
                    "hypertorch_sid: %s Retrying this hyper step (%d of %d): %s%s.",
                    err, attempt + 1, policy.retries, "v reset, " if adjoint else "", what,
                )  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover

    def _adjoint_remedy(self, retries: int) -> str:
        """What to change when the adjoint solve diverged: it depends on what already ran.

        "Use damping" is the fix only where the system was undamped (δ = 0); where δ > 0 already
        (``CurvatureDamping`` on a network, escalated by ``Recover``), the damping was too small
        for the curvature met since it was estimated.
        """
        try:
            eta0 = self._schedules()[1](0)
        except (ConfigurationError, TypeError, ValueError):
            eta0 = 0.0
        if eta0 > 1:
            return (
                f"The adjoint steps exceed 1 (η₀ = {eta0:.3g}): a KM step v + η(Ψ̂(v) − v) with "
                "η > 1 can expand even a contraction; lower them (adjoint_step_size=...)."
            )
        if not isinstance(self.phi, GradientDescentMap):
            return (
                "The fixed-point map is not a contraction here: give it a smaller step, or retry "
                "with smaller step sizes (on_divergence=BackOff(2))."
            )
        damping = type(self.config.damping).__name__
        if self.delta > 0:
            tried = f", raised by {retries} retries" if retries else ""
            return (
                f"The system was already damped ({damping}, δ = {self.delta:.3g}{tried}) and "
                "still did not contract: the curvature grew past the estimate. Allow more "
                "retries (on_divergence=Recover(4)), damp further (damping=CurvatureDamping("
                "margin=2.0) or FixedDamping(δ)), re-estimate more often (reestimate_every=), "
                "or use positive semi-definite curvature (hvp=GaussNewton(...))."
            )
        recover = ""
        if not isinstance(self.config.on_divergence, Recover):  # say how to make it retry
            recover = "; on_divergence=Recover(2) re-estimates the curvature, raises δ, retries"
        if isinstance(self.config.damping, NoDamping):
            return (
                "The system was not damped (NoDamping, δ = 0): use damping=CurvatureDamping() (δ "
                f"past the most negative estimated curvature) or a smaller alpha{recover}."
            )
        est = self.curvature_estimate
        seen = (
            "no curvature was estimated (alpha was given)"
            if est is None or est.lambda_min is None
            else f"the curvature estimate saw no negative curvature (λ̂_min = {est.lambda_min:.3g})"
        )
        return (
            f"{damping} set δ = 0: {seen}, but the map expanded. Pass damping=FixedDamping(δ) or "
            f"a smaller alpha{recover}."
        )

    def _first_checks(self, stream: BatchStream) -> None:
        """Checks needing data, once: λ reaches ℓ̂, dtypes agree, a general map contracts.

        They run on a minibatch, or on the first samples of a given full batch (a pass over all
        of it cost one epoch, about a tenth of a hypergradient at n_tr = 5000 in
        ``bench_peers``)."""
        if self.full_train_batch is not None:
            first = head(self.full_train_batch, _CHECK_SAMPLES)  # its dtypes are the batch's
        else:
            first = stream.take(1)[0]
        check_batch_dtype(first, self.inner_parameters)
        self._probe_batch = first
        with frozen_mode(self.module, self.config.mode):  # no BatchNorm statistics update
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

    def _estimate_at_w_t(self, stream: BatchStream) -> None:
        """Re-estimate the curvature at w_t, where the adjoint system (eq. linsystem) is posed.

        The first estimate was taken at the user's starting w₀; on a network the inner steps then
        move w into sharper regions (measured on a digits MLP: the adjoint solve diverged within
        20 steps on 4 of 6 runs with the w₀ constants, on none with these). The merged estimate
        only ever makes the solve safer: L̂ = max(L̂(w₀), L̂(w_t)), λ̂_min = min(...) (so α does
        not grow past the one the t inner steps just ran stably with, and the damping δ covers
        the sharper negative curvature). P stays the one the inner solve used. Skipped with
        ``inner_steps=0`` (the Lightning callback: there w_t = w₀).
        """
        curvature = self.config.curvature
        assert isinstance(curvature, EstimatedCurvature)
        self._estimate_at_w_t_pending = False
        scale = self.phi.scale
        est = self._estimate_in_convex_coordinates(
            stream, curvature, self._curvature_batches(stream, curvature)
        )
        if self.curvature_estimate is not None and self.phi.scale is scale:  # same coordinates
            est = self.curvature_estimate.union(est)
        self.curvature_estimate = est
        self.delta = max(self.delta, self.config.damping.delta(est))
        self._set_from_spectrum(est)

    def _probe_loss(self) -> float | None:
        """ℓ̂ on the batch of the first checks (the GD map's inner loss), else None."""
        batch = self._probe_batch
        if batch is None or self.config.inner_steps == 0:
            return None
        if not isinstance(self.phi, GradientDescentMap):
            return None
        with torch.no_grad(), frozen_mode(self.module, self.config.mode):
            return float(self.phi.loss(batch))

    def _warn_if_stalled(self, before: float, inner: SolveResult) -> None:
        """Warn when the first inner solve's steps shrank ≥ 10× while ℓ̂ on the probe batch fell
        by < 10 %: the iteration stopped without fitting, which is not convergence.

        Seen on a CNN with BatchNorm in eval mode (digits, seed 2): at the estimated α = 0.45 the
        first steps switched off the ReLUs; the residual fell from 2.2 to 0.062 while ℓ̂ went
        from 2.39 to 2.30 = ln 10 (uniform predictions), and the run ended at that validation
        loss with no error. Healthy runs fall by 85-97 % there.
        """
        after = self._probe_loss()
        if after is None or not (math.isfinite(before) and math.isfinite(after)):
            return
        shrank = inner.first_residual / max(inner.residual, 1e-30)
        if shrank >= _STALL_SHRINK and before - after < _STALL_DROP * abs(before):
            log.warning(
                "hypertorch_sid: the inner solve's steps shrank %.0fx but the training loss on a "
                "probe batch only went from %.4g to %.4g: the inner iteration stalled rather than "
                "converged (e.g. ReLUs switched off by a step alpha = %.3g too large for this "
                "network). Pass alpha=<the learning rate your training uses, or smaller>.",
                shrank,
                before,
                after,
                self.alpha if self.alpha is not None else math.nan,
            )

    def _inner_contraction(self) -> float | None:
        """q of the inner map where it is a contraction of a convex problem and its steps are
        stochastic: None where the curvature estimate found λ̂_min ≤ 0 (a network: the theory of
        momentum and averaging is for convex problems) or the inner batch is the full one (no
        noise to average), and the inner solver then runs the paper's iteration."""
        if self.lambda_min is not None and self.lambda_min <= 0:
            return None
        if self.config.batches.inner == "full":
            return None
        return self.q

    def _algorithm1(self, stream: BatchStream, val_batch: Any) -> Tensors:
        c = self.config
        inner_schedule, adjoint_schedule = self._schedules()
        w0 = [w.detach().clone() for w in self.inner_parameters]
        try:
            probe = self._probe_loss() if self.cost.hypergradients == 0 else None
            inner = c.inner_solver.solve(
                self._solver_map,
                self._source(c.batches.inner, stream),
                c.inner_steps,
                inner_schedule,
                self.cost,
                c.divergence_factor,
                self._inner_contraction(),
            )
            if probe is not None:
                self._warn_if_stalled(probe, inner)
            if self._estimate_at_w_t_pending:
                self._estimate_at_w_t(stream)
                adjoint_schedule = self._schedules()[1]
            with frozen_mode(self.module, "eval"):
                g_w, g_lam, value = outer_gradients(
                    self.outer_loss, val_batch, self.inner_parameters, self.hyperparameters
                )
            if self.mean_across_processes is not None:
                g_w = [self.mean_across_processes(g) for g in g_w]
                g_lam = [self.mean_across_processes(g) for g in g_lam]
                value = float(self.mean_across_processes(torch.tensor(value, dtype=g_w[0].dtype)))
            warm = c.warm_start_adjoint and self.v is not None
            v0 = self.v if warm else [torch.zeros_like(g) for g in g_w]
            g_w = self._solver_map.adjoint_target(g_w)  # S∇₁E when preconditioned
            adjoint_batches = self._source(c.batches.adjoint, stream)
            solver, adjoint_steps = c.adjoint_solver.plan(
                self._solver_map,
                c.adjoint_steps,
                adjoint_batches,
                # a full batch to choose CG with: not where a full-batch (GD) adjoint was asked
                # for; no q to choose (or accelerate) with where a scheduled or a full-batch
                # fixed-point adjoint was
                self.full_train_batch if c.batches.adjoint != "full" else None,
                self.q if c.adjoint_step_size is None and c.batches.adjoint != "full" else None,
                distributed=self.mean_across_processes is not None,
            )
            if solver != self.adjoint_solver_used:
                log.info("hypertorch_sid: adjoint solve by %r, %d steps", solver, adjoint_steps)
            self.adjoint_solver_used = solver
            with frozen_mode(self.module, c.mode):
                v, adjoint = solver.solve(
                    self._solver_map,
                    g_w,
                    v0,
                    adjoint_batches,
                    adjoint_steps,
                    adjoint_schedule,
                    self.cost,
                    c.divergence_factor,
                    self.full_train_batch,
                )
                if self.phi.hyper_vjp_is_exact:  # ∂₂Φ̂ᵀv from R alone: no batch is read
                    d2_batches = []
                    if self.cost.hypergradients == 0:
                        check_exact_hyper_vjp(self.phi, v, stream.take(1)[0], self.cost)
                elif c.batches.d2 == "full":
                    d2_batches = [self.full_train_batch]
                else:
                    d2_batches = stream.take(int(c.batches.d2))
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
                solver.step_budget(self._solver_map, adjoint_schedule, adjoint_steps)
                if isinstance(solver, FixedPointIteration)
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

    def back_off(self) -> str:
        """BackOff: halve α of the GD map (or η of the schedules of a general map)."""
        if isinstance(self.phi, GradientDescentMap):
            self.alpha = self.phi.alpha = self.phi.alpha / 2
            return f"backing off: halving alpha to {self.alpha:.3g}"
        self._step_scale /= 2
        return f"backing off: halving the step sizes eta_t (now x{self._step_scale:.3g})"

    def recover(self) -> str:
        """Recover: re-estimate L, λ_min at the current w and raise the damping δ."""
        if not isinstance(self.phi, GradientDescentMap):
            return self.back_off()
        est = self.curvature_estimate
        if isinstance(self.config.curvature, EstimatedCurvature):
            est = self._estimate_preconditioned(self._stream_now, self.config.curvature)
        elif est is None:
            est = CurvatureEstimate(self.L or 1.0 / self.phi.alpha, self.mu or 1e-4, True, 0)
        self.curvature_estimate = est
        damping = self.config.damping
        self.delta = max(damping.escalate(self.delta, est), damping.delta(est))
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
            project = self.config.feasible_set.project
            if project is not None:
                project(self.hyperparameters)
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
            if not self._is_feasible(self.hyperparameters):
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
        """λ ∈ Λ by ``config.feasible_set.contains`` (always True without a test)."""
        contains = self.config.feasible_set.contains
        if contains is None:
            return True
        with torch.no_grad():
            return bool(contains(list(hyperparameters)))

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
            "scale": (
                [s.clone() for s in self.phi.scale]
                if isinstance(self.phi, GradientDescentMap) and self.phi.scale is not None
                else None
            ),
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
        if not self._is_feasible(saved):
            raise ConfigurationError(
                "the saved hyperparameters are outside the feasible set (feasible() returned "
                "False): the checkpoint does not belong to this problem."
            )
        v = (
            _saved_tensors("v", state["v"], self.inner_parameters)
            if state["v"] is not None
            else None
        )
        scale = state.get("scale")
        if scale is not None:
            scale = _saved_tensors("scale", scale, self.inner_parameters)
            if not isinstance(self.phi, GradientDescentMap) or not all(
                bool((s > 0).all()) for s in scale
            ):
                raise ConfigurationError(
                    "the saved preconditioner scale must be positive and belongs to a "
                    "gradient-descent map: the checkpoint does not belong to this problem."
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
        if isinstance(self.phi, GradientDescentMap):
            like = self.inner_parameters
            self.phi.scale = (
                [s.to(device=w.device, dtype=w.dtype) for s, w in zip(scale, like)]
                if scale is not None
                else None
            )
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


def _inexact(delta: float, hvp: Any) -> str:
    """What the log says where the hypergradient is not the exact implicit one of ℓ."""
    notes = ["the damped hypergradient, not the exact implicit one"] if delta > 0 else []
    if isinstance(hvp, GaussNewton):
        notes.append(
            "Gauss-Newton curvature: the linearised model's hypergradient (exact only for a "
            "model linear in w)"
        )
    return "".join(f" - {note}" for note in notes)


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


def _has_batchnorm(module: torch.nn.Module | None) -> bool:
    return module is not None and any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()
    )


class _GlobalHessian:
    """Hessian–vector products averaged across processes: one curvature estimate everywhere."""

    def __init__(self, phi: GradientDescentMap, mean: Callable[[Tensor], Tensor]) -> None:
        self.phi, self.mean = phi, mean
        self.inner_parameters = phi.inner_parameters

    def hessian_vector_product(self, batch: Any, v: Sequence[Tensor]) -> Tensors:
        return [self.mean(h) for h in self.phi.hessian_vector_product(batch, v)]
