"""Session 53: imbalanced training data WITHOUT a class-rebalancing sampler (issue 27 item 5).

MNIST, a 6000-image training pool per seed, some classes down-sampled, trained from a plain
shuffled DataLoader (no ``WeightedRandomSampler``: what a user writes first), a balanced clean
validation set (30 images per class), judged on the whole MNIST test set (10,000 images):

* ``two20``   digits 3 and 8 kept at a twentieth (~30 images each, ~4860 rows);
* ``five10``  digits 5-9 kept at a tenth (~300 each, ~3300 rows): session 50's imbalanced
              recipe without its sampler.

``--noise`` moves 35 % of the training labels to another class (as session 50's recipes do).
The model is session 50's ``SmallCNN`` (Adam lr 2e-3, weight decay 1e-4), 6 epochs, batch 64.
Arms, per seed in one process:

* ``plain``       the recipe as it is;
* ``invfreq``     cross entropy with class weights n / (K n_c) (torch's ``weight=``: the
                  batch's loss Σ w_yᵢ ℓᵢ / Σ w_yᵢ), the standard user alternative;
* ``dw``          ``LearnedDataWeights()``, every default;
* ``dw_class``    ``LearnedDataWeights(per="class", num_classes=10)``;
* ``dw_batch``    ``LearnedDataWeights(gauge="batch")``;
* ``dw_centred``  ``LearnedDataWeights(gauge="class_centred")``;
* ``dw_batch_low`` ``LearnedDataWeights(gauge="batch", initial=0.1)`` (a diagnosis: room for a
                  row's weight to rise 10×, not 2×, above its start);
* ``sampler``     plain training from a ``WeightedRandomSampler`` drawing each row with
                  probability ∝ 1 / n_c (the classes drawn equally often; session 50's recipe);
* ``sampler_dw``  the same sampler with ``LearnedDataWeights()`` (``"auto"`` keeps ``"batch"``
                  there, session 52).

Recorded per fit: balanced test accuracy (the mean of the per-class recalls), test accuracy,
the minority classes' mean recall, test cross entropy, the clean validation loss, wall and CPU
seconds; for the data weights each class's mean weight and the gauge the fit ran with.

Usage (from the repository root; ``--data``: the folder holding ``mnist/``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_imbalanced_s53.py --data ../shared/data \
        --recipes two20 five10 --seeds 0 1 2 3 4 --out benchmarks/results/user_recipes/s53_imb.json
    python benchmarks/bench_imbalanced_s53.py --table \
        --out benchmarks/results/user_recipes/s53_imb.json

Each run merges its records into ``--out`` (a rerun replaces the same recipe, noise, arm and
seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_user_recipes_s50 import SmallCNN  # noqa: E402
from recipe_harness import (  # noqa: E402
    corrupt,
    images,
    mean_se,
    merge_records,
    read_records,
    timed_fit,
    trainer,
    write_json,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights  # noqa: E402

CLASSES = 10
RECIPES = {"two20": ((3, 8), 20), "five10": ((5, 6, 7, 8, 9), 10)}
ARMS = (
    "plain",
    "invfreq",
    "dw",
    "dw_class",
    "dw_batch",
    "dw_centred",
    "dw_batch_low",
    "sampler",
    "sampler_dw",
)
#: each data-weights arm's settings
DW = {
    "dw": {},
    "dw_class": {"per": "class", "num_classes": CLASSES},
    "dw_batch": {"gauge": "batch"},
    "dw_centred": {"gauge": "class_centred"},
    "dw_batch_low": {"gauge": "batch", "initial": 0.1},
    "sampler_dw": {},
}
EPOCHS, BATCH, VAL_PER_CLASS = 6, 64, 30


class InverseFrequencyCNN(SmallCNN):
    """SmallCNN whose training loss weighs each class by n / (K n_c) (torch's ``weight=``)."""

    def __init__(self, class_weights: torch.Tensor, wd: float = 1e-4) -> None:
        super().__init__(wd, per_sample=False)
        self.register_buffer("class_weights", class_weights)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y, weight=self.class_weights)
        self.log("train_loss", loss)
        return loss


def data(folder: Path, recipe: str, seed: int, noise: bool):
    """The imbalanced training set (labels, and the mask of moved labels), the balanced
    validation set, the whole test set."""
    rare, keep_one_in = RECIPES[recipe]
    (x, y), (xv, yv), (xt, yt) = images(folder, "mnist", seed, 6000, 1000, 10000)
    is_rare = torch.isin(y, torch.tensor(rare))
    keep = ~is_rare | (torch.arange(len(y)) % keep_one_in == 0)
    x, y = x[keep], y[keep]
    val = torch.cat([torch.nonzero(yv == c).flatten()[:VAL_PER_CLASS] for c in range(CLASSES)])
    bad = torch.zeros(len(y), dtype=torch.bool)
    if noise:
        y, bad = corrupt(y, CLASSES, seed)
    return (x, y, bad), (xv[val], yv[val]), (xt, yt)


