"""Session 56: where ``LearnedWeightDecay`` adds its decay relative to Lightning's gradient clip.

Lightning calls ``on_before_optimizer_step`` and then clips (``gradient_clip_val``); the
optimizer's own ``weight_decay=`` acts inside ``optimizer.step()``, after the clip. Until this
session the drop-in added ``λw`` in ``on_before_optimizer_step``, so the clip saw ``g + λw``.
With λ held (no hyper step) three fits per recipe and seed:

* ``own``          the user's recipe: the optimizer's ``weight_decay=λ``;
* ``held``         ``LearnedWeightDecay(λ)`` held (``start_step`` beyond the fit), the
                   optimizer's decay removed: the package on the ``PYTHONPATH``;
* ``before_clip``  ``λw`` added in ``on_before_optimizer_step`` by a five-line callback: the
                   ordering until session 56 (run ``held`` with the old package to check it is
                   the same fit);
* ``learned``      ``LearnedWeightDecay(λ, max_overhead=None)``: λ learned (every due hyper
                   step run, no clock), under the package on the ``PYTHONPATH`` (``--tag``
                   names it: run it with the old package for the fit as it was).

Recipes (the s55 round's data: 2000 training / 300 validation / 2000 test images):

* ``accum_clip_value``  s55's ``accum_sched``: MNIST CNN, SGD momentum,
  ``GradientAccumulationScheduler({0: 1, 2: 4})``, ``gradient_clip_val=0.5`` by value, λ = 5e-4;
* ``mlp_clip_norm``  MNIST MLP 784-128-10, SGD momentum, ``gradient_clip_val=1.0`` by norm,
  λ = 5e-4; ``mlp_clip_norm_5e-3`` the same at λ = 5e-3.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_clip_order_s56.py --data ../shared/data \
        --seeds 0 1 2 --out benchmarks/results/weight_decay/clip_order_s56/records.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_user_recipes_s55 import MLP, SmallCNN  # noqa: E402
from recipe_harness import (  # noqa: E402
    images,
    merge_records,
    paired,
    read_records,
    recipe_loader,
    test_loss,
    timed_fit,
    trainer,
    write_json,
)

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

HELD = dict(every_n_steps=10**9, start_step=10**9, max_overhead=None)
RECIPES: dict[str, dict[str, Any]] = {
    "accum_clip_value": dict(
        make=SmallCNN, lam=5e-4, clip=dict(gradient_clip_val=0.5, gradient_clip_algorithm="value"),
        extra=lambda: [GradientAccumulationScheduler(scheduling={0: 1, 2: 4})],
    ),
    "mlp_clip_norm": dict(make=MLP, lam=5e-4, clip=dict(gradient_clip_val=1.0), extra=list),
    "mlp_clip_norm_5e-3": dict(make=MLP, lam=5e-3, clip=dict(gradient_clip_val=1.0), extra=list),
}  # fmt: skip
ARMS = ("own", "held", "before_clip", "learned")


class BeforeClip(pl.Callback):
    """``grad += λ w`` in ``on_before_optimizer_step``, before Lightning's clip (the drop-in's
    ordering until session 56, for a held λ)."""

    def __init__(self, lam: float) -> None:
        self.lam = lam

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch._foreach_add_([p.grad for p in params], params, alpha=self.lam)


def run(name: str, arm: str, seed: int, data: Path, own: torch.Tensor | None) -> dict[str, Any]:
    """One fit; ``own``: the ``own`` arm's final weights (flattened), compared with."""
    recipe = RECIPES[name]
    tr, va, te = images(data, "mnist", seed, 2000, 300, 2000)
    train, val, test = (TensorDataset(*s) for s in (tr, va, te))
    lam = recipe["lam"]
    torch.manual_seed(seed)
    model = recipe["make"](lam if arm == "own" else 0.0, False)
    cbs: list[Any] = list(recipe["extra"]())
    if arm == "held":
        cbs.append(LearnedWeightDecay(lam, **HELD))
    elif arm == "learned":
        cbs.append(LearnedWeightDecay(lam, max_overhead=None))
    elif arm == "before_clip":
        cbs.append(BeforeClip(lam))
    torch.manual_seed(seed)
    tr_ = trainer(cbs, 5, **recipe["clip"])
    record: dict[str, Any] = {"recipe": name, "arm": arm, "seed": seed, "lam": lam}
    loaders = (
        recipe_loader(train, None, 64, False, True),
        recipe_loader(val, None, 64, False, False),
    )
    timed_fit(record, lambda: tr_.fit(model, *loaders), width=300)
    if "error" in record:
        return record
    test_loader = recipe_loader(test, None, 64, False, False)
    record["test_loss"], record["test_acc"] = test_loss(model, test_loader)
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    record["weight_norm"] = float(w.norm())
    record["_weights"] = w
    if own is not None:
        record["max_abs_diff_vs_own"] = float((w - own).abs().max())
        record["rel_dist_vs_own"] = float((w - own).norm() / own.norm())
    return record


def table(records: list[dict[str, Any]]) -> str:
    out = [
        "| recipe | λ | arm | test loss − own (s.e., seeds worse) | max |w − w_own| "
        "| ‖w − w_own‖/‖w_own‖ |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for r in records:
        by.setdefault((r["recipe"], r["arm"]), {})[r["seed"]] = r
    for (name, arm), runs in sorted(by.items()):
        own = by.get((name, "own"), {})
        if arm == "own" or not own:
            continue
        seeds = sorted(s for s in runs if s in own)
        diff = paired(runs[s]["test_loss"] - own[s]["test_loss"] for s in seeds)
        mx = max(runs[s].get("max_abs_diff_vs_own", float("nan")) for s in seeds)
        rel = max(runs[s].get("rel_dist_vs_own", float("nan")) for s in seeds)
        out.append(
            f"| {name} | {RECIPES[name]['lam']:g} | {arm} | {diff} | ≤ {mx:.2g} | ≤ {rel:.2g} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--tag", default="", help="appended to the arm names (e.g. _old)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    records = read_records(args.out)
    if args.table:
        print(table(records))
        return
    torch.set_num_threads(1)
    key = lambda r: (r["recipe"], r["arm"], r["seed"])  # noqa: E731
    for name in args.recipes:
        for seed in args.seeds:
            own = None  # the own arm runs first, in this process
            for arm in args.arms:
                rec = run(name, arm, seed, args.data, own)
                rec["arm"] = arm + args.tag
                weights = rec.pop("_weights", None)
                if arm == "own":
                    own = weights
                records = merge_records(records, [rec], key)
                write_json(args.out, records)
                shown = {k: rec.get(k) for k in ("test_loss", "max_abs_diff_vs_own", "error")}
                print(name, rec["arm"], seed, shown, flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
