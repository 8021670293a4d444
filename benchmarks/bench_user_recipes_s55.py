"""Session 55's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer and Trainer flags, on
small real data (MNIST / Fashion-MNIST subsets), trained per seed in the arms of
``bench_user_recipes_s54.py`` (``own`` / ``decay`` on clean data, ``plain`` / ``dw`` on 35 %
wrong labels with a clean validation set), whose ``Setup.run`` this script reuses. New here:
Lightning features and habits no earlier round tried:

* ``backbone_ft``  a CNN backbone pre-trained on MNIST, a new head on Fashion-MNIST, Lightning's
  ``BackboneFinetuning`` callback (backbone frozen, thawed at epoch 2 into a new parameter group);
* ``accum_sched``  MNIST CNN, ``GradientAccumulationScheduler({0: 1, 2: 4})``,
  ``gradient_clip_val=0.5, gradient_clip_algorithm="value"``, SGD momentum;
* ``plateau_step``  Fashion-MNIST MLP, label-smoothing cross entropy (0.1), Adam, a
  ``ReduceLROnPlateau`` on the logged ``train_loss`` stepped every 10 optimizer steps;
* ``swa_bn``  Fashion-MNIST CNN with BatchNorm, SGD momentum, Lightning's
  ``StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=0.6)``;
* ``max_time``  MNIST MLP, SGD momentum, ``Trainer(max_time=..., max_epochs=-1)``: the fit ends
  by the clock, so the drop-ins' cost shows as fewer training steps;
* ``manual_accum``  MNIST MLP under manual optimisation: two batches accumulated per step,
  ``self.clip_gradients``, ``OneCycleLR`` stepped by hand; arms ``decay`` (the README drop-in as
  is) and ``decay_tl`` (``training_loss=`` given, as the refusal asks).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s55.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out``; ``--table`` prints the table.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import (
    BackboneFinetuning,
    GradientAccumulationScheduler,
    StochasticWeightAveraging,
)
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
from bench_user_recipes_s54 import Backbone, Recipe, pretrained  # noqa: E402
from recipe_harness import (  # noqa: E402
    LogLines,
    images,
    paired_table,
)

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

RECIPES = ("backbone_ft", "accum_sched", "plateau_step", "swa_bn", "max_time", "manual_accum")

# ----------------------------------------------------------------------------- recipes


class ThawedBackbone(Recipe):
    """MNIST-pretrained backbone under ``BackboneFinetuning``; the optimizer gets only the
    trainable tensors (the callback adds the backbone's group when it thaws it)."""

    def __init__(self, wd, per_sample, state):
        super().__init__(wd, per_sample)
        self.backbone = Backbone()
        self.backbone.load_state_dict(state)
        self.head = nn.Sequential(nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.backbone(x))

    def configure_optimizers(self):
        trained = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.Adam(trained, lr=1e-3, weight_decay=self.wd)


class SmallCNN(Recipe):
    def __init__(self, wd, per_sample, bn=False, lr=0.05):
        super().__init__(wd, per_sample)
        norm = nn.BatchNorm2d if bn else (lambda c: nn.Identity())
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3), norm(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), norm(32), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=self.wd)


class MLP(Recipe):
    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class PlateauMLP(MLP):
    """Label smoothing 0.1; Adam with ReduceLROnPlateau on the logged training loss per step."""

    def per_sample_loss(self, out, y):
        return F.cross_entropy(out, y, reduction="none", label_smoothing=0.1)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=2e-3, weight_decay=self.wd)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)
        sched = {"scheduler": plateau, "monitor": "train_loss", "interval": "step",
                 "frequency": 10}  # fmt: skip
        return {"optimizer": opt, "lr_scheduler": sched}


class ManualAccum(MLP):
    """Manual optimisation: two batches per step, gradient clipping, OneCycleLR per step."""

    ACCUM = 2

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss / self.ACCUM)
        if (batch_idx + 1) % self.ACCUM == 0:
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
            sched.step()
        self.log("train_loss", loss)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
        steps = self.trainer.estimated_stepping_batches // self.ACCUM + 1
        return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)]


def manual_loss(module, batch):
    x, y = batch
    return F.cross_entropy(module(x), y)


