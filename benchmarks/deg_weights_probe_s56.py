"""Session 56: data-weights fits where the weights hardly moved (``ckpt_cnn`` seeds 11, 15).

Runs a recipe of ``bench_user_recipes_s50.py`` per seed, arms ``dw`` and ``plain`` as that
benchmark runs them, and records beside its record what the data-weights callback did: the hyper
steps (how many, at which optimizer steps), the step of the restored checkpoint, the logits'
spread, and the drop-in's warnings in full. A fit is *degenerate* by
``benchmarks/results/user_recipes/rules_s56/deg56-definition.txt``.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/deg_weights_probe_s56.py --data ../shared/data \
        --recipes ckpt_cnn --seeds 0 1 2 --out benchmarks/results/user_recipes/s56_deg.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s50 as s50  # noqa: E402
from recipe_harness import merge_records, read_records, timed_fit, write_json  # noqa: E402

#: the callbacks the benchmark built, the last one last
MADE: list = []


def recording(cls):
    """``cls`` that keeps each object it makes in :data:`MADE`."""

    def make(*args, **kwargs):
        cb = cls(*args, **kwargs)
        MADE.append(cb)
        return cb

    return make


def probe(bench, name: str, data: Path, seed: int, arm: str, trainer_kw: dict) -> dict:
    MADE.clear()
    made = bench.Setup(name, data, seed)
    made.trainer_kw.update(trainer_kw)
    rec = made.run(arm)
    rec["dw_warnings"] = [w for w in rec.pop("warnings", []) if "LearnedDataWeights" in w]
    ckpt = rec.get("best_epoch_ckpt")
    if ckpt:
        rec["ckpt_step"] = int(re.search(r"step=(\d+)", ckpt).group(1))
    if arm.startswith("dw") and MADE:
        cb = MADE[-1]
        rec["hyper_steps"] = [int(h["global_step"]) for h in cb.history]
        rec["first_hyper_due"] = -(-max(cb.start_step, 1) // cb.every_n_steps) * cb.every_n_steps
        x = cb.weights.logits.detach().float()
        rec["logit_sd"] = float(x.std())
        rec["w_sd"] = float(cb.data_weights().std())
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=["ckpt_cnn"])
    p.add_argument("--arms", nargs="+", default=["dw", "plain"])
    p.add_argument("--seeds", nargs="+", type=int, default=[11, 15])
    p.add_argument("--dw-kwargs", type=json.loads, default={})
    p.add_argument("--trainer-kwargs", type=json.loads, default={}, help="Trainer settings")
    p.add_argument("--tag", default="main", help="a label kept in each record (the code's state)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/user_recipes/s56_deg.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    bench = s50
    bench.LearnedDataWeights = recording(bench.LearnedDataWeights)
    bench.timed_fit = lambda record, fit, width: timed_fit(record, fit, 4000)  # in full
    bench.DW_KWARGS.update(args.dw_kwargs)
    old = read_records(args.out)
    command = " ".join(["python", *sys.argv])
    for name in args.recipes:
        for seed in args.seeds:
            for arm in args.arms:
                rec = probe(bench, name, args.data, seed, arm, args.trainer_kwargs)
                rec.update(
                    tag=args.tag, dw_kwargs=args.dw_kwargs, trainer_kwargs=args.trainer_kwargs
                )
                rec["command"] = command
                shown = {k: v for k, v in rec.items() if k not in ("command", "dw_warnings")}
                shown["warned"] = [w[:90] for w in rec["dw_warnings"]]
                print(json.dumps(shown), flush=True)
                old = merge_records(
                    old,
                    [rec],
                    lambda r: (
                        r["recipe"],
                        r["arm"],
                        r["seed"],
                        r["tag"],
                        json.dumps(r["dw_kwargs"]),
                    ),
                )
                write_json(args.out, {"command": command, "records": old})


if __name__ == "__main__":
    main()
