"""Session 61: two_opt_manual on fresh seeds 9–14 — the own recipe, the decay as before the fix
(every optimizer's share of the steps taken as 1: R counted each tensor's steps twice) and the
decay with eq. stepshare, alternating seed by seed in one process; every default otherwise.
usage (repository root): python benchmarks/results/user_recipes/s61_two_opt/remeasure.py
(writes remeasure.json beside it)"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import diag_two_opt_s59 as D  # noqa: E402

from hypertorch_sid.lightning import training_length as T  # noqa: E402

SEEDS = [int(s) for s in sys.argv[1:]] or [9, 10, 11, 12, 13, 14]
OUT = Path(__file__).with_name("remeasure.json")
shared = T.StepShares.share


def main() -> None:
    torch.set_num_threads(1)
    recs = []
    for seed in SEEDS:
        for kind in ("own", "before", "stepshare"):
            T.StepShares.share = (lambda self, opt: 1.0) if kind == "before" else shared
            r = D.fit("sgd_adam", "own" if kind == "own" else "decay", seed, Path("../shared/data"))
            r["kind"] = kind
            recs.append(r)
            print(kind, seed, round(r["test_loss"], 5), round(r["val_loss"], 5), r.get("lam"),
                  r.get("due_ran"), flush=True)  # fmt: skip
            OUT.write_text(json.dumps(recs, indent=1))

    def value(s, kind, key):
        return next(r[key] for r in recs if r["seed"] == s and r["kind"] == kind)

    for a, b in (("before", "own"), ("stepshare", "own"), ("stepshare", "before")):
        for key in ("test_loss", "val_loss"):
            d = [value(s, a, key) - value(s, b, key) for s in SEEDS]
            se = statistics.stdev(d) / len(d) ** 0.5
            print(f"{a} − {b} {key}: {statistics.mean(d):+.4f} ± {se:.4f} "
                  f"({sum(x > 0 for x in d)}/{len(d)} worse)")  # fmt: skip


if __name__ == "__main__":
    main()
