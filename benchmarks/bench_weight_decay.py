"""One training that beats a search? Learned weight decay vs grid search vs Optuna.

For each *setting* (data + model + optimizer + epochs, all fixed), the same training is run with

* ``no_wd``      no weight decay (the "plain" training every wall time is compared to);
* ``grid``       the optimizer's own ``weight_decay=`` at 6 log-spaced values (one training each);
* ``optuna``     Optuna's TPE sampler over log weight decay in the grid's range, one full training
                 per trial (``--optuna-trials``, default 10; optional dependency ``optuna``);
* ``learned_*``  ``LearnedWeightDecay(1e-4, granularity=g)`` for g = global, per_layer,
                 per_element, one training each, with the optimizer's ``weight_decay=0``.
                 Only the public API is used: extra callback settings come from
                 ``--learned-kwargs '{"every_n_steps": 20}'`` (JSON), so defaults can be compared;
                 ``--granularity-kwargs '{"per_element": {"outer_lr": 1.0}}'`` overrides them for
                 one granularity.

Settings (``--settings``; a–g are aliases; default: a–e):

===============  ==========================================================================
``mnist_mlp``    (a) MNIST, 5000 train / 5000 val (rest of the training set) / 10k test;
                 MLP 784-256-256-10; SGD(lr 0.05, momentum 0.9); batch 64; 10 epochs
``mnist_cnn``    (b) the same data; CNN conv3×3(16)+BN+ReLU+pool, conv3×3(32)+BN+ReLU+pool,
                 linear (20 586 parameters); Adam(lr 1e-3); batch 64; 5 epochs
``digits_mlp``   (c) scikit-learn digits (1797 8×8 images: 40 % train / 30 % val / 30 % test,
                 stratified); MLP 64-64-10; SGD(lr 0.1); batch 32; 100 epochs
``fashion_mlp``  (d) as (a) on Fashion-MNIST (``--fashion-data``): a data set the defaults
                 were not chosen on
``fashion_cnn``  (e) as (b) on Fashion-MNIST
``digits_small`` (g) the README's main job (``examples/lightning_digits.py``): scikit-learn digits,
                 300 train / 300 val / 1197 test (stratified; the seed draws the split and the
                 initial weights); MLP 64-128-128-10; SGD(lr 0.05, momentum 0.9); batch 32;
                 40 epochs
``news_mlp``     (h) ``benchmarks/check_20news_recipe.py``'s weight-decay recipe: 20 Newsgroups bag
                 of words (the 2,000 most frequent terms, rows of unit norm), 2,000 train /
                 1,000 val (the seed draws them from the training set) / the held-out test set
                 (7,532); MLP 2000-256-20 with dropout 0.2; Adam(lr 1e-3); batch 64; 12 epochs.
                 A recipe where decay does not pay (no weight decay is best): a guard against
                 defaults that add decay where it hurts. Data: ``--news-data`` (default
                 ``../shared/data``, holding ``20news/``); skipped with a message when absent
``fashion_resnet18`` (f) Fashion-MNIST 2000 train / 2000 val / 5000 test; torchvision's ResNet-18
                 (11.2 M parameters, BatchNorm; its stem takes 1 channel); SGD(lr 0.01,
                 momentum 0.9); batch 64; 4 epochs. Only on request (minutes per training on a
                 CPU); ``--accelerator gpu`` runs every training on a GPU
===============  ==========================================================================

Grid (every setting): 6 values log-spaced over [1e-5, 1e-1] (1e-5, 6.3e-5, 4.0e-4, 2.5e-3,
1.6e-2, 1e-1); Optuna searches the same range. Whether the grid's best value sits at an edge of the
grid (the optimum is then not bracketed) is recorded as ``grid_best_at_edge``.

Recorded per training: best validation cross-entropy over the epochs (the full validation set,
evaluated after every epoch), the epoch it occurred, test accuracy / loss of the weights of that
epoch (the table shows the test loss too: hyperparameters fitted to the validation set, per
element especially, can lower its loss more than the test loss), optimizer steps, for learned
runs the callback's ``sid.cost.as_dict()`` (when available),
wall time of ``trainer.fit`` (test evaluation excluded), the final λ (mean/min/max, and per slot
for global/per-layer), whether the run finished (exceptions are caught and recorded), whether the
weights and λ stayed finite, and the warnings raised by the library during the run.

Derived per setting: the grid's best; for each learned variant the number of Optuna trials (in
trial order) until Optuna's best-so-far validation loss is ≤ the learned run's ("not matched in
N" otherwise), its wall time / the plain training's, and whether it is ≤ the grid's best.

Outputs: JSON (``--out``, default ``benchmarks/results/weight_decay/runs/weight_decay.json``;
``--quick`` writes to a
temporary folder unless ``--out`` is given), a PNG next to it (same stem), a Markdown table next to
it (``.md``) which is also printed.

Usage (from the repository root)::

    python benchmarks/bench_weight_decay.py                          # all settings (heavy)
    python benchmarks/bench_weight_decay.py --settings digits_mlp --optuna-trials 0
    python benchmarks/bench_weight_decay.py --learned-kwargs '{"every_n_steps": 20}' \\
        --out benchmarks/results/weight_decay/runs/weight_decay_every20.json
    python benchmarks/bench_weight_decay.py --quick                  # seconds (smoke test)
    # after a change to the library: retrain only what it touches, take the grid's and Optuna's
    # trainings (which do not use it) from the earlier result of the same setting and seed
    python benchmarks/bench_weight_decay.py --seeds 0 1 2 --optuna-trials 0 \
        --methods no_wd learned_global learned_per_layer learned_per_element \
        --reuse 'benchmarks/results/weight_decay/runs/weight_decay_seed{seed}.json'
    # no training: one summary over per-seed results of separate runs (e.g. seeds 0-2 and 3-5)
    python benchmarks/bench_weight_decay.py --summarise \
        benchmarks/results/weight_decay/runs/weight_decay_rerun_seed{0,1,2}.json \
        benchmarks/results/weight_decay/runs/weight_decay_heldout_seed{3,4,5}.json \
        --out benchmarks/results/weight_decay/runs/weight_decay_6seeds.json

The summary over seeds (``--seeds`` or ``--summarise``) gives, per method, the paired difference
of its best validation loss to the grid's best on the same seed (same split, initial weights and
batch order): mean ± standard error and a 95 % Student-t interval. An interval that holds 0 says
the miss or gain is within the seed-to-seed noise. The grid's best is the minimum of 6 trainings:
where the grid's values are as good as each other (the CNNs, digits), one more training just as
good is at or below that minimum with probability 1/7.

Below it, the summary judges what a user *deploys* (``deployment`` in the JSON, the second
table of the .md): per seed no weight decay; the grid's pick and Optuna's pick, each the one
training its search selects on the validation loss; each learned run, all scored on the
held-out *test* loss and accuracy (the test set took part in no choice). Per method: the mean
test loss / accuracy, the mean cost in plain trainings (a search: its total wall time over the
median of its own trainings; a learned run: its wall time over the median fixed-decay training
of the run that timed it), the paired test-loss differences to the grid's pick, Optuna's pick
and no weight decay (mean ± s.e. [95 %], with the number of seeds), for learned runs on each
seed how many Optuna trials it took until Optuna's pick-so-far had a test loss at or below the
learned run's, and the goal of issue 28: a lower mean test loss than each search's pick where
that search's choice beats no weight decay, never significantly worse than a pick, ≤ 1.5× one
plain training. It is computed from stored per-seed files as well (``--summarise``): each
holds every trial's test loss. A file that added Optuna's trials to another with ``--reuse``
may be given after it: its settings replace the earlier file's.

Each setting starts with an untimed one-epoch warm-up training (the first training of a process
pays one-off start-up costs that would otherwise inflate the plain time).

Deterministic: ``torch.set_num_threads(1)`` (``--threads``), every training starts from
``pl.seed_everything(seed)`` with a seeded DataLoader generator, so every method starts from the
same initial weights and sees the same batch order; Optuna's TPE sampler is seeded.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import logging
import math
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "mnist"
#: Fashion-MNIST, the same IDX file names (``--fashion-data``)
DEFAULT_FASHION = REPO.parent / "shared" / "data" / "fashion-mnist"
#: per-pixel mean and standard deviation of each image data set's training images
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion": (0.2860, 0.3530)}
#: the data root holding ``20news/`` (``--news-data``)
DEFAULT_NEWS = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "weight_decay" / "runs" / "weight_decay.json"
GRANULARITIES = ("global", "per_layer", "per_element")
METHODS = ("no_wd", "grid", "optuna", *(f"learned_{g}" for g in GRANULARITIES))
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


# ---------------------------------------------------------------------------------- settings
@dataclass
class Setting:
    name: str
    model_text: str
    data: str  # "mnist" | "fashion" | "digits" | "news"
    model: str  # "mlp" | "cnn" | "mlp_small" | "resnet18"
    optimizer: str  # "sgd" | "adam"
    lr: float
    momentum: float
    batch_size: int
    epochs: int
    n_train: int
    n_val: int
    n_test: int
    grid: list[float] = field(default_factory=list)
    search_range: tuple[float, float] = (1e-5, 1e-1)
    accelerator: str = "cpu"  # Lightning's: "cpu", "gpu", "auto" (``--accelerator``)


def _grid(lo: float, hi: float, n: int = 6) -> list[float]:
    return [float(v) for v in np.logspace(math.log10(lo), math.log10(hi), n)]


SETTINGS: dict[str, Setting] = {
    "mnist_mlp": Setting(
        "mnist_mlp",
        "MLP 784-256-256-10",
        "mnist", "mlp", "sgd", 0.05, 0.9, 64, 10, 5000, 5000, 10000,
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "mnist_cnn": Setting(
        "mnist_cnn",
        "CNN 2×(conv3x3+BN+ReLU+maxpool)+linear",
        "mnist", "cnn", "adam", 1e-3, 0.0, 64, 5, 5000, 5000, 10000,
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "digits_mlp": Setting(
        "digits_mlp",
        "MLP 64-64-10",
        "digits", "mlp_small", "sgd", 0.1, 0.0, 32, 100, 0, 0, 0,  # sizes from the 40/30/30 split
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "fashion_mlp": Setting(
        "fashion_mlp",
        "MLP 784-256-256-10",
        "fashion", "mlp", "sgd", 0.05, 0.9, 64, 10, 5000, 5000, 10000,
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "digits_small": Setting(
        "digits_small",
        "MLP 64-128-128-10",
        "digits", "mlp_digits", "sgd", 0.05, 0.9, 32, 40, 300, 300, 0,  # the main job's split
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "news_mlp": Setting(
        "news_mlp",
        "MLP 2000-256-20, dropout 0.2",
        "news", "mlp_news", "adam", 1e-3, 0.0, 64, 12, 2000, 1000, 0,  # n_test: the whole test set
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "fashion_resnet18": Setting(
        "fashion_resnet18",
        "ResNet-18 (torchvision, 1-channel stem)",
        "fashion", "resnet18", "sgd", 0.01, 0.9, 64, 4, 2000, 2000, 5000,
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
    "fashion_cnn": Setting(
        "fashion_cnn",
        "CNN 2×(conv3x3+BN+ReLU+maxpool)+linear",
        "fashion", "cnn", "adam", 1e-3, 0.0, 64, 5, 5000, 5000, 10000,
        _grid(1e-5, 1e-1), (1e-5, 1e-1),
    ),
}  # fmt: skip
ALIASES = {"a": "mnist_mlp", "b": "mnist_cnn", "c": "digits_mlp", "d": "fashion_mlp",
           "e": "fashion_cnn", "f": "fashion_resnet18", "g": "digits_small",
           "h": "news_mlp"}  # fmt: skip
#: the settings run when none is named (ResNet-18 only on request: minutes per training on CPU)
DEFAULT_SETTINGS = ["mnist_mlp", "mnist_cnn", "digits_mlp", "fashion_mlp", "fashion_cnn"]


def describe(s: Setting, data: Data) -> str:
    opt = (
        f"SGD(lr={s.lr:g}, momentum={s.momentum:g})"
        if s.optimizer == "sgd"
        else f"Adam(lr={s.lr:g})"
    )
    source = {"mnist": "MNIST", "fashion": "Fashion-MNIST", "news": "20 Newsgroups"}.get(
        s.data, "sklearn digits"
    )
    return (
        f"{source} {len(data.y_train)} train / {len(data.y_val)} val / {len(data.y_test)} test, "
        f"{s.model_text}, {opt}, batch {s.batch_size}, {s.epochs} epochs"
    )


def quick_setting(s: Setting) -> Setting:
    """Tiny data and 1–2 epochs: the whole quick benchmark runs in seconds."""
    if s.data == "digits" and s.n_val:  # the main job's split: n_train / n_val / the rest
        return replace(s, epochs=2, batch_size=16)
    if s.data == "digits":
        return replace(s, epochs=2, batch_size=16, n_train=300)  # n_train: samples before split
    if s.data == "news":
        return replace(s, epochs=1, n_train=500, n_val=500)
    return replace(s, epochs=1, n_train=500, n_val=500, n_test=1000)


# ---------------------------------------------------------------------------------- data
@dataclass
class Data:
    X_train: Tensor
    y_train: Tensor
    X_val: Tensor
    y_val: Tensor
    X_test: Tensor
    y_test: Tensor


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[:4], "big")
    ndim = magic & 0xFF
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_mnist_arrays(
    root: Path, name: str = "MNIST", option: str = "--data"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The four IDX files of MNIST or Fashion-MNIST (the same file names) in ``root``."""
    missing = [f for pair in MNIST_FILES.values() for f in pair if not (root / f).is_file()]
    if missing:
        raise SystemExit(
            f"bench_weight_decay: {name} IDX files not found in {root} (missing: "
            f"{', '.join(missing)}). Put the four *.gz files there or pass {option} FOLDER; "
            "--settings digits_mlp needs no download."
        )
    return {
        split: (_read_idx(root / images), _read_idx(root / labels))
        for split, (images, labels) in MNIST_FILES.items()
    }


