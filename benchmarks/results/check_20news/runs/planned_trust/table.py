"""20 Newsgroups recipe, weight-decay check: the defaults of main at 1eefc9f (PlannedBudget,
TrustRprop) against the previous outer step (Adam lr 0.3, same run), no weight decay, the grid's
pick, the default without budget and the stored old-default runs: ../trust_rprop/table.py on
this folder. Writes table.md and table.json next to this file.

    python benchmarks/results/check_20news/runs/planned_trust/table.py
"""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.argv = [sys.argv[0], str(HERE)]
runpy.run_path(str(HERE.parent / "trust_rprop" / "table.py"), run_name="__main__")
