"""Session 51's unseen recipes: both drop-ins on eight more training recipes no one here wrote.

Each recipe is a ``LightningModule`` written as a user would from the Lightning / PyTorch
tutorials, on small subsets of real data (MNIST, Fashion-MNIST, 20 Newsgroups), trained four
ways per seed (the harness of ``recipe_harness.py``: data loaders, label noise, AUC, test loss,
the command line):

* ``own``    the recipe as written, with its own fixed ``weight_decay``, clean labels;
* ``decay``  ``LearnedWeightDecay(<own value>)`` with every default (``decoupled=True`` where the
             recipe's optimizer decays decoupled: AdamW, Adafactor), the optimizer's decay removed;
* ``plain``  the recipe on training labels of which 35 % were moved to another class, a clean
             validation set;
* ``dw``     the same noisy data with ``LearnedDataWeights()`` (every default),
             ``reduction="none"``, ``IndexedDataset`` (``indexed_collate`` around a ``collate_fn``
             of the recipe's);
* ``none``   (on request) the recipe without weight decay, clean labels;
* ``oracle`` (on request) the recipe on the noisy set without its corrupted rows (what perfect
             0/1 data weights would train on).

Judged on a held-out test set nothing was chosen on (mean cross entropy and accuracy); for
``dw`` also the corrupted examples' mean weight against the clean ones' and the AUC of the
weights. Wall and CPU seconds of each fit are recorded (a ratio to the plain fit under the
shared machine's load is an indication, not a cost).

Usage (from the repository root; ``--data``: the folder holding ``mnist/``, ``fashion-mnist/``
and ``20news/``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s51.py --data ../shared/data \
        --recipes all --seeds 0 1 --out benchmarks/results/user_recipes/s51.json

Each run merges its records into ``--out``; ``--table`` prints the table.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, Subset, TensorDataset, random_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_harness import (  # noqa: E402
    Docs,
    RecipeModule,
    decay_record,
    images,
    keep_rows,
    news,
    noisy_labels,
    recipe_cli,
    recipe_loader,
    test_loss,
    timed_fit,
    trainer,
    weights_record,
)

from hypertorch_sid import (  # noqa: E402
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)

ARMS = ("own", "decay", "plain", "dw")
EXTRA_ARMS = ("none", "oracle")
DW_KWARGS: dict[str, Any] = {}
MAX_TOKENS = 64
#: the class token the Transformer recipe prepends (one past the vocabulary)
CLS = 8000

# ----------------------------------------------------------------------------- collate


def pad_collate(samples):
    """A class token, then the document, padded with 0 to the batch's longest:
    ``(tokens (B, L), labels)``. (Without the class token a document of no known word is all
    padding, and the encoder's attention over it is NaN.)"""
    seqs = [torch.cat([torch.tensor([CLS]), s[: MAX_TOKENS - 1]]) for s, _ in samples]
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True), torch.stack([y for _, y in samples])


def pad_lengths_collate(samples):
    """``(tokens (B, L), lengths, labels)`` for a packed RNN."""
    seqs = [s[:MAX_TOKENS] for s, _ in samples]
    lengths = torch.tensor([len(s) for s in seqs])
    padded = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    return padded, lengths, torch.stack([y for _, y in samples])


# ----------------------------------------------------------------------------- recipes


# the harness's module, not session 50's Base: its criterion() method would shadow a recipe's
# criterion submodule (CutMix's label-smoothed loss, registered as self.criterion)
Recipe = RecipeModule


