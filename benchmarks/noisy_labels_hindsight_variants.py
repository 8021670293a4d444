"""Which errors of the learned weights cost what (issue 27 diagnosis): the drop-in's final weights
(from noisy_labels_diagnosis.py) fixed from step 0, with one group of rows corrected at a time:

* ``final``: as learned (the diagnosis' ``hindsight``);
* ``up0``: corrupted rows with ω ≥ 0.25 (those the validation evidence pushed up or left) set to 0;
* ``down0``: corrupted rows with ω < 0.25 set to 0 (what their slow-down at ~0.1 costs, eq. natsig);
* ``clean_back``: clean rows with ω < 0.25 (hard clean examples lost) set to the clean rows' mean.

    python benchmarks/noisy_labels_hindsight_variants.py --diagnosis runs/diagnosis/mnist.json.gz \
        --out runs/diagnosis/hindsight_variants_mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noisy_labels_diagnosis import FixedWeights, diagnosed_runs, fit  # noqa: E402


def variants(w: torch.Tensor, clean: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {"up0": w.clone(), "down0": w.clone(), "clean_back": w.clone()}
    out["up0"][~clean & (w >= 0.25)] = 0.0
    out["down0"][~clean & (w < 0.25)] = 0.0
    out["clean_back"][clean & (w < 0.25)] = float(w[clean].mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--diagnosis", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    out: dict = {"command": " ".join(sys.argv), "settings": {}}
    for name, seed, r, d, data, args in diagnosed_runs(a.diagnosis):
        w = torch.tensor(r["weights"], dtype=torch.float32)
        rec = {"final": r["hindsight"], "drop_in": r["drop_in"], "plain": r["plain"],
               "oracle": r["oracle"]}  # fmt: skip
        for vname, wv in variants(w, d["clean"]).items():
            torch.manual_seed(int(seed))
            rec[vname], _ = fit(FixedWeights(args.lr, wv, 0), data, d, args, int(seed), [])
        gap = {k: (v - r["plain"]) / (r["oracle"] - r["plain"]) for k, v in rec.items()}
        print(
            f"{name} seed {seed}: "
            + ", ".join(f"{k} {v:.4f} ({gap[k]:.0%})" for k, v in rec.items()),
            flush=True,
        )
        out["settings"].setdefault(name, {})[seed] = rec
    a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
