"""Session 50's unseen recipes: both drop-ins on training recipes no one here wrote before.

Each recipe is a ``LightningModule`` written as a user would, on small subsets of real data
(MNIST, Fashion-MNIST, 20 Newsgroups), trained five ways per seed:

* ``none``   the recipe without weight decay, clean labels;
* ``own``    the recipe with its own fixed ``weight_decay`` in the optimizer, clean labels;
* ``decay``  ``LearnedWeightDecay(<own value>)`` with every default (``decoupled=True`` where the
             recipe's optimizer is AdamW, as README.md says; ``training_loss=`` under manual
             optimisation, as its error asks), the optimizer's decay removed;
* ``plain``  the recipe (its own decay) on training labels of which 35 % were moved to another
             class (the regression: 35 % of the targets shifted by 10–20), a clean validation set;
* ``dw``     the same noisy data with ``LearnedDataWeights()`` (every default; the regression
             ``objective="mean_loss"`` as README.md says), ``reduction="none"``,
             ``IndexedDataset`` (and ``indexed_collate`` for a ``collate_fn`` of the recipe's).

Judged on a held-out test set nothing was chosen on (its mean cross entropy, or MSE for the
regression); for ``dw`` also the corrupted examples' mean weight against the clean ones', the
AUC of the weights and ``flagged()``'s precision / recall.

Usage (from the repository root; ``--data``: the folder holding ``mnist/``, ``fashion-mnist/``
and ``20news/``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s50.py --data ../shared/data \
        --recipes all --seeds 0 1 --out benchmarks/results/user_recipes/s50.json

Each ``--recipes`` run merges its records into ``--out``.
"""

from __future__ import annotations

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
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_harness import (  # noqa: E402, F401  (re-exported: later scripts import them here)
    NEWS_GROUPS,
    NOISE,
    Docs,
    RecipeModule,
    _idx,
    auc,
    corrupt,
    decay_record,
    images,
    news,
    noisy_labels,
    package_warnings,
    recipe_cli,
    recipe_loader,
    test_loss,
    timed_fit,
    trainer,
    weights_record,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402

ARMS = ("none", "own", "decay", "plain", "dw")
#: settings given to every data-weights arm (--dw-kwargs, JSON)
DW_KWARGS: dict[str, Any] = {}
#: arms run on request only: the data weights with objective="mean_loss"
EXTRA_ARMS = ("dw_mean_loss",)

# ----------------------------------------------------------------------------- data


def bag_collate(samples):
    """EmbeddingBag's flat input: the tokens end to end, each document's offset, the labels."""
    seqs = [s for s, _ in samples]
    offsets = torch.tensor([0] + [len(s) for s in seqs[:-1]]).cumsum(0)
    return torch.cat(seqs), offsets, torch.stack([y for _, y in samples])


# ----------------------------------------------------------------------------- recipes


class Base(RecipeModule):
    """The harness's recipe module, its per-sample loss named ``criterion``."""

    def criterion(self, out, y):
        return F.cross_entropy(out, y, reduction="none")

    def per_sample_loss(self, out, y):
        return self.criterion(out, y)


class NewsBag(Base):
    """20 Newsgroups: a mean bag of word embeddings over flat tokens + offsets, a linear head,
    Adam. ``nn.EmbeddingBag(tokens, offsets)`` is what a user writes first; the drop-ins refuse
    it (torch has no second derivative for it), so the bag is the refusal's named fix: an
    ``nn.Embedding`` whose rows are summed per document by ``index_add`` (the same function)."""

    def __init__(self, wd=1e-5, per_sample=False):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(8000, 64)
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))

    def forward(self, tokens, offsets):
        sizes = torch.diff(offsets, append=torch.tensor([len(tokens)]))
        doc = torch.repeat_interleave(torch.arange(len(offsets)), sizes)
        bag = torch.zeros(len(offsets), self.emb.embedding_dim).index_add(0, doc, self.emb(tokens))
        return self.head(bag / sizes.clamp(min=1).unsqueeze(1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=5e-3, weight_decay=self.wd)


class RowsLSTM(Base):
    """MNIST rows read by an LSTM; Adam + OneCycleLR per step, label smoothing, clipping."""

    def __init__(self, wd=1e-4, per_sample=False, steps=200):
        super().__init__(wd, per_sample)
        self.lstm = nn.LSTM(28, 48, batch_first=True)
        self.head = nn.Linear(48, 10)
        self.steps = steps

    def forward(self, x):
        out, _ = self.lstm(x.squeeze(1))
        return self.head(out[:, -1])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.reduce(F.cross_entropy(self(x), y, reduction="none", label_smoothing=0.1))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class CkptCNN(Base):
    """Fashion-MNIST CNN, SGD momentum; torchmetrics Accuracy; the best checkpoint is tested."""

    def __init__(self, wd=5e-4, per_sample=False):
        super().__init__(wd, per_sample)
        import torchmetrics

        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
        )  # fmt: skip
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def forward(self, x):
        return self.net(x)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.val_acc(out, y)
        self.log("val_loss", F.cross_entropy(out, y), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class ManualMLP(Base):
    """MNIST MLP with manual optimisation: one SGD optimizer, a StepLR stepped by hand."""

    def __init__(self, wd=5e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("train_loss", loss)

    def on_train_epoch_end(self):
        self.lr_schedulers().step()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)]


