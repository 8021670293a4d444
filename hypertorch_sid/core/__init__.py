"""The SID core: plain PyTorch, no Lightning import.

Fixed-point maps (:mod:`.maps`), step-size schedules and theory constants (:mod:`.schedules`),
curvature estimation (:mod:`.estimation`), the inner/adjoint solves and hypergradient assembly
(:mod:`.solvers`), the paper's presets (:mod:`.presets`) and :class:`SIDHyperOptimizer`.
"""

from .batches import BatchStream
from .config import Batches, FeasibleSet, SIDConfig
from .context import SolveContext
from .cost import Cost
from .damping import CurvatureDamping, Damping, FixedDamping, NoDamping
from .decay import (
    ElementModel,
    LayerThenShrunk,
    LogDecay,
    Parameterization,
    ProjectedDecay,
    ShrinkageStep,
    ShrunkToLayer,
    TiedToLayer,
    TrustShrinkageStep,
    Untied,
    WeightDecay,
)
from .directional import (
    DirectionalDerivative,
    ForwardDifference,
    ForwardMode,
    TrainingCrossTerm,
    directional_losses,
)
from .divergence import (
    BackOff,
    DivergenceGuard,
    DivergencePolicy,
    RaiseOnDivergence,
    Recover,
)
from .errors import ConfigurationError, ConvergenceWarning, DivergenceError, SIDError
from .estimation import (
    Curvature,
    CurvatureEstimate,
    EstimatedCurvature,
    KnownCurvature,
    estimate_curvature,
    lanczos_extremes,
)
from .flag_rules import BelowWeight, FlagRule, TwoComponentSplit
from .gauss_newton import GaussNewton
from .horizon import (
    CurrentWeights,
    HorizonDamping,
    HorizonSolver,
    LookAhead,
    StepReads,
    TrainedWeights,
    TrajectoryWeights,
    ValidationCurvature,
)
from .indexing import (
    Indexed,
    IndexedDataset,
    LabelledIndexed,
    indexed_collate,
    sample_label,
    split_indexed,
)
from .lazy_adam import LazyAdam
from .maps import ContractionMap, FixedPointMap, GradientDescentMap, ProximalGradientMap
from .modes import frozen_mode
from .objectives import (
    AdaptiveMarginError,
    ClassRelativeError,
    ExpectedError,
    KeptEvidenceError,
    MarginError,
    MeanLoss,
    ValidationObjective,
)
from .optimizer import SIDHyperOptimizer
from .outer import outer_gradients
from .outer_step import ShrinkFallRprop, SignalGatedAdam, TrustRprop
from .parameterizations import (
    NaturalSigmoidWeights,
    SharedLossWeights,
    SigmoidWeights,
    SoftmaxWeights,
    WeightParameterization,
)
from .preconditioning import FisherDiagonal, NoPreconditioner, Preconditioner
from .presets import PRESETS, Preset, get_preset
from .sample_weights import SampleWeights, class_weights
from .scale import HoldInvariant, InvariantRule, LearnInvariant, scale_invariant
from .schedules import (
    ConstantStep,
    DecreasingStep,
    StepSchedule,
    TheoryConstants,
    TwoPhaseStep,
    auto_switch,
    make_schedule,
    theory_constants,
)
from .solvers import (
    AdjointSolver,
    Automatic,
    AveragedMomentum,
    ConjugateGradient,
    FixedPointIteration,
    InnerSolver,
    LastIterate,
    SolveResult,
    VarianceReduced,
    adjoint_map,
    adjoint_solve,
    assemble_hypergradient,
    inner_solve,
    km_iteration,
)

__all__ = [
    "BelowWeight",
    "FlagRule",
    "TwoComponentSplit",
    "Indexed",
    "IndexedDataset",
    "LabelledIndexed",
    "LazyAdam",
    "SampleWeights",
    "TrainingCrossTerm",
    "directional_losses",
    "DirectionalDerivative",
    "ForwardDifference",
    "ForwardMode",
    "ExpectedError",
    "KeptEvidenceError",
    "MarginError",
    "ClassRelativeError",
    "AdaptiveMarginError",
    "MeanLoss",
    "NaturalSigmoidWeights",
    "SharedLossWeights",
    "ValidationObjective",
    "SigmoidWeights",
    "SoftmaxWeights",
    "WeightParameterization",
    "class_weights",
    "indexed_collate",
    "sample_label",
    "split_indexed",
    "ElementModel",
    "LogDecay",
    "Parameterization",
    "ProjectedDecay",
    "ShrinkageStep",
    "ShrinkFallRprop",
    "SignalGatedAdam",
    "TrustRprop",
    "ShrunkToLayer",
    "LayerThenShrunk",
    "TrustShrinkageStep",
    "TiedToLayer",
    "Untied",
    "WeightDecay",
    "Batches",
    "FeasibleSet",
    "SIDConfig",
    "AdjointSolver",
    "Automatic",
    "AveragedMomentum",
    "InnerSolver",
    "LastIterate",
    "BackOff",
    "ConjugateGradient",
    "Curvature",
    "CurvatureDamping",
    "Damping",
    "DivergenceGuard",
    "DivergencePolicy",
    "EstimatedCurvature",
    "FixedDamping",
    "HorizonDamping",
    "HorizonSolver",
    "LookAhead",
    "StepReads",
    "CurrentWeights",
    "TrainedWeights",
    "TrajectoryWeights",
    "ValidationCurvature",
    "HoldInvariant",
    "InvariantRule",
    "LearnInvariant",
    "scale_invariant",
    "FixedPointIteration",
    "VarianceReduced",
    "GaussNewton",
    "FisherDiagonal",
    "KnownCurvature",
    "NoPreconditioner",
    "Preconditioner",
    "NoDamping",
    "RaiseOnDivergence",
    "Recover",
    "adjoint_map",
    "km_iteration",
    "lanczos_extremes",
    "PRESETS",
    "BatchStream",
    "ConfigurationError",
    "ConstantStep",
    "ConvergenceWarning",
    "ContractionMap",
    "Cost",
    "CurvatureEstimate",
    "DecreasingStep",
    "DivergenceError",
    "FixedPointMap",
    "GradientDescentMap",
    "Preset",
    "ProximalGradientMap",
    "SIDError",
    "SIDHyperOptimizer",
    "SolveContext",
    "SolveResult",
    "StepSchedule",
    "TheoryConstants",
    "TwoPhaseStep",
    "adjoint_solve",
    "assemble_hypergradient",
    "auto_switch",
    "estimate_curvature",
    "frozen_mode",
    "get_preset",
    "inner_solve",
    "make_schedule",
    "outer_gradients",
    "theory_constants",
]
