# ruff: noqa: E501
"""Session 60 (rule: ../../rules_s60/reach60-rule.txt), condition (b): the main job itself
(examples/lightning_digits.py, its LAST weights scored) with today's default (ctl) or with ReachRprop as the drop-in's outer step (reach), through
benchmarks/main_job_spread.py (the same split, model and trainer; --seeds: the callback's
sampling seed). The reach arm swaps the class the drop-in builds its default outer step from
(lr 0.3, step sizes (0.01, 2.0), as arms.json's). Run before ReachRprop became the default
(from a checkout of the branch's commit before it; after it both arms are ReachRprop).

usage (from the repository root): PYTHONPATH=$PWD python mainjob.py ARM main_job_spread.py-args
  e.g. for k in 0 1 2 3 4 5; do for a in ctl reach; do PYTHONPATH=$PWD python \
      benchmarks/results/weight_decay/runs/s60_reach/mainjob.py $a --runs 1 --seeds $k \
      --out benchmarks/results/weight_decay/runs/s60_reach/mainjob_${a}_seed$k.json; done; done
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import main_job_spread  # noqa: E402

from hypertorch_sid.core.outer_step import ReachRprop  # noqa: E402
from hypertorch_sid.lightning import weight_decay  # noqa: E402

arm = sys.argv.pop(1)
if arm == "reach":
    weight_decay.ShrinkFallRprop = ReachRprop  # the class _defaults builds the outer step from
elif arm != "ctl":
    raise SystemExit(f"unknown arm {arm!r}: ctl or reach")
main_job_spread.main()