class DecayWithLoss(LearnedWeightDecay):
    """The drop-in as the manual-optimisation refusal asks: ``training_loss=`` given."""

    def __init__(self, weight_decay: float) -> None:
        super().__init__(weight_decay, training_loss=manual_loss)


# ----------------------------------------------------------------------------- one fit

#: the last fit's Trainer (read after ``Setup.run`` for what the records need)
LAST: dict[str, pl.Trainer] = {}


@contextmanager
def recipe_trainer(extra):
    """s54's ``trainer`` with the recipe's own callbacks (fresh per fit) added, the Trainer kept."""
    plain = s54.trainer

    def build(callbacks, epochs, **kw):
        LAST["trainer"] = plain(list(callbacks) + extra(), epochs, **kw)
        return LAST["trainer"]

    s54.trainer = build
    try:
        yield
    finally:
        s54.trainer = plain


class Setup(s54.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:  # noqa: C901 - one per recipe
        self.name, self.seed, self.data = name, seed, data
        self.epochs, self.batch, self.kind, self.classes = 5, 64, "ce", 10
        self.arms, self.dw_kw, self.trainer_kw = ("own", "decay", "plain", "dw"), {}, {}
        self.own, self.extra = 1e-4, list
        which = "mnist" if name in ("accum_sched", "max_time", "manual_accum") else "fashion-mnist"
        tr, va, te = images(data, which, seed, 2000, 300, 2000)
        if name == "backbone_ft":
            state = pretrained(data, seed)
            self.make = lambda wd, ps: ThawedBackbone(wd, ps, state)
            self.extra = lambda: [BackboneFinetuning(unfreeze_backbone_at_epoch=2, verbose=False)]
        elif name == "accum_sched":
            self.make, self.own = SmallCNN, 5e-4
            self.extra = lambda: [GradientAccumulationScheduler(scheduling={0: 1, 2: 4})]
            self.trainer_kw = {"gradient_clip_val": 0.5, "gradient_clip_algorithm": "value"}
            self.arms = ("own", "decay", "plain", "dw", "dw_advice")  # the warning's advice
            self.advice_kw = {"start_step": 17, "every_n_steps": 17}
        elif name == "plateau_step":
            self.make = PlateauMLP
        elif name == "swa_bn":
            self.make, self.own = (lambda wd, ps: SmallCNN(wd, ps, bn=True)), 5e-4
            self.extra = lambda: [StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=0.6)]
        elif name == "max_time":
            self.make, self.own = MLP, 5e-4
            self.trainer_kw = {"max_time": {"seconds": 6}, "max_epochs": -1}
        elif name == "manual_accum":
            self.make, self.own = ManualAccum, 5e-4
            self.arms = ("own", "decay", "decay_tl", "plain", "dw")
        else:
            raise SystemExit(f"unknown recipe {name!r}")
        self.train, self.val, self.test = (TensorDataset(*s) for s in (tr, va, te))

    def run(self, arm: str) -> dict[str, Any]:
        logs = LogLines()
        logger = logging.getLogger("hypertorch_sid")
        logger.addHandler(logs)
        level, logger.level = logger.level, logging.INFO
        patched, dw_kw = s54.LearnedWeightDecay, self.dw_kw
        if arm == "dw_advice":
            self.dw_kw = self.advice_kw
        if arm == "decay_tl":  # s54's "decay" arm with training_loss= given
            s54.LearnedWeightDecay = DecayWithLoss
        try:
            with recipe_trainer(self.extra):
                record = super().run({"decay_tl": "decay", "dw_advice": "dw"}.get(arm, arm))
        finally:
            s54.LearnedWeightDecay, self.dw_kw = patched, dw_kw
            logger.removeHandler(logs)
            logger.setLevel(level)
        record["arm"], record["logs"] = arm, sorted(set(logs.lines))
        tr = LAST["trainer"]
        record["epochs_run"] = tr.current_epoch
        record["final_lr"] = (
            [g["lr"] for g in tr.optimizers[0].param_groups] if tr.optimizers else []
        )
        return record


VERSUS = {"decay": "own", "decay_tl": "own", "dw": "plain", "dw_advice": "plain"}


def table(records: list[dict[str, Any]]) -> str:
    """The paired table of this round (`recipe_harness.paired_table`)."""
    return paired_table(records, VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s55", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
