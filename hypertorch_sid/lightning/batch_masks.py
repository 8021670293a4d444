"""Whether the training's per-sample loss masks rows: :class:`MaskDetection`.

A ``training_step`` that zeroes some rows' losses anew in each batch (``losses * keep``, keep a
0/1 mask: the hardest k rows of online hard example mining, a curriculum, loss truncation;
``ignore_index``) gives those rows a loss of exactly 0 that teaches nothing. Through the
self-normalised loss's Σ ω each such row's weight was pushed down at every masked visit
(session 62, OHEM: clean rows flagged 1.3–4.1× as often as with every row kept). A loss value of
exactly 0 cannot say it alone: a cross entropy rounds to 0 in float32 on a row fitted with
certainty (the reverted session-62 fix, which went by the value, failed the BatchNorm CNN's
separation test). The signal here is structural: exact zeros in one of the fit's first
:data:`~.data_checks.MASKED_CHECKS` training batches (a young network fits no example with
certainty) that stay exactly 0 with the network's weights shrunk 1000-fold
(:meth:`~.row_record.RowRecord._zero_when_shrunk`: such a loss does not depend on the weights).
Where a batch shows them, the fit's weights read a row of loss exactly 0 as masked at that visit
(:class:`~hypertorch_sid.core.weighted_loss.ZeroLossMasks`) from that step on; a fit whose first
batches show none keeps every row as before (:class:`~hypertorch_sid.core.weighted_loss.RowMasks`),
bit for bit, for the rest of the fit. docs/data_weights.md, "Session 63: per-batch masks".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigurationError
from ..core.weighted_loss import RowMasks, ZeroLossMasks
from .data_checks import MASKED_CHECKS, _warn_masked_samples

__all__ = ["MaskDetection"]


class MaskDetection:
    """The fit's answer to "does the loss mask rows?", and the :class:`RowMasks` it gives the
    weights (:meth:`row_masks`).

    It watches the fit's first :data:`MASKED_CHECKS` training batches of the loop
    (:meth:`watch`; each warns as the masked-examples check always did); once one shows a mask
    it is ``detected`` for the rest of the fit and watches no more. After the window nothing
    switches it on: a loss exactly 0 later in the fit can be a row fitted with certainty, and
    telling it from a mask costs the shrunk re-run (one forward) at every step with a zero
    and a read of the device at every step; a fit's weights would also be moved by one rule
    before and another after a late switch. A per-batch mask that only starts after the
    window (a curriculum masking from epoch k) therefore moves the rows as before.

    Under DDP every rank decides alike: at each step of the window one ``all_gather`` of
    whether this rank's batch showed a mask (the loss is the same code on every rank, so one
    rank's evidence holds for all; a rank whose batches happened to hold no masked row would
    otherwise keep pushing its rows down). Kept in the callback's checkpoint
    (:meth:`state_dict`): a resumed fit goes on with the same answer and the rest of the same
    window, as the fit would have without the stop.
    """

    def __init__(self, detected: bool = False, left: int = MASKED_CHECKS) -> None:
        #: whether a batch of the window showed a mask (on any rank)
        self.detected = bool(detected)
        #: the training batches of the window still to watch
        self.left = int(left)

    @property
    def watching(self) -> bool:
        """Whether the next training batch of the loop is watched."""
        return self.left > 0 and not self.detected

    def watch(
        self,
        losses: Any,
        data: Any,
        zero_when_shrunk: Callable[[Any], Tensor],
        gather: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """One training batch of the window: its per-sample ``losses`` and ``data`` (None:
        the batch as the step got it is gone, nothing read of it), ``zero_when_shrunk`` the
        shrunk re-run, ``gather`` DDP's ``all_gather`` (None: one process). A batch that shows
        masked examples is warned of (:func:`~.data_checks._warn_masked_samples`, by rank 0's
        logger: a mask only another rank saw is taken, not said) and sets :attr:`detected`,
        on every rank."""
        self.left -= 1
        seen = data is not None and _warn_masked_samples(losses, data, zero_when_shrunk)
        if gather is not None:  # every rank at every step of the window: they decide alike
            device = losses.device if isinstance(losses, Tensor) else None
            seen = bool(gather(torch.tensor([float(seen)], device=device)).sum() > 0)
        if seen:
            self.detected = True

    def row_masks(self) -> RowMasks:
        """What the weights read of a row's loss at a visit: exactly 0 means masked
        (:class:`ZeroLossMasks`) where the loss masks rows, else nothing (:class:`RowMasks`)."""
        return ZeroLossMasks() if self.detected else RowMasks()

    def state_dict(self) -> dict[str, Any]:
        return {"detected": self.detected, "left": self.left}

    @classmethod
    def from_state(cls, state: Any) -> MaskDetection:
        """The detection a checkpoint's :meth:`state_dict` held, or a clear error."""
        if not (
            isinstance(state, Mapping)
            and isinstance(state.get("detected"), bool)
            and isinstance(state.get("left"), int)
            and not isinstance(state.get("left"), bool)
            and 0 <= state["left"] <= MASKED_CHECKS
        ):
            raise ConfigurationError(
                "LearnedDataWeights: the checkpoint's data_batch_masks must be a dict "
                f"{{'detected': bool, 'left': int in 0..{MASKED_CHECKS}}}, got {state!r}: it is "
                "corrupted."
            )
        return cls(state["detected"], state["left"])

    def __repr__(self) -> str:
        return f"MaskDetection(detected={self.detected}, left={self.left})"
