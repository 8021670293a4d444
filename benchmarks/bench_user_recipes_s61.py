"""Session 61's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning habits, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images; four groups of 20 Newsgroups: 1200 / 300 / 1000 documents),
trained per seed in four arms: ``own`` (the recipe with its own ``weight_decay``, clean data)
against ``decay`` (``LearnedWeightDecay(<own>)``, every other default, the optimizer's decay
removed, as README.md says); ``plain`` (the recipe on corrupted training data, a clean
validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``; the regression ``objective="mean_loss"`` as README.md says, and
``dw_default`` with no setting). New here, habits no earlier round tried on real data:

* ``noisy_reg``  a regression: the angle of a rotated MNIST digit (θ ~ U(−45°, 45°), target
  θ / 30°), a small CNN, MSE (``reduction="none"`` for the data weights), Adam, own 1e-4; the
  corrupted arms have 30 % of the training targets plus heavy-tailed (Cauchy, scale 2) noise;
  the test score is the MSE on clean test angles (``test_acc``: the share within 7.5°);
* ``ckpt_mlp``  Fashion-MNIST MLP whose two hidden blocks run under activation checkpointing,
  ``torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)``, SGD momentum, own 5e-4;
* ``ckpt_reentrant``  the same with ``checkpoint(block, h)`` (the reentrant default a user
  leaves, torch's warning about it aside);
* ``sparse_emb``  20 Newsgroups: ``nn.Embedding(8000, 64, sparse=True)`` (mean of the words),
  an MLP head; manual optimization with ``torch.optim.SparseAdam`` for the embedding and
  ``Adam(weight_decay=own)`` for the rest (SparseAdam has no decay), own 1e-4;
* ``stream_steps``  MNIST MLP trained from an ``IterableDataset`` (an endless shuffled stream,
  each worker-free ``__iter__`` reseeded), ``Trainer(max_steps=500, max_epochs=-1)``,
  validation every 50 steps, SGD momentum, own 5e-4; the data weights, which need indices, are
  given ``IndexedDataset(stream)`` as README.md says;
* ``multitask``  Fashion-MNIST, a shared trunk and two heads: the 10 classes and 4 coarse
  groups (tops / bottoms+dresses / footwear / bags), the loss ``ce_fine + 0.5 · ce_coarse`` per
  image, ``LambdaLR`` linear warm-up per step (``interval: "step"``), AdamW (own 0.01,
  ``decoupled=True``); the corrupted labels move the fine class and its group with it;
  the test score is the fine head's;
* ``deterministic``  MNIST MLP under ``Trainer(deterministic=True)``, each arm fitted twice
  from the same seed: ``repeat_equal`` records whether the two fits ended bitwise equal (what
  the flag is for), SGD momentum, own 5e-4.

Extra arms: ``decay_free`` (``deterministic``: ``LearnedWeightDecay(max_overhead=None)``,
which README.md says makes a seeded fit repeatable); ``decay_loss`` (``sparse_emb``: the decay
given ``training_loss=``, what its refusal of manual optimization said to pass);
``own_learned`` (``stream_steps``: the own recipe at the mean λ the ``decay`` arm learned, read
from the default ``--out``).
Fit lengths: 10 epochs (320 steps) for the MLPs, 12 for the regression, 8 for the news model
and ``deterministic`` (fitted twice), 500 steps for the stream.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s61.py \
        --data ../shared/data --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s61/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s60 as s60  # noqa: E402
from recipe_harness import (  # noqa: E402
    Docs,
    RecipeModule,
    auc,
    images,
    learned_lam,
    news,
    noisy_labels,
    package_logs,
    paired_table,
    recipe_loader,
    scored_record,
    tensors,
    test_loss,
    timed_fit,
    trainer,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = (
    "noisy_reg", "ckpt_mlp", "ckpt_reentrant", "sparse_emb", "stream_steps", "multitask",
    "deterministic",
)  # fmt: skip
#: Fashion-MNIST's coarse groups: tops (T-shirt, pullover, coat, shirt), bottoms and dresses
#: (trouser, dress), footwear (sandal, sneaker, boot), bags
COARSE = torch.tensor([0, 1, 0, 1, 0, 2, 0, 2, 3, 2])
#: the regression's target unit (degrees) and the rotation range
DEGREES, MAX_ANGLE = 30.0, 45.0


# ----------------------------------------------------------------------------- data


def rotated(x: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image rotated by θ ~ U(−45°, 45°); the targets θ / 30°."""
    g = torch.Generator().manual_seed(500 + seed)
    theta = (2 * torch.rand(len(x), generator=g) - 1) * MAX_ANGLE
    rad = theta * math.pi / 180
    cos, sin = rad.cos(), rad.sin()
    zero = torch.zeros_like(cos)
    affine = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(affine, list(x.shape), align_corners=False)
    background = x.min()
    out = F.grid_sample(x - background, grid, align_corners=False) + background
    return out, theta / DEGREES


