"""Session 58's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning habits, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images; four groups of 20 Newsgroups: 1200 / 300 / 1000 documents),
trained per seed in four arms: ``own`` (the recipe with its own ``weight_decay``, clean labels)
against ``decay`` (``LearnedWeightDecay(<own>)``, the optimizer's decay removed, as README.md
says; ``decoupled=True`` under AdamW); ``plain`` (the recipe on 35 % wrong training labels, a
clean validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``). New here, habits no earlier round tried on real data:

* ``dict_plateau``  Fashion-MNIST MLP fed by a data set of dict samples
  (``{"image": x, "label": y}``, batches read as ``batch["image"]``), Adam, and
  ``configure_optimizers`` returning ``{"optimizer": ..., "lr_scheduler": {"scheduler":
  ReduceLROnPlateau, "monitor": "val_loss"}}`` (per epoch), own 1e-4;
* ``hf_news``  20 Newsgroups the Hugging Face way: dict samples ``{"input_ids", "labels"}``, a
  collate padding them into ``{"input_ids", "attention_mask", "labels"}``, a masked mean of
  word embeddings and an MLP head, label smoothing 0.1, AdamW (own 0.01),
  ``log_every_n_steps=1``;
* ``tuner_validate``  MNIST MLP, Adam with ``self.lr``, ``deterministic=True``: the user's
  ``trainer.validate`` before the fit (a baseline), ``Tuner(trainer).lr_find`` (it sets
  ``self.lr``), then ``trainer.fit`` in the same Trainer, own 1e-4;
* ``module_callbacks``  Fashion-MNIST CNN, SGD momentum, own 5e-4; the module declares its
  callbacks in ``configure_callbacks`` (``ModelCheckpoint(monitor="val_loss", save_top_k=3)``,
  ``EarlyStopping(patience=3)`` and, in the drop-in arms, the drop-in itself), then
  ``trainer.test(ckpt_path="best")``;
* ``prepare_dm``  MNIST MLP on a ``LightningDataModule`` whose ``prepare_data`` writes the
  subset to a cache file (as a download would) and ``setup`` reads it (the training set wrapped
  in ``IndexedDataset`` there), ``accumulate_grad_batches=2``, ``gradient_clip_val=0.5,
  gradient_clip_algorithm="value"``, ``limit_val_batches=0.5``, ``val_check_interval=0.5``,
  ``enable_checkpointing=False``, SGD momentum, own 5e-4;
* ``csv_logged``  Fashion-MNIST MLP with a ``CSVLogger``, ``log_every_n_steps=1``,
  ``LearningRateMonitor(logging_interval="step")``, ``max_steps=300`` with validation every 50
  steps (``val_check_interval=50, check_val_every_n_epoch=None``), SGD momentum + cosine per
  step over ``estimated_stepping_batches``, own 5e-4; the logged rows are read back.

Control (on request, ``--arms own_learned``): the user's own recipe at the λ the decay
learned (its mean over the layers, per seed, from ``--out``'s ``decay`` record).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s58.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s58/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.tuner import Tuner
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
from recipe_harness import (  # noqa: E402
    Docs,
    images,
    learned_lam,
    news,
    noisy_labels,
    package_logs,
    recipe_loader,
    tensors,
    timed_fit,
    trainer,
    versus_table,
)

from hypertorch_sid import (  # noqa: E402
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    indexed_collate,
)

RECIPES = (
    "dict_plateau", "hf_news", "tuner_validate", "module_callbacks", "prepare_dm", "csv_logged",
)  # fmt: skip
OUT = Path("benchmarks/results/user_recipes/s58/records.json")
#: the first words of a document the text recipe reads
MAX_TOKENS = 128

# ----------------------------------------------------------------------------- data


class DictImages(Dataset):
    """``{"image": x, "label": y}`` samples of an ``(x, y)`` data set."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"image": x, "label": y}


class DictDocs(Dataset):
    """A tokenised text data set the Hugging Face way: ``{"input_ids", "labels"}`` samples."""

    def __init__(self, docs: Docs) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, label = self.docs[i]
        return {"input_ids": ids[:MAX_TOKENS], "labels": label}


def pad_collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``DataCollatorWithPadding``'s output: padded ids, their attention mask, the labels."""
    ids = pad_sequence([s["input_ids"] for s in samples], batch_first=True)
    labels = torch.stack([torch.as_tensor(s["labels"]) for s in samples])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}


