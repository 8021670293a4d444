"""hypertorch_sid: stochastic implicit differentiation (SID) for hyperparameters, in Lightning.

Implements Algorithm 1 of Grazzi, Pontil, Salzo, "Convergence Properties of Stochastic
Hypergradients" (AISTATS 2021). The core (:mod:`hypertorch_sid.core`) is plain PyTorch; the
Lightning layer (:mod:`hypertorch_sid.lightning`) is imported lazily.
"""

from __future__ import annotations

from typing import Any

from .core import *  # noqa: F403
from .core import __all__ as _core_all

__version__ = "0.1.0"

_LIGHTNING = {
    "BilevelModule",
    "HyperOptimizationCallback",
    "LearnedDataWeights",
    "LearnedWeightDecay",
}

__all__ = [*_core_all, *sorted(_LIGHTNING), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING:
        from . import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'hypertorch_sid' has no attribute {name!r}")
