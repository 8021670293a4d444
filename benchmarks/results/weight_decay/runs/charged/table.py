"""The callback's per-step work charged (arm ``charged``, this change) against the default before it
(``rerun``: main at 72865ef, run at the same time in another process) and against the stored
default runs, held-out test loss paired by seed: digits_small seeds 0-8, the MNIST MLP seeds 0-17.
Writes table.md and table.json beside this file.

python benchmarks/results/weight_decay/runs/charged/table.py
"""

import json
import math
import statistics as st
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import default_pattern, learned_runs  # noqa: E402


def summary(new: dict[int, dict], old: dict[int, dict]) -> dict[str, float]:
    seeds = sorted(set(new) & set(old))
    d = [new[k]["test_loss"] - old[k]["test_loss"] for k in seeds]
    hs = [(old[k]["hyper_steps"] or 0, new[k]["hyper_steps"] or 0) for k in seeds]
    return {
        "mean": st.mean(d), "se": st.stdev(d) / math.sqrt(len(d)), "n": len(d),
        "above": sum(x > 0 for x in d),
        "hyper_steps_old": st.mean(a for a, _ in hs),
        "hyper_steps_new": st.mean(b for _, b in hs),
        "overhead_new": st.mean(new[k]["budget"]["overhead"] for k in seeds),
    }  # fmt: skip


HEAD = "| setting | against | charged − it | hyper steps (it / charged) | in-run share (charged) |"
table, rows = {}, [HEAD, "|---|---|---|---|---|"]
for s in ("digits_small", "mnist_mlp"):
    new = learned_runs(str(here / f"{s}_charged*_seed*.json"), s)
    for name, old in (("rerun (same time)", learned_runs(str(here / f"{s}_rerun*_seed*.json"), s)),
                      ("stored default", learned_runs(default_pattern(s), s))):  # fmt: skip
        r = table.setdefault(s, {})[name] = summary(new, old)
        rows.append(
            f"| {s} | {name} | {r['mean']:+.4f} ± {r['se']:.4f} (n = {r['n']}, "
            f"{r['above']} above 0) | {r['hyper_steps_old']:.1f} / {r['hyper_steps_new']:.1f} | "
            f"{r['overhead_new']:.2f} |"
        )
(here / "table.md").write_text("\n".join(rows) + "\n")
(here / "table.json").write_text(json.dumps(table, indent=1) + "\n")
print("\n".join(rows))
