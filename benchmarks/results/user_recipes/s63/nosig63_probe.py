"""nosig63 (session 63): run a benchmark script with each LearnedDataWeights fit's eq. drift
reading (``weight_signal()``) printed as a ``NOSIG`` line before the run's own line.

    PYTHONPATH=$PWD python benchmarks/results/user_recipes/s63/nosig63_probe.py \\
        benchmarks/bench_user_recipes_s63.py --data ../shared/data --recipes gce_fmnist ...
"""

import runpy
import sys

from hypertorch_sid.lightning import data_weights as dwm

_said = dwm.LearnedDataWeights._say_no_signal


def _say_and_print(self: dwm.LearnedDataWeights) -> None:
    _said(self)
    print("NOSIG", self.weight_signal(), flush=True)


dwm.LearnedDataWeights._say_no_signal = _say_and_print  # type: ignore[method-assign]
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
