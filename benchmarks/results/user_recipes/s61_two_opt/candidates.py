"""Session 61: two_opt_manual, the remaining candidates of the miss as arms (seeds alternating in
one process): the own recipe; the decay with every default; with no hyper step skipped by the
budget (``max_overhead=None``); with the whole validation set in each hyper step (``val="full"``,
not one batch of 64 of the 300); and with both.
usage (repository root): python benchmarks/results/user_recipes/s61_two_opt/candidates.py 3 4 5
(writes candidates.json beside it)"""

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import bench_user_recipes_s59 as s59  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

SEEDS = [int(s) for s in sys.argv[1:]] or [3, 4, 5, 6, 7, 8]
OUT = Path(__file__).with_name("candidates.json")
ARMS = {
    "own": None,
    "decay": {},
    "no_budget": {"max_overhead": None},
    "full_val": {"val": "full"},
    "no_budget_full_val": {"max_overhead": None, "val": "full"},
}


def fit(seed: int, kw: dict | None) -> dict:
    tr, va, te = images(Path("../shared/data"), "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    model = s59.TwoOptimizers(5e-4 if kw is None else 0.0, False)
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    cbs = [] if kw is None else [LearnedWeightDecay(5e-4, training_loss=loss, **kw)]
    t = trainer(cbs, 6)
    t.fit(model, recipe_loader(train, None, 64, False, True),
          recipe_loader(val, None, 64, False, False))  # fmt: skip
    t_loss, _ = test_loss(model, recipe_loader(test, None, 64, False, False))
    rec = {"seed": seed, "test_loss": t_loss, "val_loss": float(t.callback_metrics["val_loss"])}
    if cbs:
        rec["lam"] = {k: float(v.mean()) for k, v in cbs[0].learned_weight_decay.items()}
        rec["due_ran"] = [cbs[0]._due_in_fit, cbs[0]._ran_in_fit]
    return rec


def main() -> None:
    torch.set_num_threads(1)
    recs = json.loads(OUT.read_text()) if OUT.exists() else []
    for seed in SEEDS:
        for arm, kw in ARMS.items():
            r = fit(seed, kw)
            r["arm"] = arm
            recs = [x for x in recs if (x["seed"], x["arm"]) != (seed, arm)] + [r]
            print(arm, seed, round(r["test_loss"], 5), round(r["val_loss"], 5), r.get("lam"),
                  r.get("due_ran"), flush=True)  # fmt: skip
            OUT.write_text(json.dumps(recs, indent=1))
    seeds = sorted({r["seed"] for r in recs})
    for arm in list(ARMS)[1:]:
        for key in ("test_loss", "val_loss"):
            d = [
                next(r[key] for r in recs if (r["seed"], r["arm"]) == (s, arm))
                - next(r[key] for r in recs if (r["seed"], r["arm"]) == (s, "own"))
                for s in seeds
            ]
            se = statistics.stdev(d) / len(d) ** 0.5
            print(f"{arm} − own {key}: {statistics.mean(d):+.4f} ± {se:.4f} "
                  f"({sum(x > 0 for x in d)}/{len(d)} worse)")  # fmt: skip


if __name__ == "__main__":
    main()
