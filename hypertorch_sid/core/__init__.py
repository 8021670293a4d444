"""The SID core: plain PyTorch, no Lightning import.

Fixed-point maps (:mod:`.maps`), step-size schedules and theory constants (:mod:`.schedules`),
curvature estimation (:mod:`.estimation`), the inner/adjoint solves and hypergradient assembly
(:mod:`.solvers`), the paper's presets (:mod:`.presets`) and :class:`SIDHyperOptimizer`.
"""

from .batches import BatchStream
from .cost import Cost
from .errors import ConfigurationError, DivergenceError, SIDError
from .estimation import CurvatureEstimate, estimate_curvature
from .maps import ContractionMap, FixedPointMap, GradientDescentMap, ProximalGradientMap
from .modes import frozen_mode
from .optimizer import SIDHyperOptimizer
from .outer import outer_gradients
from .presets import PRESETS, Preset, get_preset
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
from .solvers import SolveResult, adjoint_solve, assemble_hypergradient, inner_solve

__all__ = [
    "PRESETS",
    "BatchStream",
    "ConfigurationError",
    "ConstantStep",
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
