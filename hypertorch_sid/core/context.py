"""``SolveContext``: what one solve of Algorithm 1 reads, as one frozen value.

Both solves (eq. inneralg, eq. backalg) and the adjoint solver's choice (:meth:`AdjointSolver.plan
<hypertorch_sid.core.solvers.AdjointSolver.plan>`) receive one of these instead of a list of
positional arguments: the map Φ̂ they iterate, the batches ζ they draw, their step count and
schedule η, the contraction constant q where it is known, the cost counter, the divergence factor,
the full training batch (for full-batch operators) and whether the run is data parallel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .batches import BatchStream
from .cost import Cost
from .maps import FixedPointMap
from .schedules import StepSchedule


@dataclass(frozen=True)
class SolveContext:
    """One solve's inputs (see the module docstring).

    Attributes
    ----------
    phi: the map Φ̂ the solve iterates (the inner solve updates ``phi.inner_parameters``).
    batches: the minibatches ζ (or the repeated full batch) it draws, one per step.
    steps: t (inner) or k (adjoint).
    schedule: η_t of the KM steps.
    cost: the counter its samples and products are added to (None: not counted).
    divergence_factor: a residual this many times the first ones counts as divergence.
    q: the map's contraction constant where known and usable (to accelerate, or to choose an
        adjoint solver), else None.
    full_batch: the whole training set as one batch, for full-batch operators (CG, SVRG anchors).
    distributed: whether products are averaged across processes (no fixed operator then).
    watch_growth: whether residual growth within the solve means expansion (10× growth, steady
        growth: :class:`~hypertorch_sid.core.watch.ResidualWatch`): not for the inner solve of
        a non-convex problem, where the gradient grows as w leaves a flat start.
    """

    phi: FixedPointMap
    batches: BatchStream
    steps: int
    schedule: StepSchedule
    cost: Cost | None = None
    divergence_factor: float = 1e4
    q: float | None = None
    full_batch: Any = None
    distributed: bool = False
    watch_growth: bool = True

    def replace(self, **changes: Any) -> SolveContext:
        """A copy with ``changes`` (e.g. the step count a chosen solver runs)."""
        return dataclasses.replace(self, **changes)
