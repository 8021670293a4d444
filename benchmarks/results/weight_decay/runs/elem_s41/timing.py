"""Where a budgeted hyper step's time goes, per element against per layer: the inclusive CPU time
(process_time, what the budget's clock reads on the CPU) of the pieces of a hyper step, per hyper
step, in one seed (0) under OverheadBudget(0.5), no profiler.

usage (from the repository root): PYTHONPATH=$PWD OMP_NUM_THREADS=1 python
    benchmarks/results/weight_decay/runs/elem_s41/timing.py METHOD OUT_TAG [SETTING]
(timing.sh runs both methods on mnist_mlp and news_mlp into timing.txt)"""

import collections
import functools
import runpy
import sys
import time

import hypertorch_sid.core.constants as K
import hypertorch_sid.core.decay as D
import hypertorch_sid.core.maps as MP
import hypertorch_sid.core.optimizer as O
import hypertorch_sid.core.outer as OU
import hypertorch_sid.lightning.callback as C
import hypertorch_sid.lightning.data_loss as DL
import hypertorch_sid.lightning.metrics as M
import hypertorch_sid.lightning.stability as ST
import hypertorch_sid.lightning.weight_decay as W

acc: dict[str, float] = collections.defaultdict(float)
cnt: collections.Counter = collections.Counter()


def wrap(obj: object, name: str) -> None:
    """Replace ``obj.name`` by a version that adds its inclusive CPU time to ``acc``."""
    f, label = getattr(obj, name), f"{getattr(obj, '__name__', obj)}.{name}"

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - t
            cnt[label] += 1

    setattr(obj, name, timed)


PIECES = [
    (C.HyperOptimizationCallback, "_hyper_step"), (C.HyperOptimizationCallback, "_log"),
    (C, "check_weights"), (W.WeightDecayProblem, "before_hyper_step"),
    (W.WeightDecayProblem, "apply"), (ST.StableBounds, "project"),
    (DL.DataLoss, "__call__"), (W.LearnedWeightDecay, "_adjust_hypergradient"),
    (O.SIDHyperOptimizer, "hypergradient"), (O.SIDHyperOptimizer, "apply"),
    (O.SIDHyperOptimizer, "_assemble"), (O.SIDHyperOptimizer, "_check_divergence"),
    (O.SIDHyperOptimizer, "_adjoint_solve"), (O.SIDHyperOptimizer, "_inner_solve"),
    (O.SIDHyperOptimizer, "_record"), (K.StepConstants, "prepare"),
    (D.TrustShrinkageStep, "step"), (D.WeightDecay, "penalty"), (M, "hyper_metrics"),
    (MP.GradientDescentMap, "hessian_vector_product"), (MP.GradientDescentMap, "vjp"),
    (MP.GradientDescentMap, "curvature_product"), (MP.GradientDescentMap, "smooth_loss"),
    (OU, "outer_gradients"),
]  # fmt: skip


def main() -> None:
    method, tag = sys.argv[1], sys.argv[2]
    setting = sys.argv[3] if len(sys.argv) > 3 else "mnist_mlp"
    for obj, name in PIECES:
        wrap(obj, name)
    C.hyper_metrics, O.outer_gradients = M.hyper_metrics, OU.outer_gradients  # imported names
    budget = {"class_path": "hypertorch_sid.core.budget.OverheadBudget",
              "init_args": {"max_overhead": 0.5}}  # fmt: skip
    sys.argv = [
        "bench_weight_decay.py", "--settings", setting, "--seeds", "0", "--methods", method,
        "--optuna-trials", "0", "--threads", "1",
        "--granularity-kwargs", '{"per_element": {"elements": "layer_then_shrunk"}}',
        "--learned-kwargs", f'{{"max_overhead": {budget}}}'.replace("'", '"'),
        "--out", f"/tmp/{tag}.json",
    ]  # fmt: skip
    runpy.run_path("benchmarks/bench_weight_decay.py", run_name="__main__")
    hyper = cnt["HyperOptimizationCallback._hyper_step"]
    print("HYPER", setting, method, hyper)
    for label, spent in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"{1e3 * spent / max(hyper, 1):8.2f} ms/hyper  {cnt[label]:5d}  {label}")


if __name__ == "__main__":
    main()
