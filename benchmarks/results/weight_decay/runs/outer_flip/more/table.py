"""TrustRprop (the default) − Adam (the previous default), held-out test loss, paired by seed:
seeds 9-17 run here (both arms at once, run.sh), and pooled with seeds 0-8 (TrustRprop's runs in
../ against Adam's stored runs). Writes table.md and table.json next to this file.

    python benchmarks/results/weight_decay/runs/outer_flip/more/table.py
"""

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[4]))  # benchmarks/
import issue28_look_ahead_table as t  # noqa: E402


def stats(d: list[float]) -> dict:
    m, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    return {"mean": m, "se": se, "n": len(d), "above": sum(x > 0 for x in d)}


rows, table = [], {}
for s in ("fashion_mlp", "mnist_mlp", "digits_small"):
    adam = t.learned_runs(str(HERE / f"{s}_adam_seed*.json"), s)
    trust = t.learned_runs(str(HERE / f"{s}_trust_seed*.json"), s)
    seeds = sorted(set(adam) & set(trust))
    if len(seeds) < 2:
        continue
    late = [trust[k]["test_loss"] - adam[k]["test_loss"] for k in seeds]
    old = t.learned_runs(t.default_pattern(s), s)
    new = t.learned_runs(t.arm_pattern(s, "trR10", HERE.parent), s)
    early = [new[k]["test_loss"] - old[k]["test_loss"] for k in sorted(set(old) & set(new))]
    table[s] = {"seeds_9_17": stats(late), "seeds_0_8": stats(early), "pooled": stats(early + late)}
    f = lambda x: f"{x['mean']:+.4f} ± {x['se']:.4f} ({x['n']}; {x['above']} above 0)"  # noqa: E731
    cells = " | ".join(f(table[s][k]) for k in ("seeds_9_17", "seeds_0_8", "pooled"))
    rows.append(f"| {s} | {cells} |")
md = "\n".join(
    [
        "| setting | seeds 9–17, both arms at once | seeds 0–8, against the stored Adam runs "
        "| pooled |",
        "|---|---|---|---|",
        *rows,
    ]
)
(HERE / "table.md").write_text(md + "\n")
(HERE / "table.json").write_text(json.dumps(table, indent=2) + "\n")
print(md)
