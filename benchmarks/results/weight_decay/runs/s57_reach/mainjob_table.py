# ruff: noqa: E501
"""Session 57, record only: the main job's last weights, ctl against reach (mainjob.py), paired by
the callback's sampling seed. Writes mainjob.md here. usage: python mainjob_table.py"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
rows = ["| sampling seed | ctl test loss | reach test loss | reach − ctl | final mean λ ctl / reach |",
        "|---|---:|---:|---:|---|"]  # fmt: skip
diffs = []
for k in range(6):
    c, r = (json.loads((here / f"mainjob_{a}_seed{k}.json").read_text())["runs"][0]
            for a in ("ctl", "reach"))  # fmt: skip
    diffs.append(r["test_loss"] - c["test_loss"])
    rows.append(f"| {k} | {c['test_loss']:.4f} | {r['test_loss']:.4f} | {diffs[-1]:+.4f} "
                f"| {c['path'][-1]['lam_mean']:.1e} / {r['path'][-1]['lam_mean']:.1e} |")  # fmt: skip
se = statistics.stdev(diffs) / math.sqrt(len(diffs))
rows.append(f"| mean | | | {statistics.fmean(diffs):+.4f} ± {se:.4f} ({sum(d > 0 for d in diffs)} of "
            f"{len(diffs)} worse) | |")  # fmt: skip
(here / "mainjob.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
