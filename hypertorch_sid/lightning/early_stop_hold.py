"""Holding an ``EarlyStopping`` stop until the data weights have had the chance to act.

:class:`~hypertorch_sid.lightning.data_weights.LearnedDataWeights` trains plainly until its first
hyper step (optimizer step 80 by default); plain training on noisy labels reaches its lowest
validation loss earlier and then fits the wrong labels, so a user's ``EarlyStopping`` can end the
fit before the weights act, and its ``ModelCheckpoint`` then keeps a plain fit's model (session
56, ``ckpt_cnn``: 19 of 60 seeds). The hold keeps such a fit going to the step

    s_hold = min(first hyper step + ⌈2 · steps per epoch⌉, planned steps)

with Lightning's own mechanism: the fit loop's ``min_steps`` (below which ``trainer.should_stop``
does not end the fit) raised to ``max(the user's min_steps, s_hold)`` for the fit and restored
after it. A ``Timer`` (``Trainer(max_time=...)``) still stops the fit on time: once its time is
up the hold is released; so is a stop an ``EarlyStopping`` asks for on a non-finite metric, a
``divergence_threshold`` or a ``stopping_threshold`` (only a patience run out is held). Works
alike under ``pytorch_lightning`` and ``lightning.pytorch``; under DDP every rank computes the
same step and takes rank 0's reading of the clock.
"""

from __future__ import annotations

import math
from typing import Any

from .namespaces import classes

__all__ = ["EarlyStopHold", "hold_step"]


def hold_step(first_hyper_step: int, epoch_steps: float, planned: float) -> int:
    """s_hold: the first hyper step plus two epochs of optimizer steps, capped by the fit's
    planned length (``planned_steps``; infinite where unknown)."""
    step = first_hyper_step + math.ceil(2 * epoch_steps)
    return int(min(step, planned)) if math.isfinite(planned) else step


class EarlyStopHold:
    """One fit's hold: :meth:`engage` at the fit's start, :meth:`check` after each training
    batch and epoch, :meth:`release` at its end (or on an exception).

    Attributes
    ----------
    step:
        The step the fit's ``min_steps`` was raised to (None: not engaged in this fit).
    held_at:
        The step at which a stop was first requested and held (None: none was): that of the
        last validation or epoch end (where ``EarlyStopping`` decides) before it was seen.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.held_at: int | None = None
        self._loop: Any = None
        self._user: int | None = None
        self._decided_at: int | None = None

    def mark(self, global_step: int) -> None:
        """Note a point where an ``EarlyStopping`` may have decided (a validation's or an
        epoch's end): a stop seen later was asked for here."""
        self._decided_at = global_step

    def engage(self, trainer: Any, step: int) -> bool:
        """Raise the fit's ``min_steps`` to ``step`` where an ``EarlyStopping`` is among the
        trainer's callbacks, the fit is before ``step`` and the user's ``min_steps`` is lower.
        Returns whether it did."""
        self.step = self.held_at = self._decided_at = None
        if not any(isinstance(c, classes("callbacks.EarlyStopping")) for c in trainer.callbacks):
            return False
        loop = trainer.fit_loop.epoch_loop
        if step <= trainer.global_step or (loop.min_steps or 0) >= step:
            return False
        self._loop, self._user, self.step = loop, loop.min_steps, step
        loop.min_steps = step
        return True

    def release(self) -> None:
        """Give the fit loop the user's ``min_steps`` back (nothing where not engaged)."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.min_steps = self._user

    @property
    def engaged(self) -> bool:
        """Whether ``min_steps`` is raised now."""
        return self._loop is not None

    def check(self, trainer: Any) -> bool:
        """Release the hold where a ``Timer``'s time is up (rank 0's clock under DDP); returns
        whether a stop is being held for the first time now (for the one line that says so)."""
        if not self.engaged:
            return False
        if _time_is_up(trainer) or _stopped_not_by_patience(trainer):
            self.release()
            return False
        if trainer.should_stop and self.held_at is None and trainer.global_step < self.step:
            decided = self._decided_at
            self.held_at = trainer.global_step if decided is None else decided
            return True
        return False


#: the reasons an ``EarlyStopping`` stops a fit that the hold keeps going: patience run out
#: (plain training past its lowest validation loss). A metric that is NaN or has crossed the
#: user's ``divergence_threshold`` (a diverged model), or a ``stopping_threshold`` reached
#: (the user's own goal), stops the fit as the user asked (session 58: they were held)
HELD_REASONS = ("NOT_STOPPED", "PATIENCE_EXHAUSTED")


def _stopped_not_by_patience(trainer: Any) -> bool:
    """Whether an ``EarlyStopping`` asked to stop for a reason other than its patience (its
    ``stopping_reason``; a Lightning that records none is read as patience)."""
    for stopper in trainer.early_stopping_callbacks:
        reason = getattr(getattr(stopper, "stopping_reason", None), "name", "NOT_STOPPED")
        if reason not in HELD_REASONS:
            return True
    return False


def _time_is_up(trainer: Any) -> bool:
    """Whether a ``Timer`` among the trainer's callbacks (``max_time``) has no time left; under
    DDP rank 0's answer, as the ``Timer`` itself decides. Nothing is broadcast without one."""
    timers = [c for c in trainer.callbacks if isinstance(c, classes("callbacks.Timer"))]
    left = [c.time_remaining() for c in timers]
    if not any(t is not None for t in left):
        return False
    up = any(t is not None and t <= 0 for t in left)
    return bool(trainer.strategy.broadcast(up, src=0))
