"""Session 47, record only: the main job's spread (benchmarks/main_job_spread.py: the learned arm
of examples/lightning_digits.py, 400 steps, final weights scored) with the default curvature
(ARM ctl) or warm-started refreshes (ARM warm: EstimatedCurvature(batches=2, iters=10, every=10,
warm_start=True, tol=0.05)); the other arguments are main_job_spread.py's.

usage (from the repository root; D=benchmarks/results/weight_decay/runs/s47_curv):
    python $D/main_job.py ARM --runs 1 --seeds 0 1 2 3 4 5 6 7 8 --out $D/main_job_ARM.json
"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
import main_job_spread  # noqa: E402

from hypertorch_sid import EstimatedCurvature, LearnedWeightDecay  # noqa: E402

WARM = EstimatedCurvature(batches=2, iters=10, every=10, warm_start=True, tol=0.05)

if __name__ == "__main__":
    arm = sys.argv.pop(1)
    if arm == "warm":
        main_job_spread.LearnedWeightDecay = functools.partial(LearnedWeightDecay, curvature=WARM)
    elif arm != "ctl":
        raise SystemExit(f"ARM must be ctl or warm, got {arm!r}")
    main_job_spread.main()
