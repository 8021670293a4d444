"""How long the fit trains, as the callbacks count it: the optimizer steps it plans
(:func:`planned_steps`, under a changing gradient accumulation, SWA's BatchNorm epoch and manual
optimisation too), the steps left (:func:`remaining_steps`), and R, the horizon the hypergradient
and the outer step's bound count on where the length is unknown (:func:`horizon`, eq.
decaytrust); and whether the fit runs in processes the strategy starts
(:func:`runs_in_new_processes`).
"""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl

from .namespaces import classes

__all__ = ["StepShares", "horizon", "planned_steps", "remaining_steps", "runs_in_new_processes"]


def planned_steps(trainer: pl.Trainer) -> float:
    """The optimizer steps the fit plans: ``trainer.estimated_stepping_batches``, counted per
    epoch where the accumulation changes between epochs. Lightning divides every epoch by the
    accumulation in force when it is read (session 55: ``GradientAccumulationScheduler({0: 1,
    2: 4})`` over 5 epochs of 32 batches, 88 steps, read as 160 at the fit's start and 40 from
    epoch 2 on, so the steps left went negative and the warnings counted a fit that does not
    run); ``StochasticWeightAveraging`` adds an epoch that accumulates all its batches into one
    step (BatchNorm's statistics of the averaged weights)."""
    total = trainer.estimated_stepping_batches
    if _manual(trainer):
        return _paced_steps(trainer, total)
    scheduler = _callback(trainer, "callbacks.GradientAccumulationScheduler")
    swa = _callback(trainer, "callbacks.StochasticWeightAveraging")
    bn_epoch = swa is not None and getattr(swa, "_model_contains_batch_norm", False)
    if not (scheduler or bn_epoch):
        return total
    batches, epochs = trainer.num_training_batches, trainer.max_epochs
    if epochs in (None, -1) or not math.isfinite(batches):
        return total
    base = trainer.accumulate_grad_batches  # in SWA's own epoch: all its batches; the fit's:
    if bn_epoch and trainer.current_epoch >= epochs - 1:
        base = getattr(swa, "_accumulate_grad_batches", base)
    accumulate = scheduler.get_accumulate_grad_batches if scheduler else lambda _: base
    steps = [math.ceil(batches / accumulate(epoch)) for epoch in range(max(epochs, 1))]
    if bn_epoch:
        steps[-1] = 1
    return min(sum(steps), trainer.max_steps) if trainer.max_steps != -1 else sum(steps)


def _paced_steps(trainer: pl.Trainer, total: float) -> float:
    """Under manual optimisation Lightning counts training batches, and ``training_step`` steps
    the optimizers as often as it likes (every second batch, session 55: 80 steps read as 160):
    the batches planned × the steps per batch so far. Before the first step: Lightning's count ×
    the optimizers, each stepped once a batch (Lightning's pattern for several; session 59: two
    optimizers toggled in turn ran 384 steps, warned at the fit's start as 192)."""
    batches, epochs, step = trainer.num_training_batches, trainer.max_epochs, trainer.global_step
    seen = trainer.fit_loop.epoch_loop.total_batch_idx + 1
    if step == 0:
        return _each_optimizer_once(trainer, total)
    if epochs in (None, -1) or not math.isfinite(batches) or seen <= 0:
        return total
    steps = math.ceil(batches * max(epochs, 1) * step / seen)
    return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps


def _each_optimizer_once(trainer: pl.Trainer, total: float) -> float:
    """Lightning's count of a manual fit's steps (its batches) × its optimizers, up to
    ``max_steps`` (which Lightning counts in optimizer steps)."""
    steps = total * max(len(trainer.optimizers), 1)
    return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps


def _manual(trainer: pl.Trainer) -> bool:
    """Whether the fit's module optimizes manually (``automatic_optimization = False``)."""
    module = getattr(trainer, "lightning_module", None)
    return module is not None and not module.automatic_optimization


def _callback(trainer: pl.Trainer, path: str) -> Any:
    """The trainer's callback of the Lightning class at ``path`` (None: none)."""
    return next(
        (c for c in getattr(trainer, "callbacks", ()) if isinstance(c, classes(path))), None
    )


