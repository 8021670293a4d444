"""Session 61: the recipe with Adam on the encoder too (``diag_two_opt_s61.TwoAdam``: two
optimizers of one kind, toggled in turn, StepLR as the recipe), own decay 5e-4 against
LearnedWeightDecay(5e-4) with every default, seeds alternating in one process.
usage (repository root): python benchmarks/results/user_recipes/s61_two_opt/two_adam.py 3 4 5 6 7 8
(writes two_adam.json beside it)"""

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import diag_two_opt_s61 as D  # noqa: E402
from recipe_harness import images, recipe_loader, tensors, test_loss, trainer  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

SEEDS = [int(s) for s in sys.argv[1:]] or [3, 4, 5, 6, 7, 8]
OUT = Path(__file__).with_name("two_adam.json")


class OwnTwoAdam(D.TwoAdam):
    """Two Adams with the user's own weight_decay."""

    def configure_optimizers(self):
        opts = [
            torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=self.wd)
            for m in (self.encoder, self.head)
        ]
        steps = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.3) for o in opts]
        return opts, steps


def fit(seed: int, arm: str) -> dict:
    tr, va, te = images(Path("../shared/data"), "fashion-mnist", seed, 2000, 300, 2000)
    train, val, test = tensors(tr), tensors(va), tensors(te)
    torch.manual_seed(seed)
    model = OwnTwoAdam(5e-4 if arm == "own" else 0.0, False)
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    cbs = [] if arm == "own" else [LearnedWeightDecay(5e-4, training_loss=loss)]
    t = trainer(cbs, 6)
    t.fit(model, recipe_loader(train, None, 64, False, True),
          recipe_loader(val, None, 64, False, False))  # fmt: skip
    t_loss, _ = test_loss(model, recipe_loader(test, None, 64, False, False))
    rec = {"seed": seed, "arm": arm, "test_loss": t_loss,
           "val_loss": float(t.callback_metrics["val_loss"])}  # fmt: skip
    if cbs:
        rec["lam"] = {k: float(v.mean()) for k, v in cbs[0].learned_weight_decay.items()}
        rec["due_ran"] = [cbs[0]._due_in_fit, cbs[0]._ran_in_fit]
    return rec


def main() -> None:
    torch.set_num_threads(1)
    recs = []
    for seed in SEEDS:
        for arm in ("own", "decay"):
            recs.append(fit(seed, arm))
            print(recs[-1], flush=True)
            OUT.write_text(json.dumps(recs, indent=1))
    for key in ("test_loss", "val_loss"):
        d = [
            next(r[key] for r in recs if (r["seed"], r["arm"]) == (s, "decay"))
            - next(r[key] for r in recs if (r["seed"], r["arm"]) == (s, "own"))
            for s in SEEDS
        ]
        se = statistics.stdev(d) / len(d) ** 0.5
        print(f"decay − own {key}: {statistics.mean(d):+.4f} ± {se:.4f} "
              f"({sum(x > 0 for x in d)}/{len(d)} worse)")  # fmt: skip


if __name__ == "__main__":
    main()
