"""Session 59's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning habits, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images), trained per seed in four arms: ``own`` (the recipe with its own
``weight_decay``, clean labels) against ``decay`` (``LearnedWeightDecay(<own>)``, the
optimizer's decay removed, as README.md says); ``plain`` (the recipe on 35 % wrong training
labels, a clean validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``). New here, habits no earlier round tried on real data:

* ``dict_ema``  MNIST MLP whose ``training_step`` returns a dict (``{"loss": ..., "logits":
  ..., "n": ...}``), read in ``on_train_batch_end``, which also keeps a hand-written EMA of the
  weights (``self.ema = copy.deepcopy(self.net).requires_grad_(False)``, a registered
  submodule); validation and the deployed model are the EMA; SGD momentum, own 5e-4;
* ``two_opt_manual``  Fashion-MNIST MLP under manual optimisation with two optimizers: the
  encoder by SGD momentum (lr 0.05), the head by Adam (lr 1e-3), each with ``weight_decay``,
  each stepped on its own loss under ``toggle_optimizer`` (Lightning's pattern for several
  optimizers), two StepLR schedulers stepped per epoch by hand; own 5e-4; the decay arm passes
  ``training_loss=`` (manual optimisation needs it);
* ``groupnorm_bf16``  Fashion-MNIST CNN with GroupNorm, ``precision="bf16-mixed"`` on CPU,
  ``gradient_clip_val=1.0, gradient_clip_algorithm="norm"``, SGD momentum with a
  ``SequentialLR`` (``LinearLR`` warm-up, then cosine) stepped per step; own 5e-4;
* ``moduledict_onecycle``  MNIST model built from an ``nn.ModuleDict`` of blocks, an
  ``nn.ModuleList`` head, an ``nn.ParameterList`` of per-class logit scales and an
  ``nn.ParameterDict`` bias; Adam with ``OneCycleLR`` (``interval: "step"``, over
  ``estimated_stepping_batches``), ``limit_train_batches=0.3``, ``check_val_every_n_epoch=2``;
  own 1e-4;
* ``ckpt_resume``  Fashion-MNIST MLP, ``ModelCheckpoint(save_top_k=-1, every_n_epochs=1)``, 6
  epochs; then a new Trainer with new callbacks (a fresh drop-in with the same arguments)
  resumes from the epoch-2 checkpoint to epoch 6 (the restart after a crash); the resumed
  model is deployed (``first_test``: the first fit's, without the restart); SGD momentum,
  own 5e-4;
* ``wn_sampler``  Fashion-MNIST MLP whose layers are ``parametrizations.weight_norm``'d, fed
  through the user's ``WeightedRandomSampler`` (the shirt class drawn twice as often), Adam,
  own 1e-4.

Control (on request, ``--arms own_learned``): the user's own recipe at the λ the decay
learned (its mean over the layers, per seed, from the ``decay`` record in ``records.json`` or
``records_fresh.json``).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s59.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s59/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader, WeightedRandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
from recipe_harness import (  # noqa: E402
    RecipeModule,
    images,
    learned_lam,
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

RECIPES = (
    "dict_ema", "two_opt_manual", "groupnorm_bf16", "moduledict_onecycle", "ckpt_resume",
    "wn_sampler",
)  # fmt: skip
OUT = Path("benchmarks/results/user_recipes/s59/records.json")
#: the fresh seeds' records (``--out`` of the second run), where ``own_learned`` also looks
FRESH = OUT.with_name("records_fresh.json")


# ----------------------------------------------------------------------------- recipes


class DictEMA(s57.MLP):
    """A dict from ``training_step``; an EMA of the weights, validated and deployed."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.ema = copy.deepcopy(self.net).requires_grad_(False)
        self.seen = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, reduction="none")
        return {"loss": self.reduce(loss), "logits": logits.detach(), "n": len(y)}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen += outputs["n"]
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.net.parameters()):
                e.lerp_(p, 0.05)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.ema(x), y), prog_bar=True)


class TwoOptimizers(RecipeModule):
    """Manual optimisation: encoder by SGD, head by Adam, each toggled and stepped in turn."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.automatic_optimization = False
        self.encoder = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU()
        )  # fmt: skip
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        *x, y = batch
        for opt in self.optimizers():  # block coordinate descent, Lightning's GAN pattern
            self.toggle_optimizer(opt)
            loss = F.cross_entropy(self(*x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.untoggle_optimizer(opt)
        self.log("train_loss", loss)

    def on_train_epoch_end(self):
        for sched in self.lr_schedulers():
            sched.step()

    def configure_optimizers(self):
        enc = torch.optim.SGD(
            self.encoder.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd
        )
        head = torch.optim.Adam(self.head.parameters(), lr=1e-3, weight_decay=self.wd)
        steps = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.3) for o in (enc, head)]
        return [enc, head], steps


class GroupNormCNN(RecipeModule):
    """Conv–GroupNorm–ReLU blocks; SGD momentum, linear warm-up then cosine, per step."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 49, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x).float()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
        steps = int(self.trainer.estimated_stepping_batches)
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - 20)
        seq = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[20])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": seq, "interval": "step"}}


