"""PlannedBudget(0.5) − OverheadBudget(0.5) with the outer step TrustRprop and the per-step work
charged (both arms at once, this folder): news_mlp and the Fashion MLP, 9 seeds, held-out test
loss paired by seed, with the hyper steps. Writes table.md and table.json beside this file.

python benchmarks/results/weight_decay/runs/planned_trust/table.py
"""

import json
import math
import statistics as st
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import learned_runs  # noqa: E402

table = {}
rows = [
    "| setting | planned − default | test loss (planned / default) | hyper steps |",
    "|---|---|---|---|",
]
for s in ("news_mlp", "fashion_mlp"):
    new = learned_runs(str(here / f"{s}_planned_seed[0-9].json"), s)
    old = learned_runs(str(here / f"{s}_default_seed[0-9].json"), s)
    k = sorted(set(new) & set(old))
    d = [new[i]["test_loss"] - old[i]["test_loss"] for i in k]
    r = table[s] = {
        "mean": st.mean(d), "se": st.stdev(d) / math.sqrt(len(d)), "n": len(d),
        "above": sum(x > 0 for x in d),
        "loss": [st.mean(x[i]["test_loss"] for i in k) for x in (new, old)],
        "hyper_steps": [st.mean(x[i]["hyper_steps"] for i in k) for x in (new, old)],
    }  # fmt: skip
    rows.append(
        f"| {s} | {r['mean']:+.4f} ± {r['se']:.4f} (n = {r['n']}, {r['above']} above 0) | "
        f"{r['loss'][0]:.4f} / {r['loss'][1]:.4f} | "
        f"{r['hyper_steps'][0]:.1f} / {r['hyper_steps'][1]:.1f} |"
    )
(here / "table.md").write_text("\n".join(rows) + "\n")
(here / "table.json").write_text(json.dumps(table, indent=1) + "\n")
print("\n".join(rows))
