"""The Lightning layer: :class:`BilevelModule`, :class:`HyperOptimizationCallback`,
:class:`LearnedWeightDecay`.

Lightning's own training steps are the inner solver of Algorithm 1; the callback runs the adjoint
solve and the outer step through the core :class:`~hypertorch_sid.core.SIDHyperOptimizer`.
Importing this package imports ``pytorch_lightning``; the core does not.
"""

from .callback import CALLBACK_CONFIG, HyperOptimizationCallback
from .data_weights import LearnedDataWeights
from .data_weights_problem import DataWeightsProblem
from .imbalance import ClassRarity
from .module import Bilevel, BilevelModule
from .problem import BilevelProblem, ModuleProblem, ProblemSource
from .weight_decay import LearnedWeightDecay, WeightDecayProblem

__all__ = [
    "CALLBACK_CONFIG",
    "ClassRarity",
    "DataWeightsProblem",
    "LearnedDataWeights",
    "Bilevel",
    "BilevelModule",
    "BilevelProblem",
    "HyperOptimizationCallback",
    "LearnedWeightDecay",
    "ModuleProblem",
    "ProblemSource",
    "WeightDecayProblem",
]
