"""Lightning test problems shared by the test modules (beside ``problems.py``, the core ones).

* :func:`ridge_data`: a seeded linear-regression data set (float64), train and validation;
* :class:`Ridge`: the ridge :class:`~hypertorch_sid.BilevelModule`
  ℓ̂ = ½ mean (Xw − y)² + ½ Σ exp(log_lam) ⊙ w², E = ½ mean (X_val w − y_val)²;
* :class:`RidgeData` and :func:`loaders`: its data as a datamodule or as two DataLoaders;
* :func:`trainer`: a quiet, deterministic single-process CPU ``pl.Trainer``;
* the careless-user toy (``TOY_X``, ``TOY_Y``, :class:`ToyClassifier`), its loaders
  (:func:`toy_train`, :func:`toy_indexed_train`, :func:`toy_val`) and quick drop-ins
  (``QUICK``, :func:`quick_weights`, :func:`quick_decay`).

The tests run with one intra-op thread (``conftest.py`` sets it for the whole session).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import BilevelModule, IndexedDataset, LearnedDataWeights, LearnedWeightDecay

D = 5  # features of the default ridge problem
f64 = torch.float64


def digits_split(n_train: int, n_val: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's bundled digits (no download), pixels in [0, 1], shuffled by ``seed``:
    (X_train, y_train, X_val, y_val) of ``n_train`` and ``n_val`` samples."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train, val = perm[:n_train], perm[n_train : n_train + n_val]
    return X[train], y[train], X[val], y[val]


def digits_cnn() -> torch.nn.Sequential:
    """A small CNN with BatchNorm for :func:`digits_split`'s 64 pixels (an 8×8 image), 10 classes."""
    nn = torch.nn
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 16, 10),
    )


#: the Lightning test modules' ``pytestmark``: Lightning's warnings about the tests' small fits
#: (loaders without workers, few batches per logging interval) and torch's LeafSpec deprecation
LIGHTNING_NOISE = (
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval.*"),
)


def ridge_data(
    n: int = 120, n_val: int = 60, d: int = D, seed: int = 1, noise: float = 0.5
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``X, y, X_val, y_val`` with y = X w* + noise·ε, one w* for both sets (float64)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=f64)
    w_true = torch.randn(d, generator=g, dtype=f64)
    y = X @ w_true + noise * torch.randn(n, generator=g, dtype=f64)
    Xv = torch.randn(n_val, d, generator=g, dtype=f64)
    yv = Xv @ w_true + noise * torch.randn(n_val, generator=g, dtype=f64)
    return X, y, Xv, yv


def loaders(
    data: tuple[Tensor, ...], batch_size: int, val_batch_size: int | None = None
) -> tuple[DataLoader, DataLoader]:
    """Sequential train and validation DataLoaders of :func:`ridge_data`'s tensors."""
    X, y, Xv, yv = data
    return (
        DataLoader(TensorDataset(X, y), batch_size=batch_size),
        DataLoader(TensorDataset(Xv, yv), batch_size=val_batch_size or batch_size),
    )


class Ridge(BilevelModule):
    """ℓ̂ = ½ mean (Xw − y)² + ½ Σ exp(log_lam) ⊙ w²,  E = ½ mean (X_val w − y_val)².

    w (no bias) starts at ``w0`` everywhere, λ = exp(``log_lam``) per feature, possibly of
    another dtype than w (``lam_dtype``). The inner optimizer is SGD(lr) on w;
    ``optimizer="all-parameters"`` gives it λ too (the mistake the module must catch).
    """

    def __init__(
        self,
        lr: float = 0.1,
        log_lam: float = math.log(0.1),
        optimizer: str = "sgd",
        d: int = D,
        w0: float = 0.0,
        lam_dtype: torch.dtype = f64,
    ) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, 1, bias=False, dtype=f64)
        torch.nn.init.constant_(self.lin.weight, w0)
        self.register_hyperparameter("log_lam", torch.full((d,), log_lam, dtype=lam_dtype))
        self.lr, self.optimizer = lr, optimizer

    def _fit(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.lin(x).squeeze(-1) - y) ** 2).mean()

    def inner_loss(self, batch: Any) -> Tensor:
        return self._fit(batch) + 0.5 * (self.log_lam.exp() * self.lin.weight[0] ** 2).sum()

    def outer_loss(self, batch: Any) -> Tensor:
        return self._fit(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "all-parameters":
            return torch.optim.SGD(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.inner_parameters(), lr=self.lr)


class TanhRegressor(pl.LightningModule):
    """A small non-convex network on :func:`ridge_data`: D → ``hidden`` → 1 with tanh, float64,
    squared loss, plain SGD at lr 0.05 (``momentum`` optional); weights drawn under ``seed``."""

    def __init__(self, hidden: int = 8, seed: int = 3, momentum: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, hidden, dtype=torch.float64),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1, dtype=torch.float64),
        )
        self.momentum = momentum

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=self.momentum)


