"""How the hyper-optimization callback builds a fit's core object.

:class:`CoreBuild` is a mixin of
:class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`: at ``on_train_start`` it
builds the fit's bilevel problem (the problem source's, with the training optimizers' own weight
decay and the other hyperparameter callbacks' penalties added to ℓ̂), the hyper steps' data
(:class:`~hypertorch_sid.lightning.sources.HyperData`) and the core
:class:`~hypertorch_sid.core.SIDHyperOptimizer` with ``inner_steps=0`` (Lightning's training is
the inner solver, eq. inneralg), whose hyperparameters start identical on every process; then it
applies a held checkpoint state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from ..core.config import FeasibleSet, SIDConfig
from ..core.errors import ConfigurationError
from ..core.gauss_newton import check_hvp
from ..core.lazy_adam import LazyAdam
from ..core.optimizer import SIDHyperOptimizer
from ..core.presets import get_preset
from .isolation import hyperparameters_require_grad
from .metrics import describe
from .optimizer_decay import OptimizerDecay, with_optimizer_decay, with_penalty
from .problem import BilevelProblem
from .resumed import resumed_from
from .sources import HyperData

__all__ = ["CoreBuild"]

Tensors = list[Tensor]


class CoreBuild:
    """The fit's problem, data and core object (a mixin of
    :class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`)."""

    def _build(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before_build = False
        self._world_size, self._rank = trainer.world_size, trainer.global_rank
        problem = self._with_optimizer_decay(
            trainer, pl_module, self.problem.build(trainer, pl_module)
        )
        self._active = problem
        self.data = self._hyper_data(trainer)
        with hyperparameters_require_grad([h for h, _ in self._frozen]):
            self.sid = self._make_sid(trainer, pl_module, problem)
        # the fit's hyper steps carry v on: its first, cold solve is continued too
        self.sid.guard.continued = self.sid.config.warm_start_adjoint
        self._sync_hyperparameters(trainer)
        if self._pending is not None:
            self._restore()
        elif resumed_from(trainer) is not None:
            rank_zero_warn(
                f"{type(self).__name__}: the checkpoint {trainer.ckpt_path} holds no state of this "
                "callback: λ continues from its current value with a fresh outer optimizer, "
                "adjoint warm start and samplers."
            )
        self._remember_learned(trainer)
        self._last_step = trainer.global_step
        self._due_in_fit, self._said_horizon, self._said_new_tensors = 0, False, False
        self._ran_in_fit = 0
        self._fit_start = trainer.global_step
        rank_zero_info(
            describe(self, self.sid, self.data.train.sampler.batch_size, self._world_size)
        )
        self._warn_if_few_hyper_steps(trainer)
        self._warn_if_not_repeatable()

    def _with_optimizer_decay(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, problem: BilevelProblem
    ) -> BilevelProblem:
        """The problem with the training optimizers' own ``weight_decay`` added to ℓ̂
        (:func:`~hypertorch_sid.lightning.optimizer_decay.with_optimizer_decay`): the training
        reaches the fixed point of ℓ̂ + D(w), so the hypergradient differentiates that. Said
        once here; an optimizer whose decay is of unknown form (not a torch optimizer known to
        couple or decouple it) is named, its decay left out."""
        decay = OptimizerDecay(trainer.optimizers, problem.inner_parameters, pl_module)
        self._optimizer_decay = decay if decay else None
        self._decay_at_build = decay
        who = type(self).__name__
        if decay.modelled:
            rank_zero_info(
                f"{who}: the training optimizers' own weight decay ({'; '.join(decay.modelled)}) "
                "is modelled: the hyper steps' inner loss is ℓ̂ + ½·wd·‖w‖² (decoupled: "
                "½·wd·Σ P⊙w², P the optimizer's preconditioner at each hyper step), the "
                "objective whose fixed point the training reaches."
            )
        if decay.unknown:
            rank_zero_warn(
                f"{who}: {'; '.join(decay.unknown)} keeps its own weight decay, whose fixed "
                "point this callback does not know (not an SGD/Adam-family torch optimizer): the "
                "hypergradient takes ℓ̂ without it, so it differentiates another problem than "
                "the one trained. Put the decay into the loss (training_step / inner_loss) and "
                "pass weight_decay=0, or use SGD, Adam or AdamW."
            )
        problem = with_optimizer_decay(problem, decay)
        for other in self._hyper_callbacks(trainer):
            if other is self:
                continue
            penalty = other.training_penalty(pl_module)
            if penalty is not None:
                rank_zero_info(
                    f"{who}: {type(other).__name__} adds its penalty to the training's "
                    "gradients; the hyper steps' inner loss holds it too, at its current "
                    "hyperparameters (constants here)."
                )
                problem = with_penalty(problem, penalty)
        return problem

    def _hyper_data(self, trainer: pl.Trainer) -> HyperData:
        return HyperData(
            trainer, batch_size=self.batch_size, val_batch_size=self.val_batch_size,
            val=self.val, seed=self.seed, who=type(self).__name__,
        )  # fmt: skip

    def _make_sid(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, problem: BilevelProblem
    ) -> SIDHyperOptimizer:
        config = self._sid_config()
        mean = None
        if self._world_size > 1:

            def mean(t: Tensor) -> Tensor:
                return trainer.strategy.reduce(t.clone(), reduce_op="mean")

        if problem.projection is not None:
            config = config.replace(
                feasible_set=FeasibleSet(problem.projection, config.feasible_set.contains)
            )
        gauss_newton = check_hvp(config.hvp)
        reg = problem.regularizer
        if gauss_newton is not None and gauss_newton.regularizer is None and reg is not None:
            # the drop-in's weight decay is inside ℓ̂: its Hessian stays exact
            hvp = dataclasses.replace(gauss_newton, regularizer=reg)
            config = config.replace(hvp=hvp)
        elif gauss_newton is not None and self._optimizer_decay is not None:
            # the user's R, and the optimizers' decay now inside ℓ̂ too
            own, decay = gauss_newton.regularizer, self._optimizer_decay.penalty
            hvp = dataclasses.replace(gauss_newton, regularizer=lambda: own() + decay())
            config = config.replace(hvp=hvp)
        return SIDHyperOptimizer(
            problem.named_hyperparameters(),
            problem.inner_parameters,
            problem.inner_loss,
            problem.outer_loss,
            self._outer_optimizer(problem.hyperparameters),
            config=config,
            module=pl_module,
            full_train_batch=self.data.full_train_batch() if config.needs_full_batch else None,
            penalty=problem.penalty,
            regularizer=problem.regularizer if problem.exact_cross_term else None,
            mean_across_processes=mean,
        )

    def _sid_config(self) -> SIDConfig:
        """The config of the core object: k, and the preset's adjoint schedule and batches."""
        changes: dict[str, Any] = {"inner_steps": 0}
        if self.adjoint_steps is not None:
            changes["adjoint_steps"] = self.adjoint_steps
        if self.preset is not None:
            assert self.data is not None
            if self.data.train_parts is None:
                raise ConfigurationError(
                    f"preset={self.preset!r} sizes its solves by the training set's size, which "
                    "a streamed train dataloader does not have: set adjoint_steps instead."
                )
            preset = get_preset(self.preset).config(
                self.preset_epochs, self.data.n_train, self.data.train.sampler.global_batch
            )
            changes["batches"] = dataclasses.replace(
                self.config.batches, adjoint=preset.batches.adjoint
            )
            if self.adjoint_steps is None:
                changes["adjoint_steps"] = preset.adjoint_steps
            if not self._schedule_given:
                changes["step_size"] = preset.adjoint_step_size
            if preset.adjoint_step_size == "constant" and self.config.eta is None:
                changes["eta"] = 1.0
        return self.config.replace(**changes)

    def _outer_optimizer(self, hyper: Tensors) -> torch.optim.Optimizer:
        if self.outer_optimizer is None:
            if any(h.dtype == torch.float16 for h in hyper):  # Adam's squares underflow (s63)
                return LazyAdam(hyper, lr=self.outer_lr)  # Adam, in float32 whatever λ's dtype
            return torch.optim.Adam(hyper, lr=self.outer_lr)
        opt = self.outer_optimizer(hyper)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigurationError(
                "outer_optimizer(params) must return a torch.optim.Optimizer, got "
                f"{type(opt).__name__}."
            )
        return opt

    def _sync_hyperparameters(self, trainer: pl.Trainer) -> None:
        """λ from rank 0 on every rank (they must start, and so stay, identical)."""
        if self._world_size == 1:
            return
        assert self.sid is not None
        with torch.no_grad():
            for h in self.sid.hyperparameters:
                h.copy_(trainer.strategy.broadcast(h.detach().clone(), src=0))