def warmup_cosine(opt, warmup: int, total: int):
    """Linear warm-up then cosine to 0, per step (the Hugging Face / Lightning tutorial form)."""

    def scale(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(opt, scale)


class NewsTransformer(Recipe):
    """20 Newsgroups: token + learned position embeddings, a 2-layer ``nn.TransformerEncoder``
    with the padding mask, masked mean pooling, AdamW + warm-up / cosine per step."""

    def __init__(self, wd=0.01, per_sample=False, steps=200):
        super().__init__(wd, per_sample)
        self.steps = steps
        self.emb = nn.Embedding(8001, 64, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, MAX_TOKENS, 64))
        layer = nn.TransformerEncoderLayer(
            64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 4)

    def forward(self, tokens):
        pad = tokens == 0
        h = self.emb(tokens) + self.pos[:, : tokens.shape[1]]
        h = self.encoder(h, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=self.wd)
        sched = warmup_cosine(opt, self.steps // 10, self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class NewsGRU(Recipe):
    """20 Newsgroups: a bidirectional GRU over packed sequences (lengths from the collate_fn),
    both final states to a linear head, Adam, ``gradient_clip_val``."""

    def __init__(self, wd=1e-5, per_sample=False):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(8000, 48, padding_idx=0)
        self.gru = nn.GRU(48, 48, batch_first=True, bidirectional=True)
        self.head = nn.Linear(96, 4)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(
            self.emb(tokens), lengths, batch_first=True, enforce_sorted=False
        )
        _, h = self.gru(packed)
        return self.head(torch.cat([h[0], h[1]], dim=1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class CutMixCNN(Recipe):
    """Fashion-MNIST CNN; CutMix in ``training_step``; the loss a module attribute
    ``nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")``; SGD momentum + cosine."""

    def __init__(self, wd=5e-4, per_sample=False, epochs=6):
        super().__init__(wd, per_sample)
        self.epochs = epochs
        self.criterion = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 7 * 7, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        lam = float(torch.distributions.Beta(1.0, 1.0).sample())
        perm = torch.randperm(len(x))
        side = int(28 * math.sqrt(1 - lam))
        cx, cy = torch.randint(0, 28 - side + 1, (2,)).tolist()
        x = x.clone()
        x[:, :, cy : cy + side, cx : cx + side] = x[perm, :, cy : cy + side, cx : cx + side]
        lam = 1 - side * side / 784
        out = self(x)
        loss = lam * self.criterion(out, y) + (1 - lam) * self.criterion(out, y[perm])
        return self.reduce(loss)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.epochs)]


class AccumNesterov(Recipe):
    """MNIST CNN with BatchNorm; SGD Nesterov; ``MultiStepLR`` stepped per optimizer step
    (``interval: "step"``); the Trainer accumulates 4 batches per step."""

    def __init__(self, wd=5e-4, per_sample=False, opt_steps=100):
        super().__init__(wd, per_sample)
        self.opt_steps = opt_steps
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        opt = torch.optim.SGD(
            self.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=self.wd
        )
        miles = [int(0.5 * self.opt_steps), int(0.75 * self.opt_steps)]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=miles, gamma=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class SmallDataMLP(Recipe):
    """200 MNIST training images: an MLP with dropout, Adam, many epochs (decay should matter)."""

    def __init__(self, wd=5e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class FocalLongTail(Recipe):
    """Long-tailed MNIST (class c kept at 0.02^(c/9)): focal loss (γ = 2) with class-balanced α
    (inverse frequency of the training labels, a buffer), Adam, small CNN."""

    def __init__(self, counts: torch.Tensor, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        alpha = counts.sum() / (len(counts) * counts.clamp(min=1))
        self.register_buffer("alpha", alpha / alpha.mean())
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 5, stride=2), nn.ReLU(),
            nn.Conv2d(8, 16, 5, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def focal(self, out, y):
        logp = F.log_softmax(out, 1).gather(1, y[:, None]).squeeze(1)
        return -self.alpha[y] * (1 - logp.exp()) ** 2 * logp

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.reduce(self.focal(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-3, weight_decay=self.wd)


def dw_block(cin: int, cout: int, stride: int) -> nn.Sequential:
    """MobileNet's depthwise-separable block: depthwise 3×3, pointwise 1×1, BN + SiLU each."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.SiLU(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.SiLU(),
    )  # fmt: skip


class MobileBF16(Recipe):
    """Fashion-MNIST MobileNet-like CNN (depthwise-separable blocks, BatchNorm, SiLU), Adam,
    ``precision="bf16-mixed"`` on CPU, data from a ``LightningDataModule`` using
    ``random_split``."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
            dw_block(16, 32, 1), dw_block(32, 64, 2), dw_block(64, 64, 1),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class SplitData(pl.LightningDataModule):
    """The user's DataModule: one pool, ``random_split`` into train / val in ``setup``; the
    training split wrapped in ``IndexedDataset`` for the data weights."""

    def __init__(self, x, y_train, y_clean, n_val: int, indexed: bool, seed: int) -> None:
        super().__init__()
        self.x, self.y_train, self.y_clean = x, y_train, y_clean
        self.n_val, self.indexed, self.seed = n_val, indexed, seed

    def setup(self, stage: str) -> None:
        n = len(self.x)
        g = torch.Generator().manual_seed(self.seed)
        tr, va = random_split(range(n), [n - self.n_val, self.n_val], generator=g)
        self.train_idx = torch.tensor(tr.indices)
        self.train = Subset(TensorDataset(self.x, self.y_train), tr.indices)
        self.val = Subset(TensorDataset(self.x, self.y_clean), va.indices)

    def train_dataloader(self):
        data = IndexedDataset(self.train) if self.indexed else self.train
        return DataLoader(data, batch_size=64, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=256)


class AdafactorMLP(Recipe):
    """Fashion-MNIST MLP with dropout, ``torch.optim.Adafactor`` (its decay is decoupled),
    ``CosineAnnealingWarmRestarts`` stepped per step with the fractional epoch."""

    def __init__(self, wd=1e-2, per_sample=False, steps_per_epoch=32):
        super().__init__(wd, per_sample)
        self.steps_per_epoch = steps_per_epoch
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        opt = torch.optim.Adafactor(self.parameters(), lr=1e-2, weight_decay=self.wd)
        sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
            opt, T_0=2 * self.steps_per_epoch
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


RECIPES = (
    "news_transformer",
    "news_gru",
    "cutmix_cnn",
    "accum_nesterov",
    "small_data",
    "focal_longtail",
    "mobile_bf16",
    "adafactor_mlp",
)

# ----------------------------------------------------------------------------- one fit


class Setup:
    """A recipe's data and how to build and fit it, per arm."""

    #: the arms every recipe runs
    arms = ARMS

    def __init__(self, name: str, data: Path, seed: int) -> None:
        self.name, self.seed = name, seed
        self.collate: Callable | None = None
        self.trainer_kw: dict[str, Any] = {}
        self.decoupled = False
        self.epochs = 6
        self.batch = 64
        self.classes = 10
        if name in ("news_transformer", "news_gru"):
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), Docs(*te)
            self.classes, self.batch = 4, 32
            steps = self.epochs * ((len(self.train) + 31) // 32)
            if name == "news_transformer":
                self.collate, self.own, self.decoupled = pad_collate, 0.01, True
                self.make = lambda wd, ps: NewsTransformer(wd, ps, steps)
            else:
                self.collate, self.own = pad_lengths_collate, 1e-5
                self.make = lambda wd, ps: NewsGRU(wd, ps)
                self.trainer_kw = {"gradient_clip_val": 1.0}
            return
        which = (
            "fashion-mnist" if name in ("cutmix_cnn", "mobile_bf16", "adafactor_mlp") else "mnist"
        )
        n_train = {"small_data": 200, "focal_longtail": 6000}.get(name, 2000)
        n_val = 100 if name == "small_data" else 300
        tr, va, te = images(data, which, seed, n_train, n_val, 2000)
        if name == "focal_longtail":
            keep_p = 0.02 ** (tr[1].float() / 9)
            g = torch.Generator().manual_seed(500 + seed)
            keep = torch.rand(len(tr[1]), generator=g) < keep_p
            tr = (tr[0][keep], tr[1][keep])
        self.train, self.val, self.test = (TensorDataset(*s) for s in (tr, va, te))
        if name == "cutmix_cnn":
            self.own = 5e-4
            self.make = lambda wd, ps: CutMixCNN(wd, ps, self.epochs)
        elif name == "accum_nesterov":
            self.own, self.batch = 5e-4, 32
            opt_steps = self.epochs * ((len(self.train) + 31) // 32) // 4
            self.make = lambda wd, ps: AccumNesterov(wd, ps, opt_steps)
            self.trainer_kw = {"accumulate_grad_batches": 4}
        elif name == "small_data":
            self.own, self.batch, self.epochs = 5e-4, 32, 30
            self.make = lambda wd, ps: SmallDataMLP(wd, ps)
        elif name == "focal_longtail":
            self.own = 1e-4
            self.make = lambda wd, ps: FocalLongTail(self.counts, wd, ps)
        elif name == "mobile_bf16":
            self.own = 1e-4
            self.make = lambda wd, ps: MobileBF16(wd, ps)
            self.trainer_kw = {"precision": "bf16-mixed"}
        elif name == "adafactor_mlp":
            self.own, self.decoupled = 1e-2, True
            spe = (len(self.train) + 63) // 64
            self.make = lambda wd, ps: AdafactorMLP(wd, ps, spe)
        else:
            raise SystemExit(f"unknown recipe {name!r}")

    def noisy_train(self):
        return noisy_labels(self.train, self.classes, self.seed)

    def loader(self, data, indexed: bool, shuffle: bool) -> DataLoader:
        return recipe_loader(data, self.collate, self.batch, indexed, shuffle)

    def run(self, arm: str) -> dict[str, Any]:
        noisy = arm in ("plain", "dw", "oracle")
        train, bad = self.noisy_train() if noisy else (self.train, None)
        if arm == "oracle":
            train = keep_rows(train, torch.nonzero(~bad).squeeze(1))
        # the focal loss's α: from the labels the user trains on
        self.counts = torch.bincount(train[:][1], minlength=self.classes).float()
        wd = 0.0 if arm in ("none", "decay") else self.own
        if arm == "dw":
            cb = LearnedDataWeights(**DW_KWARGS)
        elif arm == "decay":
            cb = LearnedWeightDecay(self.own, decoupled=self.decoupled)
        else:
            cb = None
        torch.manual_seed(self.seed)
        model = self.make(wd, arm == "dw")
        tr = trainer([cb] if cb is not None else [], self.epochs, **self.trainer_kw)
        val = self.loader(self.val, False, False)
        record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}
        dm = None
        if self.name == "mobile_bf16":
            x, y = train.tensors
            xv, yv = self.val.tensors
            y_clean = torch.cat([y if arm == "oracle" else self.train.tensors[1], yv])
            dm = SplitData(
                torch.cat([x, xv]), torch.cat([y, yv]), y_clean, len(yv), arm == "dw", self.seed
            )
            timed_fit(record, lambda: tr.fit(model, datamodule=dm))
        else:
            timed_fit(record, lambda: tr.fit(model, self.loader(train, arm == "dw", True), val))
        if "error" in record:
            return record
        test_kw = {"collate_fn": self.collate} if self.collate else {}
        loss, acc = test_loss(model, DataLoader(self.test, batch_size=500, **test_kw))
        val_loss, _ = test_loss(model, DataLoader(self.val, batch_size=500, **test_kw))
        record.update(test_loss=loss, test_acc=acc, val_loss=val_loss, epochs_run=tr.current_epoch)
        record["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        if arm == "decay":
            record.update(decay_record(cb))
        if cb is not None:
            record["hyper_steps"] = len(getattr(cb, "history", []) or [])
        if arm == "dw":
            w = cb.data_weights().detach().numpy()
            badn = bad.numpy()
            if dm is not None:  # the pool's (val rows clean), the training split's in order
                badn = np.concatenate([badn, np.zeros(len(self.val), bool)])[dm.train_idx.numpy()]
            record.update(weights_record(w, badn))
        return record


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe, each arm's test loss (accuracy) by seed."""
    by = {(r["recipe"], r["arm"], r["seed"]): r for r in records}
    seeds = sorted({r["seed"] for r in records})

    def cell(name: str, arm: str) -> str:
        out = []
        for s in seeds:
            r = by.get((name, arm, s))
            if r is None:
                continue
            out.append("error" if "error" in r else f"{r['test_loss']:.3f} ({r['test_acc']:.3f})")
        return " / ".join(out) or "–"

    lines = [
        "| recipe | none, clean | own decay, clean | learned decay (λ range) | plain, noisy "
        "| data weights, noisy | corrupted ω̄ / clean ω̄, AUC | noisy without its corrupted rows |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in RECIPES:
        if not any(k[0] == name for k in by):
            continue
        lam = [
            f"{r['lam_range'][0]:.0e}–{r['lam_range'][1]:.0e}"
            for s in seeds
            if (r := by.get((name, "decay", s))) and "lam_range" in r
        ]
        sep = "; ".join(
            f"{r['w_bad']:.2f}/{r['w_good']:.2f}, {r['auc']:.2f}"
            for s in seeds
            if (r := by.get((name, "dw", s))) and "auc" in r
        )
        lines.append(
            f"| {name} | {cell(name, 'none')} | {cell(name, 'own')} | {cell(name, 'decay')}"
            f"{' (' + ', '.join(lam) + ')' if lam else ''} | {cell(name, 'plain')} "
            f"| {cell(name, 'dw')} | {sep or '–'} | {cell(name, 'oracle')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    recipe_cli(argv, sys.modules[__name__], Path("benchmarks/results/user_recipes/s51.json"))


if __name__ == "__main__":
    main()
