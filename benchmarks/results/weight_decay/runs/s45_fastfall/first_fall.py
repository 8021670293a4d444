"""Probe (screen only, no library change): the default's TrustRprop with a larger *first* step
where the first hypergradient says "less decay" (Δ₀ = FALL_LR, 1.0 by default, for an entry whose
first g > 0; rises and every later step as the default). Session 39's lr = 1.0 made the first
step 1.0 both ways; this separates its falls from its rises.

usage (from the repository root): python .../first_fall.py <bench_weight_decay.py arguments>
    (run.sh's arm ff10 calls it as issue28_beat_run_arm.sh calls bench_weight_decay.py)
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import bench_weight_decay as bench  # noqa: E402

from hypertorch_sid.core.outer_step import TrustRprop  # noqa: E402

FALL_LR = float(os.environ.get("FALL_LR", "1.0"))
_signed = TrustRprop._signed_step


def signed_step(p, g, group, st):
    if st["step"] == 0:  # the first step: Δ₀ = FALL_LR where g says "less decay"
        st["step_size"].copy_(st["step_size"].where(g <= 0, st["step_size"].new_tensor(FALL_LR)))
    return _signed(p, g, group, st)


if __name__ == "__main__":
    TrustRprop._signed_step = staticmethod(signed_step)
    bench.main(sys.argv[1:])