class Distill(Base):
    """A small MLP student distilled from a frozen CNN teacher: per-sample CE + T² KL."""

    def __init__(self, teacher: nn.Module, wd=1e-4, per_sample=False, alpha=0.5, temp=3.0):
        super().__init__(wd, per_sample)
        self.teacher = teacher.eval().requires_grad_(False)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
        self.alpha, self.temp = alpha, temp

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        with torch.no_grad():
            soft = F.log_softmax(self.teacher(x) / self.temp, dim=1)
        kl = F.kl_div(F.log_softmax(out / self.temp, 1), soft, log_target=True, reduction="none")
        loss = self.alpha * F.cross_entropy(out, y, reduction="none") + (
            1 - self.alpha
        ) * self.temp**2 * kl.sum(1)
        return self.reduce(loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=2e-3, weight_decay=self.wd)


class ImbalancedData(pl.LightningDataModule):
    """MNIST with digits 5–9 at a tenth, a WeightedRandomSampler balancing the classes."""

    def __init__(self, train, val, indexed: bool):
        super().__init__()
        self.train, self.val, self.indexed = train, val, indexed

    def train_dataloader(self):
        x, y = self.train
        counts = torch.bincount(y, minlength=10).float()
        weights = (1.0 / counts)[y]
        data = TensorDataset(x, y)
        data = IndexedDataset(data) if self.indexed else data
        sampler = WeightedRandomSampler(weights, num_samples=len(y), replacement=True)
        return DataLoader(data, batch_size=64, sampler=sampler)

    def val_dataloader(self):
        return DataLoader(TensorDataset(*self.val), batch_size=256)