def evaluate(model, x: torch.Tensor, y: torch.Tensor, rare: tuple[int, ...]) -> dict[str, float]:
    """Test cross entropy, accuracy, balanced accuracy (mean per-class recall), and the rare
    classes' mean recall."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i : i + 1000]) for i in range(0, len(x), 1000)])
    pred = out.argmax(1)
    recall = torch.stack([(pred[y == c] == c).float().mean() for c in range(CLASSES)])
    return {
        "test_loss": F.cross_entropy(out, y).item(),
        "test_acc": (pred == y).float().mean().item(),
        "bal_acc": recall.mean().item(),
        "rare_recall": recall[list(rare)].mean().item(),
        "recall": [round(r, 4) for r in recall.tolist()],
    }


def run(folder: Path, recipe: str, seed: int, arm: str, noise: bool) -> dict[str, Any]:
    (x, y, bad), (xv, yv), (xt, yt) = data(folder, recipe, seed, noise)
    rare = RECIPES[recipe][0]
    counts = torch.bincount(y, minlength=CLASSES).float()
    torch.manual_seed(seed)
    cb = LearnedDataWeights(**DW[arm]) if arm in DW else None
    if arm == "invfreq":
        model = InverseFrequencyCNN(len(y) / (CLASSES * counts))
    else:
        model = SmallCNN(1e-4, per_sample=cb is not None)
    train = TensorDataset(x, y)
    if cb is not None and cb.per == "sample":
        train = IndexedDataset(train)
    if arm.startswith("sampler"):  # every class drawn equally often, n draws an epoch
        sampler = WeightedRandomSampler((1.0 / counts)[y], num_samples=len(y), replacement=True)
        loader = DataLoader(train, batch_size=BATCH, sampler=sampler)
    else:
        loader = DataLoader(train, batch_size=BATCH, shuffle=True)
    val = DataLoader(TensorDataset(xv, yv), batch_size=256)
    tr = trainer([cb] if cb is not None else [], EPOCHS)
    record: dict[str, Any] = {"recipe": recipe, "noise": noise, "arm": arm, "seed": seed}
    record["counts"] = counts.int().tolist()
    timed_fit(record, lambda: tr.fit(model, loader, val), width=300)
    if "error" in record:
        return record
    record.update(evaluate(model, xt, yt, rare))
    record["val_loss"] = evaluate(model, xv, yv, rare)["test_loss"]
    if cb is not None:
        w = cb.data_weights().detach().float()
        if cb.per == "sample":
            record["gauge"] = cb.problem.weights.gauge
            w_class = torch.stack([w[y == c].mean() for c in range(CLASSES)])
            if noise:
                record["w_bad"], record["w_good"] = w[bad].mean().item(), w[~bad].mean().item()
        else:
            w_class = w
        record["w_class"] = [round(v, 4) for v in w_class.tolist()]
        common = [c for c in range(CLASSES) if c not in rare]
        record["w_rare_over_common"] = (w_class[list(rare)].mean() / w_class[common].mean()).item()
    return record


def mean_se_cell(values: list[float]) -> str:
    """``mean ± s.e.``"""
    return "{:.4f} ± {:.4f}".format(*mean_se(values))


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe (and noise), each arm's means over the seeds, and its paired
    difference from ``dw`` in balanced accuracy (points, seeds better / worse)."""
    lines = [
        "| recipe | arm | seeds | balanced acc. | acc. | rare recall | test loss | wall s "
        "| − dw, bal. acc. (points; better / worse) | rare ω̄ / common ω̄ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe in RECIPES:
        for noise in (False, True):
            rows = [r for r in records if r["recipe"] == recipe and r["noise"] == noise]
            if not rows:
                continue
            dw = {r["seed"]: r for r in rows if r["arm"] == "dw"}
            for arm in ARMS:
                rs = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["seed"])
                if not rs:
                    continue
                paired = [
                    100 * (r["bal_acc"] - dw[r["seed"]]["bal_acc"]) for r in rs if r["seed"] in dw
                ]
                diff = "–"
                if paired and arm != "dw":
                    a = np.asarray(paired)
                    mean, se = mean_se(a)
                    diff = f"{mean:+.2f} ± {se:.2f} ({(a > 0).sum()} / {(a < 0).sum()})"
                ratio = [r["w_rare_over_common"] for r in rs if "w_rare_over_common" in r]
                name = f"{recipe}{' +35 % noise' if noise else ''}"
                means = " | ".join(
                    mean_se_cell([r[k] for r in rs])
                    for k in ("bal_acc", "test_acc", "rare_recall", "test_loss")
                )
                lines.append(
                    f"| {name} | {arm} | {','.join(str(r['seed']) for r in rs)} | {means} "
                    f"| {np.mean([r['wall_s'] for r in rs]):.1f} | {diff} "
                    f"| {f'{np.mean(ratio):.2f}' if ratio else '–'} |"
                )
    return "\n".join(lines)


def _key(r: dict[str, Any]) -> tuple:
    """A record's identity: a rerun of the same recipe, noise, arm and seed replaces it."""
    return r["recipe"], r["noise"], r["arm"], r["seed"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--noise", action="store_true", help="move 35 %% of the training labels")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/user_recipes/s53_imb.json"))
    p.add_argument("--table", action="store_true", help="print --out's table and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_records(args.out)))
        return
    torch.set_num_threads(1)
    command = " ".join(["python", *sys.argv])
    old = read_records(args.out)
    for recipe in args.recipes:
        for seed in args.seeds:  # every arm of a seed in turn: paired, in the same hour
            for arm in args.arms:
                rec = run(args.data, recipe, seed, arm, args.noise)
                rec["command"] = command
                shown = {
                    k: v
                    for k, v in rec.items()
                    if k not in ("warnings", "command", "recall", "counts")
                }
                print(json.dumps(shown), flush=True)
                old = merge_records(old, [rec], _key)
                write_json(args.out, {"records": old})


if __name__ == "__main__":
    main()
