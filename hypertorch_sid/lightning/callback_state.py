"""The hyper-optimization callback's checkpoint state: what it saves, loads and checks.

:class:`CheckpointState` is a mixin of
:class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback` (it reads and sets the
callback's ``sid``, ``data``, ``history``, ``budget`` and the λ it keeps for the module): its
:meth:`~CheckpointState.state_dict` holds λ, the outer optimizer, v, the counters, the constants,
both samplers and the budget's accounting, as plain tensors and numbers; a loaded state is held
until the fit's core object is built and applied only once all of it has been validated.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_warn

from ..checkpoint_file import verify_checkpoint_file
from ..core.budget import check_budget_state
from ..core.errors import ConfigurationError
from .averaging import put_learned_in_averages
from .problem import MEANING_KEY, refuse_another_callbacks_state
from .resumed import _UNAPPLIED_BY_FIT, _unapplied_outside_fit

__all__ = ["CheckpointState"]

_STATE_KEYS = ("sid", "train_sampler", "val_sampler", "val_samples", "history")


class CheckpointState:
    """Saving, loading and validating the callback's state (a mixin of
    :class:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback`)."""

    def state_dict(self) -> dict[str, Any]:
        """SID state (λ, outer optimizer, warm-start v, counters, constants, cost), samplers,
        and the budget's accounting (a resumed fit keeps what it spent)."""
        if self.sid is None:
            return dict(self._pending) if self._pending is not None else {}
        assert self.data is not None
        return {
            "sid": self.sid.state_dict(),
            **self.data.state_dict(),
            "history": [dict(h) for h in self.history],
            "budget": self.budget.state_dict(),
        }

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """The checkpoint's ``state_dict`` holds λ as learned, also where a weight-averaging
        callback writes its average there (before or after this hook: both are set,
        :mod:`~hypertorch_sid.lightning.averaging`)."""
        put_learned_in_averages(trainer, self._names, self._learned)
        state = checkpoint.get("state_dict", {})
        for name, learned in zip(self._names, self._learned):
            if name in state:
                state[name] = learned.clone()

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Refuse a checkpoint file whose bytes fail their CRC-32 (``torch.load`` skips it);
        note which of the Trainer's functions loads it (``trainer.test(ckpt_path=...)`` loads
        the callbacks' state too, but only a fit applies it)."""
        verify_checkpoint_file(trainer.ckpt_path)
        self._loaded_by = getattr(trainer.state.fn, "value", trainer.state.fn)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (applied at ``on_train_start`` if not built yet).

        Every entry is validated before anything changes (see :meth:`_restore`): an incomplete,
        corrupted or foreign state raises :class:`ConfigurationError`.
        """
        if not state_dict:
            return
        if not isinstance(state_dict, dict):
            raise ConfigurationError(
                f"not a {type(self).__name__} state: expected a dict, got "
                f"{type(state_dict).__name__}."
            )
        # a drop-in's state (it removes this key before it gets here) in the base callback
        refuse_another_callbacks_state(type(self).__name__, state_dict.get(MEANING_KEY))
        missing = [key for key in _STATE_KEYS if key not in state_dict]
        if missing:
            raise ConfigurationError(
                f"not a complete {type(self).__name__} state: {missing} missing (truncated "
                "or foreign checkpoint?). Resume from a checkpoint written by this callback."
            )
        self._pending = dict(state_dict)
        if self.sid is not None and not self._fitting:
            # outside a fit (e.g. to inspect a checkpoint) the state is applied now; a fit builds
            # a new core object at on_train_start and applies it then
            self._restore()

    def _refuse_unapplied_checkpoint(self, what: str) -> None:
        """A checkpoint's state is applied at a fit's first training step: a resumed fit that
        ran none (``trainer.fit(ckpt_path=...)`` with the checkpoint's own ``max_epochs``, e.g.
        to get a finished fit's hyperparameters back) left it unapplied, and the drop-ins'
        readers gave their start silently: ``learned_weight_decay`` λ₀ (1e-3 where 6.5e-8 was
        learned), ``data_weights()`` nothing and ``flagged()`` no row (session 52). Read after
        a fit that an exception ended (a Ctrl-C too: Lightning stops the fit and raises
        ``SystemExit``), they say so once (session 55: the unfinished fit's values, silently)."""
        if self._pending is not None:
            loaded_by = self._loaded_by or "fit"
            raise ConfigurationError(
                f"{type(self).__name__}.{what}: this callback holds "
                f"{self.hyperparameters_named} from a checkpoint that no training step has "
                "applied yet: "
                + (_UNAPPLIED_BY_FIT if loaded_by == "fit" else _unapplied_outside_fit(loaded_by))
            )
        if self._unfinished is not None:  # read after a fit an exception or Ctrl-C ended:
            said, self._unfinished = self._unfinished, None  # its values, silently (s55)
            rank_zero_warn(
                f"{type(self).__name__}.{what}: the last fit was ended {said}, before its "
                f"end: these are {self.hyperparameters_named} as it left them, not a finished "
                "fit's. Resume it (trainer.fit(..., ckpt_path=...) from a checkpoint) or fit "
                "again before relying on them."
            )

    def _say_unbuilt(self, what: str, empty: str) -> None:
        """A read-out of a callback object no fit has built its hyperparameters in: what it
        returns (``empty``: {} or an empty tensor) read as "nothing learned" or "no suspect",
        silently, where the user read another object than the Trainer's (a second
        ``LearnedWeightDecay()``, or one read before ``fit``; session 62; ``flagged`` since
        session 55)."""
        rank_zero_warn(
            f"{type(self).__name__}.{what}: no fit has built {self.hyperparameters_named} of "
            f"this callback object in this process, so it returns {empty}: read it from the "
            "callback given to the Trainer (trainer.fit(...) with callbacks=[callback]), after "
            "the fit (a fit run in new processes, e.g. strategy='ddp_spawn', keeps them there)."
        )

    def _restore(self) -> None:
        """Load the pending state: everything is checked first, so a bad state changes nothing."""
        assert self.sid is not None and self.data is not None and self._pending is not None
        state, self._pending = self.data.resized_by_reload(self._pending), None
        self.data.check_state(state)
        budget = state.get("budget", {})  # absent in checkpoints written before it was kept
        check_budget_state(budget)
        history = state["history"]
        if not isinstance(history, list) or not all(
            isinstance(h, dict) and all(isinstance(x, (int, float)) for x in h.values())
            for h in history
        ):
            raise ConfigurationError(
                "the checkpoint's history must be a list of dicts of numbers: it is corrupted."
            )
        self.sid.load_state_dict(state["sid"])  # validates everything before changing anything
        self.data.load_state_dict(state)
        self.history = [dict(h) for h in history]
        self.budget.load_state_dict(budget)
