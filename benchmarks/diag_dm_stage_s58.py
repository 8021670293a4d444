"""Session 58: why the learned decay lost to the user's own recipe on ``dm_stage`` (session 57).

The recipe (``bench_user_recipes_s57.py``): a Fashion-MNIST MLP on a ``LightningDataModule``
whose ``setup(stage)`` splits one pool, ``val_check_interval=0.25``,
``check_val_every_n_epoch=2``, 6 epochs of 32 batches (192 optimizer steps, 9 hyper steps due).
Arms, run alternately seed by seed:

* ``own``  the recipe, ``SGD(weight_decay=5e-4)``;
* ``decay``  ``LearnedWeightDecay(5e-4)``, every default (the clock's budget), traced: λ per
  layer after every hyper step, and each due step's budget decision (run / deferred);
* ``nobudget``  the same with ``max_overhead=None`` (every due hyper step runs);
* ``frozen``  ``decay`` whose hyper steps run but leave λ at 5e-4 (what running them costs the
  training, λ aside);
* ``at_learned``  the recipe at the λ per layer ``decay`` ended with (the same seed), fixed from
  the start: does that λ lose by itself (the validation data's choice), or does the fit's path?
* ``at_nobudget``  the recipe at ``nobudget``'s final λ per layer;
* ``own_m1`` / ``own_p1``  the recipe at λ = 4.95e-4 / 5.05e-4 (1 % off its own): the spread of
  the last weights' test loss under a change of λ no validation set tells apart.

``sweep`` (imported, see ``docs/failures.md``): the recipe at fixed λ from 0 to 5e-3.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/diag_dm_stage_s58.py --data ../shared/data --seeds 0 1 2

Records: ``benchmarks/results/user_recipes/s58_dm_stage/records.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s57 as s57  # noqa: E402
from recipe_harness import mean_se, recipe_loader, test_loss  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

LAYERS = ("net.1", "net.3", "net.5")
#: the own recipe at λ 1 % below / above its 5e-4: how far the fit's last weights move for a
#: change of λ no validation set could tell apart (the comparison's own noise)
NEAR = {"own_m1": dict.fromkeys(LAYERS, 4.95e-4), "own_p1": dict.fromkeys(LAYERS, 5.05e-4)}


class AtLambda(s57.MLP):
    """The recipe's MLP with one fixed ``weight_decay`` per layer (the λ a fit learned)."""

    def __init__(self, lams: dict[str, float]) -> None:
        super().__init__(0.0, False)
        self.lams = lams

    def configure_optimizers(self):
        groups = [
            {"params": list(self.get_submodule(name).parameters()), "weight_decay": lam}
            for name, lam in self.lams.items()
        ]
        return torch.optim.SGD(groups, lr=self.lr, momentum=0.9)


