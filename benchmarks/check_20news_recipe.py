"""A new user's recipe nobody here tuned: 20 Newsgroups bag of words through Lightning.

The 2,000 most frequent terms (rows scaled to unit norm), an MLP 2000-256-20, Adam (lr 1e-3),
batch 64, the held-out 20 Newsgroups test set (7,532 documents); data from ``../shared/data``
(``examples/datasets.py``). Two checks, per seed:

* ``weight_decay``: 2,000 training and 1,000 validation documents, 12 epochs, dropout 0.2: no
  weight decay; the grid's pick (Adam's ``weight_decay`` in 1e-5 … 1e-1, picked on validation
  loss); ``LearnedWeightDecay(1e-4)`` with its defaults and with ``max_overhead=None``.
* ``data_weights``: half the training documents (5,657) with 40 % symmetric label noise, 500 clean
  validation documents, 15 epochs: plain; the clean-only oracle; Ren et al.'s look-ahead
  reweighting; ``LearnedDataWeights()`` with its defaults (precision / recall of ``flagged()``).

``python benchmarks/check_20news_recipe.py --seeds 0 1 2`` (writes
benchmarks/results/check_20news/check_20news.json)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_noisy_labels import look_ahead_weighted_loss  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GRID = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def load(root: Path) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Unit-norm counts of the 2,000 most frequent terms: train and test."""
    sys.path.insert(0, str(REPO / "examples"))
    from datasets import load_20news_vectorized, use_data_root  # examples stay out of the package

    use_data_root(root)
    X, y, X_test, y_test = load_20news_vectorized()
    cols = np.asarray(X.sum(0)).ravel().argsort()[::-1][:2000]

    def dense(m: Any) -> Tensor:
        d = torch.tensor(m[:, cols].toarray(), dtype=torch.float32)
        return d / d.norm(dim=1, keepdim=True).clamp_min(1e-8)

    return dense(X), torch.tensor(y), dense(X_test), torch.tensor(y_test)


class Net(pl.LightningModule):
    def __init__(self, weight_decay: float = 0.0, per_sample: bool = False, dropout: float = 0.0):
        super().__init__()
        self.weight_decay, self.per_sample = weight_decay, per_sample
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2000, 256), torch.nn.ReLU(), torch.nn.Dropout(dropout),
            torch.nn.Linear(256, 20),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none" if self.per_sample else "mean")
        self.log("train_loss", loss.mean())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.weight_decay)


class Ren(Net):
    """Ren et al.'s look-ahead reweighting at every step (the noisy-label benchmark's, at Adam's
    lr 1e-3 as the look-ahead step)."""

    def __init__(self, Xv: Tensor, yv: Tensor) -> None:
        super().__init__()
        self.Xv, self.yv, self.gen = Xv, yv, torch.Generator().manual_seed(0)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return look_ahead_weighted_loss(self.net, batch, (self.Xv, self.yv), 1e-3, self.gen)


def fit(model: Net, train: Any, val: TensorDataset, epochs: int, callbacks: list) -> float:
    """Train; CPU seconds."""
    trainer = pl.Trainer(
        max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    start = time.process_time()
    trainer.fit(
        model, DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, batch_size=1000)
    )
    return time.process_time() - start


def scores(model: Net, X: Tensor, y: Tensor) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(X)
    return {
        "loss": float(F.cross_entropy(logits, y)),
        "acc": float((logits.argmax(1) == y).float().mean()),
    }


def look_aheads(spec: str | None) -> dict[str, dict[str, Any]]:
    """``--look-aheads`` ``name=Class,name=Class``: more drop-in runs, each with
    ``look_ahead=Class()`` (a class of hypertorch_sid, e.g. ``valcurv=ValidationCurvature``)."""
    import hypertorch_sid

    out = {}
    for item in (spec or "").split(","):
        if item:
            name, cls = item.split("=")
            out[name] = {"look_ahead": getattr(hypertorch_sid, cls)}
    return out


def adam_arm(wanted: bool) -> dict[str, dict[str, Any]]:
    """``--adam-arm``: the drop-in with the outer step it had before ``TrustRprop``."""
    adam = functools.partial(torch.optim.Adam, lr=0.3)
    return {"learned_adam": {"outer_optimizer": adam}} if wanted else {}


