"""Probe (screen only, no library change): eq. shrink with the noise counted MARGIN standard
deviations of a χ² spread high instead of the default's 2 (STRICT_MARGIN, 4 by default), so
that a tensor's deviations move only on a larger spread of its averaged hypergradients.

With the default's c = 1 − N(1 + 2k)/S (k = √(2/(p − 1))), this returns
c' = max(0, 1 − N(1 + MARGIN·k)/S), from c itself: c' = 0 where c = 0, so c' ≤ c, and a fit
whose c stays 0 throughout is the default's fit bit for bit.

usage (from the repository root): python .../strict_shrink.py <bench_weight_decay.py arguments>
    (run.sh's arm strict4 calls it as issue28_beat_run_arm.sh calls bench_weight_decay.py)
"""

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import bench_weight_decay as bench  # noqa: E402

from hypertorch_sid.core import decay  # noqa: E402

MARGIN = float(os.environ.get("STRICT_MARGIN", "4"))
_shrinkage = decay.shrinkage


def strict(mean, square, beta, t, share, lagged=0.0):
    c = _shrinkage(mean, square, beta, t, share, lagged)
    if c <= 0:
        return 0.0
    k = math.sqrt(2 / (mean.numel() - 1))
    return max(0.0, 1.0 - (1.0 - c) * (1 + MARGIN * k) / (1 + 2 * k))


if __name__ == "__main__":
    decay.shrinkage = strict  # _shrunk_step reads the module's name at each step
    bench.main(sys.argv[1:])
