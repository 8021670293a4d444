"""Session 56: does the decay of tensors thawed mid-fit matter (should they join the learned λ)?

Session 55's ``backbone_ft`` recipe (``bench_user_recipes_s55.py``): an MNIST-pretrained CNN
backbone, a new head on Fashion-MNIST, Adam, ``BackboneFinetuning`` thawing the backbone at
epoch 2 into a new parameter group. Arms (the rule: ``results/weight_decay/thaw_s56/RULE.md``):
``own`` (Adam's ``weight_decay=1e-4`` on every group), ``decay`` (``LearnedWeightDecay(1e-4,
max_overhead=None)``: the thawed group undecayed), ``decay_thaw_1e-4`` and ``decay_thaw_1e-2``
(the same with a fixed decay on the thawed group, set in ``finetune_function`` as the
drop-in's warning advises).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_thaw_s56.py --data ../shared/data --seeds 0 1 2 \
        --out benchmarks/results/weight_decay/thaw_s56/records.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.callbacks import BackboneFinetuning

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s55 as s55  # noqa: E402
from recipe_harness import merge_records, paired, read_records, write_json  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

ARMS = ("own", "decay", "decay_thaw_1e-4", "decay_thaw_1e-2")
THAWED_DECAY = {"decay_thaw_1e-4": 1e-4, "decay_thaw_1e-2": 1e-2}


class Unbudgeted(LearnedWeightDecay):
    """The drop-in with every due hyper step run (no clock: the arms differ only in the thaw)."""

    def __init__(self, weight_decay: float, **kw: Any) -> None:
        super().__init__(weight_decay, max_overhead=None, **kw)


class DecayedThaw(BackboneFinetuning):
    """``BackboneFinetuning`` giving the group it adds a fixed ``weight_decay`` (the advice)."""

    def __init__(self, thawed_decay: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.thawed_decay = thawed_decay

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        before = len(optimizer.param_groups)
        super().finetune_function(pl_module, epoch, optimizer)
        if len(optimizer.param_groups) > before:
            optimizer.param_groups[-1]["weight_decay"] = self.thawed_decay


def run(arm: str, seed: int, data: Path) -> dict[str, Any]:
    setup = s55.Setup("backbone_ft", data, seed)
    if arm in THAWED_DECAY:
        c = THAWED_DECAY[arm]
        setup.extra = lambda: [DecayedThaw(c, unfreeze_backbone_at_epoch=2, verbose=False)]
    patched, s54.LearnedWeightDecay = s54.LearnedWeightDecay, Unbudgeted
    try:
        record = setup.run("own" if arm == "own" else "decay")
    finally:
        s54.LearnedWeightDecay = patched
    record["arm"] = arm
    optimizers = s55.LAST["trainer"].optimizers
    record["group_decays"] = [g["weight_decay"] for g in optimizers[0].param_groups]
    return record


def table(records: list[dict[str, Any]]) -> str:
    out = ["| arm | vs | test loss − vs (s.e., seeds worse) | test loss per seed |",
           "| --- | --- | --- | --- |"]  # fmt: skip
    by: dict[str, dict[int, dict]] = {}
    for r in records:
        by.setdefault(r["arm"], {})[r["seed"]] = r
    for arm, vs in [(a, "own") for a in ARMS[1:]] + [(a, "decay") for a in ARMS[2:]]:
        runs, ref = by.get(arm, {}), by.get(vs, {})
        seeds = sorted(s for s in runs if s in ref and "test_loss" in runs[s])
        if not seeds:
            continue
        diff = paired(runs[s]["test_loss"] - ref[s]["test_loss"] for s in seeds)
        each = " / ".join(f"{runs[s]['test_loss']:.4f}" for s in seeds)
        out.append(f"| {arm} | {vs} | {diff} | {each} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    records = read_records(args.out)
    if not args.table:
        torch.set_num_threads(1)
        key = lambda r: (r["arm"], r["seed"])  # noqa: E731
        for seed in args.seeds:  # arms alternate seed by seed
            for arm in args.arms:
                rec = run(arm, seed, args.data)
                records = merge_records(records, [rec], key)
                write_json(args.out, records)
                shown = {k: rec.get(k) for k in ("test_loss", "lam_range", "steps", "error")}
                print(arm, seed, shown, flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
