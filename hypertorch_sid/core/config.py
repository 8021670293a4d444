"""``SIDConfig``: every setting of Algorithm 1 in one frozen value, validated once.

The *problem* (λ, w, ℓ̂ or a map Φ̂, E, the module, the data) is what
:class:`~hypertorch_sid.SIDHyperOptimizer` is constructed with; *how* Algorithm 1 solves it is one
:class:`SIDConfig`: the step counts t, k (eq. inneralg, eq. backalg), the step-size schedules
(Thm 4.1, Thm 4.2), the constants α, β, γ, q, σ₂ (Corollary 4.3), and the strategies — objects, not
flags:

==================  ============================================================================
``curvature``       where L, μ come from: :class:`KnownCurvature` / :class:`EstimatedCurvature`
``inner_solver``    how the t inner steps run: ``AveragedMomentum`` (the default), ``LastIterate``
``damping``         the shift δ of the adjoint system α(∇²₁₁ℓ + δI)v = ∇₁E: :class:`Damping`
``adjoint_solver``  how it is solved: ``Automatic`` (the default), ``FixedPointIteration``, CG
``look_ahead``      the right-hand side ∇₁E at w_t (``CurrentWeights``) or at the trained weights
                    (``TrainedWeights``, eq. trainedgrad)
``preconditioner``  the diagonal P of the GD map w − αP∇ℓ̂ (same w(λ), smaller κ): ``FisherDiagonal``
``on_divergence``   what a divergence does: ``RaiseOnDivergence``, ``BackOff``, ``Recover``
``feasible_set``    Λ: the projection P_Λ after each outer step and its membership test
``batches``         the batch sources: minibatches or the full batch for each solve, J of ∂₂Φ̂
==================  ============================================================================

The same value configures the Lightning callback (which keeps only what is Lightning's: when to
step, which data, logging, state), and LightningCLI can configure it as a nested ``config:``.
Each setting has one name, the field's; the flat keyword names of version 0.1 (``L=``, ``mu=``,
``estimate_batches=``, ``backoff=``, ``projection=``, ``d2_batches=`` ...) are refused with the
strategy that replaces them (:data:`REMOVED`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from .damping import CurvatureDamping, Damping
from .divergence import DivergencePolicy, RaiseOnDivergence
from .errors import ConfigurationError, DivergenceError
from .estimation import Curvature, EstimatedCurvature
from .gauss_newton import GaussNewton, check_hvp
from .horizon import CurrentWeights, LookAhead
from .preconditioning import FisherDiagonal, Preconditioner
from .rows import RowSnapshot
from .schedules import StepSchedule, check_schedule_kind
from .solvers import AdjointSolver, Automatic, AveragedMomentum, InnerSolver
from .validation import (
    check_bool,
    check_choice,
    check_integer,
    check_positive,
    check_real,
    class_given,
)
from .watch import project_in_place

Tensors = list[Tensor]
BatchSource = Literal["stochastic", "full"]
StepSize = Literal["constant", "decreasing", "two_phase"]


def _strategy(name: str, value: Any, kind: type, example: str) -> Any:
    if not isinstance(value, kind):
        raise ConfigurationError(
            f"{name} must be a {kind.__name__} object (e.g. {example}), got {type(value).__name__}."
            + class_given(value, kind)
        )
    return value


@dataclass(frozen=True)
class Batches:
    """Where each part of Algorithm 1 draws its data (the "Batch"/"Stoch" variants of section 5).

    Parameters
    ----------
    inner, adjoint:
        ``"stochastic"`` (minibatches ζ from ``train_batches``) or ``"full"`` (the full training
        batch: the deterministic map Φ, a GD solve).
    d2:
        J, the fresh minibatches averaged in the ∂₂Φ̂ term of eq. gradestim, or ``"full"`` for the
        exact ∂₂Φ on the full batch (no variance floor, Thm 3.4).
    """

    inner: BatchSource = "stochastic"
    adjoint: BatchSource = "stochastic"
    d2: int | Literal["full"] = 1

    def __post_init__(self) -> None:
        check_choice("inner_batches", self.inner, ("stochastic", "full"))
        check_choice("adjoint_batches", self.adjoint, ("stochastic", "full"))
        if self.d2 != "full":
            object.__setattr__(self, "d2", check_integer("d2_batches (J)", self.d2, 1))

    @property
    def needs_full(self) -> bool:
        """Whether a full training batch must be given."""
        return "full" in (self.inner, self.adjoint, self.d2)


@dataclass(frozen=True)
class FeasibleSet:
    """Λ, the set λ must stay in: P_Λ applied after each outer step and its membership test.

    Parameters
    ----------
    project:
        ``project(hyperparameters)``, in place under ``no_grad`` (e.g.
        ``lambda hs: hs[0].clamp_(min=0)``).
    contains:
        ``contains(hyperparameters) -> bool``: checked on the initial λ, on loaded states and after
        every projected step (λ restored and :class:`ConfigurationError` raised outside Λ).
    """

    project: Callable[[Tensors], None] | None = None
    contains: Callable[[Tensors], bool] | None = None

    def __post_init__(self) -> None:
        for name in ("project", "contains"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigurationError(
                    f"FeasibleSet.{name} must be a callable of the list of hyperparameters, got "
                    f"{type(value).__name__}."
                )

    def holds(self, hyperparameters: Sequence[Tensor]) -> bool:
        """λ ∈ Λ by ``contains`` (always True without a test)."""
        if self.contains is None:
            return True
        with torch.no_grad():
            return bool(self.contains(list(hyperparameters)))

    def enter(
        self, hyperparameters: Tensors, before: Sequence[RowSnapshot], hyper_step: int
    ) -> None:
        """λ ← P_Λ(λ) after the outer step; λ restored from ``before`` (the rows the step may
        change, :class:`~.rows.RowSnapshot`) and an error raised where they are not finite or λ
        is not in Λ."""
        with torch.no_grad():
            if self.project is not None:
                try:
                    project_in_place(self.project, hyperparameters)
                except ConfigurationError:
                    for h, b in zip(hyperparameters, before):
                        b.restore(h)
                    raise
            if not all(torch.isfinite(b.changed(h)).all() for h, b in zip(hyperparameters, before)):
                for h, b in zip(hyperparameters, before):
                    b.restore(h)
                raise DivergenceError(
                    "hyperparameters",
                    hyper_step,
                    math.inf,
                    "The outer step produced non-finite λ; λ was restored. Lower the outer "
                    "learning rate.",
                )
            if not self.holds(hyperparameters):
                for h, b in zip(hyperparameters, before):
                    b.restore(h)
                raise ConfigurationError(
                    f"the outer step {hyper_step} left the feasible set (feasible("
                    "hyperparameters) returned False); λ was restored. Pass a projection onto the "
                    "set (e.g. feasible_set=FeasibleSet(project=lambda hs: hs[0].clamp_(min=0))) "
                    "or learn an unconstrained parameterisation such as log λ."
                )


@dataclass(frozen=True)
class SIDConfig:
    """How Algorithm 1 runs: step counts, schedules, constants and strategies, validated once.

    Parameters
    ----------
    inner_steps, adjoint_steps:
        t ≥ 0 and k ≥ 1 of Algorithm 1.
    step_size, adjoint_step_size:
        ``"constant"`` (Thm 4.1), ``"decreasing"`` (Thm 4.2), ``"two_phase"`` (the default:
        η = 1/(1+σ₂), then β/(γ + t − t₀), section 4; measured best at every budget in
        ``benchmarks/bench_peers.py``) or a :class:`StepSchedule`; the adjoint solve uses
        ``step_size`` unless told otherwise.
    alpha, eta, beta, gamma, switch, q, sigma2:
        α of the GD map, η of constant steps, β, γ of decreasing steps, t₀ of two-phase steps, the
        contraction constant q and σ₂ of Assumption 4.1(iii). Missing ones come from the theory
        (α = 2/(L+μ), q = (L−μ)/(L+μ), β = 2/(1−q²), γ = β(1+σ₂); Cor. 4.3).
    curvature, inner_solver, damping, adjoint_solver, preconditioner, on_divergence,
    feasible_set, batches:
        The strategies (see the module docstring). The default ``inner_solver``,
        ``AveragedMomentum()``, adds momentum min(0.5, q²) to the constant phase of two-phase
        inner steps on a convex problem and returns the polynomial-decay average of the
        decreasing phase (same fixed point; with the accelerated adjoint, 1.7-9× lower
        hypergradient error per budget in ``benchmarks/bench_peers.py``); ``LastIterate()`` is
        the paper's.
        The default preconditioner, ``FisherDiagonal()``, applies where α, L, μ are estimated
        (measured 5-15× lower error per budget in ``benchmarks/bench_peers.py``); given constants
        keep the unpreconditioned map.
        The default ``adjoint_solver``, ``Automatic()``, runs conjugate gradients on
        ``full_train_batch`` when one is given, or on one epoch of a re-iterable, sized
        ``train_batches`` (a ``DataLoader``), where they are faster (a symmetric system, one
        process, few minibatches per epoch against √κ̂; same samples as the k minibatch steps),
        and the fixed-point iteration otherwise (accelerated like the inner steps on a symmetric
        system with a two-phase schedule).
    divergence_factor:
        A residual this many times larger than the first ones counts as divergence (in a solve).
    hvp, mode:
        How the GD map's curvature products are taken: exact Hessian–vector products,
        ``"reverse"``/``"forward"``, or Gauss–Newton products ``GaussNewton(outputs,
        output_loss)`` (positive semi-definite; :mod:`~hypertorch_sid.core.gauss_newton`); the
        module mode of the solves (``"train"``/``"eval"``; see
        :func:`~hypertorch_sid.frozen_mode`).
    warm_start_adjoint:
        Start each adjoint solve from the previous v_k (True) or from 0.
    """

    inner_steps: int = 100
    adjoint_steps: int = 100
    step_size: StepSize | StepSchedule = "two_phase"
    adjoint_step_size: StepSize | StepSchedule | None = None
    alpha: float | None = None
    eta: float | None = None
    beta: float | None = None
    gamma: float | None = None
    switch: int | None = None
    q: float | None = None
    sigma2: float = 0.0
    curvature: Curvature = field(default_factory=EstimatedCurvature)
    inner_solver: InnerSolver = field(default_factory=AveragedMomentum)
    damping: Damping = field(default_factory=CurvatureDamping)
    adjoint_solver: AdjointSolver = field(default_factory=Automatic)
    look_ahead: LookAhead = field(default_factory=CurrentWeights)
    preconditioner: Preconditioner = field(default_factory=FisherDiagonal)
    on_divergence: DivergencePolicy = field(default_factory=RaiseOnDivergence)
    feasible_set: FeasibleSet = field(default_factory=FeasibleSet)
    batches: Batches = field(default_factory=Batches)
    divergence_factor: float = 1e4
    hvp: Literal["reverse", "forward"] | GaussNewton = "reverse"
    mode: Literal["train", "eval"] = "train"
    warm_start_adjoint: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "inner_steps", check_integer("inner_steps (t)", self.inner_steps, 0))
        set_(self, "adjoint_steps", check_integer("adjoint_steps (k)", self.adjoint_steps, 1))
        for name in ("step_size", "adjoint_step_size"):
            kind = getattr(self, name)
            if kind is None and name == "adjoint_step_size":
                continue
            check_schedule_kind(name, kind)
        for name in ("alpha", "eta", "beta", "gamma"):
            set_(self, name, check_positive(name, getattr(self, name), allow_none=True))
        set_(self, "switch", check_integer("switch", self.switch, 0, allow_none=True))
        self._check_constants_read()
        contraction = "a contraction constant in [0, 1)"
        set_(self, "q", check_real("q", self.q, lambda q: 0 <= q < 1, contraction, True))
        at_least_0 = "a number ≥ 0"
        set_(self, "sigma2", check_real("sigma2", self.sigma2, _finite_nonnegative, at_least_0))
        _strategy("curvature", self.curvature, Curvature, "EstimatedCurvature()")
        _strategy("inner_solver", self.inner_solver, InnerSolver, "LastIterate()")
        _strategy("damping", self.damping, Damping, "CurvatureDamping()")
        _strategy("adjoint_solver", self.adjoint_solver, AdjointSolver, "FixedPointIteration()")
        _strategy("look_ahead", self.look_ahead, LookAhead, "TrainedWeights()")
        _strategy("preconditioner", self.preconditioner, Preconditioner, "FisherDiagonal()")
        _strategy("on_divergence", self.on_divergence, DivergencePolicy, "Recover()")
        _strategy("feasible_set", self.feasible_set, FeasibleSet, "FeasibleSet(project=...)")
        _strategy("batches", self.batches, Batches, "Batches(d2='full')")
        factor = check_real(
            "divergence_factor", self.divergence_factor, lambda x: x > 1, "a number > 1"
        )
        set_(self, "divergence_factor", factor)
        check_hvp(self.hvp)
        check_choice("mode", self.mode, ("train", "eval"))
        check_bool("warm_start_adjoint", self.warm_start_adjoint)

    #: the loose schedule constants each named schedule reads (a StepSchedule object: none)
    CONSTANTS_READ: ClassVar[dict[str, tuple[str, ...]]] = {
        "constant": ("eta",),
        "decreasing": ("beta", "gamma"),
        "two_phase": ("eta", "beta", "gamma", "switch"),
    }

    def _check_constants_read(self) -> None:
        """Every loose constant given (η, β, γ, t₀) is read by the inner or the adjoint schedule,
        else a warning (session 60: ``SIDConfig(step_size="constant", beta=2.0, gamma=3.0)``,
        ``step_size="decreasing", eta=0.5`` or a ``ConstantStep(1.0)`` object beside
        ``eta=0.5`` ran without them, unsaid)."""
        kinds = [self.step_size, self.adjoint_step_size or self.step_size]
        read = {n for k in kinds if isinstance(k, str) for n in self.CONSTANTS_READ.get(k, ())}
        unread = [n for n in ("eta", "beta", "gamma", "switch") if getattr(self, n) is not None]
        unread = [n for n in unread if n not in read]
        if unread:
            given = ", ".join(f"{n}={getattr(self, n)!r}" for n in unread)
            shown = [k if isinstance(k, str) else type(k).__name__ for k in kinds]
            said = "; ".join(
                f"{n} is read by "
                + " or ".join(repr(k) for k, names in self.CONSTANTS_READ.items() if n in names)
                for n in unread
            )
            warnings.warn(  # a warning: helpers set eta=1.0 beside any step_size
                f"SIDConfig: {given} is ignored: the schedules here are {shown[0]!r} (inner) "
                f"and {shown[1]!r} (adjoint), and {said} (a StepSchedule object carries its "
                "own constants). Drop it, or choose a step_size that reads it.",
                UserWarning,
                stacklevel=4,
            )

    # ------------------------------------------------------------------ derived
    @property
    def needs_full_batch(self) -> bool:
        """Whether the solves or the curvature estimate read the full training batch."""
        return self.batches.needs_full or self.curvature.reads_full_batch

    def check_full_batch(self, full_train_batch: Any) -> None:
        """Raise where a strategy reads the full training batch and none is given."""
        if self.batches.needs_full and full_train_batch is None:
            raise ConfigurationError(
                "full-batch solves (Batches(inner='full'), Batches(adjoint='full'), "
                "Batches(d2='full') or a Batch preset) need full_train_batch=<one batch holding "
                "the whole training set>."
            )
        if self.curvature.reads_full_batch and full_train_batch is None:
            raise ConfigurationError(
                "EstimatedCurvature(batches='full') needs full_train_batch=<one batch holding "
                "the whole training set>; or give a number of minibatches."
            )

    @property
    def schedule_kinds(self) -> tuple[StepSize | StepSchedule, StepSize | StepSchedule]:
        """The inner and the adjoint schedule."""
        return self.step_size, self.adjoint_step_size or self.step_size

    @property
    def schedule_args(self) -> dict[str, Any]:
        """The loose constants :func:`~hypertorch_sid.core.schedules.make_schedule` reads."""
        return dict(
            eta=self.eta, beta=self.beta, gamma=self.gamma, switch=self.switch, sigma2=self.sigma2
        )

    @property
    def needs_q(self) -> bool:
        """Whether a decreasing schedule must derive β, γ from q."""
        kinds = [k for k in self.schedule_kinds if isinstance(k, str)]
        return self.beta is None and any(k != "constant" for k in kinds)

    # ------------------------------------------------------------------ construction
    def replace(self, **settings: Any) -> SIDConfig:
        """A copy with ``settings`` (field names) changed, validated again."""
        return SIDConfig.from_settings(self, **settings)

    @classmethod
    def from_settings(cls, base: SIDConfig | None = None, **settings: Any) -> SIDConfig:
        """``base`` (default: ``SIDConfig()``) with ``settings`` (field names) applied; a
        strategy given as None keeps the base's. A removed 0.1 name says what replaces it."""
        base = base if base is not None else cls()
        if not isinstance(base, SIDConfig):
            raise ConfigurationError(
                f"config must be a SIDConfig, got {type(base).__name__}." + class_given(base, cls)
            )
        if not settings:
            return base
        fields = {f.name for f in dataclasses.fields(cls)}
        removed = sorted(set(settings) & set(REMOVED))
        if removed:
            raise ConfigurationError(
                f"the settings {removed} were removed in 0.2 (one name for each setting): "
                + "; ".join(f"{name}= → {REMOVED[name]}" for name in removed)
                + "."
            )
        unknown = set(settings) - fields
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {sorted(unknown)}; SIDConfig takes {sorted(fields)}."
            )
        changes = {k: v for k, v in settings.items() if not (v is None and k in _STRATEGIES)}
        return dataclasses.replace(base, **changes)


def _finite_nonnegative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


_STRATEGIES = frozenset(
    {
        "curvature",
        "inner_solver",
        "damping",
        "adjoint_solver",
        "look_ahead",
        "preconditioner",
        "on_divergence",
        "feasible_set",
        "batches",
    }
)

#: the flat keyword names of version 0.1 and what replaces each
REMOVED = {
    "L": "curvature=KnownCurvature(L, mu)",
    "mu": "curvature=KnownCurvature(L, mu) or EstimatedCurvature(mu=...)",
    "estimate_batches": "curvature=EstimatedCurvature(batches=...)",
    "estimate_iters": "curvature=EstimatedCurvature(iters=...)",
    "reestimate_every": "curvature=EstimatedCurvature(every=...)",
    "backoff": "on_divergence=BackOff(retries)",
    "projection": "feasible_set=FeasibleSet(project=...)",
    "feasible": "feasible_set=FeasibleSet(contains=...)",
    "inner_batches": "batches=Batches(inner=...)",
    "adjoint_batches": "batches=Batches(adjoint=...)",
    "d2_batches": "batches=Batches(d2=...)",
}
