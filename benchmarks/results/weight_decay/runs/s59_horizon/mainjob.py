"""Session 59: the main job (examples/lightning_digits.py via benchmarks/main_job_spread.py, LAST
weights scored) with today's default (ctl) or HorizonRprop(memory=0.25) (horizon) as the drop-in's
default outer step (HorizonRprop is at git tag s59-horizon-rprop-unmerged).
usage: PYTHONPATH=$PWD python mainjob.py ARM main_job_spread.py-args"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import main_job_spread  # noqa: E402

from hypertorch_sid.core.outer_step import HorizonRprop  # noqa: E402
from hypertorch_sid.lightning import weight_decay  # noqa: E402

arm = sys.argv.pop(1)
if arm == "horizon":
    weight_decay.ShrinkFallRprop = functools.partial(HorizonRprop, memory=0.25)
elif arm != "ctl":
    raise SystemExit(f"unknown arm {arm!r}: ctl or horizon")
main_job_spread.main()