def padded(docs: Docs) -> TensorDataset:
    """The test documents as ``(ids, mask, labels)`` tensors (for the harness's test loss)."""
    batch = pad_collate([DictDocs(docs)[i] for i in range(len(docs))])
    return TensorDataset(batch["input_ids"], batch["attention_mask"], batch["labels"])


# ----------------------------------------------------------------------------- recipes


class DictPlateau(s57.MLP):
    """Dict batches; Adam with ReduceLROnPlateau on the logged ``val_loss`` (per epoch)."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample, lr=1e-3)
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["image"]), batch["label"], reduction="none")
        return self.reduce(loss)

    def validation_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["image"]), batch["label"])
        self.log("val_loss", loss, prog_bar=True)

    def on_train_epoch_end(self):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.wd)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.3, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}


class NewsHF(pl.LightningModule):
    """A masked mean of word embeddings, an MLP head; AdamW, label smoothing 0.1."""

    def __init__(self, wd, per_sample):
        super().__init__()
        self.wd, self.per_sample = wd, per_sample
        self.emb = nn.Embedding(8000, 64, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        return self.head((self.emb(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1))

    def loss(self, batch, reduction):
        out = self(batch["input_ids"], batch["attention_mask"])
        return F.cross_entropy(out, batch["labels"], label_smoothing=0.1, reduction=reduction)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch, "none")
        self.log("train_loss", loss.mean())
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch, "mean"), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=self.wd)


class TunedMLP(s57.MLP):
    """Adam with ``self.lr`` (the tuner's attribute)."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample, lr=1e-3)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.wd)


class SelfCallbacks(pl.LightningModule):
    """Fashion-MNIST CNN whose callbacks come from ``configure_callbacks``."""

    def __init__(self, wd, per_sample, extra: list, folder: str):
        super().__init__()
        self.wd, self.per_sample, self.extra, self.folder = wd, per_sample, extra, folder
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 49, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        self.log("train_loss", loss.mean())
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)

    def configure_callbacks(self):
        best = ModelCheckpoint(dirpath=self.folder, monitor="val_loss", save_top_k=3)
        return [best, EarlyStopping("val_loss", patience=3), *self.extra]


class CachedMNIST(pl.LightningDataModule):
    """``prepare_data`` writes the subset to a cache file, ``setup`` reads it."""

    def __init__(self, train, val, per_sample, folder: str):
        super().__init__()
        self.source, self.per_sample = (train, val), per_sample
        self.cache = Path(folder) / "mnist_subset.pt"
        self.calls: list[str] = []

    def prepare_data(self):
        self.calls.append("prepare_data")
        if not self.cache.exists():
            (tx, ty), (vx, vy) = (t.tensors for t in self.source)
            torch.save({"train": (tx, ty), "val": (vx, vy)}, self.cache)

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")
        cached = torch.load(self.cache)
        train = TensorDataset(*cached["train"])
        self.train_set = IndexedDataset(train) if self.per_sample else train
        self.val_set = TensorDataset(*cached["val"])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=64)


