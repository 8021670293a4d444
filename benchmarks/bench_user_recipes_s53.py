"""Session 53's unseen recipes: both drop-ins on seven more set-ups, written from README.md only.

Each recipe is a small ``LightningModule`` a demanding user would write, on small real data
(scikit-learn's diabetes and digits, Fashion-MNIST / MNIST subsets, four groups of 20
Newsgroups), trained per seed in up to five arms:

* ``own``   the recipe as written, with its own fixed ``weight_decay``, clean data;
* ``decay`` ``LearnedWeightDecay(<own value>)`` with every default (``decoupled=True`` under
            AdamW), the optimizer's decay removed;
* ``plain`` the recipe (own decay) on corrupted training data (35 % of the labels moved to another
            class; the regression: 30 % of the targets shifted by ±3–6 σ; the multi-label set:
            30 % of the label vectors replaced by another digit's), clean validation data;
* ``dw``    the same corrupted data with ``LearnedDataWeights()`` (every default; the regression
            ``objective="mean_loss"`` as README.md says), ``reduction="none"``, ``IndexedDataset``;
* ``dw_default`` / ``dw_mean_loss`` (on request) ``LearnedDataWeights()`` with no setting /
            with ``objective="mean_loss"``;
* ``both``  (where the recipe is about it) ``LearnedWeightDecay`` and ``LearnedDataWeights`` in
            one Trainer on the corrupted data.

Judged on a held-out test set nothing was chosen on: the recipe's own loss (MSE, cross entropy,
mean binary cross entropy) and accuracy (per-label accuracy for the multi-label set; the
regression: none). The data-weight arms also record the corrupted rows' mean weight against the
clean ones' and the weights' AUC. The harness (20 Newsgroups loader, label noise, AUC, Trainer,
the command line) is ``recipe_harness.py``.

Usage (from the repository root; ``--data``: the folder holding ``mnist/``, ``fashion-mnist/``
and ``20news/``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s53.py --data ../shared/data \
        --recipes all --seeds 0 1 2 --out benchmarks/results/user_recipes/s53/records.json

Each run merges its records into ``--out``; ``--table`` prints the table.
"""

from __future__ import annotations

import math
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_harness import (  # noqa: E402, F401  (split, diabetes, shift_targets: re-exported)
    Docs,
    RecipeModule,
    corrupt,
    decay_record,
    diabetes,
    images,
    news,
    noisy_labels,
    package_warnings,
    paired,
    recipe_cli,
    recipe_loader,
    shift_targets,
    split,
    timed_fit,
    trainer,
    weights_record,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402

ARMS = ("own", "decay", "plain", "dw", "both")
#: run on request: the data weights with every default where the recipe gives them settings
EXTRA_ARMS = ("dw_default", "dw_mean_loss")
MAX_TOKENS = 128

# ----------------------------------------------------------------------------- data


#: five attributes of a digit: even, ≥ 5, prime, has a closed loop, drawn with straight strokes
ATTRS = torch.tensor(
    [
        [1, 0, 0, 1, 0], [0, 0, 0, 0, 1], [1, 0, 1, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 1, 1],
        [0, 1, 1, 0, 0], [1, 1, 0, 1, 0], [0, 1, 1, 0, 1], [1, 1, 0, 1, 0], [0, 1, 0, 1, 0],
    ],
    dtype=torch.float32,
)  # fmt: skip


def digits(seed: int, n_train: int = 900, n_val: int = 300):
    """scikit-learn's digits (1797 × 64 pixels in 0..16, scaled to [0, 1]); labels 0..9."""
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target, dtype=torch.long)
    tr, va, te = split(len(x), seed, n_train, n_val)
    return (x[tr], y[tr]), (x[va], y[va]), (x[te], y[te])


def conv_collate(samples):
    """``(tokens (B, L), labels)``, each document's first ``MAX_TOKENS`` words, padded with 0 to
    at least the convolution's width."""
    seqs = [s[:MAX_TOKENS] for s, _ in samples]
    out = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    if out.shape[1] < 5:
        out = F.pad(out, (0, 5 - out.shape[1]))
    return out, torch.stack([y for _, y in samples])


# ----------------------------------------------------------------------------- recipes


class Recipe(RecipeModule):
    """The harness's recipe module with a test step logging the recipe's loss."""

    def test_step(self, batch, batch_idx):
        *x, y = batch
        self.log("test_loss", self.per_sample_loss(self(*x), y).mean())


