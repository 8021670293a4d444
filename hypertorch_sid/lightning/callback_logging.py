"""What the hyper-optimization callback reports: its metrics and its warnings about the fit.

:class:`HyperLogging` is a mixin of
:class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`: every hyper step's
``hyper/*`` metrics (:func:`~hypertorch_sid.lightning.metrics.hyper_metrics`) go to the
callback's ``history``, to ``trainer.loggers`` and, for ``lam`` and ``hg``, to the progress bar;
and a fit that learns nothing, or differentiates another problem than the one it trains, is
said so once (too few hyper steps planned, ended before the first, cut by the budget; an
optimizer's decay switched on, tensors trained that the fit did not start with; a fit asked to
be deterministic whose budget reads the clock).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn

from .metrics import budget_cut, few_hyper_steps, hyper_metrics, lambda_mean
from .problem import named_tensors
from .training_length import _manual, planned_steps

__all__ = ["HyperLogging"]


class HyperLogging:
    """The callback's metrics and warnings (a mixin of
    :class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`)."""

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self._active is not None
        summary = self._active.summary()  # once: per element it holds every λ
        assert self.sid is not None and self.data is not None
        metrics = hyper_metrics(
            self.sid, summary, self._world_size, self.data.val_samples, self.budget.overhead
        )
        self.history.append({"global_step": float(trainer.global_step), **metrics})
        if self.log_to_loggers and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        # Through Lightning's (slower, ~0.4 ms per key) logging only what monitors and the
        # progress bar need: the validation objective (e.g. for ModelCheckpoint) and λ's mean.
        pl_module.log(
            "hyper/outer_loss", metrics["hyper/outer_loss"], on_step=True, on_epoch=False,
            logger=False,
        )  # fmt: skip
        pl_module.log(
            "lam", lambda_mean(summary), prog_bar=True, on_step=True, on_epoch=False,
            logger=False,
        )  # fmt: skip
        pl_module.log(
            "hg", metrics["hyper/hypergradient_norm"], prog_bar=True, on_step=True,
            on_epoch=False, logger=False,
        )  # fmt: skip

    def _warn_if_few_hyper_steps(self, trainer: pl.Trainer) -> None:
        """Say so when the fit is too short for λ to move (:func:`few_hyper_steps`)."""
        said = few_hyper_steps(
            planned_steps(trainer), self.every_n_steps, self.start_step,
            trainer.global_step, self.hyper_steps_needed(), self.hyperparameters_named,
        )  # fmt: skip
        self._planned_short = said is not None
        if said is not None and _manual(trainer):
            said += (
                " (Under manual optimisation Lightning counts training batches; this counts "
                "one step of each optimizer per batch: where training_step steps less often, "
                "fewer hyper steps run.)"
            )
        if said is not None and trainer.fast_dev_run:  # a smoke test, not a short fit
            said = (
                f"fast_dev_run={trainer.fast_dev_run!r} runs {planned_steps(trainer)} optimizer "
                "step(s), a smoke test of the code: too few for a hyper step to learn anything, "
                "so the hyperparameters stay (nearly) where they start and read as nothing "
                "learned. Fit without fast_dev_run to learn them (the same callback object "
                "then starts from where it is now)."
            )
        if said is not None:
            rank_zero_warn(f"{type(self).__name__}: {said}")

    def _warn_if_not_repeatable(self) -> None:
        """Under deterministic algorithms (``Trainer(deterministic=True)``, or
        ``torch.use_deterministic_algorithms(True)``) the user asked for a repeatable fit, which
        a budget deciding by the clock does not give: say so at the fit's start, with the
        setting that does (session 61: two fits of a seed ended with weights up to 0.02–0.03
        apart, silently)."""
        if not (torch.are_deterministic_algorithms_enabled() and self.budget.reads_time()):
            return
        rank_zero_warn(
            f"{type(self).__name__}: deterministic algorithms are on (Trainer(deterministic="
            "True) or torch.use_deterministic_algorithms), but the compute budget "
            f"(max_overhead={getattr(self.budget, 'max_overhead', None)!r}) decides by the "
            "clock which hyper steps run, so two fits from the same seed can run different "
            "hyper steps and end with different hyperparameters and weights. Pass "
            "max_overhead=None for a repeatable fit (every due hyper step runs: more compute)."
        )

    def _warn_if_decay_switched_on(self, trainer: pl.Trainer) -> None:
        """Once per fit: an optimizer group's ``weight_decay`` switched on from 0 during the
        fit is not in the hyper steps' ℓ̂ (:meth:`OptimizerDecay.switched_on`)."""
        decay = self._decay_at_build
        switched = decay.switched_on(trainer.optimizers) if decay is not None else []
        if switched:
            self._decay_at_build = None
            rank_zero_warn(
                f"{type(self).__name__}: {'; '.join(switched)} was switched on during the fit "
                "(a weight-decay schedule, a callback?): the training now minimises ℓ̂ plus that "
                "decay, but the hyper steps model the optimizers' decay as it was at the fit's "
                "start (none here), so they differentiate another problem than the one trained. "
                "Start the fit with the decay on (its schedule's first value), so that it is "
                "modelled and followed."
            )

    def _warn_if_new_tensors(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Say once per fit when the optimizers train tensors that are no inner parameters of
        the hypergradient: unfrozen or added during the fit (``BackboneFinetuning`` adds a
        parameter group), while the inner parameters are collected when a fit starts."""
        assert self.sid is not None
        if self._said_new_tensors:
            return
        known = {id(p) for p in self.sid.inner_parameters}
        names = {id(p): n for n, p in named_tensors(pl_module)}
        new = [
            names.get(id(p), "an unnamed tensor")
            for opt in trainer.optimizers
            for group in opt.param_groups
            for p in group["params"]
            if p.requires_grad and id(p) not in known
        ]
        if new:
            self._said_new_tensors = True
            rank_zero_warn(
                f"{type(self).__name__}: the optimizers now train {len(new)} tensors the fit did "
                f"not start with ({', '.join(new[:3])}{', ...' if len(new) > 3 else ''}; e.g. "
                f"BackboneFinetuning unfroze them): they {self._new_tensors_get}, because "
                "the inner parameters are collected when a fit starts. Unfreeze before the fit, "
                "or continue in a new fit (trainer.fit again with this callback: λ carries over "
                "and the new tensors are collected)." + self._thawed_mid_fit_advice
            )

    def _warn_if_ended_before_learning(self, trainer: pl.Trainer) -> None:
        """A fit planned long enough that ended (``EarlyStopping``, ``max_time``, a
        ``should_stop``) before its first hyper step was due learned nothing: say so, since the
        hyperparameters then read as learned values (data weights all at their start, nothing
        flagged; λ where it started)."""
        ran = trainer.global_step - self._fit_start
        if self._due_in_fit or self._planned_short or ran <= 0:
            return
        n = self.every_n_steps
        first = -(-max(self.start_step, self._fit_start + 1, 1) // n) * n
        rank_zero_warn(
            f"{type(self).__name__}: the fit ended after {ran} optimizer steps (at step "
            f"{trainer.global_step}), before its first hyper step (due at step {first}: "
            f"start_step={self.start_step}, "
            f"every_n_steps={n}), so it learned nothing: the hyperparameters are where they "
            "started. If a callback stopped it early (EarlyStopping, max_time), let it run past "
            "that step (e.g. EarlyStopping(patience=...) or min_steps), or lower start_step."
        )

    def _warn_if_budget_cut(self) -> None:
        """One warning where the budget ran too few of the fit's due hyper steps for
        the hyperparameters to be learned: none of them (the budget's own account of why,
        :meth:`~hypertorch_sid.core.budget.Budget.starved`), or fewer than
        :meth:`hyper_steps_needed` where more were due (:func:`budget_cut`). Counted, not timed:
        the hyper steps due and those run."""
        assert self.sid is not None
        ran, due = self._ran_in_fit, self._due_in_fit
        said = (
            self.budget.starved(due, self.sid.minimum_products())
            if ran == 0
            else budget_cut(
                ran, due, self.hyper_steps_needed(), getattr(self.budget, "max_overhead", None),
                self.hyperparameters_named,
            )
        )  # fmt: skip
        if said is not None:
            rank_zero_warn(f"{type(self).__name__}: {said}")
