"""The data terms of :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`'s bilevel
problem: ℓ, the user's training loss on a training batch (the inner loss without the decay), and
E, the validation loss (``validation_loss=``, else ℓ on a validation batch).

ℓ is ``training_loss(module, batch)`` where given, else ``training_step(batch, 0)`` with
``self.log`` muted (:func:`~hypertorch_sid.lightning.isolation.muted_logging`). What either
returns is checked to be a scalar tensor, and a failure is named with its fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from ..core.errors import ConfigurationError
from ..core.indexing import Indexed
from .isolation import muted_logging
from .problem import with_batch_idx

__all__ = ["DataLoss"]


class DataLoss:
    """ℓ or E on a batch: ``data_loss(module, batch, "training")`` or ``(..., "validation")``.

    ``training_loss`` and ``validation_loss``: see
    :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`.
    """

    def __init__(
        self,
        training_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        validation_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
    ) -> None:
        self.training_loss = training_loss
        self.validation_loss = validation_loss
        #: whether E's direction was compared with ℓ's on a validation batch (session 64)
        self._compared = False

    def __call__(
        self, module: pl.LightningModule, batch: Any, which: Literal["training", "validation"]
    ) -> Tensor:
        """The scalar loss of ``module`` on ``batch``: ℓ (``which="training"``) or E."""
        if which == "validation" and self.validation_loss is not None:
            source, out = "validation_loss", self.validation_loss(module, batch)
        elif which == "validation":  # the training loss on a validation batch
            source, out = self._training_loss_on_validation(module, batch)
        else:
            source, out = self._training_loss(module, batch)
        if isinstance(out, Mapping):
            out = out.get("loss")
        if not isinstance(out, Tensor) or out.numel() != 1:
            fix = (
                "return a scalar tensor computed from the module (not a Python float or "
                ".item(): λ's hypergradient flows through it)"
                if source != "training_step"
                else "pass training_loss=lambda module, batch: <scalar tensor>"
            )
            if out is None and source == "training_step":
                fix += (
                    " (Lightning skips a batch whose training_step returns None; a hyper step "
                    "needs the loss of every batch it draws)"
                )
            got = (
                f"a tensor of shape {tuple(out.shape)} (per-sample losses? reduce them: .mean())"
                if isinstance(out, Tensor)
                else type(out).__name__
            )
            raise ConfigurationError(
                f"LearnedWeightDecay: {source} returned {got}, not a scalar tensor ({which} "
                f"loss): {fix}."
            )
        if source == "validation_loss" and not self._compared:
            self._compared = True
            self._warn_if_a_score(module, batch, out)
        return out.reshape(())

    def _warn_if_a_score(self, module: pl.LightningModule, batch: Any, e: Tensor) -> None:
        """Once, at the first E of a ``validation_loss``: its gradient in the trained weights
        against ℓ's on the same validation batch. A loss falls where ℓ falls; one whose
        gradient points against ℓ's (cosine below −0.5) is a score to maximise (an accuracy,
        a log-likelihood), which the hyper steps minimise: λ then climbs to make the model
        worse, silently (session 64: ``validation_loss=-cross_entropy`` drove λ from 1e-4 to
        0.11 in 6 hyper steps). Two backward passes, once."""
        weights = [p for p in module.parameters() if p.requires_grad]
        try:
            _, ell = self._training_loss_on_validation(module, batch)
        except Exception:  # noqa: BLE001 (validation batches training_step cannot read: the
            return  # reason validation_loss= exists; nothing to compare)
        ell = ell.get("loss") if isinstance(ell, Mapping) else ell
        if not (weights and isinstance(ell, Tensor) and ell.numel() == 1 and e.requires_grad):
            return
        with torch.enable_grad():
            g_e = torch.autograd.grad(e.sum(), weights, retain_graph=True, allow_unused=True)
            g_l = torch.autograd.grad(ell.sum(), weights, allow_unused=True)
        pairs = [
            (a.flatten(), b.flatten()) for a, b in zip(g_e, g_l) if a is not None and b is not None
        ]
        if not pairs:
            return
        a, b = torch.cat([p[0] for p in pairs]).double(), torch.cat([p[1] for p in pairs]).double()
        cosine = float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))
        if cosine < -0.5:
            source = "training_loss" if self.training_loss is not None else "training_step"
            rank_zero_warn(
                "LearnedWeightDecay: validation_loss rises where the training loss falls: on a "
                f"validation batch its gradient in the weights points against {source}'s "
                f"(cosine {cosine:.2f}), so it reads as a score to maximise (an accuracy, a "
                "log-likelihood, a loss negated). The hyper steps minimise validation_loss: "
                "they would tune λ to make the model worse. Return a loss, lower for a better "
                "model (e.g. F.cross_entropy(module(x), y), not its negative)."
            )

    def _training_loss(self, module: pl.LightningModule, batch: Any) -> tuple[str, Any]:
        """(where it came from, ℓ on ``batch``): ``training_loss`` or ``training_step``."""
        if self.training_loss is not None:
            return "training_loss", self.training_loss(module, batch)
        with muted_logging(module):
            return "training_step", with_batch_idx(module.training_step)(batch, 0)

    def _training_loss_on_validation(
        self, module: pl.LightningModule, batch: Any
    ) -> tuple[str, Any]:
        """ℓ on a validation batch (E without ``validation_loss=``): where
        :class:`~hypertorch_sid.LearnedDataWeights` weights the training step, its unweighted
        mean (a validation batch has no example indices, and E is the loss as the data are).
        A failure there is named:
        a validation loader whose batches differ from the training's (an extra index, a dict)
        failed inside the user's ``training_step`` with its bare message ("too many values to
        unpack")."""
        unweighted = getattr(module.training_step, "unweighted", None)
        try:
            if unweighted is not None and self.training_loss is None:  # LearnedDataWeights'
                with muted_logging(module):  # step: a validation batch's loss, unweighted
                    return "training_step", unweighted(batch, 0)
            return self._training_loss(module, batch)
        except ConfigurationError:
            raise
        except Exception as err:
            source = "training_loss" if self.training_loss is not None else "training_step"
            raise ConfigurationError(
                f"LearnedWeightDecay: E is the training loss on validation batches, and "
                f"{source} failed on one ({type(err).__name__}: {err}). "
                + (_INDEXED_VALIDATION if isinstance(batch, Indexed) else "")
                + "The validation loader's batches must have the training batches' structure, "
                "or pass validation_loss=lambda module, batch: <scalar tensor> for its batches."
            ) from err


#: why a validation batch carries an example index under the decay (session 61: the index was
#: read as the input, "mat1 and mat2 must have the same dtype", with no word of the wrapper)
_INDEXED_VALIDATION = (
    "Its batch is an Indexed (index, data) pair: the validation loader's dataset is an "
    "IndexedDataset, which LearnedWeightDecay never needs (only LearnedDataWeights reads "
    "example indices, and from the training set alone). Pass the validation set unwrapped, "
    "DataLoader(val_set) instead of DataLoader(IndexedDataset(val_set)). "
)
