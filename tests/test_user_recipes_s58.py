"""Session 58's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 58)"; the recipes: benchmarks/bench_user_recipes_s58.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import three_class_sets
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)


class SelfCallbacks(pl.LightningModule):
    """The Lightning docs' habit: the module makes its callbacks in ``configure_callbacks``;
    ``made_once`` holds a drop-in made in ``__init__`` (returned each time) instead."""

    def __init__(self, folder: Path, drop_in: type, made_once: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.folder, self.drop_in = folder, drop_in
        self.per_sample = drop_in is LearnedDataWeights
        self.once = self.make_drop_in() if made_once else None
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def make_drop_in(self) -> Any:
        if self.drop_in is LearnedWeightDecay:
            return LearnedWeightDecay(1e-3, every_n_steps=2, max_overhead=None)
        return LearnedDataWeights(every_n_steps=2, start_step=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def configure_callbacks(self) -> list:
        best = ModelCheckpoint(dirpath=self.folder, monitor="val_loss", save_top_k=2)
        return [best, self.once if self.once is not None else self.make_drop_in()]


def _fit_then_test_best(model: SelfCallbacks, tmp_path: Path) -> pl.Trainer:
    train, val = three_class_sets()
    train = IndexedDataset(train) if model.per_sample else train
    trainer = pl.Trainer(
        max_epochs=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(
        model, DataLoader(train, batch_size=16, shuffle=True), DataLoader(val, batch_size=64)
    )
    trainer.test(model, DataLoader(val, batch_size=64), ckpt_path="best", verbose=False)
    return trainer


def _drop_in(trainer: pl.Trainer, kind: type) -> Any:
    [cb] = [c for c in trainer.callbacks if isinstance(c, kind)]
    return cb


@pytest.mark.parametrize("kind", [LearnedWeightDecay, LearnedDataWeights])
def test_a_drop_in_made_in_configure_callbacks_names_the_way_to_read_it_after_test(
    kind: type, tmp_path: Path
) -> None:
    """Lightning calls ``configure_callbacks()`` again at ``trainer.test``: the drop-in there is
    a new object given the best checkpoint's state, the fitted one gone from the Trainer. Its
    read-out was refused with "Resume with trainer.fit(..., ckpt_path=...) ... or keep the fitted
    callback object" (and "a checkpoint's the data weights"): the user never held that object.
    It now names configure_callbacks() and the way out: make the drop-in once."""
    trainer = _fit_then_test_best(SelfCallbacks(tmp_path, kind), tmp_path)
    cb = _drop_in(trainer, kind)
    read = cb.decay_values if kind is LearnedWeightDecay else cb.data_weights
    with pytest.raises(ConfigurationError) as err:
        read()
    message = str(err.value)
    assert "configure_callbacks()" in message and "__init__" in message, message
    assert "trainer.test" in message and "checkpoint's the" not in message, message


@pytest.mark.parametrize("kind", [LearnedWeightDecay, LearnedDataWeights])
def test_the_named_way_a_drop_in_made_once_reads_the_best_checkpoints_values(
    kind: type, tmp_path: Path
) -> None:
    """The way the refusal names works: one drop-in made in ``__init__`` and returned by
    ``configure_callbacks()`` is the Trainer's after ``trainer.test(ckpt_path="best")`` and
    holds the best checkpoint's values (finite, of the fit's shape)."""
    model = SelfCallbacks(tmp_path, kind, made_once=True)
    trainer = _fit_then_test_best(model, tmp_path)
    cb = _drop_in(trainer, kind)
    assert cb is model.once
    best = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    assert any(kind.__name__ in key for key in best["callbacks"])
    if kind is LearnedWeightDecay:
        values = cb.decay_values()
        assert set(values) == {n for n, _ in model.named_parameters()}
        assert all(bool(torch.isfinite(v).all()) for v in values.values())
    else:
        w = cb.data_weights()
        assert w.shape == (128,) and bool(torch.isfinite(w).all())


def test_the_data_weights_short_fit_warning_speaks_of_the_data_weights() -> None:
    """The short-fit warning of ``LearnedDataWeights`` said "λ will barely move" (the decay's
    words) in every data-weights fit too short for its hyper steps: it names the data weights."""
    train, val = three_class_sets()
    model = SelfCallbacks(Path("."), LearnedDataWeights)
    model.configure_callbacks = lambda: []  # type: ignore[method-assign]
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, accelerator="cpu", callbacks=[LearnedDataWeights()],
    )  # fmt: skip
    loader = DataLoader(IndexedDataset(train), batch_size=16, shuffle=True)
    with pytest.warns(UserWarning, match="the data weights will barely move") as caught:
        trainer.fit(model, loader, DataLoader(val, batch_size=64))
    assert not any("λ will barely move" in str(w.message) for w in caught)
