"""Session 54's unseen recipes: both drop-ins on five more set-ups, written from README.md only.

Each recipe is a small ``LightningModule`` a new user would write, on small real data (20
Newsgroups, Fashion-MNIST / MNIST subsets, scikit-learn's diabetes), trained per seed in up to
five arms (as in ``bench_user_recipes_s53.py``):

* ``own``   the recipe as written, with its own fixed ``weight_decay``, clean data;
* ``decay`` ``LearnedWeightDecay(<own value>)`` with every default, the optimizer's decay removed;
* ``plain`` the recipe (own decay) on corrupted training data, clean validation data;
* ``dw``    the same corrupted data with ``LearnedDataWeights()`` (the regression:
            ``objective="mean_loss"`` as README.md says), ``reduction="none"``, ``IndexedDataset``;
* ``both``  (frozen backbone only) both callbacks in one Trainer on the corrupted data.

The recipes:

* ``lm_tied_lstm``  a word-level LSTM language model on 20 Newsgroups (2000 words, 32 tokens a
  row), the output layer tied to the embedding (``out.weight = emb.weight``), a per-token loss of
  shape (B, T); corrupted: 30 % of the rows' tokens replaced by random words;
* ``frozen_backbone``  a CNN pre-trained on MNIST, frozen (``requires_grad_(False)``; the optimizer
  still given ``self.parameters()``), a new two-layer head trained on Fashion-MNIST; the frozen
  weights are checked unchanged after each fit;
* ``compiled_mlp``  Fashion-MNIST MLP whose network is ``torch.compile``'d;
* ``reg_b1``  diabetes MLP regression with an output of shape (B, 1) and
  ``F.mse_loss(out, y, reduction="none")`` of shape (B, 1); corrupted: 30 % of the targets shifted;
* ``trainer_feats``  MNIST MLP whose blocks run under ``torch.utils.checkpoint`` (gradient
  checkpointing), a ``training_step`` returning ``{"loss": ...}``, ``Trainer(max_steps=240,
  val_check_interval=0.25, limit_train_batches=0.5)`` without ``max_epochs``.

Judged on a held-out test set nothing was chosen on (the recipe's loss; accuracy where it has
one). Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s54.py --data ../shared/data \
        --recipes all --seeds 0 1 --out benchmarks/results/user_recipes/s54/records.json

Each run merges its records into ``--out``; ``--table`` prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_harness import (  # noqa: E402
    RecipeModule,
    callbacks_record,
    diabetes,
    images,
    merge_records,
    news,
    noisy_labels,
    paired,
    read_records,
    recipe_key,
    recipe_loader,
    shift_targets,
    timed_fit,
    trainer,
    write_json,
)

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = (
    "lm_tied_lstm", "frozen_backbone", "compiled_mlp", "reg_b1", "trainer_feats", "groups_lr",
)  # fmt: skip
VOCAB, T = 2000, 32

# ----------------------------------------------------------------------------- data


def lm_rows(data: Path, seed: int):
    """20 Newsgroups documents of ≥ T + 1 known words: their first T + 1 word ids (2000-word
    vocabulary, rarer words dropped), as (inputs (N, T), next words (N, T))."""
    tr, va, te = news(data, seed, 1800, 300, 1000, vocab=VOCAB)
    out = []
    for seqs, _ in (tr, va, te):
        rows = torch.stack([s[: T + 1] for s in seqs if len(s) > T])
        out.append((rows[:, :-1], rows[:, 1:]))
    return out


def noisy_lm(y: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """30 % of the rows' next words replaced by random words (a garbled transcript)."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < 0.3
    rand = torch.randint(1, VOCAB, y.shape, generator=g)
    return torch.where(bad[:, None], rand, y), bad


# ----------------------------------------------------------------------------- recipes


