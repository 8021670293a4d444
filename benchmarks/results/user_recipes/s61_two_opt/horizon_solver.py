"""Session 61: two_opt_manual with the look-ahead over the whole remaining training
(docs/weight_decay_budget.md, "HorizonSolver": Gauss–Newton products, no damping,
``adjoint_solver=HorizonSolver()``) against the own recipe and the default decay, seeds
alternating in one process (after eq. stepshare: η per step of R).
usage (repository root): python benchmarks/results/user_recipes/s61_two_opt/horizon_solver.py
3 4 5 6 7 8  (writes horizon_solver.json beside it)"""

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import candidates as C  # noqa: E402

from hypertorch_sid import GaussNewton, HorizonSolver, NoDamping  # noqa: E402

SEEDS = [int(s) for s in sys.argv[1:]] or [3, 4, 5, 6, 7, 8]
OUT = Path(__file__).with_name("horizon_solver.json")


class HorizonArm(C.s59.TwoOptimizers):
    """The recipe's module, which hands the HorizonSolver arm its Gauss–Newton products."""

    def horizon_kwargs(self) -> dict:
        gn = GaussNewton(lambda b: self(b[0]), lambda z, b: F.cross_entropy(z, b[1]))
        return {"hvp": gn, "damping": NoDamping(), "adjoint_solver": HorizonSolver()}


def fit_horizon(seed: int) -> dict:
    """candidates.fit with the module's own Gauss–Newton products (the keywords are filled in
    when the module is built, before the callback reads them)."""
    kw: dict = {}

    class Built(HorizonArm):
        def __init__(self, wd, per_sample):
            super().__init__(wd, per_sample)
            kw.update(self.horizon_kwargs())

    real, C.s59.TwoOptimizers = C.s59.TwoOptimizers, Built
    try:
        return C.fit(seed, kw)
    finally:
        C.s59.TwoOptimizers = real


def main() -> None:
    torch.set_num_threads(1)
    recs = []
    for seed in SEEDS:
        for arm in ("own", "decay", "horizon"):
            r = fit_horizon(seed) if arm == "horizon" else C.fit(seed, None if arm == "own" else {})
            r["arm"] = arm
            recs.append(r)
            print(arm, seed, round(r["test_loss"], 5), round(r["val_loss"], 5), r.get("lam"),
                  r.get("due_ran"), flush=True)  # fmt: skip
            OUT.write_text(json.dumps(recs, indent=1))
    for arm in ("decay", "horizon"):
        d = [
            next(r["test_loss"] for r in recs if (r["seed"], r["arm"]) == (s, arm))
            - next(r["test_loss"] for r in recs if (r["seed"], r["arm"]) == (s, "own"))
            for s in SEEDS
        ]
        se = statistics.stdev(d) / len(d) ** 0.5
        print(f"{arm} − own test_loss: {statistics.mean(d):+.4f} ± {se:.4f} "
              f"({sum(x > 0 for x in d)}/{len(d)} worse)")  # fmt: skip


if __name__ == "__main__":
    main()