def heavy_tailed(y: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """30 % of the targets plus Cauchy noise (scale 2, cut at ±50); returns them and the mask."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < 0.3
    cauchy = torch.tan(math.pi * (torch.rand(len(y), generator=g) - 0.5)) * 2
    return torch.where(bad, y + cauchy.clamp(-50, 50), y), bad


class Stream(IterableDataset):
    """An endless shuffled stream of ``(x, y)`` rows (each ``__iter__`` a fresh order)."""

    def __init__(self, data: TensorDataset, seed: int) -> None:
        self.data, self.g = data, torch.Generator().manual_seed(seed)

    def __iter__(self):
        while True:
            for i in torch.randperm(len(self.data), generator=self.g).tolist():
                yield self.data[i]


# ----------------------------------------------------------------------------- recipes


class AngleCNN(RecipeModule):
    """Two strided convolutions and a linear head: the angle, one number per image."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
            nn.Flatten(), nn.Linear(32 * 6 * 6, 64), nn.ReLU(), nn.Linear(64, 1),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def per_sample_loss(self, out, y):
        return F.mse_loss(out, y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class CheckpointedMLP(s57.MLP):
    """The MLP's hidden blocks under activation checkpointing (``reentrant``: torch's default)."""

    def __init__(self, wd, per_sample, reentrant: bool):
        super().__init__(wd, per_sample)
        self.reentrant = reentrant
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU())
        self.block1 = nn.Sequential(nn.Linear(256, 256), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(256, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)
        del self.net

    def forward(self, x):
        h = self.stem(x)
        for block in (self.block1, self.block2):
            if self.reentrant:  # the default a user leaves (torch warns, and uses reentrant)
                h = checkpoint(block, h)
            else:
                h = checkpoint(block, h, use_reentrant=False)
        return self.head(h)


def bag_collate(samples):
    """Documents (cut at 200 words) padded with 0, and their labels."""
    seqs = [s[:200] for s, _ in samples]
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True), torch.stack([y for _, y in samples])


class SparseNews(RecipeModule):
    """Mean of sparse word embeddings, an MLP head; SparseAdam + Adam, manual optimization."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.automatic_optimization = False
        self.emb = nn.Embedding(8000, 64, padding_idx=0, sparse=True)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, tokens):
        mask = (tokens != 0).float().unsqueeze(-1)
        h = (self.emb(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        *x, y = batch
        loss = self.reduce(self.per_sample_loss(self(*x), y))
        sparse, dense = self.optimizers()
        sparse.zero_grad()
        dense.zero_grad()
        self.manual_backward(loss.mean())
        sparse.step()
        dense.step()
        return loss

    def configure_optimizers(self):
        sparse = torch.optim.SparseAdam(list(self.emb.parameters()), lr=1e-2)
        dense = torch.optim.Adam(self.head.parameters(), lr=1e-3, weight_decay=self.wd)
        return [sparse, dense]


class MultiTask(RecipeModule):
    """A trunk, a fine head (10 classes) and a coarse head (4 groups); LambdaLR warm-up."""

    def __init__(self, wd, per_sample, total_steps: int):
        super().__init__(wd, per_sample)
        self.total_steps = total_steps
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU())
        self.fine = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
        self.coarse = nn.Linear(256, 4)

    def forward(self, x):
        return self.fine(self.trunk(x))

    def losses(self, x, y, c):
        h = self.trunk(x)
        fine = F.cross_entropy(self.fine(h), y, reduction="none")
        coarse = F.cross_entropy(self.coarse(h), c, reduction="none")
        return fine, coarse

    def training_step(self, batch, batch_idx):
        x, y, c = batch
        fine, coarse = self.losses(x, y, c)
        self.log("train_fine", fine.mean())
        return self.reduce(fine + 0.5 * coarse)

    def validation_step(self, batch, batch_idx):
        x, y, c = batch
        fine, coarse = self.losses(x, y, c)
        self.log("val_fine", fine.mean())
        self.log("val_loss", (fine + 0.5 * coarse).mean(), prog_bar=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=self.wd)
        warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warm, "interval": "step"}}


# ----------------------------------------------------------------------------- one fit


class Setup(s60.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw")
        self.arms += {
            "noisy_reg": ("dw_default",), "deterministic": ("decay_free",),
            "sparse_emb": ("decay_loss",), "stream_steps": ("own_learned",),
        }.get(name, ())  # fmt: skip
        self.own = {"noisy_reg": 1e-4, "sparse_emb": 1e-4, "multitask": 0.01}.get(name, 5e-4)
        self.classes, self.collate, self.regression = 10, None, name == "noisy_reg"
        if name == "sparse_emb":
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), Docs(*te)
            self.classes, self.collate = 4, bag_collate
            return
        fashion = name in ("ckpt_mlp", "ckpt_reentrant", "multitask")
        splits = images(data, "fashion-mnist" if fashion else "mnist", seed, 2000, 300, 2000)
        self.train, self.val, self.test = (tensors(s) for s in splits)
        if self.regression:
            self.train, self.val, self.test = (
                TensorDataset(*rotated(d.tensors[0], seed + 100 * k))
                for k, d in enumerate((self.train, self.val, self.test))
            )

    def drop_ins(self, arm: str) -> list:
        """The arm's drop-in, as README.md writes it (``decoupled=True`` under AdamW; the
        regression's data weights ``objective="mean_loss"``)."""
        if arm in ("decay", "decay_free", "decay_loss"):
            kw: dict[str, Any] = {"max_overhead": None} if arm == "decay_free" else {}
            if arm == "decay_loss":  # what the manual-optimization refusal says to pass
                kw["training_loss"] = lambda m, b: F.cross_entropy(m(b[0]), b[1])
            return [LearnedWeightDecay(self.own, decoupled=self.name == "multitask", **kw)]
        if arm == "dw":
            return [LearnedDataWeights(**({"objective": "mean_loss"} if self.regression else {}))]
        return [LearnedDataWeights()] if arm == "dw_default" else []

    def corrupted(self) -> tuple[Any, torch.Tensor]:
        """The training set with its corruption, and the mask of the corrupted rows."""
        if self.regression:
            x, y = self.train.tensors
            y2, bad = heavy_tailed(y, self.seed)
            return TensorDataset(x, y2), bad
        return noisy_labels(self.train, self.classes, self.seed)

    def with_groups(self, data: TensorDataset) -> TensorDataset:
        x, y = data.tensors
        return TensorDataset(x, y, COARSE[y])

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        val_set = self.with_groups(self.val) if name == "multitask" else self.val
        val = recipe_loader(val_set, self.collate, 64, False, False)
        if name == "multitask":
            train = self.with_groups(train)
        if name == "stream_steps":
            stream = Stream(train, self.seed)
            loader = DataLoader(IndexedDataset(stream) if per_sample else stream, batch_size=64)
            model = s57.MLP(wd, per_sample)
            self.tr = trainer(
                cbs, -1, max_steps=500, val_check_interval=50, check_val_every_n_epoch=None
            )
        else:
            batch = 32 if name == "sparse_emb" else 64
            loader = recipe_loader(train, self.collate, batch, per_sample, True)
            epochs = {"sparse_emb": 8, "noisy_reg": 12, "deterministic": 8}.get(name, 10)
            if name == "noisy_reg":
                model = AngleCNN(wd, per_sample)
            elif name.startswith("ckpt"):
                model = CheckpointedMLP(wd, per_sample, reentrant=name == "ckpt_reentrant")
            elif name == "sparse_emb":
                model = SparseNews(wd, per_sample)
            elif name == "multitask":
                model = MultiTask(wd, per_sample, total_steps=epochs * math.ceil(2000 / 64))
            else:
                model = s57.MLP(wd, per_sample)
            kw = {"deterministic": True} if name == "deterministic" else {}
            self.tr = trainer(cbs, epochs, **kw)
        self.tr.fit(model, loader, val)
        if name == "deterministic":  # the same fit again: the flag promises the same weights
            again_cbs = self.drop_ins(record["arm"])
            torch.manual_seed(self.seed)
            again = s57.MLP(wd, per_sample)
            loader = recipe_loader(train, None, 64, per_sample, True)
            trainer(again_cbs, 8, deterministic=True).fit(again, loader, val)
            record["repeat_equal"] = all(
                torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters())
            )
            record["repeat_max_diff"] = max(
                float((a - b).abs().max()) for a, b in zip(model.parameters(), again.parameters())
            )
        return model

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test loss (MSE for the regression) and accuracy (the regression: the share
        of angles within 7.5°)."""
        test = recipe_loader(self.test, self.collate, 64, False, False)
        if not self.regression:
            return test_loss(model, test)
        model.eval()
        with torch.no_grad():
            x, y = self.test.tensors
            out = model(x)
        close = ((out - y).abs() * DEGREES < 7.5).float().mean()
        return float(F.mse_loss(out, y)), float(close)

    def run(self, arm: str) -> dict[str, Any]:
        with package_logs() as logs:
            noisy, per_sample = arm in ("plain", "dw", "dw_default"), arm.startswith("dw")
            train, bad = self.corrupted() if noisy else (self.train, None)
            wd = 0.0 if arm.startswith("decay") else self.own
            if arm == "own_learned":  # the own recipe at the λ the decay learned (its mean)
                wd = learned_lam([OUT], self.name, self.seed)
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return scored_record(self, record, model, logs, cbs, bad, per_sample)

    def flags_record(self, record: dict[str, Any], cb: LearnedDataWeights, bad: Tensor) -> None:
        """``flagged()`` against the corrupted rows (its warnings kept), and for the regression
        the weights' AUC at telling the rows moved by more than 1 (30°) from the clean ones."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            flagged = cb.flagged()
        hit = int(bad[flagged].sum()) if len(flagged) else 0
        record["flagged"] = {
            "n": len(flagged), "precision": hit / max(len(flagged), 1),
            "recall": hit / max(int(bad.sum()), 1),
            "warnings": [str(w.message)[:300] for w in caught],
        }  # fmt: skip
        if self.regression:
            moved = (self.corrupted()[0].tensors[1] - self.train.tensors[1]).abs()
            w = cb.data_weights().detach().float().numpy()
            large, clean = (moved > 1).numpy(), (~bad).numpy()
            record["auc_large"] = auc(w[large], w[clean])
            record["flagged"]["recall_large"] = float(large[flagged.numpy()].sum() / large.sum())