class CosineMLP(s57.MLP):
    """SGD momentum with a cosine schedule stepped per optimizer step."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=self.wd)
        steps = self.trainer.estimated_stepping_batches
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}


def csv_rows(folder: Path) -> dict[str, Any]:
    """What the CSVLogger wrote: rows with each column, and the steps of the training rows."""
    [path] = folder.rglob("metrics.csv")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    cols = {k for r in rows for k, v in r.items() if v != ""}
    train_steps = [int(r["step"]) for r in rows if r.get("train_loss")]
    return {
        "columns": sorted(cols),
        "rows_per_column": {c: sum(1 for r in rows if r.get(c)) for c in sorted(cols)},
        "train_rows": len(train_steps),
        "train_steps_repeated": len(train_steps) - len(set(train_steps)),
    }


# ----------------------------------------------------------------------------- one fit


class Setup(s57.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw", "own_learned")
        self.own = {"dict_plateau": 1e-4, "hf_news": 0.01, "tuner_validate": 1e-4}.get(name, 5e-4)
        self.classes = 4 if name == "hf_news" else 10
        if name == "hf_news":
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), padded(Docs(*te))
            return
        fashion = name in ("dict_plateau", "module_callbacks", "csv_logged")
        tr, va, te = images(data, "fashion-mnist" if fashion else "mnist", seed, 2000, 300, 2000)
        self.train, self.val, self.test = tensors(tr), tensors(va), tensors(te)

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name, folder = self.name, tempfile.mkdtemp(prefix=f"s58_{self.name}_")
        val = recipe_loader(self.val, None, 64, False, False)
        loader = recipe_loader(train, None, 64, per_sample, True)
        if name == "dict_plateau":
            model = DictPlateau(wd, per_sample)
            dl = DataLoader(DictImages(train), batch_size=64, shuffle=True)
            if per_sample:
                dl = DataLoader(IndexedDataset(DictImages(train)), batch_size=64, shuffle=True)
            self.tr = trainer(cbs, 8)
            self.tr.fit(model, dl, DataLoader(DictImages(self.val), batch_size=256))
            record["lrs"] = model.lrs
        elif name == "hf_news":
            model = NewsHF(wd, per_sample)
            data = IndexedDataset(DictDocs(train)) if per_sample else DictDocs(train)
            collate = indexed_collate(pad_collate) if per_sample else pad_collate
            dl = DataLoader(data, batch_size=32, shuffle=True, collate_fn=collate)
            val_dl = DataLoader(DictDocs(self.val), batch_size=256, collate_fn=pad_collate)
            self.tr = trainer(cbs, 6, log_every_n_steps=1)
            self.tr.fit(model, dl, val_dl)
        elif name == "tuner_validate":
            model = TunedMLP(wd, per_sample)
            self.tr = trainer(cbs, 5, deterministic=True)
            record["val_before"] = self.tr.validate(model, val, verbose=False)[0]["val_loss"]
            finder = Tuner(self.tr).lr_find(model, loader, val, num_training=40)
            record["lr_found"], record["lr_model"] = finder.suggestion(), model.lr
            record["after_lr_find"] = self.after(cbs)
            self.tr.fit(model, loader, val)
        elif name == "module_callbacks":
            model = SelfCallbacks(wd, per_sample, cbs, folder)
            self.tr = pl.Trainer(
                max_epochs=8, logger=False, enable_progress_bar=False,
                enable_model_summary=False, accelerator="cpu", default_root_dir=folder,
            )  # fmt: skip
            self.tr.fit(model, loader, val)
            test = recipe_loader(self.test, None, 64, False, False)
            got = self.tr.test(model, test, ckpt_path="best", verbose=False)
            best = self.tr.checkpoint_callback
            record["lightning_test"] = got[0]["test_loss"]
            record["best"] = Path(best.best_model_path).name
            record["stopped_epoch"] = self.tr.current_epoch
            record["after_test"] = self.after(cbs)
        elif name == "prepare_dm":
            dm = CachedMNIST(train, self.val, per_sample, folder)
            model = s57.MLP(wd, per_sample)
            self.tr = trainer(
                cbs, 6, accumulate_grad_batches=2, gradient_clip_val=0.5,
                gradient_clip_algorithm="value", limit_val_batches=0.5, val_check_interval=0.5,
            )  # fmt: skip
            self.tr.fit(model, datamodule=dm)
            record["dm_calls"] = dm.calls
        elif name == "csv_logged":
            model = CosineMLP(wd, per_sample)
            self.tr = pl.Trainer(
                max_steps=300, max_epochs=None, val_check_interval=50,
                check_val_every_n_epoch=None, log_every_n_steps=1, accelerator="cpu",
                logger=CSVLogger(folder, name="run"), enable_checkpointing=False,
                callbacks=[*cbs, LearningRateMonitor(logging_interval="step")],
                enable_progress_bar=False, enable_model_summary=False,
            )  # fmt: skip
            self.tr.fit(model, loader, val)
            record["csv"] = csv_rows(Path(folder))
        return model

    def run(self, arm: str) -> dict[str, Any]:
        with package_logs() as logs:
            noisy, per_sample = arm in ("plain", "dw"), arm == "dw"
            train, bad = (self.train, None)
            if noisy:
                train, bad = noisy_labels(self.train, self.classes, self.seed)
            wd = {"decay": 0.0, "own_learned": self.learned_lam()}.get(arm, self.own)
            cbs: list = []
            if arm == "decay":
                cbs.append(LearnedWeightDecay(self.own, decoupled=self.name == "hf_news"))
            if arm == "dw":
                cbs.append(LearnedDataWeights())
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return self.scored(record, model, logs, cbs, bad, per_sample)

    def learned_lam(self) -> float:
        """The decay arm's λ of this recipe and seed, from ``OUT`` (``recipe_harness``)."""
        return learned_lam([OUT], self.name, self.seed)


VERSUS = {"decay": "own", "dw": "plain", "own_learned": "own"}


#: the paired table of this round (`recipe_harness.paired_table`)
table = versus_table(VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s58", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
