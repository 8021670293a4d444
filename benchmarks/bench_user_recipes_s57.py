"""Session 57's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning habits, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images), trained per seed in four arms: ``own`` (the recipe with its own
``weight_decay``, clean labels) against ``decay`` (``LearnedWeightDecay(<own>)``, the
optimizer's decay removed, as README.md says); ``plain`` (the recipe on 35 % wrong training
labels, a clean validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``). New here, habits no earlier round tried on real data:

* ``two_val``  Fashion-MNIST MLP whose ``val_dataloader`` returns two loaders, a probe of 500
  training rows first ("how well does it fit what it trains on") then the validation set, and a
  ``validation_step(batch, batch_idx, dataloader_idx=0)`` logging each; SGD momentum;
* ``reload_pool``  MNIST MLP, ``reload_dataloaders_every_n_epochs=1``, ``train_dataloader()``
  drawing a fresh random half of the 2000-image pool each epoch (a data set that changes; the
  data-weights arm wraps the pool in ``IndexedDataset`` once and takes a ``Subset`` of it);
* ``dev_run``  MNIST MLP, the notebook habit: ``Trainer(fast_dev_run=True).fit`` first (the
  same module and callback objects), then the real ``Trainer(max_epochs=5).fit``;
* ``predict``  Fashion-MNIST MLP with a ``predict_step``; after the fit the user scores the test
  set with ``trainer.predict`` (its loss is what the table shows) and, in the data-weights arm,
  predicts the training loader too, to set the model's own suspects beside ``flagged()``;
* ``metrics_step``  MNIST MLP logging torchmetrics in ``training_step`` with ``on_step=True,
  on_epoch=True``: an accuracy and a ``SumMetric`` of the rows seen (it must read 2000 per
  epoch: a hyper step's call of ``training_step`` must not count);
* ``dm_stage``  Fashion-MNIST MLP on a ``LightningDataModule`` whose ``setup(stage)`` builds the
  split per stage (``"fit"``: ``random_split`` of one pool into train / val; ``"test"``: the
  test file), ``val_check_interval=0.25, check_val_every_n_epoch=2``, then ``trainer.validate``
  and ``trainer.test`` on the data module.

Controls (on request, ``--arms``): ``dw_sampler`` (``reload_pool``: one ``IndexedDataset`` over
the pool, the half chosen by a ``SubsetRandomSampler``, the route the refusal names);
``decay_val_first`` / ``dw_val_first`` (``two_val``: the validation set listed first);
``own_low`` (``predict``, ``dm_stage``: the own recipe at ``weight_decay=1e-4``, the λ learned).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s57.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s57/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, random_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
from recipe_harness import (  # noqa: E402
    LogLines,
    RecipeModule,
    auc,
    images,
    noisy_labels,
    package_logs,
    recipe_loader,
    scored_record,
    tensors,
    test_loss,
    timed_fit,
    trainer,
    versus_table,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = ("two_val", "reload_pool", "dev_run", "predict", "metrics_step", "dm_stage")

# ----------------------------------------------------------------------------- recipes


class MLP(RecipeModule):
    def __init__(self, wd, per_sample, lr=0.05):
        super().__init__(wd, per_sample)
        self.lr = lr
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=self.wd)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))


class TwoVal(MLP):
    """Two validation loaders: the training probe (0) and the validation set (1)."""

    names = ("probe_loss", "val_loss")

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        name = self.names[dataloader_idx]
        self.log(name, F.cross_entropy(self(x), y), add_dataloader_idx=False)


class ReloadPool(MLP):
    """Each epoch a fresh random half of the pool (``reload_dataloaders_every_n_epochs=1``)."""

    def __init__(self, wd, per_sample, pool, val, seed, by_sampler=False):
        super().__init__(wd, per_sample)
        self.pool, self.val = (IndexedDataset(pool) if per_sample else pool), val
        self.g = torch.Generator().manual_seed(seed)
        self.halves: list[list[int]] = []
        self.by_sampler = by_sampler

    def train_dataloader(self):
        half = torch.randperm(len(self.pool), generator=self.g)[: len(self.pool) // 2].tolist()
        self.halves.append(half)
        if self.by_sampler:  # one IndexedDataset over the pool, the half chosen by a sampler
            return DataLoader(self.pool, batch_size=64, sampler=SubsetRandomSampler(half))
        return DataLoader(Subset(self.pool, half), batch_size=64, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=256)


class Predicting(MLP):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        return self(x), y


class Metered(MLP):
    """torchmetrics logged per step and per epoch in ``training_step``."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(10, average="micro")
        self.rows_seen = torchmetrics.SumMetric()
        self.epoch_rows: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.train_acc(out, y)
        self.rows_seen(torch.tensor(float(len(y))))
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
        self.log("rows_seen", self.rows_seen, on_step=False, on_epoch=True)
        return self.reduce(F.cross_entropy(out, y, reduction="none"))

    def on_train_epoch_end(self):
        self.epoch_rows.append(float(self.trainer.callback_metrics["rows_seen"]))


