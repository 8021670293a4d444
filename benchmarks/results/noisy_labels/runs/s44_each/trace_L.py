"""Session 44: the curvature estimate's L and alpha of LearnedDataWeights on the benchmark (the bench's JSON does
not keep the callback's history): runs benchmarks/bench_noisy_labels.py with its arguments, LearnedDataWeights
replaced by a subclass that prints hyper/L, hyper/lambda_min, hyper/alpha and the relative adjoint residual of each
hyper step at the end of the fit.
Usage (repository root): PYTHONPATH=$PWD OMP_NUM_THREADS=1 python .../trace_L.py <bench_noisy_labels.py arguments>"""

from __future__ import annotations

import runpy
import sys

import hypertorch_sid

Base = hypertorch_sid.LearnedDataWeights


class Traced(Base):
    def on_fit_end(self, trainer, module):  # noqa: D102
        super().on_fit_end(trainer, module)
        arm = self.config.curvature.minibatches
        nan = float("nan")
        for r in self.history:
            g = lambda k: float(r.get(k, nan))  # noqa: E731
            print(
                f"TRACE {arm} step {g('hyper/step'):.0f} L {g('hyper/L'):.4g} "
                f"lambda_min {g('hyper/lambda_min'):.4g} alpha {g('hyper/alpha'):.4g} "
                f"damping {g('hyper/damping'):.4g} rel_res {g('hyper/relative_adjoint_residual'):.3g}",
                flush=True,
            )


hypertorch_sid.LearnedDataWeights = Traced
sys.argv = ["benchmarks/bench_noisy_labels.py", *sys.argv[1:]]
runpy.run_path("benchmarks/bench_noisy_labels.py", run_name="__main__")
