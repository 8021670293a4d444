"""Screen for a rewind (issue 27 diagnosis): train from scratch with the drop-in's weights as they
were at step S (reconstructed from the visits logged by noisy_labels_diagnosis.py), fixed from
step 0: what a rewind to the initial network at step S, then a full fit with those weights
frozen, would reach (its cost: 100 + 2(S − 100) + 384 plain steps).

    python benchmarks/noisy_labels_rewind_screen.py --diagnosis runs/diagnosis/mnist.json.gz \
        --steps 192 224 --out runs/diagnosis/rewind_screen_mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noisy_labels_diagnosis import FixedWeights, diagnosed_runs, fit  # noqa: E402


def weights_at(visits: dict, n: int, step: int) -> torch.Tensor:
    x = np.zeros(n)
    for i, s, x1 in zip(visits["index"], visits["step"], visits["x1"]):
        if s < step:
            x[int(i)] = x1  # visits are in order: the last one before `step` wins
    return torch.sigmoid(torch.tensor(x, dtype=torch.float32))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--diagnosis", type=Path, required=True)
    p.add_argument("--steps", type=int, nargs="+", default=[192, 224])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--start", type=int, default=0,
        help="plain steps before the fixed weights (100: a rewind to the end of the warm-up)",
    )  # fmt: skip
    a = p.parse_args()
    out: dict = {"command": " ".join(sys.argv), "settings": {}}
    for name, seed, r, d, data, args in diagnosed_runs(a.diagnosis):
        rec = {}
        for step in a.steps:
            w = weights_at(r["visits"], len(d["y"]), step)
            torch.manual_seed(int(seed))
            acc, cpu = fit(FixedWeights(args.lr, w, a.start), data, d, args, int(seed), [])
            clean = d["clean"]
            rec[str(step)] = {
                "acc": acc,
                "cpu": cpu,
                "w_clean": float(w[clean].mean()),
                "w_corrupted": float(w[~clean].mean()),
                "share_corrupted": float(w[~clean].sum() / w.sum()),
            }
            gap = (acc - r["plain"]) / (r["oracle"] - r["plain"])
            print(
                f"{name} seed {seed} weights of step {step} from step {a.start}: "
                f"acc {acc:.4f} ({gap:.0%}) "
                f"drop-in {r['drop_in']:.4f} hindsight {r['hindsight']:.4f} "
                f"corrupted share {rec[str(step)]['share_corrupted']:.3f}",
                flush=True,
            )
        out["settings"].setdefault(name, {})[seed] = rec
    a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
