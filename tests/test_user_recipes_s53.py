"""Session 53's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen recipes
(session 53)"; the recipes: benchmarks/bench_user_recipes_s53.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights


def _trainer(callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


# ------------------------------------------------ precision="bf16-true": the masked-row re-read


class Level(pl.LightningModule):
    """A regression whose targets (300) a bfloat16 output hits exactly: bfloat16 spaces its
    numbers 2 apart there, so every row's squared error is exactly 0 from the first step on —
    a well-fitted row, not a masked one (with the weights shrunk its loss is 300²)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        with torch.no_grad():
            self.net.weight.mul_(0.01)
            self.net.bias.fill_(300.0)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y, reduction="none")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x).squeeze(-1), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def test_bf16_true_rows_fitted_to_0_are_not_called_masked() -> None:
    # Before session 53 the epoch-end re-read of the rows whose loss was exactly 0 handed the
    # bfloat16 network float32 inputs (the precision's conversion skipped); the forward failed,
    # and a failed forward confirmed every row as a masked example, a false warning (and the
    # advice to drop them from the training set).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = torch.full((64,), 300.0)
    cb = LearnedDataWeights(objective="mean_loss", start_step=1, every_n_steps=2)
    train = DataLoader(IndexedDataset(TensorDataset(x, y)), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([cb], max_epochs=2, precision="bf16-true").fit(Level(), train, val)
    said = [str(w.message) for w in caught if "masked" in str(w.message)]
    assert not said, said
    assert bool(torch.isfinite(cb.data_weights().float()).all())


# ------------------------------------------ on_before_batch_transfer: the masked-row re-read


class Bytes(pl.LightningModule):
    """Images stored as uint8 (to save memory), made float in ``on_before_batch_transfer``; a
    hinge loss every row meets with margin from the first step (loss exactly 0 in float32;
    with the weights shrunk, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        with torch.no_grad():
            self.net.weight.copy_(torch.tensor([[40.0, 0.0, 0.0, 0.0]]))
            self.net.bias.fill_(-20.0)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        def floats(t: Tensor) -> Tensor:
            return t.float() / 255 if t.dtype == torch.uint8 else t

        return apply_to_collection(batch, Tensor, floats)

    def hinge(self, batch: Any) -> Tensor:
        x, y = batch
        return F.relu(1 - y * self.net(x).squeeze(-1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.hinge(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.hinge(batch).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def test_rows_fitted_to_0_are_not_called_masked_behind_a_batch_hook() -> None:
    # Before session 53 the re-read skipped the module's on_before_batch_transfer: uint8 inputs
    # met the float network, the forward failed, and every row was called a masked example.
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 4), generator=g, dtype=torch.uint8)
    x[:, 0] = torch.where(x[:, 0] < 128, x[:, 0] % 96, 160 + x[:, 0] % 96)  # margin ≥ 5
    y = torch.where(x[:, 0] >= 128, 1.0, -1.0)
    cb = LearnedDataWeights(objective="mean_loss", start_step=1, every_n_steps=2)
    train = DataLoader(IndexedDataset(TensorDataset(x, y)), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([cb], max_epochs=2).fit(Bytes(), train, val)
    said = [str(w.message) for w in caught if "masked example" in str(w.message)]
    assert not said, said
