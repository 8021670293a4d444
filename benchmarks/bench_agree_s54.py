"""Session 54: the agreeing outer step (eq. agreestep, ``AgreeingLazyAdam``) against the default
on session 50's recipes, the two arms alternated seed by seed in one process.

Each seed builds the recipe once (``bench_user_recipes_s50.Setup``) and runs its ``dw`` arm with
the default ``LearnedDataWeights()`` and then with the agreeing outer step; records are the
harness's own (test loss, test accuracy, the weights' AUC at the corrupted rows).

Usage (from the repository root; one thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_agree_s54.py --data ../shared/data \
        --recipes ckpt_cnn --seeds 10 11 --out benchmarks/results/user_recipes/s54_hard54_cnn.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s50 as s50  # noqa: E402

from hypertorch_sid.core.agreeing_step import AgreeingLazyAdam  # noqa: E402

AGREE = {
    "outer_optimizer": functools.partial(AgreeingLazyAdam, lr=1.0, betas=(0.0, 0.999)),
    "sparse_grad": True,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=["ckpt_cnn"])
    p.add_argument("--seeds", nargs="+", type=int, default=[10, 11])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    records = []
    for name in args.recipes:
        for seed in args.seeds:
            made = s50.Setup(name, args.data, seed)
            for arm, kwargs in (("dw", {}), ("dw_agree", AGREE)):
                s50.DW_KWARGS.clear()
                s50.DW_KWARGS.update(kwargs)
                rec = made.run("dw")
                rec.update(arm=arm, command=" ".join(["python", *sys.argv]))
                keep = ("recipe", "seed", "arm", "test_loss", "test_acc", "auc", "cpu_s")
                records.append({k: rec[k] for k in keep if k in rec})
                print(json.dumps(records[-1]), flush=True)
                args.out.write_text(json.dumps({"records": records}, indent=1))


if __name__ == "__main__":
    main()
