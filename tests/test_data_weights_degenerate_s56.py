"""Session 56: data-weights fits where the weights hardly moved (docs/data_weights.md, "Session 56:
fits where the weights hardly moved"). On ``ckpt_cnn`` of benchmarks/bench_user_recipes_s50.py
the recipe's ``EarlyStopping(patience=3)`` stopped 6 of 30 seeds at step 80–96, at or just after
the first hyper step (80), and its ``ModelCheckpoint`` kept a checkpoint from step 32–64: the
tested model was the plain fit's to every digit. The fit's end now says which callback stopped
it, the ``min_steps`` that lets the weights act (measured: it rescued all 6), and that the best
checkpoint holds a plain fit's model. Session 57 made holding the stop the default
(tests/test_data_weights_early_stop_s57.py): these fits take the opt-out,
``hold_early_stopping=False``, unless they say otherwise."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights


class Net(pl.LightningModule):
    """Logs ``val_metric``: the optimizer step (``rising``: the best is the first validation,
    as a noisy-label fit's validation loss after its minimum) or its negative."""

    def __init__(self, rising: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rising = rising
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        step = float(self.trainer.global_step)
        self.log("val_metric", torch.tensor(step if self.rising else -step))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(
    tmp_path: Path, rising: bool = True, hold: bool = False, **trainer_kw: Any
) -> tuple[pl.Trainer, list[str]]:
    """128 rows in 8 batches of 16 (an epoch: 8 steps), 6 epochs planned (48 steps), the first
    hyper step at step 16; EarlyStopping(patience=2) and a ModelCheckpoint on ``val_metric``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    train = DataLoader(IndexedDataset(TensorDataset(x[:128], y[:128])), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    callbacks = [
        LearnedDataWeights(start_step=16, every_n_steps=8, hold_early_stopping=hold),
        EarlyStopping(monitor="val_metric", patience=2),
        ModelCheckpoint(monitor="val_metric", dirpath=tmp_path),
    ]
    trainer = pl.Trainer(
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", max_epochs=6, **trainer_kw,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(rising), train, val)
    return trainer, [str(w.message) for w in caught if "LearnedDataWeights" in str(w.message)]


def test_an_early_stopped_fit_names_the_stopper_and_the_min_steps_that_lets_the_weights_act(
    tmp_path: Path,
) -> None:
    """Stopped at step 24 (the best validation at step 8, patience 2), one epoch after the first
    hyper step: the warning said "(EarlyStopping, max_time?)" and "let it run longer (patience,
    min_steps)", no number; now it names the EarlyStopping and min_steps = 16 + 2 epochs."""
    trainer, said = _fit(tmp_path)
    assert trainer.global_step == 24
    stopped = [s for s in said if "stopped at optimizer step 24 of the 48 planned" in s]
    assert len(stopped) == 1, said
    assert "EarlyStopping(monitor='val_metric', patience=2)" in stopped[0]
    assert "Trainer(min_steps=32)" in stopped[0]


def test_the_min_steps_advised_keeps_the_fit_two_epochs_under_the_weights(tmp_path: Path) -> None:
    """With the advice taken the fit runs to step 32 and the early-stop warning is gone."""
    trainer, said = _fit(tmp_path, min_steps=32)
    assert trainer.global_step == 32
    assert not [s for s in said if "stopped at optimizer step" in s], said


def test_a_best_checkpoint_from_before_the_first_hyper_step_is_said_to_hold_a_plain_fit(
    tmp_path: Path,
) -> None:
    """The best checkpoint was saved at step 8, before the first hyper step (16): a model loaded
    from it is a plain fit's (ckpt_cnn: the plain arm's test loss to every digit). Nothing said
    that before; also not with the min_steps advice taken, or the stop held (session 57), since
    the metric never improved."""
    for i, kw in enumerate(({}, {"min_steps": 32}, {"hold": True})):
        trainer, said = _fit(tmp_path / str(i), **kw)
        plain = [s for s in said if "best checkpoint of ModelCheckpoint" in s]
        assert len(plain) == 1, said
        assert "monitor='val_metric'" in plain[0] and "optimizer step 8," in plain[0]
        assert "first hyper step (step 16)" in plain[0]
        assert Path(trainer.checkpoint_callback.best_model_path).name.endswith("step=8.ckpt")


def test_a_best_checkpoint_from_after_the_first_hyper_step_says_nothing(tmp_path: Path) -> None:
    """A falling metric: the best checkpoint is the last one (step 48), trained under the
    weights; no checkpoint warning, and no early stop."""
    trainer, said = _fit(tmp_path, rising=False)
    assert trainer.global_step == 48
    assert not [s for s in said if "best checkpoint" in s or "stopped at" in s], said