class Traced(LearnedWeightDecay):
    """The drop-in with its budget's decisions and λ per hyper step kept (``frozen``: λ put
    back after every hyper step)."""

    def __init__(self, *args: Any, frozen: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frozen, self.decisions, self.path = frozen, [], []

    def _budget_allows(self, trainer, pl_module):
        ok = super()._budget_allows(trainer, pl_module)
        self.decisions.append((trainer.global_step, bool(ok)))
        return ok

    def _hyper_step(self, trainer, pl_module):
        before = [r.detach().clone() for r in self.rho]
        super()._hyper_step(trainer, pl_module)
        if self.frozen:
            with torch.no_grad():
                for r, b in zip(self.rho, before):
                    r.copy_(b)
        lam = {k: float(v.mean()) for k, v in self.learned_weight_decay.items()}
        self.path.append({"step": trainer.global_step, "lam": lam})


def fit(setup: s57.Setup, arm: str, lams: dict[str, float] | None) -> dict[str, Any]:
    record: dict[str, Any] = {"arm": arm, "seed": setup.seed}
    cbs: list = []
    if arm in ("decay", "nobudget", "frozen"):
        kw = {"max_overhead": None} if arm == "nobudget" else {}
        cbs.append(Traced(5e-4, frozen=arm == "frozen", **kw))
    wd = 0.0 if cbs else 5e-4
    original = s57.MLP
    if lams is not None:  # the recipe's fit builds ``MLP(wd, per_sample)``: one at λ per layer
        s57.MLP = lambda wd, per_sample: AtLambda(lams)  # type: ignore[assignment,misc]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = setup.fit(cbs, setup.train, None, False, wd, record)
    finally:
        s57.MLP = original
    test = recipe_loader(setup.test, None, 64, False, False)
    record["test_loss"], record["test_acc"] = test_loss(model, test)
    if cbs:
        cb = cbs[0]
        record["lam"] = {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()}
        record["path"], record["decisions"] = cb.path, cb.decisions
        record["due_ran"] = [cb._due_in_fit, cb._ran_in_fit]
        val_loop = setup.tr.fit_loop.epoch_loop.val_loop
        record["validations"] = int(val_loop.batch_progress.total.completed)
    if lams is not None:
        record["lam"] = lams
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--arms", nargs="+",
        default=["own", "decay", "nobudget", "frozen", "at_learned", "at_nobudget"],
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path,
        default=Path("benchmarks/results/user_recipes/s58_dm_stage/records.json"),
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    done = {(r["arm"], r["seed"]) for r in records}
    for seed in args.seeds:
        setup = s57.Setup("dm_stage", args.data, seed)
        by: dict[str, dict] = {r["arm"]: r for r in records if r["seed"] == seed}
        for arm in args.arms:
            if (arm, seed) in done:
                continue
            lams = NEAR.get(arm)
            if arm == "at_learned":
                lams = by["decay"]["lam"]
            if arm == "at_nobudget":
                lams = by["nobudget"]["lam"]
            rec = fit(setup, arm, lams)
            by[arm] = rec
            records.append(rec)
            loss = f"{rec['test_loss']:.4f}"
            print(seed, arm, loss, rec.get("due_ran"), rec.get("lam"), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(records, indent=1))
    summary(records)


def summary(records: list[dict[str, Any]]) -> None:
    by = {(r["arm"], r["seed"]): r for r in records}
    seeds = sorted({r["seed"] for r in records})
    for arm in ("decay", "nobudget", "frozen", "at_learned", "at_nobudget", "own_m1", "own_p1"):
        d = [by[arm, s]["test_loss"] - by["own", s]["test_loss"] for s in seeds if (arm, s) in by]
        if d:
            m, se = mean_se(d)
            print(f"{arm:12s} − own: {m:+.4f} ± {se:.4f} ({sum(x > 0 for x in d)}/{len(d)})")


if __name__ == "__main__":
    main()


def sweep(data: Path, seeds: list[int], lams: list[float], out: Path) -> None:
    """The recipe at fixed λ (every layer): test loss and the loss on the split's validation
    rows (the outer objective E at the fit's end), per seed — what the validation data choose,
    and how far a 1 % change of λ moves the test loss (the fit's own noise)."""
    from torch.nn import functional as F

    rows = json.loads(out.read_text()) if out.exists() else []
    for seed in seeds:
        setup = s57.Setup("dm_stage", data, seed)
        for lam in lams:
            rec = fit(setup, f"fixed_{lam:g}", dict.fromkeys(LAYERS, lam))
            model, val = setup.tr.lightning_module, setup.dm.val_set
            with torch.no_grad():
                x = torch.stack([val[i][0] for i in range(len(val))])
                y = torch.stack([val[i][1] for i in range(len(val))])
                rec["val_loss"] = float(F.cross_entropy(model.eval()(x), y))
            rec["fixed"] = lam
            rows.append(rec)
            print(seed, lam, f"test {rec['test_loss']:.4f} val {rec['val_loss']:.4f}", flush=True)
            out.write_text(json.dumps(rows, indent=1))
