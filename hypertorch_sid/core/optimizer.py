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
with ``on_divergence=BackOff(n)``, is retried from its starting point with halved step sizes). A
hypergradient that fails for any reason (divergence, a bad batch, an interrupt) leaves w where it
started.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import state
from .autodiff import grad
from .batches import BatchStream, batch_size, head, repeat
from .budget import MIN_LANCZOS, Allowance
from .config import SIDConfig
from .constants import StepConstants
from .context import SolveContext
from .cost import Cost
from .divergence import DivergenceGuard
from .errors import ConfigurationError, DivergenceError
from .estimation import CurvatureProbe
from .horizon import StepReads
from .maps import AveragedMap, FixedPointMap, build_map
from .modes import frozen_mode
from .outer import (
    check_one_full_batch,
    check_read_by_outer_loss,
    check_validation_batch,
    outer_gradients,
    outer_hessian_vector_product,
    warn_if_outer_is_inner,
)
from .rows import RowSnapshot, all_finite, stored
from .schedules import StepSchedule
from .second_order import check_second_derivatives, met_rerouted_op, twice_differentiable
from .solvers import (
    AdjointSolver,
    SolveResult,
    assemble_hypergradient,
    check_exact_hyper_vjp,
    norm,
    norms,
    warn_if_stalled,
)
from .validation import (
    as_tensor_list,
    check_batch_dtype,
    check_finite,
    check_like_hyperparameters,
    check_module,
    check_outer_optimizer,
    check_parameters,
    check_still_require_grad,
    check_unchanged,
    named_tensor_list,
    warn_validation_in_training,
)
from .watch import (
    Buffers,
    check_full_batch,
    check_initial_projection,
    check_unsolved_start,
    warn_if_lambda_stuck,
)

log = logging.getLogger("hypertorch_sid")

#: samples of a given full batch the first checks run on (≥ 2: BatchNorm in train mode)
_CHECK_SAMPLES = 8

Tensors = list[Tensor]

#: autograd's words for a graph used after it was freed
_GRAPH_FREED = "backward through the graph a second time"
#: what it means here (it was autograd's bare message, session 53)
_STALE_GRAPH = (
    "a loss reads a tensor computed from λ or w once, outside the loss (e.g. lam = "
    "log_lam.exp() before the loop, or self.lam = self.log_lam.exp() in __init__): autograd "
    "freed its graph after its first use, and it would not follow λ's updates anyway (a stale "
    "λ). Compute it inside inner_loss / outer_loss (e.g. lam = log_lam.exp() there), or as a "
    "property of the module."
)


