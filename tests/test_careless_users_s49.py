"""A careless user's inputs that gave silent wrong answers, ignored settings or failures inside
the user's own code (session 49; the table of every recipe tried and its outcome is in
docs/failures.md, "Careless users (session 49)"). Each test fails without its fix.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay

N, D, C = 240, 6, 3
_g = torch.Generator().manual_seed(0)
X = torch.randn(N, D, generator=_g)
Y = (X @ torch.randn(D, C, generator=_g)).argmax(1)


class Net(pl.LightningModule):
    def __init__(self, reduction: str = "mean", lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, C))
        self.reduction, self.lr = reduction, lr

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1], reduction=self.reduction)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _indexed(batch_size: int = 16, labels: Tensor = Y) -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(X, labels)), batch_size=batch_size, shuffle=True)


def _plain(batch_size: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True)


def _val() -> DataLoader:
    return DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20)


def _weights(**kw: Any) -> LearnedDataWeights:
    return LearnedDataWeights(**{"start_step": 4, "every_n_steps": 4, "max_overhead": None, **kw})


def _decay(**kw: Any) -> LearnedWeightDecay:
    return LearnedWeightDecay(1e-3, **{"every_n_steps": 4, "max_overhead": None, **kw})


def _fit(cb: Any, train: DataLoader, val: DataLoader | None, model: Any, **kw: Any) -> list[str]:
    """Fit (one epoch unless said); the warnings' messages."""
    kw.setdefault("max_epochs", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], **kw).fit(model, train, val)
    return [str(w.message) for w in caught]


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return _indexed(self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return _val()


@pytest.mark.parametrize("tune", ["lr_find", "scale_batch_size"])
def test_the_tuner_runs_with_the_data_weights(tune):
    """``Tuner(trainer).lr_find`` / ``scale_batch_size`` run their trials from ``on_fit_start``
    with every other callback switched off: the user's training_step got the Indexed batch and
    failed inside the user's code ("mat1 and mat2 must have the same dtype": the index read as
    the input). Now ``training_step`` takes Indexed batches from the fit's setup on, returning
    the loss at the weights' start; the fit after the tuner learns as before, and the module
    gets its own ``training_step`` back."""
    from pytorch_lightning.tuner import Tuner

    cb, model, data = _weights(), Net("none"), Data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = trainer([cb], max_epochs=1)
        if tune == "lr_find":
            found = Tuner(fit).lr_find(model, datamodule=data, num_training=15)
            assert found is not None and len(found.results["loss"]) > 5
        else:
            # 2 then 4 (init_val=2), as without the callback
            assert Tuner(fit).scale_batch_size(model, datamodule=data, max_trials=2) == 4
        assert "training_step" not in model.__dict__  # given back after the trials
        fit.fit(model, datamodule=data)
    assert cb.sid is not None and cb.sid.hyper_step > 0
    assert "training_step" not in model.__dict__
