"""Session 59: the main job (examples/lightning_digits.py via benchmarks/main_job_spread.py, LAST
weights scored) with today's default (ctl) or TailHoldRprop(tail=0.2) (tail) as the drop-in's
default outer step (TailHoldRprop is at git tag s59-tail-hold-unmerged).
usage: PYTHONPATH=$PWD python mainjob.py ARM main_job_spread.py-args"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import main_job_spread  # noqa: E402

from hypertorch_sid.core.outer_step import TailHoldRprop  # noqa: E402
from hypertorch_sid.lightning import weight_decay  # noqa: E402

arm = sys.argv.pop(1)
if arm == "tail":
    weight_decay.ShrinkFallRprop = functools.partial(TailHoldRprop, tail=0.2)
elif arm != "ctl":
    raise SystemExit(f"unknown arm {arm!r}: ctl or tail")
main_job_spread.main()
