"""Session 44: LearnedDataWeights' curvature estimate on the benchmark (its JSON does not keep
the callback's history): runs benchmarks/bench_noisy_labels.py with the given arguments, with
LearnedDataWeights replaced by a subclass that prints, for each hyper step at the end of the fit,
hyper/L, hyper/lambda_min, hyper/alpha, hyper/damping and the relative adjoint residual.
Usage (repository root), e.g. (trace_L_seed1.txt):
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 python <this folder>/trace_L.py \\
  --epochs 12 --clip 1 --threads 1 --datasets fashion --noise symmetric --seeds 1 \\
  --methods drop_in --drop-in-kwargs '{"curvature": {"batches": 2, "iters": 10, "every": 10,
  "minibatches": "each"}}' --out trace.json
"""

from __future__ import annotations

import runpy
import sys

import hypertorch_sid

Base = hypertorch_sid.LearnedDataWeights


class Traced(Base):
    def on_fit_end(self, trainer, module):  # noqa: D102
        super().on_fit_end(trainer, module)
        arm = self.config.curvature.minibatches
        for r in self.history:
            g = {k: _number(r, "hyper/" + k) for k in KEYS}
            print(
                f"TRACE {arm} step {g['step']:.0f} L {g['L']:.4g} "
                f"lambda_min {g['lambda_min']:.4g} alpha {g['alpha']:.4g} "
                f"damping {g['damping']:.4g} rel_res {g['relative_adjoint_residual']:.3g}",
                flush=True,
            )


KEYS = ("step", "L", "lambda_min", "alpha", "damping", "relative_adjoint_residual")


def _number(row: dict, key: str) -> float:
    return float(row[key]) if key in row else float("nan")


hypertorch_sid.LearnedDataWeights = Traced
sys.argv = ["benchmarks/bench_noisy_labels.py", *sys.argv[1:]]
runpy.run_path("benchmarks/bench_noisy_labels.py", run_name="__main__")