class StepShares:
    """Each training optimizer's share of the fit's optimizer steps, counted as they are made.

    Lightning's ``global_step``, and with it R (:func:`horizon`), counts the steps of every
    optimizer; a tensor moves only in its own optimizer's. Where n optimizers step in turn
    (manual optimisation, Lightning's pattern for several: each once a batch) a tensor is
    updated in 1/n of the R steps left, so what the callbacks read per step of R — its step size
    η and the shrink its decay causes (eqs. horizondelta, decaytrust, shrinkrate) — is its
    optimizer's times that share (eq. stepshare):

        share_o = steps of optimizer o / steps of all optimizers, so far in this fit.

    Session 61: the two-optimizer recipe (an SGD encoder and an Adam head, each stepped once a
    batch) had every tensor's ηR read as twice its own. One optimizer, or before any step: 1;
    an optimizer that has not stepped yet among others that have: 0.
    """

    def __init__(self) -> None:
        self._steps: dict[int, int] = {}

    def reset(self) -> None:
        """Count afresh (a new fit)."""
        self._steps = {}

    def count(self, optimizer: Any) -> None:
        """``optimizer`` has made one update."""
        self._steps[id(optimizer)] = self._steps.get(id(optimizer), 0) + 1

    def share(self, optimizer: Any) -> float:
        """share_o of eq. stepshare (1 before any step is counted)."""
        total = sum(self._steps.values())
        return self._steps.get(id(optimizer), 0) / total if total else 1.0


def remaining_steps(trainer: pl.Trainer) -> int | None:
    """The optimizer steps left in the fit (None where its length is unknown)."""
    total = planned_steps(trainer)
    return int(total) - trainer.global_step if math.isfinite(total) and total >= 0 else None


def horizon(trainer: pl.Trainer) -> tuple[int, str | None]:
    """R, the training steps the hypergradient's horizon and the outer step's bound count on
    (eq. decaytrust), and where the fit's length is unknown, how R was estimated (a message).

    * A known length (``max_steps``, ``max_epochs`` with a sized loader): the steps left, or
      fewer where a ``max_time`` limit will end the fit sooner at the pace so far.
    * ``max_time`` alone: the time left at the pace so far.
    * Neither (``max_epochs=-1`` with early stopping, a stream): as many steps again as have
      run — Gott's Copernican estimate (the present is no special moment of the fit, so the
      steps left are as likely below as above the steps run). Unbounded, an outer step that
      grows λ while the hypergradient agrees outruns the weights' answer to it (on the main
      job's recipe, seed 0: λ 0.33 and held-out test loss 2.23 against 0.05 and 0.225).
    """
    steps = max(trainer.global_step, 1)
    known = remaining_steps(trainer)
    paced = _steps_left_in_time(trainer, steps)
    if known is not None:
        return (known if paced is None else min(known, paced)), None
    if paced is not None:
        return paced, None
    return steps, (
        "the fit's length is unknown (max_epochs=-1 without max_steps, or a loader without "
        "len), so the horizon of the hypergradient and of λ's rises (eq. decaytrust) is taken "
        "as the steps run so far, re-estimated at every hyper step. Pass max_steps or "
        "max_epochs (an upper bound will do) for the exact one."
    )


def _steps_left_in_time(trainer: pl.Trainer, steps: int) -> int | None:
    """The steps a ``max_time`` limit (Lightning's ``Timer``) leaves at the pace so far (None:
    no limit, or no time measured yet)."""
    timer = next((c for c in trainer.callbacks if isinstance(c, classes("callbacks.Timer"))), None)
    if timer is None:
        return None
    spent, left = timer.time_elapsed("train"), timer.time_remaining("train")
    if left is None or spent <= 0:
        return None
    return max(int(steps * left / spent), 0)


def runs_in_new_processes(trainer: pl.Trainer) -> bool:
    """Whether the fit runs in processes started by the strategy (``ddp_spawn``, ``ddp_fork``,
    ``ddp_notebook``: Lightning's multiprocessing launcher), not in the calling one."""
    launcher = getattr(trainer.strategy, "launcher", None)
    return type(launcher).__name__ == "_MultiProcessingLauncher"
