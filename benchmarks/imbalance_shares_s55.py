"""Session 55: eq. rarity (the imbalance hint's factor r_c = π_c / s⁰_c) on every recipe's data.

No fit: each recipe's training labels (clean and with its noise), the training loader's draws
(a plain shuffled loader draws each row once an epoch; a ``WeightedRandomSampler`` is drawn
for one epoch, the fewest draws the hint can read) and the whole validation set, read by
:class:`hypertorch_sid.lightning.imbalance.ClassRarity` as the callback reads its record. Per
recipe and seed: the largest r_c, the largest lower end (π_c's Wilson interval), and whether
the hint fires (lower end ≥ ``RARE_CLASS_FACTOR``).

Usage (from the repository root; ``--data``: the folder holding ``mnist/``, ``fashion-mnist/``,
``20news/``)::

    python benchmarks/imbalance_shares_s55.py --data ../shared/data --seeds 0 1 2 3 4 \
        --out benchmarks/results/user_recipes/s55_imbalance_shares.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_imbalanced_s53 as s53  # noqa: E402
import bench_noisy_labels as noisy  # noqa: E402
import bench_user_recipes_s50 as s50  # noqa: E402

from hypertorch_sid.lightning.imbalance import RARE_CLASS_FACTOR, ClassRarity  # noqa: E402


def shares(y: torch.Tensor, k: int) -> torch.Tensor:
    return torch.bincount(y, minlength=k).double() / len(y)


def sampler_draws(y: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """One epoch of a ``WeightedRandomSampler`` drawing each class equally often (1 / n_c per
    row, n draws with replacement): the labels drawn."""
    counts = torch.bincount(y, minlength=k).double()
    g = torch.Generator().manual_seed(seed)
    return y[torch.multinomial((1.0 / counts)[y], len(y), replacement=True, generator=g)]


def rarity(drawn: torch.Tensor, yv: torch.Tensor, k: int) -> ClassRarity:
    return ClassRarity(shares(drawn, k), shares(yv, k), float(len(yv)))


def cases(data: Path, seed: int) -> Iterator[tuple[str, str, ClassRarity]]:
    """(recipe, noise, ClassRarity) for every recipe's training labels on ``seed``."""
    for recipe in s53.RECIPES:
        for noise in (False, True):
            (_, y, _), (_, yv), _ = s53.data(data, recipe, seed, noise)
            label = "35 % sym." if noise else "clean"
            yield f"s53 {recipe}", label, rarity(y, yv, 10)
            if not noise:
                drawn = sampler_draws(y, 10, seed)
                yield f"s53 {recipe} + sampler", label, rarity(drawn, yv, 10)
    for name in ("news_bag", "rows_lstm", "ckpt_cnn", "manual_sgd", "imbalanced", "groups_adamw"):
        setup = s50.Setup(name, data, seed)
        yv = setup.val.labels if name == "news_bag" else setup.val.tensors[1]
        k = setup.classes
        for noise in (False, True):
            train = setup.noisy_train()[0] if noise else setup.train
            y = train.labels if name == "news_bag" else train.tensors[1]
            label = "35 % sym." if noise else "clean"
            drawn = sampler_draws(y, k, seed) if name == "imbalanced" else y
            shown = "s50 imbalanced (sampler)" if name == "imbalanced" else f"s50 {name}"
            yield shown, label, rarity(drawn, yv, k)
    args = argparse.Namespace(n_train=2000, n_val=1000, n_test=1, rate=0.4)
    for dataset in ("mnist", "fashion"):
        arrays = noisy.load(dataset, data)
        for kind in ("symmetric", "pair"):
            d = noisy.noisy_setting(arrays, kind, args, seed)
            if kind == "symmetric":  # the same split under either noise
                yield f"noisy CNN {dataset}", "clean", rarity(d["y"], d["yv"], 10)
            yield f"noisy CNN {dataset}", f"40 % {kind}", rarity(d["y_noisy"], d["yv"], 10)
        d = noisy.imbalanced_setting(arrays, args, seed)
        yield f"noisy CNN {dataset} --imbalance", "clean", rarity(d["y"], d["yv"], 10)


def record(recipe: str, noise: str, seed: int, r: ClassRarity) -> dict[str, Any]:
    factor, low = r.factor, r.lower_factor
    c = int(factor.argmax())
    return {
        "recipe": recipe, "noise": noise, "seed": seed, "val_examples": r.examples,
        "max_factor": float(factor.max()), "max_lower": float(low.max()), "class": c,
        "training_share": float(r.training[c]), "validation_share": float(r.validation[c]),
        "fires": r.rare(),
    }  # fmt: skip


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe and noise, the largest r_c and its lower end over the seeds
    (min–max), and on how many seeds the hint fires."""
    lines = [
        f"| recipe | labels | val. examples | largest r_c (seeds' min–max) | its lower end | "
        f"fires (lower end ≥ {RARE_CLASS_FACTOR:g}) |",
        "|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["recipe"], r["noise"]) for r in records))
    for recipe, noise in keys:
        rs = [r for r in records if (r["recipe"], r["noise"]) == (recipe, noise)]
        f = np.array([r["max_factor"] for r in rs])
        low = np.array([r["max_lower"] for r in rs])
        fired = sum(bool(r["fires"]) for r in rs)
        lines.append(
            f"| {recipe} | {noise} | {rs[0]['val_examples']:.0f} | {f.min():.2f}–{f.max():.2f} "
            f"| {low.min():.2f}–{low.max():.2f} | {fired} of {len(rs)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    records = [
        record(recipe, noise, seed, r)
        for seed in args.seeds
        for recipe, noise, r in cases(args.data, seed)
    ]
    print(table(records))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