class DiabetesMLP(Recipe):
    """Regression: an MLP on the ten diabetes features, MSE, Adam."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def per_sample_loss(self, out, y):
        return F.mse_loss(out, y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class MultiLabel(Recipe):
    """Multi-label: five attributes of a digit from its 8×8 pixels, ``BCEWithLogitsLoss`` per
    sample and label (B, 5), an MLP with dropout, Adam."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.criterion = nn.BCEWithLogitsLoss(reduction="none")
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 5))

    def forward(self, x):
        return self.net(x)

    def per_sample_loss(self, out, y):
        return self.criterion(out, y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class NewsConv(Recipe):
    """20 Newsgroups: word embeddings (dense ``nn.Embedding``, padding 0), a 1-D convolution of
    width 5, global max pooling, dropout, a linear head; AdamW with its own decay."""

    def __init__(self, wd=0.01, per_sample=False):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(8000, 64, padding_idx=0)
        self.conv = nn.Conv1d(64, 96, 5, padding=2)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(96, 4)

    def forward(self, tokens):
        h = F.relu(self.conv(self.emb(tokens).transpose(1, 2)))
        h = h.masked_fill((tokens == 0).unsqueeze(1), 0.0).amax(-1)  # ReLU ≥ 0: pads lose
        return self.head(self.drop(h))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=self.wd)


