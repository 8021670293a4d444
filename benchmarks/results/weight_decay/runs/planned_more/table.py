"""PlannedBudget − the default budget, held-out test loss paired by seed, on the MLP settings:
seeds 9-26 (this folder, both arms run at once) and pooled with seeds 0-8 (``../planned_retry``
against the stored default runs). Writes table.md beside this file.

python benchmarks/results/weight_decay/runs/planned_more/table.py
"""

import math
import statistics as st
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import DEFAULT, learned_runs  # noqa: E402


def runs(pattern: str, setting: str) -> dict[int, float]:
    return {s: r["test_loss"] for s, r in learned_runs(pattern, setting).items()}


def summary(d: list[float]) -> str:
    se = st.stdev(d) / math.sqrt(len(d))
    return f"{st.mean(d):+.4f} ± {se:.4f} (n = {len(d)}, {sum(x > 0 for x in d)} above 0)"


rows = [
    "| setting | seeds 9-26 (same run) | seeds 0-8 (stored default) | seeds 0-26 |",
    "|---|---|---|---|",
]
for s in ("mnist_mlp", "fashion_mlp"):
    new = runs(str(here / f"{s}_planned_seed*.json"), s)
    old = runs(str(here / f"{s}_default_seed*.json"), s)
    late = [new[k] - old[k] for k in sorted(set(new) & set(old))]
    p0 = runs(str(here.parent / "planned_retry" / f"{s}_planned_seed[0-9].json"), s)
    d0 = runs(str(DEFAULT / f"{s}_default05_seed[0-9].json"), s)
    early = [p0[k] - d0[k] for k in sorted(set(p0) & set(d0))]
    rows.append(f"| {s} | {summary(late)} | {summary(early)} | {summary(early + late)} |")
(here / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
