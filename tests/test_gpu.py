"""The drop-ins and ``BilevelModule`` trained on a CUDA device, as a user with a GPU trains them
(``Trainer(accelerator="gpu")``): every result finite, learned on the device, read back on the
CPU where the docs say so, and a checkpoint written on the GPU resumes. Skipped without CUDA
(conftest.py); run on a GPU host with ``pytest -m cuda tests``."""

from __future__ import annotations

from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from test_data_weights_recipes import NOISY, Classifier, assert_separates, loader, val_loader
from test_weight_decay import MLP, RidgeData
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    BilevelModule,
    HyperOptimizationCallback,
    LearnedDataWeights,
    LearnedWeightDecay,
)

pytestmark = pytest.mark.cuda


def gpu_trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(
        accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    return pl.Trainer(callbacks=callbacks, **{**settings, **kwargs})


class SmallCNN(pl.LightningModule):
    """conv+BatchNorm+ReLU+pool, linear; a user's classifier with its own optimizer."""

    def __init__(self, adam: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 7 * 7, 4),
        )  # fmt: skip
        self.adam = adam

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.adam:
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def images(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 14, 14, generator=gen)
    return TensorDataset(x, (x.mean((1, 2, 3)) * 40).long().clamp(-2, 1) + 2)


def image_loaders() -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(0)
    return (
        DataLoader(images(512, 0), batch_size=32, shuffle=True, generator=gen),
        DataLoader(images(256, 1), batch_size=64),
    )


@pytest.mark.parametrize("granularity", ["global", "per_layer", "per_element"])
@pytest.mark.parametrize("adam", [False, True])
def test_learned_weight_decay_on_the_gpu(granularity, adam):
    cb = LearnedWeightDecay(1e-4, granularity=granularity, every_n_steps=4, max_overhead=None)
    model = SmallCNN(adam)
    gpu_trainer([cb], max_epochs=3).fit(model, *image_loaders())
    assert cb.sid is not None and len(cb.history) > 0
    for name, lam in cb.decay_values().items():
        assert bool(torch.isfinite(lam).all()) and bool((lam >= 0).all()), name


class RowLSTM(pl.LightningModule):
    """pytorch/examples' MNIST LSTM shape: rows as a sequence, LSTM, linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm, self.head = torch.nn.LSTM(14, 16, batch_first=True), torch.nn.Linear(16, 4)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out, _ = self.lstm(x.view(x.shape[0], 14, 14))
        return F.cross_entropy(self.head(out[:, -1]), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_learned_weight_decay_on_an_lstm_on_the_gpu():
    """cuDNN's RNN has no double backward: the hyper steps run without cuDNN, the training
    with it."""
    cb = LearnedWeightDecay(1e-4, every_n_steps=4, max_overhead=None)
    gpu_trainer([cb], max_epochs=2).fit(RowLSTM(), *image_loaders())
    assert len(cb.history) > 0 and torch.backends.cudnn.enabled
    for name, lam in cb.decay_values().items():
        assert bool(torch.isfinite(lam).all()), name


def test_weight_decay_checkpoint_written_on_the_gpu_resumes(tmp_path):
    """tests/test_weight_decay.py's resume check (float64 MLP, per layer), on the GPU."""

    def make() -> tuple[LearnedWeightDecay, pl.LightningModule]:
        cb = LearnedWeightDecay(
            0.02, every_n_steps=2, adjoint_steps=4, outer_lr=0.1, max_overhead=None
        )
        return cb, MLP()

    def gpu(callbacks: list[Any], epochs: int) -> pl.Trainer:
        return gpu_trainer(callbacks, max_epochs=epochs, limit_val_batches=0, deterministic=True)

    cb, model = make()
    gpu([cb], 4).fit(model, datamodule=RidgeData())
    straight = cb.decay_values()
    cb, model = make()
    half = gpu([cb], 2)
    half.fit(model, datamodule=RidgeData())
    half.save_checkpoint(tmp_path / "half.ckpt")
    cb, model = make()
    gpu([cb], 4).fit(model, datamodule=RidgeData(), ckpt_path=tmp_path / "half.ckpt")
    resumed = cb.decay_values()
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key].cpu(), straight[key].cpu(), rtol=1e-6, atol=0)
    assert not torch.allclose(
        straight["net.0.weight"].cpu(), torch.tensor(0.02, dtype=torch.float64)
    )