class BlocksModel(RecipeModule):
    """ModuleDict blocks, a ModuleList head, ParameterList scales, a ParameterDict bias."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.blocks = nn.ModuleDict(
            {
                "stem": nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU()),
                "mid": nn.Sequential(nn.Linear(256, 128), nn.ReLU()),
            }
        )
        self.heads = nn.ModuleList([nn.Linear(128, 10)])
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(10))])
        self.extra = nn.ParameterDict({"bias": nn.Parameter(torch.zeros(10))})

    def forward(self, x):
        h = self.blocks["mid"](self.blocks["stem"](x))
        return self.heads[0](h) * self.scales[0] + self.extra["bias"]

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)
        steps = int(self.trainer.estimated_stepping_batches)
        one = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": one, "interval": "step"}}


class WNMLP(RecipeModule):
    """Weight-normalised linear layers (``parametrizations.weight_norm``); Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), weight_norm(nn.Linear(784, 256)), nn.ReLU(),
            weight_norm(nn.Linear(256, 128)), nn.ReLU(), nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class Probe(Callback):
    """What the drop-ins hold at given hooks: λ by slot, the data weights' mean."""

    def __init__(self, cbs: list, record: dict, key: str) -> None:
        self.cbs, self.record, self.key = cbs, record, key

    def on_validation_end(self, trainer, pl_module):
        if trainer.current_epoch == 2 and not trainer.sanity_checking:
            self.record.setdefault(self.key, {})["epoch2_val_end"] = Setup.after(self.cbs)

    def on_train_start(self, trainer, pl_module):
        self.record.setdefault(self.key, {})["train_start"] = Setup.after(self.cbs)


# ----------------------------------------------------------------------------- one fit


class Setup(s57.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw", "own_learned")
        self.own = {"moduledict_onecycle": 1e-4, "wn_sampler": 1e-4}.get(name, 5e-4)
        mnist = name in ("dict_ema", "moduledict_onecycle")
        tr, va, te = images(data, "mnist" if mnist else "fashion-mnist", seed, 2000, 300, 2000)
        self.train, self.val, self.test = tensors(tr), tensors(va), tensors(te)

    def drop_ins(self, arm: str) -> list:
        """The arm's drop-in, as README.md writes it (``training_loss=`` under manual
        optimisation, as the refusal asks)."""
        if arm == "decay" and self.name == "two_opt_manual":
            loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
            return [LearnedWeightDecay(self.own, training_loss=loss)]
        return {"decay": [LearnedWeightDecay(self.own)], "dw": [LearnedDataWeights()]}.get(arm, [])

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name, folder = self.name, tempfile.mkdtemp(prefix=f"s59_{self.name}_")
        val = recipe_loader(self.val, None, 64, False, False)
        loader = recipe_loader(train, None, 64, per_sample, True)
        if name == "dict_ema":
            model = DictEMA(wd, per_sample)
            self.tr = trainer(cbs, 5)
            self.tr.fit(model, loader, val)
            record["rows_seen"] = model.seen
            return model.ema
        if name == "two_opt_manual":
            model = TwoOptimizers(wd, per_sample)
            self.tr = trainer(cbs, 6)
            self.tr.fit(model, loader, val)
        elif name == "groupnorm_bf16":
            model = GroupNormCNN(wd, per_sample)
            self.tr = trainer(
                cbs, 4, precision="bf16-mixed", gradient_clip_val=1.0,
                gradient_clip_algorithm="norm",
            )  # fmt: skip
            self.tr.fit(model, loader, val)
        elif name == "moduledict_onecycle":
            model = BlocksModel(wd, per_sample)
            loader = recipe_loader(train, None, 32, per_sample, True)
            self.tr = trainer(cbs, 16, limit_train_batches=0.3, check_val_every_n_epoch=2)
            self.tr.fit(model, loader, val)
        elif name == "ckpt_resume":
            model = s57.MLP(wd, per_sample)
            every = dict(dirpath=folder, save_top_k=-1, every_n_epochs=1)
            self.tr = trainer([*cbs, ModelCheckpoint(**every), Probe(cbs, record, "first")], 6)
            self.tr.fit(model, loader, val)
            record["first_end"] = self.after(cbs)
            first = recipe_loader(self.test, None, 64, False, False)
            record["first_test"] = test_loss(model, first)  # the fit without the restart
            model.train()
            ckpts = sorted(p.name for p in Path(folder).glob("*.ckpt"))
            record["ckpts"] = ckpts
            [mid] = [p for p in Path(folder).glob("epoch=2-*.ckpt")]
            fresh = self.drop_ins(record["arm"])
            model = s57.MLP(wd, per_sample)
            self.tr = trainer(
                [*fresh, ModelCheckpoint(**every), Probe(fresh, record, "resumed")], 6
            )
            self.tr.fit(model, loader, val, ckpt_path=str(mid))
            cbs[:] = fresh
        elif name == "wn_sampler":
            model = WNMLP(wd, per_sample)
            y = train.tensors[1]
            weights = torch.where(y == 6, 2.0, 1.0).double()
            sampler = WeightedRandomSampler(weights, num_samples=len(y), replacement=True)
            data = IndexedDataset(train) if per_sample else train
            loader = DataLoader(data, batch_size=64, sampler=sampler)
            self.tr = trainer(cbs, 6)
            self.tr.fit(model, loader, val)
        return model

    def run(self, arm: str) -> dict[str, Any]:
        with package_logs() as logs:
            noisy, per_sample = arm in ("plain", "dw"), arm == "dw"
            train, bad = noisy_labels(self.train, 10, self.seed) if noisy else (self.train, None)
            wd = {"decay": 0.0, "own_learned": self.learned_lam()}.get(arm, self.own)
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return scored_record(self, record, model, logs, cbs, bad, per_sample)

    def learned_lam(self) -> float:
        """The decay arm's λ of this recipe and seed, from ``OUT``
        or ``FRESH`` (``recipe_harness``)."""
        return learned_lam([OUT, FRESH], self.name, self.seed)


VERSUS = {"decay": "own", "dw": "plain", "own_learned": "own"}


#: the paired table of this round (`recipe_harness.paired_table`)
table = versus_table(VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s59", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