class StageData(pl.LightningDataModule):
    """One pool, split into train / val in ``setup("fit")``; the test file in ``setup("test")``."""

    def __init__(self, pool, test, per_sample, seed):
        super().__init__()
        self.pool, self.test_set, self.per_sample, self.seed = pool, test, per_sample, seed
        self.stages: list[str] = []

    def setup(self, stage):
        self.stages.append(stage)
        if stage in ("fit", "validate"):
            g = torch.Generator().manual_seed(self.seed)
            self.train_set, self.val_set = random_split(self.pool, [2000, 300], generator=g)
        if stage == "test":
            self.test_set_ = self.test_set

    def train_dataloader(self):
        data = IndexedDataset(self.train_set) if self.per_sample else self.train_set
        return DataLoader(data, batch_size=64, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self):
        return DataLoader(self.test_set_, batch_size=256)


# ----------------------------------------------------------------------------- one fit


class Setup:
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw")
        self.own = 5e-4
        if name == "reload_pool":  # the data weights by the route the refusal names
            self.arms += ("dw_sampler",)
        if name == "two_val":  # the warning's advice: the held-out loader listed first
            self.arms += ("decay_val_first", "dw_val_first")
        if name in ("predict", "dm_stage"):  # the decay's loss: the λ it learned, by hand
            self.arms += ("own_low",)
        which = "fashion-mnist" if name in ("two_val", "predict", "dm_stage") else "mnist"
        tr, va, te = images(data, which, seed, 2000, 300, 2000)
        self.train, self.val, self.test = tensors(tr), tensors(va), tensors(te)

    # each recipe's fit: the model trained as the user would, returned for the test
    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        val = recipe_loader(self.val, None, 64, False, False)
        loader = recipe_loader(train, None, 64, per_sample, True)
        if name == "two_val":
            model = TwoVal(wd, per_sample)
            probe = DataLoader(Subset(train, range(500)), batch_size=256)
            self.tr = trainer(cbs, 5)
            first = record["arm"].endswith("val_first")
            model.names = ("val_loss", "probe_loss") if first else model.names
            self.tr.fit(model, loader, [val, probe] if first else [probe, val])
            record["logged"] = {k: float(v) for k, v in self.tr.callback_metrics.items()}
        elif name == "reload_pool":
            by_sampler = record["arm"] == "dw_sampler"
            model = ReloadPool(wd, per_sample, train, self.val, self.seed, by_sampler)
            self.tr = trainer(cbs, 10, reload_dataloaders_every_n_epochs=1)
            self.tr.fit(model)
            seen = np.zeros(len(train), bool)
            for half in model.halves[:10]:
                seen[half] = True
            record["rows_never_trained"] = int((~seen).sum())
            record["loaders_built"] = len(model.halves)
        elif name == "dev_run":
            model = MLP(wd, per_sample)
            self.tr = trainer(cbs, 5, fast_dev_run=True)
            self.tr.fit(model, loader, val)
            record["dev_run"] = {"steps": self.tr.global_step, **self.after(cbs)}
            self.tr = trainer(cbs, 5)
            self.tr.fit(model, loader, val)
        elif name == "predict":
            model = Predicting(wd, per_sample)
            self.tr = trainer(cbs, 5)
            self.tr.fit(model, loader, val)
            test = recipe_loader(self.test, None, 64, False, False)
            out = self.tr.predict(model, test)
            logits, y = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
            record["predict_test_loss"] = float(F.cross_entropy(logits, y))
            if per_sample:  # the model's own suspects: the training rows it predicts worst
                try:  # the training loader as it trains (Indexed batches): the user's crash
                    self.tr.predict(model, recipe_loader(train, None, 64, True, False))
                except Exception as err:  # noqa: BLE001 - a finding, recorded
                    record["predict_train_error"] = f"{type(err).__name__}: {err}"[:400]
                rows = self.tr.predict(model, recipe_loader(train, None, 64, False, False))
                losses = torch.cat([F.cross_entropy(o, t, reduction="none") for o, t in rows])
                record["own_loss_auc"] = auc(-losses[bad].numpy(), -losses[~bad].numpy())
                record["after_predict"] = self.after(cbs)
        elif name == "metrics_step":
            model = Metered(wd, per_sample)
            self.tr = trainer(cbs, 5)
            self.tr.fit(model, loader, val)
            record["rows_seen_per_epoch"] = model.epoch_rows
            record["train_acc_epoch"] = float(self.tr.callback_metrics["train_acc_epoch"])
        elif name == "dm_stage":
            pool = torch.utils.data.ConcatDataset([train, self.val])
            dm = StageData(pool, self.test, per_sample, self.seed)
            model = MLP(wd, per_sample)
            self.tr = trainer(cbs, 6, val_check_interval=0.25, check_val_every_n_epoch=2)
            self.tr.fit(model, datamodule=dm)
            self.dm = dm
            got = self.tr.validate(model, datamodule=dm, verbose=False)
            record["validate"] = got[0] if got else None
            got = self.tr.test(model, datamodule=dm, verbose=False)
            record["lightning_test"] = got[0] if got else None
            record["stages"] = dm.stages
            record["after_validate_test"] = self.after(cbs)
        return model

    @staticmethod
    def after(cbs: list) -> dict[str, Any]:
        """What the callbacks hold now (λ by slot; the data weights' mean)."""
        out: dict[str, Any] = {}
        for cb in cbs:
            try:
                if isinstance(cb, LearnedWeightDecay):
                    out["lam"] = {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()}
                else:
                    out["w_mean"] = float(cb.data_weights().float().mean())
            except Exception as err:  # noqa: BLE001 - a read-out refused is a finding
                out["read_out_error"] = f"{type(err).__name__}: {err}"[:600]
        return out

    #: the recipe's ``collate_fn`` for the test loader (None: the default)
    collate = None

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test loss and accuracy (:func:`recipe_harness.test_loss`)."""
        return test_loss(model, recipe_loader(self.test, self.collate, 64, False, False))

    def flags_record(self, record: dict[str, Any], cb: LearnedDataWeights, bad: Tensor) -> None:
        """No flags: this round's records hold none (session 61's ``Setup`` records them)."""

    def scored(
        self, record: dict[str, Any], model: Any, logs: LogLines, cbs: list, bad, per_sample: bool
    ) -> dict[str, Any]:
        """:func:`recipe_harness.scored_record` without ``val_loss``, which this round's and the
        next's records do not hold."""
        scored = scored_record(self, record, model, logs, cbs, bad, per_sample)
        scored.pop("val_loss", None)
        return scored

    def run(self, arm: str) -> dict[str, Any]:
        with package_logs() as logs:
            noisy, per_sample = arm == "plain" or arm.startswith("dw"), arm.startswith("dw")
            train, bad = noisy_labels(self.train, 10, self.seed) if noisy else (self.train, None)
            wd = 0.0 if arm.startswith("decay") else 1e-4 if arm == "own_low" else self.own
            cbs: list = []
            if arm.startswith("decay"):
                cbs.append(LearnedWeightDecay(self.own))
            if arm.startswith("dw"):
                cbs.append(LearnedDataWeights())
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        # the weights' rows are the split's
        if model is not None and self.name == "dm_stage" and per_sample:
            pool_bad = torch.cat([bad, torch.zeros(len(self.val), dtype=torch.bool)])
            bad = pool_bad[torch.as_tensor(self.dm.train_set.indices)]
        return self.scored(record, model, logs, cbs, bad, per_sample)


VERSUS = {
    "decay": "own", "dw": "plain", "dw_sampler": "plain", "decay_val_first": "own",
    "dw_val_first": "plain", "own_low": "own",
}  # fmt: skip


#: the paired table of this round (`recipe_harness.paired_table`)
table = versus_table(VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s57", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
