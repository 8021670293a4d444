"""Session 56's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning callbacks, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images), trained per seed in four arms: ``own`` (the recipe with its own
``weight_decay``, clean labels) against ``decay`` (``LearnedWeightDecay(<own>)``, the
optimizer's decay removed, as README.md says); ``plain`` (the recipe on 35 % wrong training
labels, a clean validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``). New here, Lightning features no earlier round tried:

* ``pruning``  Fashion-MNIST MLP, Lightning's ``ModelPruning("l1_unstructured", amount=0.3)``
  (the docs' example: a mask on every weight from the first epoch's end, the lottery-ticket
  reset), SGD momentum;
* ``lr_finder``  MNIST MLP, Lightning's ``LearningRateFinder`` callback (the finder runs inside
  ``trainer.fit``, from ``on_fit_start``, and sets ``self.lr``), Adam;
* ``batch_finder``  MNIST MLP whose loaders read ``self.batch_size``, Lightning's
  ``BatchSizeFinder`` callback (inside ``trainer.fit``), SGD momentum;
* ``lp_ft``  linear probing then fine-tuning: a CNN backbone pre-trained on MNIST, a new head on
  Fashion-MNIST trained 2 epochs with the backbone frozen, then everything 3 epochs at a lower
  learning rate, in a second ``trainer.fit`` (a new Trainer, the same callback object), Adam;
* ``best_resume``  Fashion-MNIST CNN, ``num_sanity_val_steps=-1``, ``ModelCheckpoint(monitor=
  "val_acc", mode="max", save_top_k=2)``, ``trainer.test(ckpt_path="best")``, then training
  continued from the best checkpoint to 6 epochs in a new Trainer (``fit(ckpt_path=best)``);
* ``workers``  MNIST MLP, a data set that augments in ``__getitem__`` (random shifts), loaders
  with ``num_workers=2, persistent_workers=True``, ``seed_everything(workers=True)``; two more
  arms say why the learned decay lost there: ``decay_held`` (the drop-in with λ held at the own
  value, no hyper step) and ``own_low`` (the own recipe at ``weight_decay=1e-4``, the λ learned).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s56.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s56/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import (
    BatchSizeFinder,
    LearningRateFinder,
    ModelCheckpoint,
    ModelPruning,
)
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
from bench_user_recipes_s54 import Backbone, pretrained  # noqa: E402
from recipe_harness import (  # noqa: E402
    LogLines,
    RecipeModule,
    callbacks_record,
    images,
    noisy_labels,
    recipe_loader,
    tensors,
    test_loss,
    timed_fit,
    trainer,
    versus_table,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = ("pruning", "lr_finder", "batch_finder", "lp_ft", "best_resume", "workers")

# ----------------------------------------------------------------------------- recipes


class Recipe(RecipeModule):
    """The harness's recipe module, logging the validation accuracy too."""

    def validation_step(self, batch, batch_idx):
        *x, y = batch
        out = self(*x)
        self.log("val_loss", self.per_sample_loss(out, y).mean())
        self.log("val_acc", (out.argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.log("test_loss", F.cross_entropy(out, y))
        self.log("test_acc", (out.argmax(1) == y).float().mean())


class MLP(Recipe, s57.MLP):
    """Session 57's MLP (784-256-128-10, SGD momentum) with this round's validation and test
    steps (:class:`Recipe`)."""


class AdamMLP(MLP):
    """``self.lr`` is what ``LearningRateFinder`` sets."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample, lr=1e-3)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.wd)


class LoaderMLP(MLP):
    """Loaders from the module, their batch size ``self.batch_size`` (``BatchSizeFinder``'s)."""

    def __init__(self, wd, per_sample, train, val):
        super().__init__(wd, per_sample)
        self.batch_size, self.train_set, self.val_set = 16, train, val

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)


class SmallCNN(Recipe):
    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class ProbeThenTune(Recipe):
    """A pre-trained backbone and a new head: stage 1 trains the head (backbone frozen), stage
    2 everything at a tenth of the learning rate."""

    def __init__(self, wd, per_sample, state):
        super().__init__(wd, per_sample)
        self.backbone = Backbone()
        self.backbone.load_state_dict(state)
        self.head = nn.Sequential(nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10))
        self.stage = 1
        self.backbone.requires_grad_(False)

    def forward(self, x):
        return self.head(self.backbone(x))

    def configure_optimizers(self):
        trained = [p for p in self.parameters() if p.requires_grad]
        lr = 1e-3 if self.stage == 1 else 1e-4
        return torch.optim.Adam(trained, lr=lr, weight_decay=self.wd)


class Shifted(Dataset):
    """Images shifted by up to 2 pixels at random in ``__getitem__`` (torch's generator)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        dx, dy = torch.randint(-2, 3, (2,)).tolist()
        return torch.roll(self.x[i], (dx, dy), dims=(1, 2)), self.y[i]


# ----------------------------------------------------------------------------- one fit


class Setup:
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw")
        self.own = {"lr_finder": 1e-4, "lp_ft": 1e-4}.get(name, 5e-4)
        which = "mnist" if name in ("lr_finder", "batch_finder", "workers") else "fashion-mnist"
        tr, va, te = images(data, which, seed, 2000, 300, 2000)
        self.train, self.val, self.test = tensors(tr), tensors(va), tensors(te)
        self.state = pretrained(data, seed) if name == "lp_ft" else None
        if name == "workers":  # why the decay lost: λ fixed by the drop-in; the own recipe at 1e-4
            self.arms += ("decay_held", "own_low")

    # each recipe's fit: the model trained as the user would, returned for the test
    def fit(self, cbs: list, train, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        val = recipe_loader(self.val, None, 64, False, False)
        loader = recipe_loader(train, None, 64, per_sample, True)
        if name == "pruning":
            model = MLP(wd, per_sample)
            prune = ModelPruning("l1_unstructured", amount=0.3, verbose=0)
            self.tr = trainer(cbs + [prune], 5)
            self.tr.fit(model, loader, val)
        elif name == "lr_finder":
            model = AdamMLP(wd, per_sample)
            finder = LearningRateFinder(min_lr=1e-5, max_lr=0.3, num_training_steps=40)
            self.tr = trainer(cbs + [finder], 5)
            self.tr.fit(model, loader, val)
            record["found_lr"] = model.lr
        elif name == "batch_finder":
            data = IndexedDataset(train) if per_sample else train
            model = LoaderMLP(wd, per_sample, data, self.val)
            finder = BatchSizeFinder(mode="power", init_val=16, max_trials=3)
            self.tr = trainer(cbs + [finder], 5)
            self.tr.fit(model)
            record["found_batch"] = model.batch_size
        elif name == "lp_ft":
            model = ProbeThenTune(wd, per_sample, self.state)
            self.tr = trainer(cbs, 2)
            self.tr.fit(model, loader, val)
            record["stage1"] = self.after(cbs)
            model.stage = 2
            model.backbone.requires_grad_(True)
            self.tr = trainer(cbs, 3)
            self.tr.fit(model, loader, val)
        elif name == "best_resume":
            model = SmallCNN(wd, per_sample)
            with tempfile.TemporaryDirectory() as tmp:
                best = ModelCheckpoint(tmp, monitor="val_acc", mode="max", save_top_k=2)
                self.tr = trainer(cbs + [best], 4, num_sanity_val_steps=-1)
                self.tr.fit(model, loader, val)
                test = recipe_loader(self.test, None, 64, False, False)
                got = self.tr.test(model, test, ckpt_path="best", verbose=False)
                record["best_test_loss"] = test_loss(model, test)[0]
                record["best_epoch"] = torch.load(best.best_model_path, weights_only=False)["epoch"]
                record["lightning_test"] = got[0] if got else None
                record["after_test"] = self.after(cbs)
                record["best_state"] = self.checkpoint_state(best.best_model_path)
                self.tr = trainer(cbs, 6)
                self.tr.fit(model, loader, val, ckpt_path=best.best_model_path)
        elif name == "workers":
            pl.seed_everything(self.seed, workers=True, verbose=False)
            x, y = train.tensors
            data = Shifted(x, y)
            data = IndexedDataset(data) if per_sample else data
            loader = DataLoader(
                data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True
            )
            val = DataLoader(self.val, batch_size=256, num_workers=2, persistent_workers=True)
            model = MLP(wd, per_sample)
            self.tr = trainer(cbs, 5)
            self.tr.fit(model, loader, val)
        return model

    @staticmethod
    def after(cbs: list) -> dict[str, Any]:
        """What the callbacks hold now (λ by slot; the data weights' mean)."""
        out: dict[str, Any] = {}
        for cb in cbs:
            if isinstance(cb, LearnedWeightDecay):
                out["lam"] = {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()}
            else:
                out["w_mean"] = float(cb.data_weights().float().mean())
        return out

    @staticmethod
    def checkpoint_state(path: str) -> dict[str, Any]:
        """The drop-ins' state in the checkpoint file: its keys and a fingerprint of each."""
        ck = torch.load(path, weights_only=False)
        out = {"global_step": ck.get("global_step")}
        for key, state in ck.get("callbacks", {}).items():
            if "Learned" in key:
                out[key.split("{")[0]] = (
                    sorted(state)[:20] if isinstance(state, dict) else str(type(state))
                )
        return out

    def run(self, arm: str) -> dict[str, Any]:
        logs = LogLines()
        logger = logging.getLogger("hypertorch_sid")
        logger.addHandler(logs)
        level, logger.level = logger.level, logging.INFO
        noisy, per_sample = arm in ("plain", "dw"), arm == "dw"
        train, bad = noisy_labels(self.train, 10, self.seed) if noisy else (self.train, None)
        wd = {"decay": 0.0, "decay_held": 0.0, "own_low": 1e-4}.get(arm, self.own)
        cbs: list = []
        if arm == "decay":
            cbs.append(LearnedWeightDecay(self.own))
        if arm == "decay_held":  # no hyper step: λ = the own value, applied by the drop-in
            cbs.append(LearnedWeightDecay(self.own, start_step=10**9))
        if arm == "dw":
            cbs.append(LearnedDataWeights())
        record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}
        try:
            model = timed_fit(record, lambda: self.fit(cbs, train, per_sample, wd, record), 600)
        finally:
            logger.removeHandler(logs)
            logger.setLevel(level)
        record["logs"] = sorted(set(logs.lines))
        if model is None:
            return record
        record["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        test = recipe_loader(self.test, None, 64, False, False)
        record["test_loss"], record["test_acc"] = test_loss(model, test)
        record["steps"] = self.tr.global_step
        callbacks_record(record, cbs, bad)
        return record


VERSUS = {"decay": "own", "dw": "plain", "decay_held": "own", "own_low": "own"}


#: the paired table of this round (`recipe_harness.paired_table`)
table = versus_table(VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s56", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