VERSUS = {
    "decay": "own", "dw": "plain", "dw_default": "plain", "decay_free": "own", "decay_loss": "own",
    "own_learned": "own",
}  # fmt: skip
OUT = Path("benchmarks/results/user_recipes/s61/records.json")


def table(records: list[dict[str, Any]]) -> str:
    """The paired table of this round (`recipe_harness.paired_table`), then each drop-in arm's
    CPU-time ratio to its comparison (the wall ratio reads other processes' load too), the
    flags' precision / recall, and whether the ``deterministic`` recipe's two fits ended equal."""
    by = {(r["recipe"], r["arm"], r["seed"]): r for r in records}
    lines = [paired_table(records, VERSUS, accuracy=True), "", "| recipe | arm | CPU × | notes |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for (recipe, arm), seeds in sorted(_group(records).items()):
        refs = [by.get((recipe, VERSUS.get(arm, ""), s)) for s in seeds]
        runs = [by[(recipe, arm, s)] for s in seeds]
        cpu = [r["cpu_s"] / f["cpu_s"] for r, f in zip(runs, refs) if f and "cpu_s" in r]
        notes = []
        if any("flagged" in r for r in runs):
            notes.append("flags P/R " + ", ".join(
                f"{r['flagged']['precision']:.2f}/{r['flagged']['recall']:.2f}" for r in runs
            ))  # fmt: skip
        if any("auc_large" in r for r in runs):
            notes.append("AUC (moved > 30°) " + ", ".join(f"{r['auc_large']:.2f}" for r in runs))
        if any("repeat_equal" in r for r in runs):
            notes.append("repeat equal " + ", ".join(str(r.get("repeat_equal")) for r in runs))
        span = f"{min(cpu):.2f}–{max(cpu):.2f}" if cpu else ""
        lines.append(f"| {recipe} | {arm} | {span} | {'; '.join(notes)} |")
    return "\n".join(lines)


def _group(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for r in records:
        out.setdefault((r["recipe"], r["arm"]), []).append(r["seed"])
    return {k: sorted(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(
        argv, sys.modules[__name__], "s61", seeds=[0, 1, 2], shown=("steps", "repeat_equal")
    )


if __name__ == "__main__":
    main()
