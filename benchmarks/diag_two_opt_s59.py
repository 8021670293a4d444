"""Session 59: is the learned decay's small loss on ``two_opt_manual`` a two-optimizer effect?

The same Fashion-MNIST MLP (784-256-128-10) and data as ``bench_user_recipes_s59.py``'s
``two_opt_manual``, own decay 5e-4 against ``LearnedWeightDecay(5e-4)``, in three variants:
``sgd_adam`` (the recipe: encoder SGD momentum, head Adam, toggled in turn, manual),
``two_sgd`` (both SGD momentum lr 0.05, toggled in turn, manual), ``one_sgd`` (one SGD
momentum optimizer, automatic optimisation) and ``one_adam`` (one Adam, lr 1e-3, automatic).
Arms alternate seed by seed in one process.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/diag_two_opt_s59.py --data ../shared/data \
        --seeds 3 4 5 6 7 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s59 as s59  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

OUT = Path("benchmarks/results/user_recipes/s59_two_opt/records.json")


class TwoSGD(s59.TwoOptimizers):
    def configure_optimizers(self):
        return [
            torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)
            for m in (self.encoder, self.head)
        ]

    def on_train_epoch_end(self):
        pass


class OneAdam(s57.MLP):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


def fit(variant: str, arm: str, seed: int, data: Path) -> dict:
    tr, va, te = images(data, "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    wd = 0.0 if arm == "decay" else 5e-4
    model = {
        "sgd_adam": s59.TwoOptimizers,
        "two_sgd": TwoSGD,
        "one_sgd": s57.MLP,
        "one_adam": OneAdam,
    }[variant](wd, False)
    cbs = []
    if arm == "decay":
        manual = variant not in ("one_sgd", "one_adam")
        loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
        cbs = [LearnedWeightDecay(5e-4, **({"training_loss": loss} if manual else {}))]
    tr_ = trainer(cbs, 6)
    tr_.fit(
        model,
        recipe_loader(train, None, 64, False, True),
        recipe_loader(val, None, 64, False, False),
    )
    t_loss, t_acc = test_loss(model, recipe_loader(test, None, 64, False, False))
    rec = {
        "variant": variant,
        "arm": arm,
        "seed": seed,
        "test_loss": t_loss,
        "test_acc": t_acc,
        "val_loss": float(tr_.callback_metrics["val_loss"]),
        "steps": tr_.global_step,
    }
    if cbs:
        rec["lam"] = {k: float(v.mean()) for k, v in cbs[0].learned_weight_decay.items()}
        rec["due_ran"] = [cbs[0]._due_in_fit, cbs[0]._ran_in_fit]
    return rec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5, 6, 7, 8])
    p.add_argument("--variants", nargs="+", default=["sgd_adam", "two_sgd", "one_sgd"])
    args = p.parse_args()
    torch.set_num_threads(1)
    recs = []
    for seed in args.seeds:
        for variant in args.variants:
            for arm in ("own", "decay"):
                recs.append(fit(variant, arm, seed, args.data))
                print(
                    {k: recs[-1][k] for k in ("variant", "arm", "seed", "test_loss", "val_loss")},
                    flush=True,
                )
                OUT.parent.mkdir(parents=True, exist_ok=True)
                OUT.write_text(json.dumps(recs, indent=1))
    for variant in args.variants:
        for key in ("test_loss", "val_loss"):
            d = np.array(
                [
                    next(
                        r[key]
                        for r in recs
                        if (r["variant"], r["arm"], r["seed"]) == (variant, "decay", s)
                    )
                    - next(
                        r[key]
                        for r in recs
                        if (r["variant"], r["arm"], r["seed"]) == (variant, "own", s)
                    )
                    for s in args.seeds
                ]
            )
            print(
                f"{variant} {key} decay - own: {d.mean():+.4f} ± "
                f"{d.std(ddof=1) / len(d) ** 0.5:.4f} ({(d > 0).sum()}/{len(d)})"
            )


if __name__ == "__main__":
    main()