class OneCycleCNN(Recipe):
    """Fashion-MNIST CNN, SGD momentum, ``OneCycleLR`` stepped per optimizer step over
    ``trainer.estimated_stepping_batches``; the Trainer clips gradients and accumulates 2."""

    def __init__(self, wd=5e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
        total = int(self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ResBlock(nn.Module):
    """Pre-norm residual block: x + Dropout(W2 GELU(W1 LayerNorm(x)))."""

    def __init__(self, d: int, p: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(p), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class ResLNMLP(Recipe):
    """Fashion-MNIST residual MLP: three pre-norm LayerNorm blocks with dropout, AdamW with its
    own decay 0.05, linear warm-up then cosine per step; trained in ``bf16-mixed`` on CPU."""

    def __init__(self, wd=0.05, per_sample=False, steps=200):
        super().__init__(wd, per_sample)
        self.steps = steps
        self.inp = nn.Linear(784, 128)
        self.blocks = nn.Sequential(*[ResBlock(128, 0.1) for _ in range(3)])
        self.out = nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 10))

    def forward(self, x):
        return self.out(self.blocks(self.inp(x.flatten(1))))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=self.wd)
        warm = max(1, self.steps // 10)

        def scale(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (self.steps - warm))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, scale)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class MnistCNN(Recipe):
    """MNIST CNN for both callbacks together: Adam, own decay 1e-4."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 5, stride=2), nn.ReLU(),
            nn.Conv2d(16, 32, 5, stride=2), nn.ReLU(), nn.Flatten(),
            nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-3, weight_decay=self.wd)


class DigitsMLP(Recipe):
    """Digits (10 classes) MLP with BatchNorm and dropout, SGD momentum, logged accuracy; fed by a
    ``LightningDataModule``, with ``ModelCheckpoint`` and ``EarlyStopping`` on ``val_loss``."""

    def __init__(self, wd=5e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10)
        )

    def forward(self, x):
        return self.net(x)

    def test_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.log("test_loss", F.cross_entropy(out, y))
        self.log("test_acc", (out.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class DigitsData(pl.LightningDataModule):
    """The user's DataModule: digits split in ``setup``; the training set wrapped in
    ``IndexedDataset`` when the data weights are on."""

    def __init__(self, train, val, test, indexed: bool) -> None:
        super().__init__()
        self.train_set, self.val_set, self.test_set, self.indexed = train, val, test, indexed

    def train_dataloader(self):
        data = IndexedDataset(self.train_set) if self.indexed else self.train_set
        return DataLoader(data, batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=256)


RECIPES = (
    "diabetes_mse",
    "digits_multilabel",
    "news_conv",
    "onecycle_accum_clip",
    "resln_adamw_bf16",
    "both_callbacks",
    "datamodule_ckpt",
)

# ----------------------------------------------------------------------------- one fit


class Setup:
    """A recipe's data and how to build and fit it, per arm."""

    def __init__(self, name: str, data: Path, seed: int) -> None:
        self.name, self.seed = name, seed
        self.collate: Callable | None = None
        self.trainer_kw: dict[str, Any] = {}
        self.decoupled, self.epochs, self.batch, self.classes = False, 6, 64, 10
        self.arms = ("own", "decay", "plain", "dw")
        self.kind = "ce"
        self.dw_kw: dict[str, Any] = {}
        if name == "diabetes_mse":
            tr, va, te = diabetes(seed)
            self.own, self.epochs, self.batch, self.kind = 1e-4, 60, 32, "mse"
            self.dw_kw = {"objective": "mean_loss"}
            self.make = DiabetesMLP
        elif name in ("digits_multilabel", "datamodule_ckpt"):
            tr, va, te = digits(seed)
            if name == "digits_multilabel":
                self.own, self.epochs, self.batch, self.kind = 1e-4, 25, 32, "bce"
                tr, va, te = ((x, ATTRS[y]) for x, y in (tr, va, te))
                self.make = MultiLabel
            else:
                self.own, self.epochs, self.batch = 5e-4, 40, 32
                self.make = DigitsMLP
        elif name == "news_conv":
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), Docs(*te)
            self.own, self.decoupled, self.classes, self.batch = 0.01, True, 4, 32
            self.collate, self.make = conv_collate, NewsConv
            return
        else:
            which = "mnist" if name == "both_callbacks" else "fashion-mnist"
            tr, va, te = images(data, which, seed, 2000, 300, 2000)
            if name == "onecycle_accum_clip":
                self.own, self.batch, self.make = 5e-4, 32, OneCycleCNN
                self.trainer_kw = {"gradient_clip_val": 1.0, "accumulate_grad_batches": 2}
            elif name == "resln_adamw_bf16":
                self.own, self.decoupled = 0.05, True
                steps = self.epochs * ((2000 + 63) // 64)
                self.make = lambda wd, ps: ResLNMLP(wd, ps, steps)
                self.trainer_kw = {"precision": "bf16-mixed"}
            elif name == "both_callbacks":
                self.own, self.make = 1e-4, MnistCNN
                self.arms = ("own", "decay", "plain", "dw", "both")
            else:
                raise SystemExit(f"unknown recipe {name!r}")
        self.train, self.val, self.test = (TensorDataset(*s) for s in (tr, va, te))

    def noisy_train(self):
        if self.kind == "ce":
            return noisy_labels(self.train, self.classes, self.seed)
        x, y = self.train.tensors
        if self.kind == "mse":
            y2, bad = shift_targets(y, self.seed)
        elif self.kind == "bce":  # another digit's attributes (a digit of different attributes)
            g = torch.Generator().manual_seed(7 + self.seed)
            bad = torch.rand(len(y), generator=g) < 0.3
            other = ATTRS[torch.randint(0, 10, (len(y),), generator=g)]
            bad &= (other != y).any(1)
            y2 = torch.where(bad[:, None], other, y)
        return TensorDataset(x, y2), bad

    def metrics(self, model: nn.Module, data) -> tuple[float, float | None]:
        """The recipe's loss and accuracy on ``data`` (eval mode, float32)."""
        kw = {"collate_fn": self.collate} if self.collate else {}
        model.eval()
        total, hit, n = 0.0, 0.0, 0
        with torch.no_grad():
            for *x, y in DataLoader(data, batch_size=500, **kw):
                out = model.float()(*x).float()
                total += float(model.per_sample_loss(out, y).reshape(len(y), -1).mean(1).sum())
                if self.kind == "ce":
                    hit += float((out.argmax(1) == y).sum())
                elif self.kind == "bce":
                    hit += float(((out > 0).float() == y).float().mean(1).sum())
                n += len(y)
        return total / n, (None if self.kind == "mse" else hit / n)

    def run(self, arm: str) -> dict[str, Any]:
        noisy = arm in ("plain", "dw", "both", *EXTRA_ARMS)
        per_sample = arm in ("dw", "both", *EXTRA_ARMS)
        train, bad = self.noisy_train() if noisy else (self.train, None)
        wd = 0.0 if arm in ("decay", "both") else self.own
        cbs: list = []
        if arm in ("decay", "both"):
            cbs.append(LearnedWeightDecay(self.own, decoupled=self.decoupled))
        if arm in ("dw", "both"):
            cbs.append(LearnedDataWeights(**self.dw_kw))
        if arm == "dw_default":
            cbs.append(LearnedDataWeights())
        if arm == "dw_mean_loss":
            cbs.append(LearnedDataWeights(objective="mean_loss"))
        torch.manual_seed(self.seed)
        model = self.make(wd, per_sample)
        extra: list = []
        ckpt_dir = None
        if self.name == "datamodule_ckpt":
            ckpt_dir = tempfile.mkdtemp()
            extra = [
                ModelCheckpoint(dirpath=ckpt_dir, monitor="val_loss", save_top_k=1),
                EarlyStopping("val_loss", patience=8),
            ]
        tr = trainer(cbs + extra, self.epochs, **self.trainer_kw)
        record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}

        def fit() -> nn.Module:
            if self.name != "datamodule_ckpt":
                val = recipe_loader(self.val, self.collate, self.batch, False, False)
                train_loader = recipe_loader(train, self.collate, self.batch, per_sample, True)
                tr.fit(model, train_loader, val)
                return model
            dm = DigitsData(train, self.val, self.test, per_sample)
            tr.fit(model, datamodule=dm)
            record["validate_best"] = tr.validate(datamodule=dm, ckpt_path="best", verbose=False)[0]
            record["test_best"] = tr.test(datamodule=dm, ckpt_path="best", verbose=False)[0]
            return DigitsMLP.load_from_checkpoint(extra[0].best_model_path)

        model = timed_fit(record, fit)
        if "error" in record:
            return record
        record["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        record["test_loss"], record["test_acc"] = self.metrics(model, self.test)
        record["val_loss"], _ = self.metrics(model, self.val)
        record["epochs_run"] = tr.current_epoch
        for cb in cbs:
            record.setdefault("hyper_steps", {})[type(cb).__name__] = len(
                getattr(cb, "history", []) or []
            )
            if isinstance(cb, LearnedWeightDecay):
                record.update(decay_record(cb))
            else:
                b = bad.numpy()
                record.update(weights_record(cb.data_weights().detach().float().numpy(), b))
                with warnings.catch_warnings(record=True) as said:
                    warnings.simplefilter("always")
                    try:
                        flags = cb.flagged().cpu().numpy()
                    except Exception as err:  # noqa: BLE001 - a finding, recorded
                        record["flagged_error"] = f"{type(err).__name__}: {err}"[:600]
                        flags = None
                record["flagged_warnings"] = package_warnings(said, 400)
                if flags is not None:
                    hit = int(b[flags].sum()) if len(flags) else 0
                    record.update(
                        flagged=len(flags),
                        flag_precision=hit / len(flags) if len(flags) else None,
                        flag_recall=hit / max(1, int(b.sum())),
                    )
        return record


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe and arm, test loss (accuracy) by seed, and the paired difference of
    each drop-in arm against its comparison arm (mean ± s.e., seeds worse)."""
    by = {(r["recipe"], r["arm"], r["seed"]): r for r in records}
    lines = [
        "| recipe | arm | test loss (acc) by seed | − comparison (mean ± s.e., worse) "
        "| λ range / ω̄ bad, good, AUC |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in RECIPES:
        for arm in ARMS + EXTRA_ARMS:
            rows = sorted((k[2], r) for k, r in by.items() if k[:2] == (name, arm))
            if not rows:
                continue
            cells = []
            for s, r in rows:
                if "error" in r:
                    cells.append(f"{s}: error")
                else:
                    acc = "" if r["test_acc"] is None else f" ({r['test_acc']:.3f})"
                    cells.append(f"{s}: {r['test_loss']:.4f}{acc}")
            ref = {
                "decay": "own",
                "dw": "plain",
                "both": "plain",
                "dw_default": "plain",
                "dw_mean_loss": "plain",
            }.get(arm)
            diff = "–"
            if ref:
                d = [
                    r["test_loss"] - by[(name, ref, s)]["test_loss"]
                    for s, r in rows
                    if "test_loss" in r and "test_loss" in by.get((name, ref, s), {})
                ]
                diff = paired(d) if d else diff
            extra = "; ".join(
                f"{r['lam_range'][0]:.1e}–{r['lam_range'][1]:.1e}"
                if "lam_range" in r and arm == "decay"
                else f"{r['w_bad']:.2f}/{r['w_good']:.2f}, {r['auc']:.2f}"
                if "auc" in r
                else ""
                for _, r in rows
            )
            lines.append(f"| {name} | {arm} | {' / '.join(cells)} | {diff} | {extra} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    out = Path("benchmarks/results/user_recipes/s53/records.json")
    recipe_cli(argv, sys.modules[__name__], out, seeds=(0, 1, 2))


if __name__ == "__main__":
    main()