def news_data_missing(root: Path) -> str | None:
    """Why 20 Newsgroups cannot be read offline from ``root`` (``None``: it can)."""
    sys.path.insert(0, str(REPO / "examples"))
    from datasets import _NEWS20_ARCHIVE, _NEWS20_SKLEARN_CACHE, default_cache_dir

    cached = default_cache_dir() / "scikit_learn_data" / _NEWS20_SKLEARN_CACHE
    if (root / "20news" / _NEWS20_ARCHIVE).is_file() or cached.is_file():
        return None
    return f"no {root / '20news' / _NEWS20_ARCHIVE} (pass --news-data FOLDER holding 20news/)"


@functools.cache
def _news_arrays(root: Path) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``check_20news_recipe.load``: read once per process."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from check_20news_recipe import load

    return load(root)


def make_data(s: Setting, data_root: Path, seed: int) -> Data:
    """The setting's train / val / test split (``data_root``: the folder of its IDX files, or
    for 20 Newsgroups the data root holding ``20news/``)."""
    if s.data == "news":  # check_20news_recipe.weight_decay_check's split
        X, y, X_test, y_test = _news_arrays(data_root)
        perm = torch.tensor(np.random.default_rng(seed).permutation(len(y)))
        tr, va = perm[: s.n_train], perm[s.n_train : s.n_train + s.n_val]
        n_test = s.n_test or len(y_test)
        return Data(X[tr], y[tr], X[va], y[va], X_test[:n_test], y_test[:n_test])
    if s.data == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        X, y = load_digits(return_X_y=True)
        idx = np.arange(len(y))
        if s.n_val:  # the main job's split (examples/lightning_digits.py: splits)
            tr, rest = train_test_split(idx, train_size=s.n_train, stratify=y, random_state=seed)
            va, te = train_test_split(rest, train_size=s.n_val, stratify=y[rest], random_state=seed)
            Xt = torch.tensor(X / 16.0, dtype=torch.float32)
            yt = torch.tensor(y, dtype=torch.int64)
            return Data(Xt[tr], yt[tr], Xt[va], yt[va], Xt[te], yt[te])
        if s.n_train:  # quick mode: a stratified subset of n_train samples before the split
            idx, _ = train_test_split(idx, train_size=s.n_train, stratify=y, random_state=seed)
        tr, rest = train_test_split(idx, train_size=0.4, stratify=y[idx], random_state=seed)
        va, te = train_test_split(rest, train_size=0.5, stratify=y[rest], random_state=seed)
        Xt = torch.tensor(X / 16.0, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.int64)
        return Data(Xt[tr], yt[tr], Xt[va], yt[va], Xt[te], yt[te])
    arrays = load_mnist_arrays(data_root)
    mean, std = NORMALISATION[s.data]

    def prep(images: np.ndarray) -> Tensor:
        x = torch.tensor(images.reshape(len(images), -1), dtype=torch.float32) / 255.0
        return (x - mean) / std

    X, y = arrays["train"]
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).numpy()
    tr, va = perm[: s.n_train], perm[s.n_train : s.n_train + s.n_val]
    X_test, y_test = arrays["test"]
    yt = torch.tensor(y, dtype=torch.int64)
    return Data(
        prep(X[tr]), yt[tr], prep(X[va]), yt[va],
        prep(X_test[: s.n_test]), torch.tensor(y_test[: s.n_test], dtype=torch.int64),
    )  # fmt: skip


# ---------------------------------------------------------------------------------- model
def make_network(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )
    if kind == "mlp_digits":  # the main job's MLP (examples/lightning_digits.py)
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    if kind == "mlp_news":  # check_20news_recipe.Net(dropout=0.2)
        return nn.Sequential(
            nn.Linear(2000, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 20)
        )  # fmt: skip
    if kind == "mlp_small":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    if kind == "resnet18":  # torchvision's, its stem taking the 1-channel 28×28 images
        import torchvision

        net = torchvision.models.resnet18(num_classes=10)
        net.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), net)
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


class Classifier(pl.LightningModule):
    """An ordinary LightningModule; keeps the weights of its best validation epoch."""

    def __init__(self, s: Setting, weight_decay: float) -> None:
        super().__init__()
        self.network = make_network(s.model)
        self.setting, self.weight_decay = s, weight_decay
        self.val_curve: list[float] = []
        self.best_val, self.best_epoch = math.inf, -1
        self.best_state: dict[str, Tensor] | None = None
        self._sum, self._count = 0.0, 0

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def on_validation_epoch_start(self) -> None:
        self._sum, self._count = 0.0, 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self._sum += float(F.cross_entropy(self(x), y, reduction="sum"))
        self._count += len(y)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        loss = self._sum / max(self._count, 1)
        self.val_curve.append(loss)
        if loss < self.best_val:  # NaN never improves
            self.best_val, self.best_epoch = loss, len(self.val_curve)
            self.best_state = {k: v.detach().clone() for k, v in self.state_dict().items()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        s = self.setting
        if s.optimizer == "sgd":
            return torch.optim.SGD(
                self.parameters(), lr=s.lr, momentum=s.momentum, weight_decay=self.weight_decay
            )
        return torch.optim.Adam(self.parameters(), lr=s.lr, weight_decay=self.weight_decay)


@torch.no_grad()
def evaluate(net: nn.Module, X: Tensor, y: Tensor) -> tuple[float, float]:
    net.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(y), 1000):
        logits = net(X[i : i + 1000])
        loss += float(F.cross_entropy(logits, y[i : i + 1000], reduction="sum"))
        correct += int((logits.argmax(1) == y[i : i + 1000]).sum())
    return loss / len(y), correct / len(y)


# ---------------------------------------------------------------------------------- one training
_LIB_WARNING_SKIP = ("does not have many workers", "log_every_n_steps", "GPU available")


