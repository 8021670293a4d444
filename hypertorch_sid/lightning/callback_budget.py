"""How the hyper-optimization callback spends its compute budget (``max_overhead``).

:class:`BudgetedHyperSteps` is a mixin of
:class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`: whether a due hyper step
may run now (the budget's decision, rank 0's under DDP), the allowance of products it runs
within, and the hyper work of several hyper-optimization callbacks in one fit counted on one
clock (:class:`~hypertorch_sid.core.budget.Budget`).
"""

from __future__ import annotations

import pytorch_lightning as pl

from ..core.budget import UNLIMITED
from .isolation import metric_states_kept, private_rng
from .training_length import horizon

__all__ = ["BudgetedHyperSteps"]


class BudgetedHyperSteps:
    """The budget's decisions about the hyper steps (a mixin of
    :class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`)."""

    def _share_hyper_work(self, trainer: pl.Trainer) -> None:
        """Beside other hyper-optimization callbacks in the fit, a budget counts their hyper
        work as hyper work, not as its training (eq. budget: the plain training's cost): the
        first budget that plans costs times everyone's hyper work on its clock
        (:class:`~hypertorch_sid.core.budget.HyperWork`), a later one joins it."""
        if not self.budget.plans_costs():
            return
        others = [c for c in self._hyper_callbacks(trainer) if c is not self]
        if not others:
            return
        shared = (c.budget.work for c in others if c.budget.plans_costs())
        work = next((w for w in shared if w is not None and w.clock is self.budget.clock), None)
        for callback in (self, *others):
            callback.budget.share_work(work or self.budget.work)

    def _budget_allows(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """The budget's decision; under DDP rank 0's (every rank runs the hyper step or none).
        A budget that has not yet measured a Hessian–vector product times one first (charged
        to the callback)."""
        assert self.sid is not None and self.data is not None
        if self.budget.needs_product_cost():
            seed = (self.seed * 1_000_003 + 104_729 + self._rank) % (2**63)
            with (
                self.budget.added_work(),
                private_rng(seed, pl_module.device),
                metric_states_kept(pl_module),
            ):
                cost = self.sid.time_product(self.data.train_stream, self.budget.synchronized_clock)
            self.budget.note_product_cost(cost)
        allowed = self.budget.allows(
            horizon(trainer)[0], self.sid.minimum_products(), self._due_left(trainer)
        )
        if self._world_size > 1:
            allowed = bool(trainer.strategy.broadcast(allowed, src=0))
        return allowed

    def _budgeted_hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A hyper step within the budget's allowance (under DDP only the decision to start is
        the budget's: shortening a solve on one rank would desynchronise the collectives)."""
        assert self.sid is not None
        cost = self.sid.cost
        products = cost.jacobian_vector_products + cost.curvature_products
        if self._world_size == 1:
            needed = self.sid.minimum_products()
            self.sid.allowance = self.budget.allowance(
                horizon(trainer)[0], needed, self._due_left(trainer)
            )
        self.budget.start_hyper_step()
        self._ran_in_fit += 1
        try:
            self._hyper_step(trainer, pl_module)
        finally:
            made = cost.jacobian_vector_products + cost.curvature_products - products
            self.budget.end_hyper_step(made)
            self.sid.allowance = UNLIMITED

    def _due_left(self, trainer: pl.Trainer) -> int:
        """The hyper steps due from now to the end of the fit: the one waiting now and those
        due at the steps that remain, where :func:`horizon` estimates those steps where the fit's
        length is unknown (so the budget plans an unknown-length fit as one of the expected
        length)."""
        left = horizon(trainer)[0]
        step, n = trainer.global_step, self.every_n_steps
        after = max(step, max(self.start_step, 1) - 1)
        return 1 + max((step + left) // n - after // n, 0)
