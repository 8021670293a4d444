"""Whether a ``training_step``'s per-sample losses follow the batch's rows (session 63).

``LearnedDataWeights`` gives loss i the weight of row i of the batch. A step that returns its
losses in another order — grouped by class (``torch.cat([l[y == c] for c in classes])``),
sorted by sequence length for ``pack_padded_sequence`` — passes every shape check, and each
weight then multiplies another example's loss: on the careless-user toy the learned weights
came out uncorrelated with the right ones (correlation −0.02, largest difference 0.90),
silently.

The check, once at the fit's first training step: the step is run again on the batch in eval
mode, without gradient, under the same random stream (the step's own draws replayed), then on
the batch with row i's content replaced by row j's, for i = the first and the last row. Loss i
must change; where it does not, while another one does, row i's loss is elsewhere. Losses that
couple rows (mixup, a contrastive loss) change loss i too and are not said; randomness not
replayed (NumPy's) can only hide a fault, not invent one; a batch the replaced row makes
invalid (flat tokens with per-row offsets: the step fails) is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from .cross_term import RandomState
from .isolation import metric_states_kept, muted_logging


def warn_if_losses_leave_rows(
    step: Callable[..., Any], data: Any, losses: Tensor, module: pl.LightningModule
) -> bool:
    """Say (a warning) where ``step(data, 0)``'s per-sample losses do not follow the rows of
    ``data`` (module docstring); True if said. ``losses``: what the step returned, (b,) or
    (b, ...)."""
    b = losses.shape[0] if losses.dim() > 0 else 0
    if b < 3 or not module.automatic_optimization:
        return False
    rng = RandomState.capture(module.device)
    with torch.no_grad(), _eval_flags(module), muted_logging(module), metric_states_kept(module):
        base = _losses(step, data, rng, b)
        if base is None:
            return False
        for i, j in ((0, 1), (b - 1, b - 2)):
            moved = _losses(step, _row_replaced(data, b, i, j), rng, b)
            if moved is None:
                return False
            changed = (moved - base).abs() > 1e-6 * (1 + base.abs())
            if not bool(changed[i]) and bool(changed.any()):
                at = int(changed.nonzero()[0])
                rank_zero_warn(
                    f"LearnedDataWeights: training_step's per-sample losses do not follow the "
                    f"batch's rows: with row {i}'s example replaced, loss {i} stayed as it was "
                    f"and loss {at} changed, so each weight would multiply another example's "
                    "loss. Does training_step group or sort the rows (torch.cat([l[y == c] for "
                    "c in classes]), a sort by length for pack_padded_sequence)? Return the "
                    "losses in the batch's order (undo the sort: losses[order.argsort()]; "
                    "enforce_sorted=False sorts nothing)."
                )
                return True
    return False


@contextmanager
def _eval_flags(module: torch.nn.Module) -> Iterator[None]:
    """Every submodule in eval mode inside, its own flag back after. Not ``frozen_mode``: its
    restore of the buffers (in place) broke the step's pending backward, whose graph holds a
    BatchNorm's running statistics; in eval mode no forward changes them."""
    flags = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, training in flags.items():
            m.training = training


def _losses(step: Callable[..., Any], data: Any, rng: RandomState, b: int) -> Tensor | None:
    """The step's per-sample losses on ``data`` as a (b,) float64 tensor under the replayed
    stream, or None where it returns something else (the caller's checks say what)."""
    try:
        with rng.replayed():
            out = step(data, 0)
    except Exception:  # a batch whose rows are not independent records (offsets): no check
        return None
    out = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != b:
        return None
    return out.detach().reshape(b, -1).double().mean(1)


def _row_replaced(data: Any, b: int, i: int, j: int) -> Any:
    """``data`` with row i of every tensor of b rows holding row j's content."""

    def replace(t: Tensor) -> Tensor:
        if t.dim() == 0 or t.shape[0] != b:
            return t
        out = t.clone()
        out[i] = t[j]
        return out

    return apply_to_collection(data, Tensor, replace)
