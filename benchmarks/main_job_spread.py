"""How much the main job's learned run moves from run to run, and why.

The main job (``examples/lightning_digits.py``) scores the *final* weights of one 400-step fit.
This script trains only its learned arm, ``--runs`` times in one process, with the example's own
data split, model and trainer, and records per run the held-out test loss, the steps at which hyper
steps ran, λ after each hyper step and the validation objective E the hyper step read, and the
budget's measured share. The arms of the session-43 measurement::

    python benchmarks/main_job_spread.py --runs 8 --out R/default.json
    python benchmarks/main_job_spread.py --runs 6 --max-overhead planned --out R/planned.json
    python benchmarks/main_job_spread.py --runs 1 --max-overhead none --seeds 0 1 2 3 4 5 \
        --out R/none_seeds.json

(``R=benchmarks/results/main_job_spread``; ``--seeds``: the callback's own sampling seed, one run
each; the split, initial weights and batch order stay the example's seed 0.) ``--cost N`` instead
times N rounds of a plain fit, the default and ``max_overhead=None`` back to back (CPU time of
each whole training, as the main job runs it) and writes their ratios::

    python benchmarks/main_job_spread.py --cost 6 --out R/cost.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
import lightning_digits as job  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402
from hypertorch_sid.core.budget import PlannedBudget  # noqa: E402


def budget(name: str) -> dict[str, Any]:
    """The callback's ``max_overhead`` keyword for ``--max-overhead``."""
    if name == "default":
        return {}
    if name == "none":
        return {"max_overhead": None}
    if name == "planned":
        return {"max_overhead": PlannedBudget(0.5)}
    return {"max_overhead": float(name)}


def one_run(
    data: dict, args: argparse.Namespace, arm: str, name: str, seed: int | None
) -> dict[str, Any]:
    """The learned arm once; what it ran and where λ went."""
    kw = budget(arm)
    if seed is not None:
        kw["seed"] = seed
    cb = LearnedWeightDecay(**kw)
    result = job.train(data, args, name, callbacks=[cb])
    path = []
    for h in cb.history:
        lam = [
            v for k, v in h.items() if k.startswith("hyper/weight_decay/") and k.endswith("_mean")
        ]
        path.append(
            dict(
                step=int(h["global_step"]),
                lam_mean=statistics.fmean(lam) if lam else None,
                E=h.get("hyper/outer_loss"),
                L=h.get("hyper/L"),
                retries=h.get("hyper/retries"),
            )
        )
    return dict(
        seed=seed,
        test_loss=result["test_loss"],
        val_loss=result["val_loss"],
        hyper_steps=[p["step"] for p in path],
        path=path,
        overhead=cb.budget.overhead,
        load_average=os.getloadavg()[0],
    )


def cost(data: dict, args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    """CPU time of the default and of ``max_overhead=None`` over a plain fit, per round."""
    arms = {"plain": {}, "default": budget("default"), "none": budget("none")}
    job.train(data, args, "warm-up")
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, kw in arms.items():
            callbacks = [] if name == "plain" else [LearnedWeightDecay(**kw)]
            start = time.process_time()
            job.train(data, args, name, callbacks=callbacks)
            cpu[name].append(time.process_time() - start)
    ratios = {
        name: [a / b for a, b in zip(cpu[name], cpu["plain"])] for name in ("default", "none")
    }
    for name, r in ratios.items():
        print(
            f"{name}: CPU × plain, median {statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]"
        )
    return dict(cpu_s=cpu, ratios=ratios, load_average=os.getloadavg()[0])


def example_args(logs: str) -> argparse.Namespace:
    """The main job's own settings (its defaults), one thread, its logs under the temp dir, and
    Lightning's and the library's messages quiet."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return argparse.Namespace(
        n_train=300, n_val=300, hidden=128, epochs=40, batch_size=32, lr=0.05, seed=0,
        logs=Path(tempfile.gettempdir()) / logs,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument(
        "--max-overhead", default="default", help="default | none | planned | a number"
    )
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="the callback's seeds")
    parser.add_argument("--cost", type=int, default=0, help="time this many rounds instead")
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    args = example_args("main_job_spread_logs")
    data = job.splits(args.n_train, args.n_val, args.seed)
    if a.cost:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"command": " ".join(sys.argv), **cost(data, args, a.cost)}))
        return
    seeds = a.seeds if a.seeds else [None]
    runs = []
    for seed in seeds:
        for r in range(a.runs):
            run = one_run(data, args, a.max_overhead, f"spread{r}", seed)
            runs.append(run)
            print(
                f"seed {seed} run {r}: test {run['test_loss']:.4f} hyper steps "
                f"{len(run['hyper_steps'])} (last at {run['hyper_steps'][-3:]}) final mean λ "
                f"{run['path'][-1]['lam_mean']:.2e} load {run['load_average']:.1f}",
                flush=True,
            )
    tests = [r["test_loss"] for r in runs]
    summary = dict(
        command=" ".join(sys.argv),
        max_overhead=a.max_overhead,
        test_loss=dict(min=min(tests), median=statistics.median(tests), max=max(tests)),
        runs=runs,
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=1))
    print(
        f"test loss min {min(tests):.4f} median {statistics.median(tests):.4f} max {max(tests):.4f}"
    )


if __name__ == "__main__":
    main()
