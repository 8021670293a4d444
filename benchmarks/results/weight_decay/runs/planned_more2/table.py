"""PlannedBudget(0.5) − the default budget, held-out test loss paired by seed: the Fashion MLP on
seeds 27-53 (this folder, both arms at once) pooled with seeds 0-26 (``../planned_more``,
``../planned_retry`` against the stored default runs), and digits_mlp on seeds 0-8 (this folder).
Writes table.md and table.json beside this file.

python benchmarks/results/weight_decay/runs/planned_more2/table.py
"""

import json
import math
import statistics as st
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import DEFAULT, learned_runs  # noqa: E402


def runs(pattern: str, setting: str) -> dict[int, float]:
    return {s: r["test_loss"] for s, r in learned_runs(pattern, setting).items()}


def diffs(folder: Path, setting: str, old_pattern: str | None = None) -> list[float]:
    new = runs(str(folder / f"{setting}_planned_seed*.json"), setting)
    old = runs(old_pattern or str(folder / f"{setting}_default_seed*.json"), setting)
    return [new[k] - old[k] for k in sorted(set(new) & set(old))]


def summary(d: list[float]) -> dict[str, float]:
    se = st.stdev(d) / math.sqrt(len(d))
    return {"mean": st.mean(d), "se": se, "n": len(d), "above": sum(x > 0 for x in d)}


def text(s: dict[str, float]) -> str:
    return f"{s['mean']:+.4f} ± {s['se']:.4f} (n = {s['n']}, {s['above']} above 0)"


more, retry = here.parent / "planned_more", here.parent / "planned_retry"
stored = str(DEFAULT / "fashion_mlp_default05_seed[0-9].json")
fashion = {
    "seeds 27-53 (same run)": diffs(here, "fashion_mlp"),
    "seeds 9-26 (same run)": diffs(more, "fashion_mlp"),
    "seeds 0-8 (stored default)": diffs(retry, "fashion_mlp", stored),
}
fashion["seeds 9-53 (same run only)"] = (
    fashion["seeds 27-53 (same run)"] + fashion["seeds 9-26 (same run)"]
)
fashion["seeds 0-53"] = (
    fashion["seeds 9-53 (same run only)"] + fashion["seeds 0-8 (stored default)"]
)
digits = {"seeds 0-8 (same run)": diffs(here, "digits_mlp")}
table = {
    "fashion_mlp": {k: summary(v) for k, v in fashion.items()},
    "digits_mlp": {k: summary(v) for k, v in digits.items()},
}
rows = ["| setting | seeds | planned − default |", "|---|---|---|"]
for setting, parts in table.items():
    rows += [f"| {setting} | {k} | {text(v)} |" for k, v in parts.items()]
(here / "table.md").write_text("\n".join(rows) + "\n")
(here / "table.json").write_text(json.dumps(table, indent=1) + "\n")
print("\n".join(rows))
