"""The averaged copies of the module that Lightning's weight-averaging callbacks keep, and λ in
them.

``EMAWeightAveraging``/``WeightAveraging`` keep an ``AveragedModel`` of the module,
``StochasticWeightAveraging`` a copy of it; each averages *every* parameter, a
:class:`~hypertorch_sid.lightning.BilevelModule`'s λ included, and that copy is what they swap in
while validation runs, write as a checkpoint's ``state_dict`` and copy into the module at the end
of the fit. λ is not a weight to average: the averaged model carries the λ the hyper steps
learned.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

from .namespaces import classes

#: the weight-averaging callbacks (WeightAveraging from Lightning 2.5), in either namespace
_AVERAGING = classes("callbacks.WeightAveraging") + classes("callbacks.StochasticWeightAveraging")

__all__ = ["averaged_copies", "put_learned_in_averages"]


def averaged_copies(trainer: pl.Trainer) -> list[nn.Module]:
    """The copies of the module that the fit's weight-averaging callbacks average (none before
    they built them)."""
    copies = []
    for callback in trainer.callbacks:
        if isinstance(callback, _AVERAGING):
            copy = getattr(callback, "_average_model", None)
            copy = copy.module if isinstance(copy, AveragedModel) else copy
            if isinstance(copy, nn.Module):
                copies.append(copy)
    return copies


def put_learned_in_averages(
    trainer: pl.Trainer, names: Sequence[str], learned: Sequence[Tensor]
) -> None:
    """Give λ (the module's parameters ``names``) its ``learned`` values in every averaged copy.
    Averaging then keeps them (to rounding: EMA's ``d·λ + (1 − d)·λ`` may move λ by an ulp)
    until the next call."""
    for copy in averaged_copies(trainer):
        params = dict(copy.named_parameters())
        with torch.no_grad():
            for name, value in zip(names, learned):
                if name in params:
                    params[name].copy_(value)