class SmallCNN(Base):
    """MNIST CNN (the imbalanced recipe's model), Adam."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 5, stride=2), nn.ReLU(),
            nn.Conv2d(8, 16, 5, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-3, weight_decay=self.wd)


class DigitRegressor(Base):
    """MNIST digit value as a number (MSE), an MLP, SGD momentum."""

    def __init__(self, wd=1e-4, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x):
        return self.net(x).squeeze(1)

    def criterion(self, out, y):
        return F.mse_loss(out, y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9, weight_decay=self.wd)


class GroupsAdamW(Base):
    """Fashion-MNIST MLP with LayerNorm; AdamW with decay on matrices only (two param groups),
    linear warm-up of the learning rate in an overridden ``optimizer_step``."""

    def __init__(self, wd=0.05, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 128), nn.LayerNorm(128), nn.GELU(),
            nn.Linear(128, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        scale = min(1.0, (self.trainer.global_step + 1) / 30)
        for group in optimizer.param_groups:
            group["lr"] = scale * 2e-3
        optimizer.step(closure=optimizer_closure)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.ndim >= 2]
        rest = [p for p in self.parameters() if p.ndim < 2]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.wd}, {"params": rest, "weight_decay": 0.0}],
            lr=2e-3,
        )


# ----------------------------------------------------------------------------- one fit


class Setup:
    """A recipe's data and how to build and fit it, per arm."""

    #: the arms every recipe runs
    arms = ARMS

    def __init__(self, name: str, data: Path, seed: int) -> None:
        self.name, self.seed = name, seed
        self.regression = name == "digit_mse"
        self.collate: Callable | None = None
        self.trainer_kw: dict[str, Any] = {}
        self.extra_callbacks: Callable[[], list] = list
        self.decoupled = False
        self.datamodule = False
        self.epochs = 6
        self.decay_kw: dict[str, Any] = {}
        if name == "news_bag":
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), Docs(*te)
            self.classes, self.collate, self.own = 4, bag_collate, 1e-5
            self.make = lambda wd, ps: NewsBag(wd, ps)
            self.epochs = 8
        else:
            which = "fashion-mnist" if name in ("ckpt_cnn", "groups_adamw") else "mnist"
            tr, va, te = images(
                data, which, seed, 6000 if name == "imbalanced" else 2000, 300, 2000
            )
            if name == "imbalanced":
                keep = (tr[1] < 5) | (torch.arange(len(tr[1])) % 10 == 0)
                tr = (tr[0][keep], tr[1][keep])
            if self.regression:
                tr, va, te = ((x, y.float()) for x, y in (tr, va, te))
            self.train, self.val, self.test = (TensorDataset(*s) for s in (tr, va, te))
            self.classes = 10
            if name == "rows_lstm":
                self.own, self.epochs = 1e-4, 5
                steps = self.epochs * ((len(self.train) + 63) // 64)
                self.make = lambda wd, ps: RowsLSTM(wd, ps, steps)
                self.trainer_kw = {"gradient_clip_val": 1.0}
            elif name == "ckpt_cnn":
                self.own, self.epochs = 5e-4, 8
                self.make = lambda wd, ps: CkptCNN(wd, ps)
                self.trainer_kw = {"val_check_interval": 0.5}
            elif name == "manual_sgd":
                self.own = 5e-4
                # what the drop-in's error asks for under manual optimisation
                self.decay_kw = {"training_loss": lambda m, b: F.cross_entropy(m(b[0]), b[1])}
                self.make = lambda wd, ps: ManualMLP(wd, ps)
            elif name == "distill":
                self.own = 1e-4
                teacher = self.fit_teacher(data)
                self.make = lambda wd, ps: Distill(teacher, wd, ps)
            elif name == "imbalanced":
                self.own, self.datamodule = 1e-4, True
                self.make = lambda wd, ps: SmallCNN(wd, ps)
            elif name == "digit_mse":
                self.own = 1e-4
                self.make = lambda wd, ps: DigitRegressor(wd, ps)
            elif name == "groups_adamw":
                self.own, self.decoupled = 0.05, True
                self.make = lambda wd, ps: GroupsAdamW(wd, ps)
            else:
                raise SystemExit(f"unknown recipe {name!r}")

    def fit_teacher(self, data: Path) -> nn.Module:
        """A CNN trained beforehand on 3000 other clean images (not the students' sets)."""
        tr, _, _ = images(data, "mnist", 100 + self.seed, 3000, 0, 1)
        torch.manual_seed(100 + self.seed)
        teacher = SmallCNN(0.0)
        trainer(None, 4).fit(teacher, DataLoader(TensorDataset(*tr), batch_size=64, shuffle=True))
        return teacher.eval()

    def noisy_train(self):
        if self.regression:
            x, y = self.train.tensors
            g = torch.Generator().manual_seed(7 + self.seed)
            bad = torch.rand(len(y), generator=g) < NOISE
            shift = (10 + 10 * torch.rand(len(y), generator=g)) * torch.sign(
                torch.rand(len(y), generator=g) - 0.5
            )
            return TensorDataset(x, torch.where(bad, y + shift, y)), bad
        return noisy_labels(self.train, self.classes, self.seed)

    def loader(self, data, indexed: bool, shuffle: bool) -> DataLoader:
        return recipe_loader(data, self.collate, 64, indexed, shuffle)

    def run(self, arm: str) -> dict[str, Any]:
        noisy = arm in ("plain", "dw", "dw_mean_loss")
        train, bad = self.noisy_train() if noisy else (self.train, None)
        wd = 0.0 if arm in ("none", "decay") else self.own
        if (arm == "dw" and self.regression) or arm == "dw_mean_loss":
            cb = LearnedDataWeights(objective="mean_loss", **DW_KWARGS)
        elif arm == "dw":
            cb = LearnedDataWeights(**DW_KWARGS)
        elif arm == "decay":
            cb = LearnedWeightDecay(self.own, decoupled=self.decoupled, **self.decay_kw)
        else:
            cb = None
        torch.manual_seed(self.seed)
        model = self.make(wd, arm.startswith("dw"))
        callbacks = [cb] if cb is not None else []
        ckpt = None
        if self.name == "ckpt_cnn":
            ckpt = ModelCheckpoint(monitor="val_loss", dirpath=tempfile.mkdtemp(prefix="s50ckpt"))
            callbacks += [EarlyStopping(monitor="val_loss", patience=3), ckpt]
        tr = trainer(callbacks, self.epochs, **self.trainer_kw)
        val = self.loader(self.val, False, False)
        record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}

        def fit() -> None:
            if self.datamodule:
                dm = ImbalancedData(
                    train.tensors if hasattr(train, "tensors") else train,
                    self.val.tensors,
                    arm.startswith("dw"),
                )
                tr.fit(model, datamodule=dm)
            else:
                tr.fit(model, self.loader(train, arm.startswith("dw"), True), val)

        timed_fit(record, fit, width=300)
        if "error" in record:
            return record
        if ckpt is not None and ckpt.best_model_path:
            state = torch.load(ckpt.best_model_path, weights_only=False)["state_dict"]
            model.load_state_dict(state)
            record["best_epoch_ckpt"] = Path(ckpt.best_model_path).name
        test_kw = {"collate_fn": self.collate} if self.collate else {}
        loss, acc = test_loss(
            model, DataLoader(self.test, batch_size=500, **test_kw), self.regression
        )
        val_loss, _ = test_loss(model, val, self.regression)  # the clean set the user holds
        record.update(test_loss=loss, test_acc=acc, val_loss=val_loss, epochs_run=tr.current_epoch)
        if arm == "decay":
            record.update(decay_record(cb))
        if arm.startswith("dw"):
            badn = bad.numpy()
            record.update(weights_record(cb.data_weights().detach().numpy(), badn))
            with warnings.catch_warnings(record=True) as fw:
                warnings.simplefilter("always")
                flagged = cb.flagged().numpy()
            hit = badn[flagged].sum() if len(flagged) else 0
            record.update(
                flagged=int(len(flagged)),
                flag_precision=float(hit / max(len(flagged), 1)),
                flag_recall=float(hit / badn.sum()),
                flag_warnings=[str(x.message)[:200] for x in fw],
            )
        return record


