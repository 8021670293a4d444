"""Session 61: the last λ and the effective λ (eq. effectivedecay) of a learned fit, printed at
each fit's end of ``bench_user_recipes_s60.py`` (its arguments pass through), with what the fit's
end says (``WeightDecayProblem.ended_above_applied``).

usage (repository root):
    python benchmarks/diag_effective_decay_s61.py --data ../shared/data --recipes custom_sched \
        --arms decay --seeds 0 1 --out /tmp/eff_cs.json
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from hypertorch_sid import LearnedWeightDecay

_end = LearnedWeightDecay.on_train_end


def _report(self: LearnedWeightDecay, trainer, module) -> None:
    _end(self, trainer, module)
    last = {k: float(v.double().mean()) for k, v in self.learned_weight_decay.items()}
    effective = self.effective_weight_decay
    print("last λ", {k: f"{v:.3g}" for k, v in last.items()}, flush=True)
    print("effective λ", {k: f"{v:.3g}" for k, v in effective.items()}, flush=True)
    print("said:", self.problem.ended_above_applied(), flush=True)


if __name__ == "__main__":
    LearnedWeightDecay.on_train_end = _report
    script = Path(__file__).with_name("bench_user_recipes_s60.py")
    sys.argv = [str(script), *sys.argv[1:]]
    runpy.run_path(str(script), run_name="__main__")
