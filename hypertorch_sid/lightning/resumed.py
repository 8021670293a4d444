"""Which checkpoint a fit resumed from, and why a checkpoint's state can stay unread.

:func:`resumed_from` is ``trainer.ckpt_path`` without the temporary checkpoints of Lightning's
tuners (:data:`TUNER_CHECKPOINTS`); the messages say why a callback given a checkpoint's state
outside a fit (or by a fit that ran no step) has not applied it, and the way forward.
"""

from __future__ import annotations

import os
from typing import Any

import pytorch_lightning as pl

__all__ = ["TUNER_CHECKPOINTS", "resumed_from"]


#: the basenames' starts of the temporary checkpoints Lightning's tuners (``LearningRateFinder``,
#: ``BatchSizeFinder``, ``Tuner``) write at the fit's start, restore and remove: after one of them
#: runs inside a fit, ``trainer.ckpt_path`` names its file, though the fit resumed from nothing
TUNER_CHECKPOINTS = (".lr_find_", ".scale_batch_size_")


def resumed_from(trainer: pl.Trainer) -> Any:
    """The checkpoint the fit resumed from (``trainer.ckpt_path``), None for none or for a
    tuner's temporary checkpoint (:data:`TUNER_CHECKPOINTS`, session 56: such a fit was told
    that "the checkpoint .lr_find_….ckpt holds no state of this callback")."""
    path = trainer.ckpt_path
    if path is None or os.path.basename(os.fspath(path)).startswith(TUNER_CHECKPOINTS):
        return None
    return path


_UNAPPLIED_BY_FIT = (
    "the fit that loaded it (trainer.fit(..., ckpt_path=...)) ran no step, its max_epochs / "
    "max_steps being reached at the checkpoint. Resume with trainer.fit(..., ckpt_path=...) and "
    "a larger max_epochs (they are applied at its first training step), or keep the fitted "
    "callback object."
)


def _unapplied_outside_fit(loaded_by: str) -> str:
    """Why a checkpoint's state that ``trainer.<loaded_by>(ckpt_path=...)`` gave a callback is
    unread, and the way forward (session 58: a drop-in made in ``configure_callbacks()`` is a
    new object at every ``trainer.test``, so the one that trained is gone from the Trainer)."""
    return (
        f"trainer.{loaded_by}(..., ckpt_path=...) gave it the checkpoint's state, and this "
        "callback object has run no fit in this process, so it is not the one that trained. "
        "Lightning replaces the Trainer's callbacks by those the LightningModule's "
        f"configure_callbacks() returns at every trainer.fit / {loaded_by}, so a drop-in made "
        "inside configure_callbacks() (or given to a new Trainer) is a new object there: make it "
        "once (e.g. in __init__: self.drop_in = ...) and return that object from "
        "configure_callbacks(), then read it (after trainer."
        f"{loaded_by}(ckpt_path=...) it holds the checkpoint's values); or read the fitted "
        f"object before trainer.{loaded_by}."
    )