RECIPES = (
    "news_bag",
    "rows_lstm",
    "ckpt_cnn",
    "manual_sgd",
    "distill",
    "imbalanced",
    "digit_mse",
    "groups_adamw",
)


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe, each arm's test loss by seed (an error: its first words)."""

    def cell(rec: dict[str, Any] | None) -> str:
        if rec is None:
            return "–"
        return "error" if "error" in rec else f"{rec['test_loss']:.4g}"

    by = {(r["recipe"], r["arm"], r["seed"]): r for r in records}
    seeds = sorted({r["seed"] for r in records})
    lines = [
        "| recipe | none | own decay | learned decay (λ range) | plain, noisy | data weights "
        "| corrupted ω̄ / clean ω̄, AUC | flagged: n, precision / recall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in RECIPES:
        if not any(k[0] == name for k in by):
            continue
        cols = ["/".join(cell(by.get((name, arm, s))) for s in seeds) for arm in ARMS]
        decay = [by.get((name, "decay", s)) for s in seeds]
        lam = [
            f"{d['lam_range'][0]:.1e}–{d['lam_range'][1]:.1e}"
            for d in decay
            if d and "lam_range" in d
        ]
        cols[2] += f" ({', '.join(lam)})" if lam else ""
        dws = [by.get((name, "dw", s)) for s in seeds]
        sep = "; ".join(
            f"{d['w_bad']:.2f}/{d['w_good']:.2f}, {d['auc']:.2f}" for d in dws if d and "auc" in d
        )
        flags = "; ".join(
            f"{d['flagged']}, {d['flag_precision']:.2f}/{d['flag_recall']:.2f}"
            for d in dws
            if d and "auc" in d
        )
        lines.append(f"| {name} | " + " | ".join(cols) + f" | {sep or '–'} | {flags or '–'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    recipe_cli(argv, sys.modules[__name__], Path("benchmarks/results/user_recipes/s50.json"))


if __name__ == "__main__":
    main()
