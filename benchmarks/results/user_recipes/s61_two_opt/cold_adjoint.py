"""Session 61: the adjoint v started afresh at every hyper step (``warm_start_adjoint=False``)
against the default (v carried over from the last hyper step), on two_opt_manual
(``sgd_adam``) and on the one-Adam control (``one_adam``), own recipe alongside, seeds
alternating in one process; every other setting the default.
usage (repository root): python benchmarks/results/user_recipes/s61_two_opt/cold_adjoint.py
sgd_adam 3 4 5 6 7 8   (appends to cold_adjoint.json beside it)"""

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s59 as s59  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

OUT = Path(__file__).with_name("cold_adjoint.json")
ARMS = {"own": None, "warm": {}, "cold": {"warm_start_adjoint": False}}


class OneAdam(s57.MLP):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


def fit(variant: str, seed: int, kw: dict | None) -> dict:
    tr, va, te = images(Path("../shared/data"), "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    manual = variant == "sgd_adam"
    model = (s59.TwoOptimizers if manual else OneAdam)(5e-4 if kw is None else 0.0, False)
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    extra = {"training_loss": loss} if manual else {}
    cbs = [] if kw is None else [LearnedWeightDecay(5e-4, **extra, **kw)]
    t = trainer(cbs, 6)
    t.fit(model, recipe_loader(train, None, 64, False, True),
          recipe_loader(val, None, 64, False, False))  # fmt: skip
    t_loss, _ = test_loss(model, recipe_loader(test, None, 64, False, False))
    rec = {"variant": variant, "seed": seed, "test_loss": t_loss,
           "val_loss": float(t.callback_metrics["val_loss"])}  # fmt: skip
    if cbs:
        rec["lam"] = {k: float(v.mean()) for k, v in cbs[0].learned_weight_decay.items()}
        rec["due_ran"] = [cbs[0]._due_in_fit, cbs[0]._ran_in_fit]
    return rec


def main() -> None:
    torch.set_num_threads(1)
    variant, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]]
    recs = json.loads(OUT.read_text()) if OUT.exists() else []
    for seed in seeds:
        for arm, kw in ARMS.items():
            r = fit(variant, seed, kw)
            r["arm"] = arm
            recs = [x for x in recs if (x["variant"], x["seed"], x["arm"]) != (variant, seed, arm)]
            recs.append(r)
            print(arm, variant, seed, round(r["test_loss"], 5), round(r["val_loss"], 5),
                  r.get("lam"), r.get("due_ran"), flush=True)  # fmt: skip
            OUT.write_text(json.dumps(recs, indent=1))
    for a, b in (("warm", "own"), ("cold", "own"), ("cold", "warm")):
        for key in ("test_loss", "val_loss"):
            d = [
                next(r[key] for r in recs if (r["variant"], r["seed"], r["arm"]) == (variant, s, a))
                - next(
                    r[key] for r in recs if (r["variant"], r["seed"], r["arm"]) == (variant, s, b)
                )
                for s in seeds
            ]
            se = statistics.stdev(d) / len(d) ** 0.5
            print(f"{variant} {a} − {b} {key}: {statistics.mean(d):+.4f} ± {se:.4f} "
                  f"({sum(x > 0 for x in d)}/{len(d)} worse)")  # fmt: skip


if __name__ == "__main__":
    main()
