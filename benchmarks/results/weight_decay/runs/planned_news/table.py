"""PlannedBudget(0.5) − OverheadBudget(0.5) on news_mlp, 9 seeds run at once (this folder), and
each arm against the stored default runs (``../news_mlp``); held-out test loss paired by seed,
with the hyper steps. Writes table.md and table.json beside this file.

python benchmarks/results/weight_decay/runs/planned_news/table.py
"""

import json
import math
import statistics as st
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import default_pattern, learned_runs  # noqa: E402

arms = {
    "planned": learned_runs(str(here / "news_mlp_planned_seed[0-9].json"), "news_mlp"),
    "default": learned_runs(str(here / "news_mlp_default_seed[0-9].json"), "news_mlp"),
    "stored default": learned_runs(default_pattern("news_mlp"), "news_mlp"),
}
table, rows = {}, ["| pair | difference | test loss | hyper steps |", "|---|---|---|---|"]
for a, b in (("planned", "default"), ("planned", "stored default"), ("default", "stored default")):
    new, old = arms[a], arms[b]
    k = sorted(set(new) & set(old))
    d = [new[i]["test_loss"] - old[i]["test_loss"] for i in k]
    r = table[f"{a} − {b}"] = {
        "mean": st.mean(d), "se": st.stdev(d) / math.sqrt(len(d)), "n": len(d),
        "loss": [st.mean(x[i]["test_loss"] for i in k) for x in (new, old)],
        "hyper_steps": [st.mean(x[i]["hyper_steps"] for i in k) for x in (new, old)],
    }  # fmt: skip
    rows.append(f"| {a} − {b} | {r['mean']:+.4f} ± {r['se']:.4f} (n = {r['n']}) | "
                f"{r['loss'][0]:.4f} / {r['loss'][1]:.4f} | "
                f"{r['hyper_steps'][0]:.1f} / {r['hyper_steps'][1]:.1f} |")  # fmt: skip
(here / "table.md").write_text("\n".join(rows) + "\n")
(here / "table.json").write_text(json.dumps(table, indent=1) + "\n")
print("\n".join(rows))