class Recipe(RecipeModule):
    """The harness's recipe module with Adam (lr 1e-3) over ``self.parameters()``."""

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class TiedLSTM(Recipe):
    """Embedding 64 → LSTM 64 → output layer tied to the embedding; loss per token (B, T)."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(VOCAB, 64)
        self.lstm = nn.LSTM(64, 64, batch_first=True)
        self.out = nn.Linear(64, VOCAB)
        self.out.weight = self.emb.weight  # tied

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        return self.out(h)

    def per_sample_loss(self, out, y):  # (B, T)
        return F.cross_entropy(out.transpose(1, 2), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class Backbone(nn.Sequential):
    def __init__(self):
        super().__init__(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        )  # fmt: skip


_PRETRAINED: dict[int, dict[str, torch.Tensor]] = {}


def pretrained(data: Path, seed: int) -> dict[str, torch.Tensor]:
    """A backbone trained 2 epochs on 4000 MNIST digits (plain PyTorch), once per seed."""
    if seed not in _PRETRAINED:
        (x, y), _, _ = images(data, "mnist", seed + 50, 4000, 10, 10)
        torch.manual_seed(seed)
        net = nn.Sequential(Backbone(), nn.Linear(800, 10))
        opt = torch.optim.Adam(net.parameters(), lr=2e-3)
        for _ in range(2):
            for i in torch.randperm(4000).split(64):
                opt.zero_grad()
                F.cross_entropy(net(x[i]), y[i]).backward()
                opt.step()
        _PRETRAINED[seed] = {k: v.clone() for k, v in net[0].state_dict().items()}
    return _PRETRAINED[seed]


class FrozenHead(Recipe):
    def __init__(self, wd, per_sample, state):
        super().__init__(wd, per_sample)
        self.backbone = Backbone()
        self.backbone.load_state_dict(state)
        self.backbone.requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(800, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.backbone(x))


class CompiledMLP(Recipe):
    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = torch.compile(
            nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        )

    def forward(self, x):
        return self.net(x)


class RegB1(Recipe):
    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 1))  # fmt: skip

    def forward(self, x):
        return self.net(x)  # (B, 1)

    def per_sample_loss(self, out, y):
        return F.mse_loss(out, y, reduction="none")  # (B, 1)


class CkptMLP(Recipe):
    """Blocks under gradient checkpointing; training_step returns a dict."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.b1 = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU())
        self.b2 = nn.Sequential(nn.Linear(256, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        if self.training:
            h = checkpoint(self.b1, x, use_reentrant=False)
            h = checkpoint(self.b2, h, use_reentrant=False)
        else:
            h = self.b2(self.b1(x))
        return self.head(h)

    def training_step(self, batch, batch_idx):
        *x, y = batch
        loss = self.per_sample_loss(self(*x), y)
        return {"loss": loss if self.per_sample else loss.mean(), "n": len(y)}


class GroupsLR(Recipe):
    """Fashion-MNIST MLP with LayerNorm; SGD momentum in two parameter groups, the common recipe:
    matrices at lr 0.05 with the decay, biases and norm weights at lr 0.1 without it."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        mats = [p for p in self.parameters() if p.ndim >= 2]
        rest = [p for p in self.parameters() if p.ndim < 2]
        return torch.optim.SGD(
            [{"params": mats, "lr": 0.05, "weight_decay": self.wd},
             {"params": rest, "lr": 0.1, "weight_decay": 0.0}],
            momentum=0.9,
        )  # fmt: skip


# ----------------------------------------------------------------------------- one fit


class Setup:
    def __init__(self, name: str, data: Path, seed: int) -> None:
        self.name, self.seed, self.data = name, seed, data
        self.epochs, self.batch, self.kind, self.classes = 5, 64, "ce", 10
        self.arms, self.dw_kw, self.trainer_kw = ("own", "decay", "plain", "dw"), {}, {}
        self.own = 1e-4
        if name == "lm_tied_lstm":
            tr, va, te = lm_rows(data, seed)
            self.own, self.epochs, self.kind, self.make = 1e-6, 6, "lm", TiedLSTM
        elif name == "reg_b1":
            tr, va, te = diabetes(seed)
            tr, va, te = ((x, y[:, None]) for x, y in (tr, va, te))
            self.epochs, self.batch, self.kind, self.make = 60, 32, "mse", RegB1
            self.dw_kw = {"objective": "mean_loss"}
        else:
            which = "mnist" if name == "trainer_feats" else "fashion-mnist"
            tr, va, te = images(data, which, seed, 3000, 300, 2000)
            if name == "frozen_backbone":
                state = pretrained(data, seed)
                self.make = lambda wd, ps: FrozenHead(wd, ps, state)
                self.arms = ("own", "decay", "plain", "dw", "both")
            elif name == "groups_lr":
                self.make, self.own = GroupsLR, 5e-4
                self.arms = ("own", "decay", "decay_weights", "plain", "dw")
            elif name == "compiled_mlp":
                self.make, self.epochs = CompiledMLP, 3
            elif name == "trainer_feats":
                self.make = CkptMLP
                self.trainer_kw = {
                    "max_steps": 240, "max_epochs": None, "val_check_interval": 0.25,
                    "limit_train_batches": 0.5,
                }  # fmt: skip
            else:
                raise SystemExit(f"unknown recipe {name!r}")
        self.train, self.val, self.test = (TensorDataset(*s) for s in (tr, va, te))

    def noisy_train(self):
        if self.kind == "ce":
            return noisy_labels(self.train, self.classes, self.seed)
        x, y = self.train.tensors
        if self.kind == "lm":
            y2, bad = noisy_lm(y, self.seed)
        elif self.kind == "mse":
            y2, bad = shift_targets(y[:, 0], self.seed)
            y2 = y2[:, None]
        return TensorDataset(x, y2), bad

    def metrics(self, model: nn.Module, data) -> tuple[float, float | None]:
        model.eval()
        total, hit, n = 0.0, 0.0, 0
        with torch.no_grad():
            for x, y in DataLoader(data, batch_size=500):
                out = model(x).float()
                total += float(model.per_sample_loss(out, y).reshape(len(y), -1).mean(1).sum())
                if self.kind == "ce":
                    hit += float((out.argmax(1) == y).sum())
                elif self.kind == "lm":
                    hit += float((out.argmax(-1) == y).float().mean(1).sum())
                n += len(y)
        return total / n, (None if self.kind == "mse" else hit / n)

    def run(self, arm: str) -> dict[str, Any]:
        noisy = arm in ("plain", "dw", "both")
        per_sample = arm in ("dw", "both")
        train, bad = self.noisy_train() if noisy else (self.train, None)
        wd = 0.0 if arm in ("decay", "both", "decay_weights") else self.own
        cbs: list = []
        if arm in ("decay", "both"):
            cbs.append(LearnedWeightDecay(self.own))
        if arm == "decay_weights":  # the groups' "no decay on biases and norms", kept
            cbs.append(LearnedWeightDecay(self.own, apply_to="weights"))
        if arm in ("dw", "both"):
            cbs.append(LearnedDataWeights(**self.dw_kw))
        torch.manual_seed(self.seed)
        model = self.make(wd, per_sample)
        frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
        kw = dict(self.trainer_kw)
        epochs = kw.pop("max_epochs", self.epochs)
        tr = trainer(cbs, epochs, **kw)
        record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}
        val = recipe_loader(self.val, None, self.batch, False, False)
        train_loader = recipe_loader(train, None, self.batch, per_sample, True)
        timed_fit(record, lambda: tr.fit(model, train_loader, val), width=600)
        if "error" in record:
            return record
        params = dict(model.named_parameters())
        record["frozen_changed"] = max(
            (float((params[k].detach() - v).abs().max()) for k, v in frozen.items()), default=0.0
        )
        record["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        record["test_loss"], record["test_acc"] = self.metrics(model, self.test)
        record["steps"] = tr.global_step
        callbacks_record(record, cbs, bad)
        return record


def table(records: list[dict[str, Any]]) -> str:
    """Per recipe: each arm's test loss mean over seeds and the paired differences."""
    out = ["| recipe | arm | seeds | test loss | − comparison (s.e., worse) | wall s | note |",
           "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    by = {}
    for r in records:
        by.setdefault((r["recipe"], r["arm"]), {})[r["seed"]] = r
    versus = {"decay": "own", "decay_weights": "own", "dw": "plain", "both": "plain"}
    for (recipe, arm), runs in sorted(by.items()):
        if any("error" in r for r in runs.values()):
            err = next(r["error"] for r in runs.values() if "error" in r)
            out.append(f"| {recipe} | {arm} | {len(runs)} | error | | | {err[:160]} |")
            continue
        loss = np.array([r["test_loss"] for r in runs.values()])
        diff = ""
        ref = by.get((recipe, versus.get(arm, "")), {})
        seeds = [s for s in runs if s in ref and "test_loss" in ref[s]]
        if seeds:
            diff = paired(runs[s]["test_loss"] - ref[s]["test_loss"] for s in seeds)
        wall = f"{np.mean([r['wall_s'] for r in runs.values()]):.1f}"
        if seeds:  # the wall time's ratio to the comparison's, paired by seed
            ratio = [runs[s]["wall_s"] / ref[s]["wall_s"] for s in seeds]
            wall += f" ({min(ratio):.1f}–{max(ratio):.1f}×)"
        note = []
        if "lam_range" in next(iter(runs.values())):
            note.append("λ " + "; ".join(f"{r['lam_range'][0]:.2g}–{r['lam_range'][1]:.2g}"
                                         for r in runs.values()))  # fmt: skip
        if "auc" in next(iter(runs.values())):
            note.append("AUC " + ", ".join(f"{r['auc']:.2f}" for r in runs.values()))
        if "due_ran" in next(iter(runs.values())):
            note.append("due/ran " + "; ".join(str(r["due_ran"]) for r in runs.values()))
        out.append(f"| {recipe} | {arm} | {len(runs)} | {loss.mean():.4f} | {diff} | "
                   f"{wall} | {'; '.join(note)} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    run_cli(argv, sys.modules[__name__], "s54", seeds=[0, 1], shown=("frozen_changed",))


def run_cli(
    argv: list[str] | None,
    bench: Any,
    folder: str,
    seeds: list[int],
    shown: tuple[str, ...] = (),
) -> None:
    """The command line of this round and the next: ``bench``'s ``RECIPES`` × ``--seeds`` ×
    ``Setup(...).arms`` (or ``--arms``), each record merged into ``--out`` (default
    ``benchmarks/results/user_recipes/<folder>/records.json``) and printed with the package's
    warnings; ``--table`` prints ``bench.table`` of ``--out`` and stops."""
    parser = argparse.ArgumentParser(description=bench.__doc__)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--recipes", nargs="+", default=["all"])
    parser.add_argument("--arms", nargs="+", default=None)
    parser.add_argument("--seeds", nargs="+", type=int, default=seeds)
    parser.add_argument("--threads", type=int, default=1)
    default_out = Path(f"benchmarks/results/user_recipes/{folder}/records.json")
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    records = read_records(args.out)
    if args.table:
        print(bench.table(records))
        return
    torch.set_num_threads(args.threads)
    pl.seed_everything(0, verbose=False)
    keys = ("test_loss", "wall_s", "lam_range", "auc", "due_ran", "error") + shown
    for name in bench.RECIPES if args.recipes == ["all"] else args.recipes:
        for seed in args.seeds:
            setup = bench.Setup(name, args.data, seed)
            for arm in args.arms or setup.arms:
                if arm not in setup.arms:
                    continue
                rec = setup.run(arm)
                records = merge_records(records, [rec], recipe_key)
                write_json(args.out, records)  # a bare list, as session 54 kept it
                print(name, arm, seed, {k: rec.get(k) for k in keys}, flush=True)
                for line in rec.get("warnings", []) + rec.get("logs", []):
                    print("   |", line[:300], flush=True)


if __name__ == "__main__":
    main()
