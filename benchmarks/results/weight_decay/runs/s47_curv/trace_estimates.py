"""Session 47: every curvature estimate of one benchmark fit next to a cold 30-step Lanczos run on
the same batches at the same point (not counted in the fit's cost, but it takes time: run it with
no budget, ``"max_overhead": null``). How tol = 0.05 and ρ = 0.1 were chosen, before rule.md.

usage (from the repository root; the arguments are bench_weight_decay.py's):
    python benchmarks/results/weight_decay/runs/s47_curv/trace_estimates.py --settings digits_small
        --seeds 1 --methods learned_per_layer --optuna-trials 0 --threads 1 --out OUT.json
        --reuse "benchmarks/results/weight_decay/runs/digits_small/digits_small_seed{seed}.json"
        --learned-kwargs '{"max_overhead": null, "curvature": {"class_path":
        "hypertorch_sid.EstimatedCurvature", "init_args": {"batches": 2, "iters": 10, "every": 3,
        "warm_start": true, "tol": 0.05}}}'
Prints one line per estimate (stderr): warm or cold, its Lanczos steps, L̂ and λ̂_min ± r_min,
a cold run of the strategy's ``iters`` steps (what the default reads) and the 30-step reference.
With ``S47_REFERENCE=0`` in the environment no reference is read (the fit runs as benchmarked,
under its budget) and only the estimates are printed.
"""

import os
import runpy
import sys
from pathlib import Path

import hypertorch_sid.core.estimation as estimation

REPO = Path(__file__).resolve().parents[5]
original = estimation.estimate_curvature


def traced(phi, batches, iters=20, **kw):
    est = original(phi, batches, iters, **kw)
    if os.environ.get("S47_REFERENCE") == "0":
        print(
            f"EST warm={kw.get('start') is not None} steps={est.iterations} "
            f"batches={len(batches)} L={est.L:.4g} lambda_min={est.lambda_min:.4g}",
            file=sys.stderr,
        )
        return est
    raw = getattr(phi, "phi", phi)  # the uncounted map
    same = dict(mu=kw.get("mu"), mu_floor=kw.get("mu_floor", 1e-4), seed=99)
    ref, cold = original(raw, batches, 30, **same), original(raw, batches, iters, **same)
    print(
        f"EST warm={kw.get('start') is not None} steps={est.iterations} L={est.L:.4g} "
        f"lambda_min={est.lambda_min:.4g}±{est.lambda_min_error:.2g} | cold {iters} steps: "
        f"L={cold.L:.4g} lambda_min={cold.lambda_min:.4g}±{cold.lambda_min_error:.2g} | "
        f"cold 30 steps: L={ref.L:.4g} lambda_min={ref.lambda_min:.4g}±{ref.lambda_min_error:.2g}",
        file=sys.stderr,
    )
    return est


if __name__ == "__main__":
    estimation.estimate_curvature = traced
    sys.argv = ["bench_weight_decay.py", *sys.argv[1:]]
    runpy.run_path(str(REPO / "benchmarks" / "bench_weight_decay.py"), run_name="__main__")