@pytest.mark.parametrize("adam", [False, True])
def test_data_weights_on_the_gpu_separate_the_corrupted_examples(adam):
    cb = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
    gpu_trainer([cb], max_epochs=15).fit(Classifier(adam=adam), loader(), val_loader())
    assert_separates(cb)
    w, flags = cb.data_weights(), cb.flagged()
    assert w.device.type == "cpu" and flags.device.type == "cpu"
    if flags.numel():
        assert float((flags < NOISY).float().mean()) > 0.5


def test_data_weights_checkpoint_written_on_the_gpu_resumes_on_the_cpu(tmp_path):
    cb = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
    t = gpu_trainer([cb], max_epochs=4)
    t.fit(Classifier(), loader(), val_loader())
    t.save_checkpoint(tmp_path / "gpu.ckpt")
    resumed = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
    pl.Trainer(
        accelerator="cpu", max_epochs=5, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, callbacks=[resumed], num_sanity_val_steps=0,
    ).fit(Classifier(), loader(), val_loader(), ckpt_path=tmp_path / "gpu.ckpt")  # fmt: skip
    assert bool(torch.isfinite(resumed.data_weights()).all())
    assert len(resumed.history) > len(cb.history)


def test_per_class_weights_on_the_gpu():
    cb = LearnedDataWeights(per="class", num_classes=3, every_n_steps=2, start_step=0, seed=0)
    gpu_trainer([cb], max_epochs=5).fit(
        Classifier(), DataLoader(loader().dataset.dataset, batch_size=24), val_loader()
    )
    w = cb.data_weights()
    assert w.shape == (3,) and bool(torch.isfinite(w).all())


class Ridge(BilevelModule):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(d, 1, bias=False)
        self.register_hyperparameter("log_lam", torch.zeros(d))

    def inner_loss(self, batch: Any) -> Tensor:
        x, y = batch
        fit = 0.5 * ((self.linear(x).squeeze(-1) - y) ** 2).mean()
        return fit + 0.5 * (self.log_lam.exp() * self.linear.weight[0] ** 2).sum()

    def outer_loss(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.linear(x).squeeze(-1) - y) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


def test_bilevel_module_on_the_gpu_moves_lambda_like_on_the_cpu():
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(600, 8, generator=gen), torch.randn(600, generator=gen)

    def run(accelerator: str) -> Tensor:
        torch.manual_seed(0)
        model = Ridge(8)
        train = DataLoader(TensorDataset(X[:400], y[:400]), batch_size=32)
        val = DataLoader(TensorDataset(X[400:], y[400:]), batch_size=200)
        cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        pl.Trainer(
            accelerator=accelerator, devices=1, max_epochs=3, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, callbacks=[cb],
            num_sanity_val_steps=0,
        ).fit(model, train, val)  # fmt: skip
        return model.log_lam.detach().cpu()

    cpu, gpu = run("cpu"), run("gpu")
    assert bool((cpu != 0).any())
    torch.testing.assert_close(gpu, cpu, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_learned_weight_decay_under_float16_mixed_precision(decoupled, fused):
    """``precision="16-mixed"``: float16 autocast and a GradScaler (its loss scale, its skipped
    steps: tests/test_gpu_user_recipes.py checks both on the CPU's stand-in)."""

    class Model(SmallCNN):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            make = torch.optim.AdamW if decoupled else torch.optim.Adam
            kwargs = {"weight_decay": 0.0} if decoupled else {}
            return make(self.parameters(), lr=1e-3, fused=fused, **kwargs)

    cb = LearnedWeightDecay(1e-4, decoupled=decoupled, every_n_steps=4, max_overhead=None)
    model = Model()
    gpu_trainer([cb], max_epochs=3, precision="16-mixed").fit(model, *image_loaders())
    assert len(cb.history) > 0
    for name, lam in cb.decay_values().items():
        assert bool(torch.isfinite(lam).all()), name
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