def train_once(
    s: Setting,
    data: Data,
    seed: int,
    weight_decay: float = 0.0,
    granularity: str | None = None,
    learned_init: float = 1e-4,
    learned_kwargs: dict[str, Any] | Callable[[Any], dict[str, Any]] | None = None,
    order: int | None = None,
) -> dict[str, Any]:
    """One training; never raises: an exception is recorded in the returned record.
    ``learned_kwargs`` may be a function of the model (for keywords that need it). ``seed`` sets
    the initial weights and (unless ``order`` is given) the batch order; ``order`` seeds the
    training DataLoader and the callback's samplers instead, so the same data split and initial
    weights can be trained on other batch orders."""
    rec: dict[str, Any] = dict(
        weight_decay=None if granularity else weight_decay,
        granularity=granularity,
        finished=False,
        error=None,
        best_val_loss=math.nan,
        best_epoch=None,
        test_acc=math.nan,
        test_loss=math.nan,
        val_curve=[],
        optimizer_steps=0,
        wall_s=math.nan,
        cpu_s=math.nan,
        weights_finite=None,
        lambda_finite=None,
        finite=None,
        lambda_summary=None,
        lambda_by_slot=None,
        sid_cost=None,
        hyper_steps=None,
        warnings=[],
    )
    model: Classifier | None = None
    cb: Any = None
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pl.seed_everything(seed, verbose=False)
            model = Classifier(s, 0.0 if granularity else weight_decay)
            if granularity:
                from hypertorch_sid import LearnedWeightDecay

                kw = learned_kwargs(model) if callable(learned_kwargs) else learned_kwargs
                kw = dict(kw or {})
                if order is not None:
                    kw.setdefault("seed", order)
                cb = LearnedWeightDecay(learned_init, granularity=granularity, **kw)
            train = DataLoader(
                TensorDataset(data.X_train, data.y_train),
                batch_size=s.batch_size,
                shuffle=True,
                generator=torch.Generator().manual_seed(seed if order is None else order),
            )
            val = DataLoader(TensorDataset(data.X_val, data.y_val), batch_size=s.batch_size)
            trainer = pl.Trainer(
                max_epochs=s.epochs,
                accelerator=s.accelerator,
                devices=1,
                callbacks=[cb] if cb is not None else [],
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
            )
            start, cpu_start = time.perf_counter(), time.process_time()
            trainer.fit(model, train, val)
            rec["wall_s"] = time.perf_counter() - start
            rec["cpu_s"] = time.process_time() - cpu_start
            rec["finished"] = True
        except Exception as err:  # a crash is a result: record it, go on
            rec["wall_s"] = time.perf_counter() - start
            rec["cpu_s"] = time.process_time() - cpu_start
            tb = traceback.format_exc().strip().splitlines()
            rec["error"] = f"{type(err).__name__}: {err}"
            rec["traceback_tail"] = tb[-6:]
    seen: list[str] = []
    for w in caught:
        msg = f"{w.category.__name__}: {w.message}"
        if not any(k in msg for k in _LIB_WARNING_SKIP) and msg not in seen:
            seen.append(msg)
    rec["warnings"] = seen[:8]
    rec["n_warnings"] = len(seen)
    if model is None:
        return rec
    rec["val_curve"] = list(model.val_curve)
    rec["best_val_loss"] = model.best_val
    rec["best_epoch"] = model.best_epoch if model.best_epoch > 0 else None
    try:
        rec["optimizer_steps"] = int(model.trainer.global_step)
    except Exception:  # no trainer attached (failed before fit)
        pass
    rec["weights_finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    if model.best_state is not None:
        net = make_network(s.model)  # a fresh copy: the module still holds the trainer
        prefix = "network."
        net.load_state_dict({k[len(prefix) :]: v for k, v in model.best_state.items()})
        rec["test_loss"], rec["test_acc"] = evaluate(net, data.X_test, data.y_test)
    if cb is not None:
        _record_learned(rec, cb)
    else:
        rec["lambda_finite"] = True
        rec["lambda_summary"] = dict(mean=weight_decay, min=weight_decay, max=weight_decay)
    rec["finite"] = bool(rec["weights_finite"]) and bool(rec["lambda_finite"])
    return rec


def _record_learned(rec: dict[str, Any], cb: Any) -> None:
    try:
        values = cb.decay_values()
    except Exception as err:
        rec["lambda_error"] = f"{type(err).__name__}: {err}"
        values = {}
    if values:
        flat = torch.cat([v.detach().double().flatten() for v in values.values()])
        rec["lambda_finite"] = bool(torch.isfinite(flat).all())
        rec["lambda_summary"] = dict(
            mean=float(flat.mean()), min=float(flat.min()), max=float(flat.max())
        )
        if rec["granularity"] != "per_element":
            rec["lambda_by_slot"] = {k: float(v.double().mean()) for k, v in values.items()}
    else:
        rec["lambda_finite"] = None
    applied = getattr(getattr(cb, "problem", None), "applied", None)  # eq. effectivedecay
    if applied is not None and applied.sums:
        rec["effective_by_group"] = cb.effective_weight_decay
        sums = applied.state().values()  # all groups together: one constant for the optimizer
        rec["effective_all"] = sum(n for n, _ in sums) / sum(d for _, d in sums)
    rec["every_n_steps"] = cb.every_n_steps
    # divergences recovered from (Recover's retries with their re-estimates), over all hyper steps
    rec["retries"] = int(sum(h.get("hyper/retries", 0.0) for h in cb.history))
    budget = getattr(cb, "budget", None)  # max_overhead: what the budget measured and ran
    if budget is not None and math.isfinite(budget.overhead):
        rec["budget"] = {**budget.state_dict(), "overhead": budget.overhead}
    sid = getattr(cb, "sid", None)
    cost = getattr(sid, "cost", None)
    if cost is not None and hasattr(cost, "as_dict"):
        rec["sid_cost"] = {k: v for k, v in cost.as_dict().items()}
        rec["hyper_steps"] = rec["sid_cost"].get("hypergradients")


# ---------------------------------------------------------------------------------- methods
def run_optuna(s: Setting, data: Data, seed: int, n_trials: int, log: Any) -> dict[str, Any]:
    try:
        import optuna
    except ImportError:
        return dict(skipped="optuna is not installed (pip install --no-deps optuna ...)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials: list[dict[str, Any]] = []
    lo, hi = s.search_range

    def objective(trial: Any) -> float:
        wd = trial.suggest_float("weight_decay", lo, hi, log=True)
        rec = train_once(s, data, seed, weight_decay=wd)
        rec["trial"] = trial.number + 1
        trials.append(rec)
        log(f"    optuna trial {trial.number + 1}/{n_trials}: wd={wd:.3g} {_brief(rec)}")
        value = rec["best_val_loss"]
        return value if math.isfinite(value) else math.inf

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.optimize(objective, n_trials=n_trials)
    best_so_far, best = [], math.inf
    for rec in trials:
        v = rec["best_val_loss"]
        if math.isfinite(v):
            best = min(best, v)
        best_so_far.append(best)
    i_best = min(range(len(trials)), key=lambda i: _key(trials[i]["best_val_loss"]))
    return dict(
        optuna_version=optuna.__version__,
        sampler=f"TPESampler(seed={seed})",
        search_range=list(s.search_range),
        n_trials=n_trials,
        trials=trials,
        best_so_far=best_so_far,
        best_trial=i_best + 1,
        best_weight_decay=trials[i_best]["weight_decay"],
        best_val_loss=trials[i_best]["best_val_loss"],
        test_acc=trials[i_best]["test_acc"],
        test_loss=trials[i_best]["test_loss"],
        total_wall_s=sum(_num(r["wall_s"]) for r in trials),
        total_optimizer_steps=sum(r["optimizer_steps"] for r in trials),
    )


def _key(v: float) -> float:
    return v if math.isfinite(v) else math.inf


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0


def _brief(rec: dict[str, Any]) -> str:
    if not rec["finished"]:
        return f"FAILED ({rec['error']})"
    return (
        f"best val {rec['best_val_loss']:.4f} (epoch {rec['best_epoch']}), test acc "
        f"{rec['test_acc']:.4f}, {rec['optimizer_steps']} steps, {rec['wall_s']:.1f} s"
    )


def run_setting(
    s: Setting, args: argparse.Namespace, methods: set[str], log: Any
) -> dict[str, Any]:
    roots = {"fashion": args.fashion_data, "news": args.news_data}
    data = make_data(s, roots.get(s.data, args.data), args.seed)
    cfg = asdict(s)
    cfg.update(
        n_train=len(data.y_train), n_val=len(data.y_val), n_test=len(data.y_test),
        learned_init=args.learned_init, learned_kwargs=args.learned_kwargs,
        granularity_kwargs=args.granularity_kwargs,
    )  # fmt: skip
    out: dict[str, Any] = dict(description=describe(s, data), config=cfg, runs={})
    runs = out["runs"]
    log(f"\n== {s.name}: {out['description']}")
    if args.reuse:
        out["reused"] = reuse_runs(args.reuse.format(seed=args.seed), s.name, cfg, methods, runs)
        log(f"  reused {out['reused']['methods']} from {out['reused']['from']}")
    # Untimed one-epoch warm-up: the first training of a process pays one-off start-up costs
    # (measured: ~20 % of a 10-epoch MNIST MLP training), which would inflate the plain time
    # that every ratio divides by.
    train_once(replace(s, epochs=1), data, args.seed, weight_decay=0.0)
    if "no_wd" in methods:
        runs["no_wd"] = train_once(s, data, args.seed, weight_decay=0.0)
        log(f"  no_wd: {_brief(runs['no_wd'])}")
    if "grid" in methods:
        runs["grid"] = []
        for wd in s.grid:
            rec = train_once(s, data, args.seed, weight_decay=wd)
            runs["grid"].append(rec)
            log(f"  grid wd={wd:.3g}: {_brief(rec)}")
    if "optuna" in methods and args.optuna_trials > 0:
        runs["optuna"] = run_optuna(s, data, args.seed, args.optuna_trials, log)
        if "skipped" in runs["optuna"]:
            log(f"  optuna: skipped ({runs['optuna']['skipped']})")
    for g in GRANULARITIES:
        if f"learned_{g}" in methods:
            rec = train_once(
                s, data, args.seed, granularity=g, learned_init=args.learned_init,
                learned_kwargs=_with_strategies(
                    {**args.learned_kwargs, **args.granularity_kwargs.get(g, {})}, args.damping
                ),
            )  # fmt: skip
            runs[f"learned_{g}"] = rec
            lam = rec["lambda_summary"]
            lam_s = (
                f", λ mean {lam['mean']:.3g} [{lam['min']:.3g}, {lam['max']:.3g}]" if lam else ""
            )
            log(f"  learned_{g}: {_brief(rec)}{lam_s}")
    out["derived"] = derive(s, runs, out.get("reused"))
    return out


def _with_strategies(kwargs: dict[str, Any], damping: str) -> dict[str, Any]:
    """The callback's keywords with the damping strategy of ``--damping`` (JSON cannot hold a
    strategy object): ``horizon`` is :class:`~hypertorch_sid.HorizonDamping` (δ from the steps
    that remain and the measured step size, added to the default curvature damping); an
    ``"elements"`` dict is :class:`~hypertorch_sid.TiedToLayer` with those settings (e.g.
    ``'{"per_element": {"elements": {"scale": 100}}}'``), a name (``"untied"``) passes as is;
    a ``"look_ahead"`` dict is :class:`~hypertorch_sid.TrainedWeights` with those settings
    (``'{"look_ahead": {}}'``: the validation gradient at the trained weights, eq. trainedgrad),
    or the look-ahead its ``"class"`` names (``'{"look_ahead": {"class":
    "ValidationCurvature"}}'``: eq. valcurvgrad); a ``"max_overhead"`` dict is a budget object,
    built afresh for each training (``'{"max_overhead": {"class_path":
    "hypertorch_sid.core.budget.PlannedBudget", "init_args": {"max_overhead": 0.5}}}'``), and so
    is a ``"curvature"`` dict a curvature strategy (``'{"curvature": {"class_path":
    "hypertorch_sid.EstimatedCurvature", "init_args": {"warm_start": true, ...}}}'``)."""
    if isinstance(kwargs.get("look_ahead"), dict):  # e.g. {"filter": "rayleigh"}
        import hypertorch_sid

        spec = dict(kwargs["look_ahead"])
        look = getattr(hypertorch_sid, spec.pop("class", "TrainedWeights"))
        kwargs = {**kwargs, "look_ahead": look(**spec)}
    if isinstance(kwargs.get("elements"), dict):
        from hypertorch_sid import TiedToLayer

        kwargs = {**kwargs, "elements": TiedToLayer(**kwargs["elements"])}
    if isinstance(kwargs.get("outer_optimizer"), dict):
        kwargs = {**kwargs, "outer_optimizer": _outer_factory(kwargs["outer_optimizer"])}
    for key in ("max_overhead", "curvature"):  # a Budget (PlannedBudget(0.5)), a Curvature
        if isinstance(kwargs.get(key), dict):
            kwargs = {**kwargs, key: _outer_factory(kwargs[key])()}
    if damping == "default":
        return kwargs
    from hypertorch_sid import HorizonDamping

    if damping == "horizon":
        return {**kwargs, "damping": HorizonDamping()}
    return _horizon_solver(kwargs)


def _outer_factory(spec: dict[str, Any]) -> Callable[..., Any]:
    """An ``"outer_optimizer"`` given as ``{"class_path": "module.Class", "init_args": {...}}``
    (as in a LightningCLI config): the factory ``params -> Class(params, **init_args)``."""
    import functools
    import importlib

    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return functools.partial(cls, **spec.get("init_args", {}))


def _horizon_solver(kwargs: dict[str, Any]) -> Callable[[Classifier], dict[str, Any]]:
    """``--damping horizon_solver``: the adjoint solve of the remaining training
    (:class:`~hypertorch_sid.core.horizon.HorizonSolver`, eq. horizonsolve) on Gauss–Newton
    products of the classifier's cross-entropy (positive semi-definite: no damping);
    ``"horizon_fraction"`` in ``--learned-kwargs`` is its ``fraction``."""
    from hypertorch_sid import GaussNewton, NoDamping
    from hypertorch_sid.core.horizon import HorizonSolver

    rest = {k: v for k, v in kwargs.items() if k != "horizon_fraction"}
    fraction = float(kwargs.get("horizon_fraction", 1.0))

    def make(model: Classifier) -> dict[str, Any]:
        gn = GaussNewton(lambda b: model(b[0]), lambda z, b: F.cross_entropy(z, b[1]))
        solver = HorizonSolver(fraction=fraction)
        return {**rest, "hvp": gn, "damping": NoDamping(), "adjoint_solver": solver}

    return make


#: config fields that must agree for a stored training to stand for one of this run
_SAME_TRAINING = ("name", "data", "model", "optimizer", "lr", "momentum", "batch_size", "epochs",
                  "n_train", "n_val", "n_test", "grid", "accelerator")  # fmt: skip


def reuse_runs(
    path: str, setting: str, cfg: dict[str, Any], methods: set[str], runs: dict[str, Any]
) -> dict[str, Any]:
    """Copy into ``runs`` the stored trainings of the methods this run does not retrain (the
    grid, Optuna: trainings that do not use the library, deterministic given the seed) from an
    earlier result file of the same setting and seed. They keep their own wall times, and their
    ratios divide by that run's plain time (``plain_wall_s`` of the result). Refuses a file of
    another setting, data size or grid."""
    try:
        stored = json.loads(Path(path).read_text())["settings"][setting]
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"--reuse: no result of {setting} in {path} ({err}).") from None
    before = {"accelerator": "cpu"}  # files from before a field existed: its only value then
    differ = [
        k
        for k in _SAME_TRAINING
        if not _same_value(stored["config"].get(k, before.get(k)), cfg.get(k))
    ]
    if differ:
        raise SystemExit(f"--reuse: {path} trained {setting} otherwise ({', '.join(differ)}).")
    taken = [m for m in stored["runs"] if m not in methods]
    for m in taken:
        runs[m] = stored["runs"][m]
    plain = stored.get("derived", {}).get("plain_wall_s")
    if "no_wd" in taken:
        plain = stored["runs"]["no_wd"]["wall_s"]
    return {"from": path, "methods": taken, "plain_wall_s": plain}


def _same_value(a: Any, b: Any) -> bool:
    """Config values agree; floats to 1e-9 relative (numpy versions round ``logspace`` in the
    last bit: 9.999999999999999e-06 against 1e-05)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def fixed_median_time(
    runs: dict[str, Any], reused: dict[str, Any] | None, key: str = "wall_s"
) -> float:
    """The median wall time (``key="cpu_s"``: the process's CPU time) of the fixed-decay
    trainings timed in this run (no weight decay and the grid's, not reused ones). Each costs
    what a plain training costs, so their median is a steadier yardstick for "× one plain
    training" than the one plain run, which one slow or fast start moves. CPU time leaves out
    the time the process waited for a core (a machine shared with other work); nan for result
    files from before it was recorded."""
    taken = set(reused["methods"]) if reused else set()
    fixed = [] if "no_wd" in taken or "no_wd" not in runs else [runs["no_wd"]]
    fixed += [] if "grid" in taken else runs.get("grid") or []
    times = [_seconds(r, key) for r in fixed if r["finished"]]
    return float(np.median(times)) if times else math.nan


def time_ratios(
    rec: dict[str, Any], runs: dict[str, Any], reused: dict[str, Any] | None
) -> dict[str, float]:
    """A training's wall and CPU time over the median fixed-decay training of its run
    (:func:`fixed_median_time`); nan for a training that did not finish."""
    if not rec["finished"]:
        return dict(wall=math.nan, cpu=math.nan)
    return {
        kind: _seconds(rec, key) / fixed_median_time(runs, reused, key)
        for kind, key in (("wall", "wall_s"), ("cpu", "cpu_s"))
    }


def _seconds(rec: dict[str, Any], key: str) -> float:
    """A recorded time, nan where it is missing (older result files) or not a number."""
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) else math.nan


def derive(
    s: Setting, runs: dict[str, Any], reused: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per method what the tables show. Reused searches (``--reuse``) are timed against the
    plain training of the run they come from (``reused["plain_wall_s"]``), not this run's."""
    d: dict[str, Any] = {}
    plain = runs.get("no_wd")
    plain_wall = plain["wall_s"] if plain and plain["finished"] else math.nan
    d["plain_wall_s"] = plain_wall

    def search_plain(method: str) -> float:
        if reused and method in reused["methods"]:
            return _num(reused.get("plain_wall_s"))
        return plain_wall

    grid = runs.get("grid") or []
    d["fixed_median_wall_s"] = fixed_median_time(runs, reused)
    grid_best = math.inf
    if grid:
        i = min(range(len(grid)), key=lambda j: _key(grid[j]["best_val_loss"]))
        grid_best = _key(grid[i]["best_val_loss"])
        total = sum(_num(r["wall_s"]) for r in grid)
        d["grid"] = dict(
            values=s.grid,
            best_index=i,
            best_weight_decay=s.grid[i],
            best_val_loss=grid[i]["best_val_loss"],
            test_acc=grid[i]["test_acc"],
            test_loss=grid[i]["test_loss"],
            best_at_edge=i in (0, len(grid) - 1),
            total_wall_s=total,
            wall_ratio_to_plain=total / search_plain("grid"),
            failed=sum(not r["finished"] for r in grid),
        )
    opt = runs.get("optuna")
    bsf = opt["best_so_far"] if opt and "best_so_far" in opt else None
    if bsf is not None:
        d["optuna"] = dict(wall_ratio_to_plain=opt["total_wall_s"] / search_plain("optuna"))
    learned: dict[str, Any] = {}
    for g in GRANULARITIES:
        rec = runs.get(f"learned_{g}")
        if rec is None:
            continue
        v = _key(rec["best_val_loss"])
        ratios = time_ratios(rec, runs, reused)
        info: dict[str, Any] = dict(
            best_val_loss=rec["best_val_loss"],
            wall_ratio_to_plain=rec["wall_s"] / plain_wall if rec["finished"] else math.nan,
            wall_ratio_to_fixed_median=ratios["wall"],
            cpu_ratio_to_fixed_median=ratios["cpu"],
            beats_grid=(v <= grid_best) if grid else None,
            minus_grid_best=(v - grid_best) if grid else None,
            finished=rec["finished"],
            finite=rec["finite"],
        )
        if bsf is not None:
            n = (
                next((i + 1 for i, b in enumerate(bsf) if b <= v), None)
                if math.isfinite(v)
                else None
            )
            info["optuna_trials_to_match"] = n
            info["optuna_match"] = str(n) if n is not None else f"not matched in {len(bsf)}"
            if not rec["finished"]:
                info["optuna_match"] = "learned run failed"
        learned[g] = info
    d["learned"] = learned
    return d


# ---------------------------------------------------------------------------------- reporting
def _f(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return format(v, fmt)


def markdown_table(results: dict[str, Any]) -> str:
    lines = [
        "| setting | method | best val loss | test loss | test acc | steps | wall s | "
        "× plain time | Optuna trials to match | ≤ grid best |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, res in results["settings"].items():
        runs, der = res["runs"], res["derived"]
        plain = der.get("plain_wall_s", math.nan)

        def row(
            method: str,
            rec: dict[str, Any],
            wall: float,
            steps: str,
            match: str = "",
            beats: str = "",
            name: str = name,
            plain: float = plain,
        ) -> None:
            ok = rec.get("finished", True)
            loss = _f(rec["best_val_loss"], ".4f") if ok else f"FAILED: {rec['error'][:40]}"
            lines.append(
                f"| {name} | {method} | {loss} | {_f(rec.get('test_loss'), '.4f')} | "
                f"{_f(rec['test_acc'], '.4f')} | {steps} | "
                f"{_f(wall, '.1f')} | {_f(wall / plain if plain else math.nan, '.2f')} | "
                f"{match} | {beats} |"
            )

        if "no_wd" in runs:
            r = runs["no_wd"]
            row("no WD", r, r["wall_s"], str(r["optimizer_steps"]))
        g = der.get("grid")
        for i, r in enumerate(runs.get("grid", [])):
            star = " **(best)**" if g and i == g["best_index"] else ""
            row(f"grid wd={r['weight_decay']:.2g}{star}", r, r["wall_s"], str(r["optimizer_steps"]))
        if g:
            lines.append(
                f"| {name} | grid: all {len(runs['grid'])} | {_f(g['best_val_loss'], '.4f')} | "
                f"{_f(g.get('test_loss'), '.4f')} | {_f(g['test_acc'], '.4f')} | "
                f"{sum(r['optimizer_steps'] for r in runs['grid'])} | "
                f"{_f(g['total_wall_s'], '.1f')} | {_f(g['wall_ratio_to_plain'], '.2f')} | | "
                f"{'edge!' if g['best_at_edge'] else ''} |"
            )
        opt = runs.get("optuna")
        if opt and "trials" in opt:
            lines.append(
                f"| {name} | Optuna TPE: {opt['n_trials']} trials (best #{opt['best_trial']}, "
                f"wd={opt['best_weight_decay']:.2g}) | {_f(opt['best_val_loss'], '.4f')} | "
                f"{_f(opt.get('test_loss'), '.4f')} | {_f(opt['test_acc'], '.4f')} | "
                f"{opt['total_optimizer_steps']} | "
                f"{_f(opt['total_wall_s'], '.1f')} | "
                f"{_f(der['optuna']['wall_ratio_to_plain'], '.2f')} | | |"
            )
        for gran, info in der.get("learned", {}).items():
            r = runs[f"learned_{gran}"]
            steps = str(r["optimizer_steps"])
            cost = r.get("sid_cost")
            if cost and "samples" in cost:
                bs = res["config"]["batch_size"]
                steps += f" (+{cost['samples'] / bs:.0f} SID batches)"
            beats = "" if info["beats_grid"] is None else ("yes" if info["beats_grid"] else "no")
            row(f"learned {gran}", r, r["wall_s"], steps, info.get("optuna_match", ""), beats)
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    has_optuna = any(
        "trials" in (r["runs"].get("optuna") or {}) for r in results["settings"].values()
    )
    nrows = 3 if has_optuna else 2
    fig, axes = plt.subplots(nrows, len(names), figsize=(5.5 * len(names), 3.6 * nrows),
                             squeeze=False)  # fmt: skip
    colors = {"no WD": "gray", "grid": "tab:blue", "optuna": "tab:orange", "learned": "tab:green"}
    for col, name in enumerate(names):
        res = results["settings"][name]
        runs, der = res["runs"], res["derived"]
        labels, losses, cols = [], [], []
        walls, wlabels, wcols = [], [], []
        if "no_wd" in runs:
            labels.append("no WD")
            losses.append(runs["no_wd"]["best_val_loss"])
            cols.append(colors["no WD"])
            wlabels.append("no WD")
            walls.append(_num(runs["no_wd"]["wall_s"]))
            wcols.append(colors["no WD"])
        for r in runs.get("grid", []):
            labels.append(f"grid {r['weight_decay']:.1g}")
            losses.append(r["best_val_loss"])
            cols.append(colors["grid"])
        if "grid" in der:
            wlabels.append(f"grid ×{len(runs['grid'])}")
            walls.append(der["grid"]["total_wall_s"])
            wcols.append(colors["grid"])
        opt = runs.get("optuna") or {}
        if "trials" in opt:
            labels.append(f"Optuna best/{opt['n_trials']}")
            losses.append(opt["best_val_loss"])
            cols.append(colors["optuna"])
            wlabels.append(f"Optuna ×{opt['n_trials']}")
            walls.append(opt["total_wall_s"])
            wcols.append(colors["optuna"])
        for g in GRANULARITIES:
            if f"learned_{g}" in runs:
                r = runs[f"learned_{g}"]
                labels.append(f"learned {g}")
                losses.append(r["best_val_loss"] if r["finished"] else math.nan)
                cols.append(colors["learned"])
                wlabels.append(f"learned {g}")
                walls.append(_num(r["wall_s"]))
                wcols.append(colors["learned"])
        ax = axes[0][col]
        x = np.arange(len(labels))
        y = np.array([v if v is not None and math.isfinite(v) else np.nan for v in losses])
        ax.scatter(x, y, c=cols, s=40, zorder=3)
        for xi, yi in zip(x, y):
            if np.isnan(yi):
                ax.annotate("failed", (xi, np.nanmin(y) if np.isfinite(y).any() else 0),
                            ha="center", fontsize=7, color="red")  # fmt: skip
        if np.isfinite(y).any() and np.nanmax(y) > 1.5 * np.nanmin(y):  # zoom on the best
            top = 1.5 * np.nanmin(y)
            ax.set_ylim(0.97 * np.nanmin(y), top)
            for xi, yi in zip(x, y):
                if yi > top:
                    ax.annotate(f"↑{yi:.3g}", (xi, top), ha="center", va="top", fontsize=7)
        if "grid" in der and der["grid"]["best_val_loss"] is not None:
            ax.axhline(der["grid"]["best_val_loss"], ls="--", lw=0.8, color=colors["grid"])
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("best validation loss")
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax = axes[1][col]
        xw = np.arange(len(wlabels))
        ax.bar(xw, walls, color=wcols)
        for xi, w in zip(xw, walls):
            ax.annotate(f"{w:.0f}s", (xi, w), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(xw, wlabels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("wall time, s (total for searches)")
        ax.set_yscale("log")
        if has_optuna:
            ax = axes[2][col]
            if "best_so_far" in opt:
                n = len(opt["best_so_far"])
                ax.step(range(1, n + 1), opt["best_so_far"], where="post",
                        color=colors["optuna"], label="Optuna best so far")  # fmt: skip
                for g, ls in zip(GRANULARITIES, ("-", "--", ":")):
                    r = runs.get(f"learned_{g}")
                    if r and r["finished"] and math.isfinite(r["best_val_loss"]):
                        ax.axhline(r["best_val_loss"], ls=ls, color=colors["learned"],
                                   label=f"learned {g}")  # fmt: skip
                ax.set_xlabel("Optuna trial (one full training each)")
                ax.set_ylabel("best validation loss")
                ax.legend(fontsize=7)
            else:
                ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _clean(obj: Any) -> Any:
    """Strict JSON: non-finite floats become null (the ``finite``/``finished`` flags say why)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ---------------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--settings", nargs="+", default=None,
                   help=f"any of {list(SETTINGS)} (aliases {' '.join(ALIASES)}); default: "
                   f"{DEFAULT_SETTINGS} (--quick: digits_mlp)")  # fmt: skip
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--optuna-trials", type=int, default=None,
                   help="trials per setting (default 10, --quick 2); 0 skips Optuna")  # fmt: skip
    p.add_argument("--learned-kwargs", type=json.loads, default={},
                   help="JSON dict of extra LearnedWeightDecay/callback settings")  # fmt: skip
    p.add_argument("--granularity-kwargs", type=json.loads, default={},
                   help="JSON dict granularity -> settings overriding --learned-kwargs for it, "
                   "e.g. '{\"per_element\": {\"outer_lr\": 1.0}}'")  # fmt: skip
    p.add_argument("--damping", choices=("default", "horizon", "horizon_solver"),
                   default="default",
                   help="damping strategy of the learned runs: the callback's default, "
                   "HorizonDamping() (the remaining training length), or horizon_solver: "
                   "HorizonSolver() on Gauss-Newton products, undamped")  # fmt: skip
    p.add_argument("--learned-init", type=float, default=1e-4, help="initial λ (default 1e-4)")
    p.add_argument("--epochs", type=int, default=None, help="override every setting's epochs")
    p.add_argument("--grid", type=float, nargs="+", default=None,
                   help="override every grid (and the Optuna range: min..max)")  # fmt: skip
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the MNIST *.gz files")
    p.add_argument("--fashion-data", type=Path, default=DEFAULT_FASHION,
                   help="folder of the Fashion-MNIST *.gz files")  # fmt: skip
    p.add_argument("--news-data", type=Path, default=DEFAULT_NEWS,
                   help="data root holding 20news/20news-bydate.tar.gz (news_mlp)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny data, 1-2 epochs: seconds")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run everything once per seed (data split, initial weights, batch order), "
                   "into <out>_seed<s>.{json,md,png}, and summarise over the seeds in "
                   "<out>_seeds.{json,md}")  # fmt: skip
    p.add_argument("--summarise", type=Path, nargs="+", default=None,
                   help="run nothing: summarise earlier per-seed result files "
                   "(<out>_seed<s>.json, one per seed, from any runs) into --out "
                   "(.json and .md)")  # fmt: skip
    p.add_argument("--retrained", type=Path, nargs="+", default=(),
                   help="with --summarise: per-seed files that retrained some methods alone on "
                   "the same seeds and data (e.g. the default with another max_overhead, no "
                   "--reuse): their runs replace those methods' runs of the summarised "
                   "files")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reuse", default=None,
                   help="an earlier result JSON ('{seed}' is replaced by each seed): take "
                   "the trainings of the methods not in --methods from it")  # fmt: skip
    p.add_argument("--accelerator", default="cpu",
                   help="Lightning accelerator of every training: cpu, gpu, auto")  # fmt: skip
    args = p.parse_args(argv)
    if not isinstance(args.learned_kwargs, dict):
        p.error("--learned-kwargs must be a JSON object, e.g. '{\"every_n_steps\": 20}'")
    gk = args.granularity_kwargs
    if not isinstance(gk, dict) or not all(
        k in GRANULARITIES and isinstance(v, dict) for k, v in gk.items()
    ):
        p.error(f"--granularity-kwargs must be a JSON object {{granularity: {{...}}}} with "
                f"granularities from {list(GRANULARITIES)}")  # fmt: skip
    names = args.settings or (["digits_mlp"] if args.quick else DEFAULT_SETTINGS)
    try:
        args.settings = list(dict.fromkeys(ALIASES.get(n, n) for n in names))
        for n in args.settings:
            SETTINGS[n]
    except KeyError as err:
        p.error(f"unknown setting {err}; choose from {list(SETTINGS)} or {', '.join(ALIASES)}")
    if args.optuna_trials is None:
        args.optuna_trials = 2 if args.quick else 10
    args.out = out_path(args.out, args.quick, DEFAULT_OUT)
    return args


def out_path(out: Path | None, quick: bool, default: Path) -> Path:
    """``--out``; without it a temporary folder for ``--quick`` runs, else ``default``."""
    if out is not None:
        return out
    return (
        Path(tempfile.mkdtemp(prefix=f"bench_{default.stem}_")) / default.name if quick else default
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    for name in ("pytorch_lightning", "lightning", "lightning_fabric", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.WARNING)
    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    if args.summarise:
        return summarise(args.summarise, args.out, command, args.retrained)
    if not args.seeds:
        return run_seed(args, command)
    per_seed = {}
    for seed in args.seeds:
        out = args.out.with_name(f"{args.out.stem}_seed{seed}.json")
        per_seed[seed] = run_seed(replace_args(args, seed=seed, out=out), command)
    summary = seed_summary(per_seed)
    summary["command"] = command
    path = args.out.with_name(f"{args.out.stem}_seeds.json")
    write_summary(summary, path)
    return summary


#: the heading of the deployment table in a summary's Markdown
DEPLOYMENT_HEADING = (
    "What a user deploys: held-out test loss of the model each search selects on validation "
    "data, paired by seed"
)


#: the heading of the per-setting goal table
GOAL_HEADING = (
    "The goal, per setting: the default (learned per layer) against what each search deploys, "
    "held-out test loss paired by seed"
)


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """A summary over seeds as JSON and Markdown (the seeds table, then the deployment table),
    and printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(summary), indent=1, allow_nan=False))
    text = summary["table_markdown"]
    deployment = summary["deployment"]
    if deployment.get("goal_markdown"):
        text += f"\n\n{GOAL_HEADING}\n\n{deployment['goal_markdown']}"
    text += f"\n\n{DEPLOYMENT_HEADING}\n\n{deployment['table_markdown']}"
    out.with_suffix(".md").write_text(text + "\n")
    print("\n" + text)
    print(f"\nwrote {out} and {out.with_suffix('.md').name}")


def replace_args(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def run_seed(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Every setting and method with ``args.seed``; writes ``args.out`` (JSON, .md, .png)."""

    def log(msg: str) -> None:
        print(msg, flush=True)

    settings = []
    for n in args.settings:
        s = SETTINGS[n]
        if args.quick:
            s = quick_setting(s)
        s = replace(s, accelerator=args.accelerator)
        if args.epochs is not None:
            s = replace(s, epochs=args.epochs)
        if args.grid is not None:
            s = replace(s, grid=sorted(args.grid), search_range=(min(args.grid), max(args.grid)))
        settings.append(s)
    if any(s.data == "mnist" for s in settings):  # fail early, with a clear message
        load_mnist_arrays(args.data)
    if any(s.data == "fashion" for s in settings):
        load_mnist_arrays(args.fashion_data, "Fashion-MNIST", "--fashion-data")
    if any(s.data == "news" for s in settings) and (why := news_data_missing(args.news_data)):
        log(f"news_mlp skipped: {why}")
        settings = [s for s in settings if s.data != "news"]
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "pytorch_lightning": pl.__version__,
                # the CPU kernels torch chose (AVX2 / AVX512 round differently)
                "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # fmt: skip
    try:
        import optuna

        versions["optuna"] = optuna.__version__
    except ImportError:
        versions["optuna"] = None
    results: dict[str, Any] = dict(
        benchmark="weight_decay",
        command=command,
        quick=args.quick,
        seed=args.seed,
        threads=torch.get_num_threads(),
        methods=args.methods,
        reuse=args.reuse,
        optuna_trials=args.optuna_trials,
        learned_init=args.learned_init,
        learned_kwargs=args.learned_kwargs,
        granularity_kwargs=args.granularity_kwargs,
        damping=args.damping,
        environment=dict(platform=platform.platform(), processor=platform.processor(), **versions),
        settings={},
    )
    t0 = time.perf_counter()
    methods = set(args.methods)
    for s in settings:
        results["settings"][s.name] = run_setting(s, args, methods, log)
    results["total_wall_s"] = time.perf_counter() - t0
    table = markdown_table(results)
    results["table_markdown"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_clean(results), indent=1, allow_nan=False))
    args.out.with_suffix(".md").write_text(table + "\n")
    png = args.out.with_suffix(".png")
    plot(results, png)
    print("\n" + table)
    print(f"\ntotal {results['total_wall_s']:.0f} s; wrote {args.out}, {png.name}, "
          f"{args.out.with_suffix('.md').name}")  # fmt: skip
    return results


def _method_records(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One setting's result per method row of the summary: no WD, the grid's and Optuna's best
    (with the wall time of all their trainings), each learned variant."""
    runs, der = res["runs"], res["derived"]
    rows: dict[str, dict[str, Any]] = {}
    plain = der.get("plain_wall_s", math.nan)
    if "no_wd" in runs:
        r = runs["no_wd"]
        rows["no WD"] = dict(val=r["best_val_loss"], test_loss=r["test_loss"],
                             test_acc=r["test_acc"], ratio=1.0)  # fmt: skip
    if "grid" in der:
        g = der["grid"]
        rows[f"grid best ({len(runs['grid'])} trainings)"] = dict(
            val=g["best_val_loss"], test_loss=g["test_loss"], test_acc=g["test_acc"],
            ratio=g["wall_ratio_to_plain"],
        )  # fmt: skip
    opt = runs.get("optuna") or {}
    if "trials" in opt:
        rows[f"Optuna best ({opt['n_trials']} trials)"] = dict(
            val=opt["best_val_loss"], test_loss=opt["test_loss"], test_acc=opt["test_acc"],
            ratio=opt["total_wall_s"] / plain,
        )  # fmt: skip
    for g in GRANULARITIES:
        r = runs.get(f"learned_{g}")
        if r is not None:
            ratios = time_ratios(r, runs, res.get("reused"))
            rows[f"learned {g}"] = dict(
                val=r["best_val_loss"] if r["finished"] else math.nan,
                test_loss=r["test_loss"], test_acc=r["test_acc"],
                ratio=r["wall_s"] / plain if r["finished"] else math.nan,
                ratio_fixed=ratios["wall"], ratio_cpu=ratios["cpu"],
                beats_grid=der["learned"][g]["beats_grid"],
            )  # fmt: skip
    return rows


def paired_difference(a: list[float], b: list[float]) -> dict[str, float]:
    """The mean of the per-seed differences a − b, its standard error and a two-sided 95 %
    Student-t interval (n − 1 degrees of freedom): whether a method's miss or gain over another
    is larger than the seed-to-seed noise both share (the same split, initial weights, order)."""
    from scipy.stats import t as student_t

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        return dict(n=n, mean=mean, se=math.nan, low=math.nan, high=math.nan)
    se = float(d.std(ddof=1) / math.sqrt(n))
    half = float(student_t.ppf(0.975, n - 1)) * se
    return dict(n=n, mean=mean, se=se, low=mean - half, high=mean + half)


def _paired_text(d: dict[str, float] | None) -> str:
    if d is None or not math.isfinite(d["mean"]):
        return ""
    if not math.isfinite(d["se"]):
        return f"{d['mean']:+.4f}"
    return f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def hindsight_records(per_seed: dict[int, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The grid value with the lowest mean best validation loss over the seeds, and its record
    on each seed: the best *single fixed* λ, chosen in hindsight with every seed's validation
    loss. It is the most any one training with a constant λ can be expected to reach; its
    difference to the grid's best (a minimum over six trainings of each seed) is the part of
    "at least as low as the grid's best" that no constant λ can close. None with under 2 seeds
    or without the grid on every seed (a row of one seed would be the grid's best itself)."""
    grids = {}
    for seed, results in per_seed.items():
        res = results["settings"].get(name)
        if res is None or not res["runs"].get("grid"):
            return None
        grids[seed] = {float(r["weight_decay"]): (r, res["derived"]) for r in res["runs"]["grid"]}
    if len(grids) < 2:
        return None
    values = set.intersection(*(set(g) for g in grids.values()))
    if not values:
        return None

    def mean_val(v: float) -> float:
        return float(np.mean([_num(g[v][0]["best_val_loss"]) for g in grids.values()]))

    best = min(sorted(values), key=mean_val)
    seeds = {}
    for seed, g in grids.items():
        r, der = g[best]
        seeds[seed] = dict(val=r["best_val_loss"], test_loss=r["test_loss"],
                           test_acc=r["test_acc"],
                           ratio=r["wall_s"] / _seconds(der, "plain_wall_s"))  # fmt: skip
    return dict(weight_decay=best, seeds=seeds)


def _slowest_seed(row: dict[str, Any], recs: list[dict[str, Any]]) -> str:
    """For learned runs (the ≤ 2× target): the slowest seed's time over the plain training and
    over the median fixed-decay training (and in CPU time, where recorded), stored in ``row``
    and as the table's text; "" for the other methods."""
    if not all("ratio_fixed" in r for r in recs):
        return ""
    row["max_ratio"] = max(_num(r["ratio"]) for r in recs)
    row["max_ratio_fixed"] = max(_num(r["ratio_fixed"]) for r in recs)
    cpu = [r["ratio_cpu"] for r in recs]
    row["max_ratio_cpu"] = max(cpu) if all(map(math.isfinite, cpu)) else math.nan
    text = f"{row['max_ratio']:.2f} / {row['max_ratio_fixed']:.2f}"
    if math.isfinite(row["max_ratio_cpu"]):
        text += f" (CPU {row['max_ratio_cpu']:.2f})"
    return text


def _same_value(a: Any, b: Any) -> bool:
    """Equal, floats to rounding (a grid built as 10**linspace once read 1e-05, now
    9.999999999999999e-06)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def seed_summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per setting and method, over the seeds: the best validation loss of each seed and their
    mean, the mean test loss / accuracy and wall-time ratio, for learned runs on how many seeds
    they reached the grid's best, and for every method the paired difference of its best
    validation loss to the grid's best (mean ± standard error [95 % interval]; negative: lower
    than the grid's best). Below the grid's best, the best single grid value in hindsight
    (:func:`hindsight_records`): the floor of the target for any constant λ."""
    seeds = list(per_seed)
    table: dict[str, dict[str, Any]] = {}
    for seed, results in per_seed.items():
        for name, res in results["settings"].items():
            for method, rec in _method_records(res).items():
                row = table.setdefault(name, {}).setdefault(method, {"seeds": {}})
                row["seeds"][seed] = rec
    for name in table:
        hindsight = hindsight_records(per_seed, name)
        if hindsight is not None:
            method = f"grid, one λ = {hindsight['weight_decay']:.1e} (best in hindsight)"
            rows = list(table[name].items())
            at = next(i for i, (m, _) in enumerate(rows) if m.startswith("grid best")) + 1
            rows.insert(at, (method, {"seeds": hindsight["seeds"]}))
            table[name] = dict(rows)
    lines = [
        f"| setting | method | best val loss, seeds {', '.join(map(str, seeds))} | mean | "
        "mean test loss | mean test acc | × plain time (mean) | max × plain / × median fixed | "
        "≤ grid best | − grid best: mean ± s.e. [95 %] | − one λ in hindsight |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, methods in table.items():
        grid = next((r for m, r in methods.items() if m.startswith("grid best")), None)
        hindsight = next((r for m, r in methods.items() if m.startswith("grid, one λ")), None)
        for method, row in methods.items():
            recs = list(row["seeds"].values())
            for key in ("val", "test_loss", "test_acc", "ratio"):
                row[f"mean_{key}"] = float(np.mean([_num(r[key]) for r in recs]))
            worst = _slowest_seed(row, recs)
            beats = [r["beats_grid"] for r in recs if r.get("beats_grid") is not None]
            row["beats_grid"] = f"{sum(beats)} of {len(beats)}" if beats else ""
            for key, ref in (("minus_grid", grid), ("minus_hindsight", hindsight)):
                row[key] = None
                if ref is not None and row is not ref and row is not grid:
                    both = [s for s in row["seeds"] if s in ref["seeds"]]
                    row[key] = paired_difference(
                        [_num(row["seeds"][s]["val"]) for s in both],
                        [_num(ref["seeds"][s]["val"]) for s in both],
                    )
            vals = ", ".join(_f(r["val"], ".4f") for r in recs)
            lines.append(
                f"| {name} | {method} | {vals} | {_f(row['mean_val'], '.4f')} | "
                f"{_f(row['mean_test_loss'], '.4f')} | {_f(row['mean_test_acc'], '.4f')} | "
                f"{_f(row['mean_ratio'], '.2f')} | {worst} | {row['beats_grid']} | "
                f"{_paired_text(row['minus_grid'])} | {_paired_text(row['minus_hindsight'])} |"
            )
    return dict(benchmark="weight_decay_seeds", seeds=seeds, settings=table,
                table_markdown="\n".join(lines),
                deployment=deployment_summary(per_seed))  # fmt: skip


# ---------------------------------------------------------------------------------- deployment
#: the granularity LearnedWeightDecay uses when none is given: the one the goal is about
DEFAULT_GRANULARITY = "per_layer"


def _nan(v: Any) -> float:
    """A recorded number, nan where it is missing (None in strict JSON) or not a number."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def search_pick(trials: list[dict[str, Any]], n: int | None = None) -> dict[str, Any] | None:
    """The training a search deploys after its first ``n`` trainings (all by default): the one of
    lowest best validation loss (failed or non-finite ones never win); None if none finished."""
    done = [t for t in trials[:n] if math.isfinite(_nan(t["best_val_loss"]))]
    return min(done, key=lambda t: t["best_val_loss"]) if done else None


def _same_run_fixed_median(
    runs: dict[str, Any], reused: dict[str, Any] | None, method: str
) -> float:
    """The median wall time of the fixed-decay trainings (no weight decay, the grid) timed in the
    same run as ``method``'s training: the yardstick of "× one plain training" for it. A result
    file whose learned runs were reused together with the grid (``--reuse`` to add Optuna) still
    has its ratios."""
    taken = set(reused["methods"]) if reused else set()
    fixed = [runs["no_wd"]] if "no_wd" in runs and ("no_wd" in taken) == (method in taken) else []
    if ("grid" in taken) == (method in taken):
        fixed += runs.get("grid") or []
    times = [_nan(r["wall_s"]) for r in fixed if r["finished"]]
    return float(np.median(times)) if times else math.nan


def _search_cost(trials: list[dict[str, Any]]) -> float:
    """A search's total wall time over the median of its own trainings (each a plain training
    with another fixed decay): ≈ its number of trainings, steady under machine load."""
    times = [_nan(t["wall_s"]) for t in trials if t["finished"]]
    return sum(times) / float(np.median(times)) if times else math.nan


def deployment_records(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One setting's result as a user deploys it: per method the deployed model's held-out test
    loss / accuracy and the total cost in plain trainings. The grid's and Optuna's rows are the
    training each search *selects* on the validation loss (its pick), scored on the test set,
    which no choice was made on. Optuna's row also keeps its trials (for "trials to match").
    A learned run with no fixed-decay training timed in its own run (retrained alone with
    ``--reuse``) costs 1 + the overhead its ``max_overhead`` budget measured in-run (the callback's
    time over the training's own), where it had one."""
    runs, reused = res["runs"], res.get("reused")
    rows: dict[str, dict[str, Any]] = {}

    def row(rec: dict[str, Any] | None, cost: float, **extra: Any) -> dict[str, Any]:
        keys = dict(test_loss="test_loss", test_acc="test_acc", val="best_val_loss")
        return {k: _nan(rec[key]) if rec else math.nan for k, key in keys.items()} | dict(
            cost=cost, **extra
        )

    if "no_wd" in runs:
        rows["no WD"] = row(runs["no_wd"], 1.0)
    if runs.get("grid"):
        pick = search_pick(runs["grid"])
        rows["grid pick"] = row(pick, _search_cost(runs["grid"]), n=len(runs["grid"]),
                                weight_decay=pick["weight_decay"] if pick else None)  # fmt: skip
    opt = runs.get("optuna") or {}
    if opt.get("trials"):
        trials = opt["trials"]
        pick = search_pick(trials)
        slim = [{k: t[k] for k in ("best_val_loss", "test_loss", "test_acc")} for t in trials]
        rows["Optuna pick"] = row(pick, _search_cost(trials), n=len(trials), trials=slim,
                                  weight_decay=pick["weight_decay"] if pick else None)  # fmt: skip
    for g in GRANULARITIES:
        rec = runs.get(f"learned_{g}")
        if rec is None:
            continue
        method = f"learned_{g}"
        cost = _nan(rec["wall_s"]) / _same_run_fixed_median(runs, reused, method)
        if not math.isfinite(cost):  # no plain training timed beside it: the budget's reading
            cost = 1.0 + _nan((rec.get("budget") or {}).get("overhead"))
        rows[f"learned {g}"] = row(rec if rec["finished"] else None,
                                   cost if rec["finished"] else math.nan)  # fmt: skip
    return rows


def optuna_trials_to_match(trials: list[dict[str, Any]], test_loss: float) -> int | None:
    """How many Optuna trials (in trial order) it takes until the model Optuna would deploy (its
    pick so far, chosen on validation loss) has a held-out test loss ≤ ``test_loss``; None if
    not within the trials run."""
    if not math.isfinite(test_loss):
        return None
    for n in range(1, len(trials) + 1):
        pick = search_pick(trials, n)
        if pick is not None and _nan(pick["test_loss"]) <= test_loss:
            return n
    return None


def _paired_on(row: dict[str, Any], ref: dict[str, Any], key: str) -> dict[str, float]:
    """The paired difference ``row − ref`` of ``key`` over the seeds both have a number for."""
    both = [s for s in row["seeds"] if s in ref["seeds"]]
    both = [s for s in both if all(math.isfinite(r["seeds"][s][key]) for r in (row, ref))]
    return paired_difference([row["seeds"][s][key] for s in both],
                             [ref["seeds"][s][key] for s in both])  # fmt: skip


def deployment_verdict(row: dict[str, Any], refs: dict[str, dict[str, Any]],
                       max_cost: float = 1.5) -> str:  # fmt: skip
    """The issue's goal for one learned row: a lower mean test loss than each search's pick where
    that search's own choice beats no weight decay (its mean paired test-loss difference to no WD
    is negative), never significantly worse (the 95 % interval of the difference lies above 0)
    than any pick, and a mean cost ≤ ``max_cost`` plain trainings."""
    misses = []
    for name, ref in refs.items():
        d = row[f"minus_{ref['key']}"]
        if d is None or d["n"] == 0:
            continue
        if math.isfinite(d["low"]) and d["low"] > 0:
            misses.append(f"significantly worse than the {name}")
        elif ref["beats_no_wd"] and d["mean"] >= 0:
            misses.append(f"not below the {name}")
    if not math.isfinite(row["mean_cost"]):
        misses.append("cost unknown (no fixed-decay training timed in its run)")
    elif row["mean_cost"] > max_cost:
        misses.append(f"costs {row['mean_cost']:.2f}× > {max_cost}×")
    return "met" if not misses else "missed: " + "; ".join(misses)


def deployment_summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What a user deploys, over the seeds: per setting and method the mean held-out test loss
    and accuracy of the deployed model, its mean cost in plain trainings, and the paired
    differences (mean ± s.e. [95 %]) of its test loss to the grid's pick, Optuna's pick and no
    weight decay; for learned rows how many Optuna trials it took to match them on each seed and
    the goal's verdict (:func:`deployment_verdict`). Seeds without Optuna trials pair only with
    the grid (the table says how many seeds each difference has)."""
    order = ["no WD", "grid pick", ORACLE, "Optuna pick", *(f"learned {g}" for g in GRANULARITIES)]
    table: dict[str, dict[str, Any]] = {}
    for seed, results in per_seed.items():
        for name, res in results["settings"].items():
            for method, rec in deployment_records(res).items():
                table.setdefault(name, {}).setdefault(method, {"seeds": {}})["seeds"][seed] = rec
    for name, methods in table.items():
        oracle = constant_lambda_oracle(per_seed, name)
        if oracle is not None:
            methods[ORACLE] = oracle
    table = {n: {m: ms[m] for m in order if m in ms} for n, ms in table.items()}
    lines = [
        "| setting | method | seeds | mean test loss | mean test acc | cost × plain (mean) | "
        "test loss − grid pick: mean ± s.e. [95 %] (n) | − Optuna pick (n) | − no WD (n) | "
        "Optuna trials to match, per seed | goal |",
        "|---|---|---:|---:|---:|---:|---|---|---|---|---|",
    ]
    for name, methods in table.items():
        _deployment_rows(methods)
        lines += [_deployment_line(name, method, row) for method, row in methods.items()]
    return dict(benchmark="weight_decay_deployment", seeds=list(per_seed), settings=table,
                goal_markdown=goal_table(table),
                table_markdown="\n".join(lines))  # fmt: skip


#: the deployment row of the best constant λ of the grid chosen on the *test* loss (an oracle)
ORACLE = "one λ, best on test (oracle)"


def constant_lambda_oracle(per_seed: dict[int, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The grid value of lowest mean held-out test loss over the seeds, with its record on each
    seed: what the best *constant* λ reaches, chosen with the test set itself (no user can; it
    bounds what one training with any one λ can be expected to deploy). Against the grid's pick
    it separates the value of λ from the value of choosing, per seed, among six trainings on
    validation data. None with under 2 seeds or without a common grid."""
    grids = {}
    for seed, results in per_seed.items():
        res = results["settings"].get(name)
        if res is None or not res["runs"].get("grid"):
            return None
        grids[seed] = {float(r["weight_decay"]): r for r in res["runs"]["grid"] if r["finished"]}
    values = set.intersection(*(set(g) for g in grids.values())) if len(grids) > 1 else set()
    if not values:
        return None
    best = min(
        sorted(values), key=lambda v: np.mean([_nan(g[v]["test_loss"]) for g in grids.values()])
    )
    seeds = {seed: dict(test_loss=_nan(g[best]["test_loss"]), test_acc=_nan(g[best]["test_acc"]),
                        val=_nan(g[best]["best_val_loss"]), cost=1.0, weight_decay=best)
             for seed, g in grids.items()}  # fmt: skip
    return {"seeds": seeds}


def goal_table(table: dict[str, dict[str, Any]]) -> str:
    """The goal per setting for the default (learned per layer): its paired test-loss
    difference to each search's pick, the best constant λ's (the oracle) to the grid's pick, its
    cost, Optuna's trials to match it and the verdict."""
    lines = [
        "| setting | default − grid pick: mean ± s.e. [95 %] (n) | default − Optuna pick (n) | "
        "one λ, best on test − grid pick (n) | default cost × plain | Optuna trials to match, "
        "per seed | goal |",
        "|---|---|---|---|---:|---|---|",
    ]
    for name, methods in table.items():
        row = methods.get(f"learned {DEFAULT_GRANULARITY}")
        if row is None:
            continue
        oracle = methods.get(ORACLE)
        match = row.get("optuna_trials_to_match") or {}
        lam = f" (λ = {next(iter(oracle['seeds'].values()))['weight_decay']:.1e})" if oracle else ""
        lines.append(
            f"| {name} | {_paired_n(row['minus_grid'])} | {_paired_n(row['minus_optuna'])} | "
            f"{_paired_n(oracle['minus_grid']) + lam if oracle else ''} | "
            f"{_f(row['mean_cost'], '.2f')} | "
            f"{', '.join('not matched' if v is None else str(v) for v in match.values())} | "
            f"{row['goal']} |"
        )
    return "\n".join(lines)


#: the references every deployed model is paired with: method row -> key of the difference
_REFERENCES = {"grid pick": "grid", "Optuna pick": "optuna", "no WD": "no_wd"}


def _deployment_rows(methods: dict[str, dict[str, Any]]) -> None:
    """One setting's rows over the seeds, in place: means, paired differences to the references,
    and for learned rows Optuna's trials to match and the goal's verdict."""
    for row in methods.values():
        recs = list(row["seeds"].values())
        for key in ("test_loss", "test_acc", "cost"):
            vals = [r[key] for r in recs if math.isfinite(r[key])]
            row[f"mean_{key}"] = float(np.mean(vals)) if vals else math.nan
    for method, key in _REFERENCES.items():
        ref = methods.get(method)
        for row in methods.values():
            row[f"minus_{key}"] = (
                None if ref is None or row is ref else _paired_on(row, ref, "test_loss")
            )
    refs = {}
    for method, key in _REFERENCES.items():
        if method in methods and method != "no WD":
            d = methods[method]["minus_no_wd"]
            refs[method] = dict(key=key, beats_no_wd=bool(d and d["n"] and d["mean"] < 0))
    optuna = methods.get("Optuna pick")
    for method, row in methods.items():
        row["goal"] = ""
        if not method.startswith("learned"):
            continue
        if optuna is not None:
            row["optuna_trials_to_match"] = {
                s: optuna_trials_to_match(optuna["seeds"][s]["trials"], rec["test_loss"])
                for s, rec in row["seeds"].items()
                if s in optuna["seeds"]
            }
        row["goal"] = deployment_verdict(row, refs)


def _deployment_line(name: str, method: str, row: dict[str, Any]) -> str:
    first = next(iter(row["seeds"].values()))
    label = method
    if method in ("grid pick", "Optuna pick"):
        label += f" ({first['n']} {'values' if method == 'grid pick' else 'trials'})"
    if method == f"learned {DEFAULT_GRANULARITY}":
        label += " (default)"
    match = row.get("optuna_trials_to_match") or {}
    match_text = ", ".join("not in the trials" if v is None else str(v) for v in match.values())
    diffs = " | ".join(_paired_n(row[f"minus_{k}"]) for k in _REFERENCES.values())
    return (
        f"| {name} | {label} | {len(row['seeds'])} | {_f(row['mean_test_loss'], '.4f')} | "
        f"{_f(row['mean_test_acc'], '.4f')} | {_f(row['mean_cost'], '.2f')} | {diffs} | "
        f"{match_text} | {row['goal']} |"
    )


def _paired_n(d: dict[str, float] | None) -> str:
    text = _paired_text(d)
    return f"{text} ({d['n']})" if text else ""


def _made_from(setting: dict[str, Any]) -> str:
    """The name of the file a setting's result was made from with ``--reuse`` ("" if none)."""
    return Path((setting.get("reused") or {}).get("from") or "").name


def summarise(
    paths: list[Path], out: Path, command: str, retrained: Sequence[Path] = ()
) -> dict[str, Any]:
    """The seeds summary of earlier per-seed result files (``--summarise``), e.g. two draws of
    seeds run at different times; written to ``out`` (JSON and .md). A setting of a seed given
    twice is an error (its trainings would count twice), except where the later file was made
    with ``--reuse`` from one of the earlier ones or from the file they were made from (e.g. one
    added Optuna's trials, another retrained the default): the trainings it ran itself replace
    theirs; the rest (its copies of reused runs, the methods only they have) stays as the earlier
    files hold it. ``retrained`` (``--retrained``): files that trained some methods alone, without
    ``--reuse``, on a seed and setting of those files (the same data, model and training; only the
    learned runs' settings may differ): their runs replace those methods' runs."""
    per_seed: dict[int, dict[str, Any]] = {}
    sources: dict[tuple[int, str], list[Path]] = {}
    bases: dict[tuple[int, str], set[str]] = {}  # the files the given ones were made from
    for path in map(Path, paths):
        res = json.loads(path.read_text())
        seed = int(res["seed"])
        merged = per_seed.setdefault(seed, {**res, "settings": {}})
        for name, setting in res["settings"].items():
            earlier = sources.setdefault((seed, name), [])
            made_from = _made_from(setting)
            if earlier and made_from not in {p.name for p in earlier} | bases.get(
                (seed, name), set()
            ):
                raise SystemExit(
                    f"--summarise: seed {seed} is in two files (the second: {path}) with "
                    f"{name}, and {path.name} was not made from "
                    f"{' or '.join(p.name for p in earlier)} with --reuse"
                )
            if earlier:  # its own trainings replace; the rest stays as the earlier files had it
                taken = set((setting.get("reused") or {}).get("methods") or ())
                own = {m: r for m, r in setting["runs"].items() if m not in taken}
                setting = {**setting, "runs": {**merged["settings"][name]["runs"], **own}}
            merged["settings"][name] = setting
            earlier.append(path)
            if made_from:
                bases.setdefault((seed, name), set()).add(made_from)
    for path in map(Path, retrained):
        res = json.loads(path.read_text())
        for name, setting in res["settings"].items():
            base = per_seed.get(int(res["seed"]), {}).get("settings", {}).get(name)
            free = ("learned_kwargs", "granularity_kwargs")
            same = base is not None and all(
                _same_value(base["config"].get(k), v)
                for k, v in setting["config"].items()
                if k not in free
            )
            if not same:
                raise SystemExit(
                    f"--retrained: {path} has seed {res['seed']} with {name}, which the "
                    "summarised files lack or ran on another data, model or training"
                )
            per_seed[int(res["seed"])]["settings"][name] = {
                **base,
                "runs": {**base["runs"], **setting["runs"]},
            }
    summary = seed_summary(dict(sorted(per_seed.items())))
    summary["command"] = command
    summary["sources"] = [str(p) for p in [*paths, *retrained]]
    write_summary(summary, out)
    return summary


if __name__ == "__main__":
    main()