def weight_decay_check(
    data: tuple[Tensor, ...], seed: int, variants: dict[str, dict[str, Any]] | None = None,
    searches: bool = True,
) -> dict[str, Any]:  # fmt: skip
    X, y, X_test, y_test = data
    perm = torch.tensor(np.random.default_rng(seed).permutation(len(y)))
    train = TensorDataset(X[perm[:2000]], y[perm[:2000]])
    val = TensorDataset(X[perm[2000:3000]], y[perm[2000:3000]])

    def one(weight_decay: float, callbacks: list) -> dict[str, Any]:
        pl.seed_everything(seed, verbose=False)
        model = Net(weight_decay, dropout=0.2)
        cpu = fit(model, train, val, 12, callbacks)
        return {
            "val": scores(model, *val.tensors)["loss"],
            **scores(model, X_test, y_test),
            "cpu": cpu,
        }

    out: dict[str, Any] = {"no_wd": one(0.0, [])}
    if searches:
        grid = {wd: one(wd, []) for wd in GRID}
        pick = min(grid, key=lambda wd: grid[wd]["val"])
        out["grid_pick"] = {
            **grid[pick],
            "weight_decay": pick,
            "cpu": sum(g["cpu"] for g in grid.values()),
        }
    runs = {"learned": {}} if not searches else {"learned": {}, "learned_no_budget": {}}
    for name, extra in {**runs, **(variants or {})}.items():
        budget = None if name == "learned_no_budget" else 0.5
        extra = {k: v() if k == "look_ahead" else v for k, v in extra.items()}
        cb = LearnedWeightDecay(1e-4, max_overhead=budget, **extra)
        out[name] = {**one(0.0, [cb]), "hyper_steps": len(cb.history),
                     "lambda_end": float(cb.problem.decay.summary().mean())}  # fmt: skip
    return out


def noisy_split(X: Tensor, y: Tensor, seed: int) -> tuple[TensorDataset, TensorDataset, Tensor]:
    """The data-weights check's split and noise: half the documents for training with 40 %
    symmetric label noise, 500 clean validation documents; returns (train, val, noisy mask)."""
    gen = np.random.default_rng(seed)
    perm = gen.permutation(len(y))
    tr, va = perm[: len(y) // 2], perm[len(y) // 2 : len(y) // 2 + 500]
    noisy = torch.tensor(gen.random(len(tr)) < 0.4)
    y_noisy = y[tr].clone()
    y_noisy[noisy] = torch.tensor(gen.integers(0, 20, int(noisy.sum())))
    return TensorDataset(X[tr], y_noisy), TensorDataset(X[va], y[va]), noisy


def plain_scores(
    train: TensorDataset,
    val: TensorDataset,
    test: tuple[Tensor, Tensor],
    seed: int,
    make: Callable[[], Net] = Net,
) -> dict[str, Any]:
    """One training without data weights of the model ``make()`` builds once seeded."""
    pl.seed_everything(seed, verbose=False)
    model = make()
    cpu = fit(model, train, val, 15, [])
    return {**scores(model, *test), "cpu": cpu}


def drop_in_scores(
    train: TensorDataset,
    val: TensorDataset,
    test: tuple[Tensor, Tensor],
    noisy: Tensor,
    seed: int,
    **kwargs: Any,
) -> dict[str, Any]:
    """One training with ``LearnedDataWeights(**kwargs)``: test scores, CPU time, and the
    precision/recall of ``flagged()`` at naming the corrupted examples."""
    pl.seed_everything(seed, verbose=False)
    cb, model = LearnedDataWeights(**kwargs), Net(per_sample=True)
    cpu = fit(model, IndexedDataset(train), val, 15, [cb])
    flagged, bad = set(cb.flagged().tolist()), set(torch.nonzero(noisy).ravel().tolist())
    return {
        **scores(model, *test),
        "cpu": cpu,
        "precision": len(flagged & bad) / max(len(flagged), 1),
        "recall": len(flagged & bad) / len(bad),
    }


def data_weights_check(data: tuple[Tensor, ...], seed: int) -> dict[str, Any]:
    X, y, X_test, y_test = data
    train, val, noisy = noisy_split(X, y, seed)
    test = (X_test, y_test)
    clean = TensorDataset(*(t[~noisy] for t in train.tensors))
    return {
        "plain": plain_scores(train, val, test, seed),
        "oracle": plain_scores(clean, val, test, seed),
        "ren": plain_scores(train, val, test, seed, make=lambda: Ren(*val.tensors)),
        "drop_in": drop_in_scores(train, val, test, noisy, seed),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--checks", nargs="+", default=["weight_decay", "data_weights"])
    p.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/check_20news/check_20news.json"
    )
    p.add_argument(
        "--look-aheads", help="more drop-in runs: name=Class,... (e.g. valcurv=ValidationCurvature)"
    )
    p.add_argument(
        "--no-searches", action="store_true", help="weight decay: no grid, no run without budget"
    )
    p.add_argument(
        "--adam-arm", action="store_true",
        help="weight decay: also the previous default outer step, Adam(lr=0.3) on log λ",
    )  # fmt: skip
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    data = load(args.data_root)
    checks = {
        "weight_decay": lambda d, s: weight_decay_check(
            d, s, {**look_aheads(args.look_aheads), **adam_arm(args.adam_arm)}, not args.no_searches
        ),
        "data_weights": data_weights_check,
    }
    results: dict[str, Any] = {"command": " ".join(sys.argv), "runs": {c: {} for c in args.checks}}
    for seed in args.seeds:
        for c in args.checks:
            results["runs"][c][seed] = checks[c](data, seed)
            print(c, seed, json.dumps(results["runs"][c][seed]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
