"""Session 61: two_opt_manual, the decay arm as on main (CurrentWeights) against
look_ahead=TrainedWeights(), seeds alternating (run before eq. stepshare). usage (repository
root): python benchmarks/results/user_recipes/s61_two_opt/trained_weights.py OUT.json"""

import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_user_recipes_s59 as s59
import torch
import torch.nn.functional as F
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.horizon import TrainedWeights

torch.set_num_threads(1)


def fit(seed, kw):
    tr, va, te = images(Path("../shared/data"), "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    model = s59.TwoOptimizers(0.0 if kw is not None else 5e-4, False)
    cbs = (
        []
        if kw is None
        else [
            LearnedWeightDecay(
                5e-4, training_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]), **kw
            )
        ]
    )
    t = trainer(cbs, 6)
    t.fit(
        model,
        recipe_loader(train, None, 64, False, True),
        recipe_loader(val, None, 64, False, False),
    )
    tl, ta = test_loss(model, recipe_loader(test, None, 64, False, False))
    r = {"seed": seed, "test_loss": tl, "val_loss": float(t.callback_metrics["val_loss"])}
    if cbs:
        r["lam"] = {k: float(v.mean()) for k, v in cbs[0].learned_weight_decay.items()}
        r["due_ran"] = [cbs[0]._due_in_fit, cbs[0]._ran_in_fit]
    return r


arms = {"own": None, "today": {}, "trained": {"look_ahead": TrainedWeights()}}
if len(sys.argv) > 2 and sys.argv[2] == "nobudget":
    arms = {
        "own": None,
        "today_nb": {"max_overhead": None},
        "trained_nb": {"look_ahead": TrainedWeights(), "max_overhead": None},
    }
recs = []
seeds = [int(s) for s in sys.argv[3:]] if len(sys.argv) > 3 else [3, 4, 5, 6, 7, 8]
for seed in seeds:
    for kind, kw in arms.items():
        r = fit(seed, kw)
        r["kind"] = kind
        recs.append(r)
        print(
            kind,
            seed,
            round(r["test_loss"], 5),
            round(r["val_loss"], 5),
            r.get("lam"),
            r.get("due_ran"),
            flush=True,
        )
        Path(sys.argv[1]).write_text(json.dumps(recs, indent=1))
