"""traj64 (session 64): run a benchmark script with each LearnedDataWeights fit's eq. drift
trajectory printed as a ``TRAJ`` JSON line before the run's own line: after every hyper step's
interval k (k = 1, 2, ...), the optimizer step it was read at, R and the median zᵢ² of the
first k intervals, and the fit's planned optimizer steps.

    PYTHONPATH=$PWD python benchmarks/results/user_recipes/s64/traj64_probe.py \\
        benchmarks/bench_user_recipes_s63.py --data ../shared/data --recipes gce_fmnist ...
"""

import json
import runpy
import sys

from hypertorch_sid.lightning import data_weights as dwm
from hypertorch_sid.lightning.training_length import planned_steps

_watch = dwm.LearnedDataWeights._watch_signal
_said = dwm.LearnedDataWeights._say_no_signal


def _watch_and_keep(self: dwm.LearnedDataWeights) -> None:
    before = self._signal.steps
    _watch(self)
    traj = self.__dict__.setdefault("_traj", [])
    if self._signal.steps == 0:
        traj.clear()  # a new fit
    if self._signal.steps > before and self._trainer is not None:
        drift, median, rows = self._signal._read()
        traj.append([self._signal.steps, self._trainer.global_step, drift, median, rows])


def _say_and_print(self: dwm.LearnedDataWeights) -> None:
    _said(self)
    planned = planned_steps(self._trainer) if self._trainer is not None else None
    hyper = [int(h["global_step"]) for h in self.history]
    line = {"planned": planned, "hyper_steps": hyper, "traj": self.__dict__.get("_traj", [])}
    print("TRAJ", json.dumps(line), flush=True)
    self._traj = []


dwm.LearnedDataWeights._watch_signal = _watch_and_keep  # type: ignore[method-assign]
dwm.LearnedDataWeights._say_no_signal = _say_and_print  # type: ignore[method-assign]
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