class SIDHyperOptimizer:
    """Stochastic implicit differentiation (Algorithm 1) driving a torch optimizer on λ.

    Parameters
    ----------
    hyperparameters, inner_parameters:
        λ and w: leaf tensors with ``requires_grad=True`` (lists, single tensors or
        ``module.parameters()``). The losses read them as closures. λ may be given as
        ``(name, tensor)`` pairs (a dict, ``holder.named_parameters()``): a saved state names
        them, and a load whose names differ (the same λ in another order) is refused. λ held by
        ``module``, or given to an ``outer_optimizer`` built over named tensors, are named
        there already.
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
        ``on_divergence``, ``feasible_set``, ``batches``). Default: ``SIDConfig()``; one of the
        paper's variants: ``get_preset("stoch_dec").config(total_epochs, n_train, batch_size)``.
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
        read for it and ``config.batches.d2`` is not used. Checked against one minibatch at the
        first hypergradient (a :class:`ConfigurationError` if the data term reads λ after all).
    module:
        The ``nn.Module`` owning w, if any: the solves then run in ``config.mode`` with its
        buffers restored (see :mod:`hypertorch_sid.core.modes`), and ``hvp="forward"`` works.
    full_train_batch:
        One batch holding the whole training set: the deterministic map Φ for GD ("Batch")
        solves, ``Batches(d2="full")`` and the curvature estimate.
    mean_across_processes:
        For data parallel runs, a function averaging a tensor over processes (an all-reduce
        mean). Every Φ̂, Jacobian product and ∇E is averaged, so each process's minibatch is a
        shard of one global batch and λ stays identical everywhere.

    Notes
    -----
    Divergence is detected within each solve and across hyper steps (:class:`DivergenceGuard`);
    λ is never written from a diverged step and the warm-start v is reset.
    """

    def __init__(
        self,
        hyperparameters: Iterable[Tensor]
        | Iterable[tuple[str, Tensor]]
        | Mapping[str, Tensor]
        | Tensor,
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
    ) -> None:
        self.config = SIDConfig.from_settings(config)  # checks that it is a SIDConfig
        self.hyperparameters, names = named_tensor_list(hyperparameters, "hyperparameters")
        #: the names λ were given with (None where none was): :func:`.state.hyperparameter_names`
        self.given_names: list[str | None] = names
        self.inner_parameters = as_tensor_list(inner_parameters, "inner_parameters")
        check_parameters(self.inner_parameters, self.hyperparameters)
        if outer_loss is None or not callable(outer_loss):
            raise ConfigurationError("outer_loss must be a callable outer_loss(batch) -> scalar.")
        self.outer_loss = outer_loss
        self.inner_loss = inner_loss
        if outer_optimizer is not None:
            check_outer_optimizer(outer_optimizer, self.inner_parameters, self.hyperparameters)
        self.outer_optimizer = outer_optimizer
        #: the one owner of α, L, μ, λ_min, q and the damping δ
        self.constants = StepConstants(self.config)
        if module is not None:
            check_module(module, self.inner_parameters)
            check_second_derivatives(module, self.inner_parameters)
        self.module = module
        self.penalty = penalty
        self.regularizer = regularizer
        self.phi = build_map(
            fixed_point_map, inner_loss, penalty, regularizer, self.inner_parameters,
            self.hyperparameters, alpha=self.constants.alpha, hvp=self.config.hvp, module=module,
        )  # fmt: skip
        if mean_across_processes is not None and not callable(mean_across_processes):
            raise ConfigurationError(  # True was taken, then called on a tensor (session 56)
                "mean_across_processes must be a function averaging a tensor over processes "
                f"(an all-reduce mean), got {type(mean_across_processes).__name__}."
            )
        self.mean_across_processes = mean_across_processes
        self._solver_map: FixedPointMap = (
            AveragedMap(self.phi, mean_across_processes) if mean_across_processes else self.phi
        )
        self.config.check_full_batch(full_train_batch)
        check_one_full_batch(full_train_batch)
        self.full_train_batch = full_train_batch
        check_initial_projection(self.hyperparameters, self.config.feasible_set.project)
        if not self.is_feasible(self.hyperparameters):
            raise ConfigurationError(
                "the initial hyperparameters are outside the feasible set: "
                "feasible(hyperparameters) returned False. Initialise λ inside it (e.g. a weight "
                "decay ≥ 0), or learn an unconstrained parameterisation such as log λ."
            )
        self.guard = DivergenceGuard()
        self.v: Tensors | None = None
        self.hyper_step = 0
        self.cost = Cost()
        self.probe = CurvatureProbe(
            self.phi,  # type: ignore[arg-type]
            self.config,
            self.cost,
            module=module,
            full_batch=full_train_batch,
            mean=mean_across_processes,
            on_rescale=self._change_coordinates,
        )
        self.constants.bind(self.phi, self.probe)
        self.config.look_ahead.start(self.inner_parameters)  # where the training starts from
        self.last: dict[str, float] = {}
        self._checked = False
        self._reroute = False  # a product met an op computed twice differentiably (session 64)
        self._probe_batch: Any = None  # the first checks' batch: ℓ̂ before/after the first solve
        self._streams: dict[int, BatchStream] = {}
        #: a loaded state's position in the pass of ``train_batches`` (skipped at the first draw)
        self._resume_position: int | None = None
        self._lambda_at_start: Tensors = []  # λ as the running hypergradient found it
        #: buffers of the modules the losses call, found at the first checks and restored after
        #: each hyper step when no ``module=`` was given (as ``frozen_mode`` does with it)
        self._buffers = Buffers()
        self._buffers_at_start: list[tuple[Tensor, Tensor]] = []
        self._buffers_after_inner: list[tuple[Tensor, Tensor]] = []
        self._warned_stuck = False  # said once that the outer step cannot move λ
        #: the solver that ran the last adjoint solve (``config.adjoint_solver`` or, for
        #: ``Automatic``, the one it chose)
        self.adjoint_solver_used: AdjointSolver | None = None

    # ------------------------------------------------------------------ read-only views
    alpha = property(lambda self: self.constants.alpha, doc="α of the GD map (None: not set yet).")
    L = property(lambda self: self.constants.L, doc="L: the (estimated) largest curvature.")
    mu = property(lambda self: self.constants.mu, doc="μ the schedules use.")
    q = property(lambda self: self.constants.q, doc="q: the map's contraction constant.")
    lambda_min = property(lambda self: self.constants.lambda_min, doc="λ_min (estimated).")
    delta = property(lambda self: self.constants.delta, doc="δ of the damped adjoint system.")

    def refresh_damping(self) -> None:
        """δ from the damping strategy again (a strategy whose δ follows the training, e.g.
        :class:`~.horizon.HorizonDamping`); see :meth:`StepConstants.refresh_damping`."""
        self.constants.refresh_damping()

    curvature_estimate = property(
        lambda self: self.constants.estimate, doc="The curvature estimate α, q, δ came from."
    )

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

    # ------------------------------------------------------------------ a compute budget
    @property
    def allowance(self) -> Allowance:
        """What the next hypergradient may spend (:class:`~.budget.Allowance`; a compute
        budget's, set by the caller before a hyper step; unlimited by default): it may shorten
        the curvature estimate, skip a scheduled refresh and shorten the adjoint solve."""
        return self.probe.allowance

    @allowance.setter
    def allowance(self, allowance: Allowance) -> None:
        self.probe.allowance = allowance

    def minimum_products(self) -> int:
        """The fewest Hessian–vector products the next hypergradient can be made with under an
        allowance: the adjoint steps, and a first curvature estimate's fewest Lanczos steps
        where one is still to be made (a scheduled refresh may be skipped)."""
        L, mu = self.config.curvature.given()
        first = not self.constants.resolved and (L is None or mu is None)
        return self.config.adjoint_steps + self._assembly_products() + (MIN_LANCZOS if first else 0)

    def _retry_fits(self) -> bool:
        """Whether the allowance pays for a retry: a short re-estimate and the solves again."""
        return self.allowance.affords(MIN_LANCZOS + self.minimum_products())

    def _assembly_products(self) -> int:
        """The products of step 3 (eq. gradestim): one ∂₂Φ̂ᵀv from R or the full batch, else
        one per minibatch (and the check of the exact one, at the first hypergradient)."""
        if self.phi.hyper_vjp_is_exact:
            return 1 + (self.cost.hypergradients == 0)
        d2 = self.config.batches.d2
        return 1 if d2 == "full" else int(d2)

    def time_product(self, train_batches: Iterable[Any], clock: Callable[[], float]) -> float:
        """The cost of one Hessian–vector product ∂₁Φ̂ᵀv on a fresh training minibatch, read on
        ``clock`` (a compute budget's first measurement, before it commits to a hyper step);
        counted in ``cost.curvature_products``."""
        batch = next(self._stream(train_batches))
        v = [torch.ones_like(w) for w in self.inner_parameters]
        # the GD map's Hessian product (its α may not be set yet), else a general map's ∂₁Φ̂ᵀv
        product = getattr(self.phi, "hessian_vector_product", None) or (
            lambda b, u: self.phi.vjp(b, u)[0]
        )

        def timed() -> float:
            with frozen_mode(self.module, self.config.mode):
                self._buffers_at_start = self._buffers.snapshot()
                try:
                    start = clock()
                    n = batch_size(batch)
                    self.cost.curvature_products += 1
                    self.cost.curvature_samples += n
                    self.cost.samples += n
                    product(batch, v)
                    return clock() - start
                finally:
                    Buffers.restore(self._buffers_at_start or self._buffers.initial)

        return self._twice_differentiable(timed)

    def _twice_differentiable(self, run: Callable[[], Any]) -> Any:
        """``run()`` in :func:`twice_differentiable`'s context, and once more with its twice
        differentiable equivalents of torch functions where a product met one without a layer
        telling it (``F.multi_margin_loss`` called in ``training_step``: refused before, session
        64); from then on every product computes them so. ``run`` leaves w as it was when it
        fails (:meth:`_algorithm1`), so the repeat is the same hyper step."""
        try:
            with twice_differentiable(self.module, self._reroute):
                return run()
        except ConfigurationError as err:
            if self._reroute or not met_rerouted_op(err):
                raise
        self._reroute = True
        with twice_differentiable(self.module, reroute=True):
            return run()

    # ------------------------------------------------------------------ data
    def _stream(self, train_batches: Iterable[Any]) -> BatchStream:
        if isinstance(train_batches, BatchStream):
            return train_batches
        stream = self._streams.get(id(train_batches))
        if stream is None or stream.source is not train_batches:
            last = next(iter(self._streams.values()), None)
            stream = BatchStream(train_batches, "train_batches")
            self._streams = {id(train_batches): stream}
            state.resume_position(stream, self._resume_position, last)
            self._resume_position = None
        return stream

    def _source(self, kind: str, stream: BatchStream) -> BatchStream:
        if kind == "full":
            return BatchStream(repeat(self.full_train_batch), "full_train_batch")
        return stream

    def _change_coordinates(self, old: Tensors | None, new: Tensors | None) -> None:
        """S of the preconditioned map changes: v_z = S⁻¹v_w carried over to the new one."""
        if self.v is not None and (old is not None or new is not None):
            ones = [torch.ones_like(x) for x in self.v]
            self.v = [x * o / s for x, o, s in zip(self.v, old or ones, new or ones)]
            self.guard.reset()  # its growth budget was in the old coordinates

    # ------------------------------------------------------------------ constants
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
        self.constants.set_user(L, mu, alpha, q)

    def _schedules(self) -> tuple[StepSchedule, StepSchedule]:
        """η_t of the inner and the adjoint solve (BackOff's halvings of η applied)."""
        return self.constants.schedules()

    # ------------------------------------------------------------------ Algorithm 1
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
        check_still_require_grad(self.inner_parameters, self.hyperparameters)
        check_finite(self.hyperparameters, "hyperparameters")  # written by the user since?
        if not self._checked:  # once: validation data that are training data (session 57)
            warn_validation_in_training(train_batches, val_batch)
        self._lambda_at_start = [h.detach().clone() for h in self.hyperparameters]
        self._buffers_at_start, self._buffers_after_inner = self._buffers.snapshot(), []
        try:
            with frozen_mode(self.module, "eval"):  # None refused here, not after the solves
                check_validation_batch(self.outer_loss, val_batch)
            # autograd on, as torch.optim's closures run: a call under torch.no_grad() or
            # inference_mode (a loop's outer update wrapped in one) was refused as "inner_loss
            # does not depend on the inner parameters", then a raw autograd error (session 53)
            with _autograd_on():
                stream = self._stream(train_batches)
                return self._twice_differentiable(lambda: self._hypergradient(stream, val_batch))
        except RuntimeError as err:  # (an op without a second derivative: twice_differentiable)
            if _GRAPH_FREED in str(err):
                raise ConfigurationError(_STALE_GRAPH) from err
            raise
        finally:  # as with module=: changed by the inner steps only
            Buffers.restore(
                self._buffers_after_inner or self._buffers_at_start or self._buffers.initial
            )

    def _hypergradient(self, stream: BatchStream, val_batch: Any) -> Tensors:
        """Algorithm 1 with the divergence policy's retries."""
        if not self._checked:
            self._first_checks(stream)
            self._checked = True
        self.probe.stream, self.probe.hyper_step = stream, self.hyper_step
        self.constants.prepare(self.hyper_step, self.cost.hypergradients == 0)
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
                # NaN/Inf data: no retry can help, and none may ratchet α or δ (NaN labels
                # raised δ from 0 to 1130 over skips); a compute budget may not pay for one
                no_room = attempt < attempts - 1 and not err.data and not self._retry_fits()
                if attempt == attempts - 1 or err.data or no_room:
                    done = "v was reset; λ was not updated." if adjoint else "λ was not updated."
                    if no_room:
                        done += " The compute budget (max_overhead) left no room to retry."
                    remedy = self._adjoint_remedy(policy.retries) if adjoint else ""
                    said = err.with_remedy(f"{done} {remedy}".strip())
                    raise said.with_traceback(err.__traceback__) from None  # where it was seen
                what = policy.adapt(self, err)
                log.warning(
                    "hypertorch_sid: %s Retrying this hyper step (%d of %d): %s%s.",
                    err, attempt + 1, policy.retries, "v reset, " if adjoint else "", what,
                )  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover

    def _algorithm1(self, stream: BatchStream, val_batch: Any) -> Tensors:
        """Steps 1–3 of Algorithm 1 (step 4, the outer step, is :meth:`apply`); w as it was
        where any of them fails."""
        w0 = [w.detach().clone() for w in self.inner_parameters]
        try:
            inner = self._inner_solve(stream)  # 1. w_t            (eq. inneralg)
            adjoint = self._adjoint_solve(stream, val_batch)  # 2. v_k   (eq. backalg)
            hypergrad = self._assemble(stream, adjoint)  # 3. ∇̂f(λ)      (eq. gradestim)
            self._check_divergence(hypergrad, adjoint)
            check_unchanged(self.hyperparameters, self._lambda_at_start)  # a loss wrote λ?
        except BaseException:  # a failed hypergradient leaves no partial state
            with torch.no_grad():
                for w, w_start in zip(self.inner_parameters, w0):
                    w.copy_(w_start)
            raise
        self.v = adjoint.v
        self.guard.accept(norm(hypergrad))
        self.cost.hypergradients += 1
        self._record(inner, adjoint, hypergrad)
        return hypergrad

    def _inner_solve(self, stream: BatchStream) -> SolveResult:
        """Step 1: t warm-started steps w ← w + η_t (Φ̂(w, λ, ζ_t) − w), w updated in place."""
        c = self.config
        probe = self._probe_loss() if self.cost.hypergradients == 0 else None
        if c.inner_steps == 0 and self.cost.hypergradients == 0 and self._probe_batch is not None:
            with frozen_mode(self.module, c.mode):  # w must already be near w(λ)
                check_unsolved_start(self._solver_map, self._probe_batch, self.inner_parameters)
        # buffers as the hyper step found them (the checks and estimates ran forward passes)
        Buffers.restore(self._buffers_at_start or self._buffers.initial)
        inner = c.inner_solver.solve(
            SolveContext(
                self._solver_map,
                self._source(c.batches.inner, stream),
                c.inner_steps,
                self._schedules()[0],
                self.cost,
                c.divergence_factor,
                q=self._inner_contraction(),
                # growth means expansion, a drift no convergence, on a convex problem only
                watch_growth=self.lambda_min is None or self.lambda_min > 0,
            )  # fmt: skip
        )
        self._buffers_after_inner = self._buffers.snapshot()
        if probe is not None:
            warn_if_stalled(probe, self._probe_loss(), inner, self.alpha)
        return inner

    def _adjoint_solve(self, stream: BatchStream, val_batch: Any) -> _Adjoint:
        """Step 2: (I − ∂₁Φ(w_t, λ)ᵀ) v = ∇₁E(w_t, λ) (eq. linsystem) by the adjoint solver, from
        the last v; the curvature read again at w_t first on the first hyper step."""
        c, mean = self.config, self.mean_across_processes
        self.constants.at_w_t()
        with frozen_mode(self.module, "eval"):
            try:
                g_w, g_lam, value = outer_gradients(
                    self.outer_loss, val_batch, self.inner_parameters, self.hyperparameters,
                    self.module,
                )  # fmt: skip
            except RuntimeError as error:  # validation data of another dtype: named (session 54)
                try:
                    check_batch_dtype(val_batch, self.inner_parameters, "val_batch")
                except ConfigurationError as named:
                    raise named from error
                raise
            if self.cost.hypergradients == 0 and self.phi.unread_hyperparameters:
                check_read_by_outer_loss(
                    self.outer_loss, val_batch, self.hyperparameters,
                    self.phi.unread_hyperparameters,
                )  # fmt: skip
            if self.cost.hypergradients == 0:
                warn_if_outer_is_inner(self.inner_loss, self.outer_loss, val_batch, g_lam)
        if mean is not None:
            g_w, g_lam = [mean(g) for g in g_w], [mean(g) for g in g_lam]
            value = float(mean(torch.tensor(value, dtype=g_w[0].dtype)))
        v0 = (
            self.v
            if c.warm_start_adjoint and self.v is not None
            else [torch.zeros_like(g) for g in g_w]
        )
        # eq. trainedgrad where the look-ahead asks for it (∇₁E(w_t) itself by default)
        reads = StepReads(
            lambda n, h: self._train_gradient(stream, n, h),
            lambda u: self._validation_product(val_batch, u),
            self._look_ahead_product,
            self.inner_parameters,
        )
        g_w = c.look_ahead.target(g_w, reads)
        target = self._solver_map.adjoint_target(g_w)  # S∇₁E when preconditioned
        # no q to choose (or accelerate) with where a scheduled or a full-batch adjoint was asked
        q = self.q if c.adjoint_step_size is None and c.batches.adjoint != "full" else None
        allowance = self.allowance  # a compute budget may shorten the solve (≥ 1 step)
        ctx = SolveContext(
            self._solver_map, self._source(c.batches.adjoint, stream),
            allowance.adjoint_steps(c.adjoint_steps, self._assembly_products()),
            self._schedules()[1], self.cost,
            c.divergence_factor, q=q, full_batch=self.full_train_batch,
            distributed=mean is not None,
        )  # fmt: skip
        solver, ctx = c.adjoint_solver.plan(ctx)
        if solver != self.adjoint_solver_used:
            log.info("hypertorch_sid: adjoint solve by %r, %d steps", solver, ctx.steps)
        self.adjoint_solver_used = solver
        started = allowance.clock_reading()
        with frozen_mode(self.module, c.mode):
            v, result = solver.solve(ctx, target, v0)
        allowance.adjoint_done(started, ctx.steps)
        return _Adjoint(v, v0, target, g_lam, value, result, solver.step_budget(ctx))

    def _train_gradient(
        self, stream: BatchStream, n: int, curvature: bool
    ) -> tuple[Tensors, float | None]:
        """The mean ∇₁ℓ̂(w_t) over ``n`` fresh training minibatches (for the look-ahead,
        :class:`~.horizon.TrainedWeights`) and, with ``curvature``, its Rayleigh quotient
        ⟨g, Hg⟩/⟨g, g⟩ on the first of them (one Hessian–vector product; under DDP the
        processes' mean)."""
        batches = stream.take(n)
        self._look_ahead_batch = batches[0]
        with frozen_mode(self.module, self.config.mode):
            # the whole ℓ̂'s (the proximal map's data term ĝ leaves out the penalty's λw)
            grads = [grad(self.phi.loss(b), self.inner_parameters) for b in batches]
            mean = [sum(g[i].detach() for g in grads) / len(grads) for i in range(len(grads[0]))]
            if self.mean_across_processes is not None:  # every rank solves the same system
                mean = [self.mean_across_processes(g) for g in mean]
            self.cost.samples += sum(batch_size(b) for b in batches)
            if not curvature:
                return mean, None
            hg = self.phi.hessian_vector_product(batches[0], mean)
            self.cost.jacobian_vector_products += 1
        gg = sum(float(x.double().pow(2).sum()) for x in mean)
        ghg = sum(float((x.double() * y.double()).sum()) for x, y in zip(mean, hg))
        if self.mean_across_processes is not None:  # one filter on every rank
            ghg = float(self.mean_across_processes(torch.tensor(ghg, dtype=mean[0].dtype)))
        return mean, (ghg / gg if gg > 0 else None)

    def _look_ahead_product(self, u: Sequence[Tensor]) -> Tensors:
        """H·u on the training minibatch the look-ahead's ∇₁ℓ̂ was first read on (Lanczos steps
        of :class:`~.horizon.ValidationCurvature`; under DDP the processes' mean)."""
        with frozen_mode(self.module, self.config.mode):
            hu = self.phi.hessian_vector_product(self._look_ahead_batch, list(u))
        self.cost.jacobian_vector_products += 1
        hu = [x.detach() for x in hu]
        if self.mean_across_processes is not None:
            hu = [self.mean_across_processes(x) for x in hu]
        return hu

    def _validation_product(self, val_batch: Any, u: Sequence[Tensor]) -> Tensors:
        """∇²₁₁E(w_t)·u on the hyper step's validation batch, in eval mode as ∇₁E was read (for
        the look-ahead, :class:`~.horizon.ValidationCurvature`; under DDP the processes' mean)."""
        with frozen_mode(self.module, "eval"):
            hu = outer_hessian_vector_product(self.outer_loss, val_batch, self.inner_parameters, u)
        self.cost.jacobian_vector_products += 1
        if self.mean_across_processes is not None:  # every rank solves the same system
            hu = [self.mean_across_processes(x) for x in hu]
        return hu

    def _assemble(self, stream: BatchStream, adjoint: _Adjoint) -> Tensors:
        """Step 3: ∇̂f(λ) = ∇₂E(w_t, λ) + mean_j ∂₂Φ̂(w_t, λ, ζ_j)ᵀ v_k on J fresh minibatches (or
        the full batch; none where ∂₂Φ̂ᵀv is exact from the regularizer)."""
        c, v = self.config, adjoint.v
        with frozen_mode(self.module, c.mode):
            if self.phi.hyper_vjp_is_exact:  # ∂₂Φ̂ᵀv from R alone: no batch is read
                d2_batches = []
                if self.cost.hypergradients == 0:
                    check_exact_hyper_vjp(self.phi, v, stream.take(1)[0], self.cost)
            elif c.batches.d2 == "full":
                d2_batches = [self.full_train_batch]
            else:
                d2_batches = stream.take(int(c.batches.d2))
            return assemble_hypergradient(self._solver_map, v, adjoint.g_lam, d2_batches, self.cost)

    def _check_divergence(self, hypergrad: Tensors, adjoint: _Adjoint) -> None:
        """A non-finite ∇̂f, or growth past what a non-expansive adjoint map allows (the guard)."""
        if not all_finite(hypergrad):
            raise DivergenceError(
                "hypergradient",
                None,
                norm(hypergrad),
                "λ was left unchanged. The solves' residuals were finite, so ∂₂Φ̂ᵀv or ∇₂E "
                "overflowed: check the losses and the training data for NaN/Inf.",
            )
        warm = [x.any() for x in adjoint.v0]  # a warm start: v0 ≠ 0
        if len({x.device for x in warm}) == 1:
            warm = [torch.stack(warm).any()]
        v_norm, v0_norm, grad_norm, h_norm, *started = norms(  # one read of the device
            adjoint.v, adjoint.v0, adjoint.target, hypergrad, also=warm
        )
        self.guard.note_convergence(adjoint.result.unconverged, any(bool(x) for x in started))
        self.guard.check(
            v_norm=v_norm,
            v0_norm=v0_norm,
            grad_norm=grad_norm,
            etas=adjoint.budget,
            residual=adjoint.result.residual,
            first_residual=adjoint.result.first_residual,
            hypergradient_norm=h_norm,
        )

    # ------------------------------------------------------------------ around the solves
    def _first_checks(self, stream: BatchStream) -> None:
        """Checks needing data, once: λ reaches ℓ̂, dtypes agree, a general map contracts.

        They run on a minibatch, or on the first samples of a given full batch (a pass over all
        of it cost one epoch, about a tenth of a hypergradient at n_tr = 5000 in
        ``bench_peers``)."""
        if self.full_train_batch is not None:
            first = head(self.full_train_batch, _CHECK_SAMPLES)  # its dtypes are the batch's
        else:
            first = stream.take(1)[0]
        if self.full_train_batch is not None:
            check_full_batch(self.full_train_batch, stream.source, batch_size)
        self._probe_batch = first
        try:
            with frozen_mode(self.module, self.config.mode):  # no BatchNorm statistics update
                if self.module is None:  # the modules the losses call: their buffers are kept
                    self._buffers.discover(lambda: self.phi.check_first_batch(first, self.cost))
                else:
                    self.phi.check_first_batch(first, self.cost)
        except RuntimeError as error:
            # data of another dtype than the parameters is named where the loss fails on it;
            # a loss that converts its batch (x.float()) runs (it was refused before it ran)
            try:
                check_batch_dtype(first, self.inner_parameters)
            except ConfigurationError as named:
                raise named from error
            raise

    def _probe_loss(self) -> float | None:
        """ℓ̂ on the batch of the first checks (the GD map's inner loss), else None."""
        batch = self._probe_batch
        if batch is None or self.config.inner_steps == 0:
            return None
        with frozen_mode(self.module, self.config.mode):
            return self.phi.training_loss(batch)

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

    def _reset_adjoint(self) -> None:
        """Forget the warm-start v (and its growth budget): the next solve starts from 0."""
        self.v = None
        self.guard.reset()

    def _adjoint_remedy(self, retries: int) -> str:
        """What to change when the adjoint solve diverged: steps above 1, else the map says."""
        try:
            eta0 = self._schedules()[1](0)
        except (ConfigurationError, TypeError, ValueError):
            eta0 = 0.0
        if eta0 > 1:
            return (
                f"The adjoint steps exceed 1 (η₀ = {eta0:.3g}): a KM step v + η(Ψ̂(v) − v) with "
                "η > 1 can expand even a contraction; lower them (adjoint_step_size=...)."
            )
        c = self.config
        return self.phi.divergence_remedy(
            c.damping, self.delta, retries, self.curvature_estimate, c.on_divergence.retry_hint
        )

    def back_off(self) -> str:
        """BackOff: halve α of the GD map (or η of the schedules of a general map)."""
        return self.phi.back_off(self.constants)

    def recover(self) -> str:
        """Recover: re-estimate L, λ_min at the current w, then halve α (the damping covers the
        negative curvature: the map expanded at the top) or raise the damping δ."""
        return self.phi.recover(self.constants)

    def _record(self, inner: SolveResult, adjoint: _Adjoint, g: Tensors) -> None:
        est = self.curvature_estimate
        grad_norm, v_norm, g_norm = norms(adjoint.target, adjoint.v, g)  # one read
        self.last = {
            "relative_adjoint_residual": adjoint.result.residual / max(grad_norm, 1e-30),
            "v_norm": v_norm,
            "damping": float(self.delta),
            "L": float(self.L) if self.L is not None else math.nan,
            "lambda_min": float(est.lambda_min) if est and est.lambda_min is not None else math.nan,
            "outer_loss": adjoint.value,
            "hypergradient_norm": g_norm,
            "inner_residual": inner.residual,
            "adjoint_residual": adjoint.result.residual,
            "inner_eta": inner.eta,
            "adjoint_eta": adjoint.result.eta,
            "alpha": float(self.alpha) if self.alpha is not None else math.nan,
            "samples": float(self.cost.samples),
        }

    # ------------------------------------------------------------------ 4. the outer step
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
        check_like_hyperparameters(hypergrad, self.hyperparameters)
        if not all_finite(hypergrad):
            raise DivergenceError(
                "hypergradient",
                self.hyper_step,
                norm(hypergrad),
                "λ and the outer optimizer were left unchanged. Check the losses for NaN/Inf.",
            )
        before = [RowSnapshot(h, g) for h, g in zip(self.hyperparameters, hypergrad)]
        for h, g in zip(self.hyperparameters, hypergrad):
            h.grad = g.detach().clone()
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        if not self._warned_stuck:  # Adam's eps above a 1e-31 hypergradient: λ never moves
            self._warned_stuck = warn_if_lambda_stuck(
                [b.values for b in before],
                [b.changed(h) for b, h in zip(before, self.hyperparameters)],
                [stored(g) for g in hypergrad],
                self.outer_optimizer,
            )
        self.config.feasible_set.enter(self.hyperparameters, before, self.hyper_step)
        self.hyper_step += 1

    def is_feasible(self, hyperparameters: Sequence[Tensor]) -> bool:
        """λ ∈ Λ by ``config.feasible_set`` (always True without a test)."""
        return self.config.feasible_set.holds(hyperparameters)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """What this optimizer owns, to resume: λ, the outer optimizer's state, the warm-start v,
        the constants, the cost, the position in the current pass of ``train_batches`` and the
        config's settings (:mod:`~hypertorch_sid.core.state`).

        Not w: save the inner weights with the model (``model.state_dict()``) beside this state,
        and load both, e.g. ``torch.save({"model": model.state_dict(), "hopt":
        hopt.state_dict()}, path)``. With w, this state and the user's own random state (a
        shuffling ``DataLoader``'s generator, dropout) restored, N/2 + N/2 hyper steps equal N.
        """
        return state.state_dict(self)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (λ in place, on their current device).

        Every entry is validated before anything changes: a truncated, corrupted or foreign state
        raises :class:`ConfigurationError` and leaves this optimizer (λ, v, the outer optimizer,
        constants, cost) exactly as it was. A state saved under other config settings loads with
        a warning naming them. The next ``train_batches`` (a list, a ``DataLoader``) goes on
        from the saved position in its pass (a warning where it cannot: a one-shot iterator, a
        shorter pass). The inner weights w are not in it: load them with the model.
        """
        state.load_state_dict(self, saved)
        # the saved run checked inner_loss's dependencies at its first hypergradient; checking
        # again would draw one more batch (and dropout mask) than the uninterrupted run did
        self._checked = self._checked or self.cost.hypergradients > 0


@contextmanager
def _autograd_on() -> Iterator[None]:
    """Gradients recorded whatever the caller's mode: Algorithm 1 differentiates the losses."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


@dataclass(frozen=True)
class _Adjoint:
    """What step 2 hands to step 3 and the checks: v_k from v₀, the right-hand side S∇₁E, ∇₂E
    and E at w_t, the solve's report and how far a non-expansive solve could move v (Σ η‖∇₁E‖
    in units of ‖∇₁E‖: the solver's ``step_budget``)."""

    v: Tensors
    v0: Tensors
    target: Tensors
    g_lam: Tensors
    value: float
    result: SolveResult
    budget: float