class RidgeData(pl.LightningDataModule):
    """:func:`ridge_data` (its default sizes) as a datamodule of sequential DataLoaders."""

    def __init__(self, batch_size: int = 20, val_batch_size: int = 30, seed: int = 1) -> None:
        super().__init__()
        self.X, self.y, self.Xv, self.yv = ridge_data(seed=seed)
        self.batch_size, self.val_batch_size = batch_size, val_batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.X, self.y), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.Xv, self.yv), batch_size=self.val_batch_size)


class IndexedFullBatch(pl.LightningDataModule):
    """A training set (indexed, :class:`~hypertorch_sid.IndexedDataset`) and a validation set,
    each as one full batch: the exact problems of the data-weight oracles."""

    def __init__(self, X: Tensor, y: Tensor, Xv: Tensor, yv: Tensor) -> None:
        super().__init__()
        self.X, self.y, self.Xv, self.yv = X, y, Xv, yv

    def train_dataloader(self) -> DataLoader:
        return DataLoader(IndexedDataset(TensorDataset(self.X, self.y)), batch_size=len(self.X))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.Xv, self.yv), batch_size=len(self.Xv))


def three_class_sets() -> tuple[TensorDataset, TensorDataset]:
    """The recipe tests' data: 128 training rows, 64 validation rows, 6 features, 3 classes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return TensorDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])


def rank_batches(n: int, global_batch: int, world: int, rank: int) -> list[list[int]]:
    """Sequential global batches of ``global_batch`` of ``n`` rows, of each this ``rank``'s
    contiguous share among ``world`` processes (the whole batch for one): a DDP test's batch
    sampler that keeps the single-process reference on the same global batches."""
    size = global_batch // world
    return [
        list(range(start + rank * size, start + (rank + 1) * size))
        for start in range(0, n, global_batch)
    ]


#: the careless-user toy: 240 examples, 6 features, 3 classes of a random linear map
TOY_N, TOY_D, TOY_C = 240, 6, 3
_toy = torch.Generator().manual_seed(0)
TOY_X = torch.randn(TOY_N, TOY_D, generator=_toy)
TOY_Y = (TOY_X @ torch.randn(TOY_D, TOY_C, generator=_toy)).argmax(1)


#: the careless-user tests' drop-in settings: a hyper step every 4 steps from the first, no budget
QUICK = dict(every_n_steps=4, start_step=0, max_overhead=None)


def toy_train() -> DataLoader:
    """The toy's training rows (60 on), batches of 16."""
    return DataLoader(TensorDataset(TOY_X[60:], TOY_Y[60:]), batch_size=16)


def toy_indexed_train() -> DataLoader:
    """:func:`toy_train` indexed (``IndexedDataset``), for the data weights."""
    return DataLoader(IndexedDataset(TensorDataset(TOY_X[60:], TOY_Y[60:])), batch_size=16)


def toy_val(y: Tensor = TOY_Y) -> DataLoader:
    """The toy's validation rows (the first 60) with the labels ``y``, batches of 20."""
    return DataLoader(TensorDataset(TOY_X[:60], y[:60]), batch_size=20)


def quick_weights(**kw: Any) -> LearnedDataWeights:
    """``LearnedDataWeights`` stepping every 4 steps from step 4, no budget; ``kw`` override."""
    return LearnedDataWeights(**{"start_step": 4, "every_n_steps": 4, "max_overhead": None, **kw})


def quick_decay(weight_decay: float = 1e-3, **kw: Any) -> LearnedWeightDecay:
    """``LearnedWeightDecay(weight_decay)`` stepping every 4 steps, no budget; ``kw`` override."""
    return LearnedWeightDecay(weight_decay, **{"every_n_steps": 4, "max_overhead": None, **kw})


class ToyClassifier(pl.LightningModule):
    """An MLP 6-16-3 on the careless-user toy, SGD; ``reduction="none"`` for the data weights."""

    def __init__(self, reduction: str = "mean", lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(TOY_D, 16), torch.nn.Tanh(), torch.nn.Linear(16, TOY_C)
        )
        self.reduction, self.lr = reduction, lr

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1], reduction=self.reduction)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def end_ddp_worker() -> None:
    """Close a DDP test worker's process group before the interpreter exits: left open, gloo's
    threads can abort the process at exit (``terminate called without an active exception``,
    return code -6) after a fit that succeeded, seen once under load in CI."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def trainer(callbacks: list[Any] | None = None, **kwargs: Any) -> pl.Trainer:
    """A CPU ``pl.Trainer`` without logger, checkpoints, progress bar, summary or sanity check;
    deterministic. ``kwargs`` add to or override these settings."""
    settings: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    return pl.Trainer(callbacks=callbacks or [], **{**settings, **kwargs})


def blobs(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Four Gaussian blobs in 2 of 8 features (the rest noise), labels 0–3."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centres = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0]])
    x = torch.cat(
        [centres[y] + 0.8 * torch.randn(n, 2, generator=g), torch.randn(n, 6, generator=g)], 1
    )
    return x, y


def noisy_four_classes(y: Tensor) -> tuple[Tensor, Tensor]:
    """30 % of the labels moved to another class; the labels and the moved mask."""
    g = torch.Generator().manual_seed(2)
    bad = torch.rand(len(y), generator=g) < 0.3
    return torch.where(bad, (y + torch.randint(1, 4, y.shape, generator=g)) % 4, y), bad
