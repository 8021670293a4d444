"""TrustRprop (the default) − Adam (the previous default), Fashion MLP, held-out test loss, paired
by seed: seeds 18-35 run here (both arms at once, run.sh), pooled with seeds 9-17 (../more, both
arms at once) and seeds 0-8 (TrustRprop's runs in ../ against Adam's stored runs). Writes table.md
and table.json next to this file.

    python benchmarks/results/weight_decay/runs/outer_flip/more2/table.py
"""

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MORE = HERE.parent / "more"
sys.path.insert(0, str(HERE.parents[4]))  # benchmarks/
sys.path.insert(0, str(MORE))
import issue28_look_ahead_table as t  # noqa: E402

S = "fashion_mlp"


def runs(folder: Path, arm: str) -> dict:
    out = {}
    for f in folder.glob(f"{S}_{arm}_seed[0-9]*.json"):
        d = json.loads(f.read_text())
        out[int(d["seed"])] = d["settings"][S]["runs"]["learned_per_layer"]
    return out


def diffs(trust: dict, adam: dict) -> list[float]:
    return [trust[k]["test_loss"] - adam[k]["test_loss"] for k in sorted(set(trust) & set(adam))]


def stats(d: list[float]) -> dict:
    m, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    return {"mean": m, "se": se, "n": len(d), "above": sum(x > 0 for x in d)}


new_t, new_a = runs(HERE, "trust"), runs(HERE, "adam")
groups = {
    "seeds 18–35, both arms at once": diffs(new_t, new_a),
    "seeds 9–17, both arms at once": diffs(runs(MORE, "trust"), runs(MORE, "adam")),
    "seeds 0–8, against the stored Adam runs": diffs(
        t.learned_runs(t.arm_pattern(S, "trR10", HERE.parent), S),
        t.learned_runs(t.default_pattern(S), S),
    ),
}
groups["seeds 9–35, both arms at once"] = (
    groups["seeds 9–17, both arms at once"] + groups["seeds 18–35, both arms at once"]
)
groups["pooled, seeds 0–35"] = (
    groups["seeds 0–8, against the stored Adam runs"] + groups["seeds 9–35, both arms at once"]
)
table = {k: stats(v) for k, v in groups.items() if len(v) > 1}
seeds = sorted(set(new_t) & set(new_a))
table["per_seed_18_35"] = {
    k: {
        "trust": new_t[k]["test_loss"],
        "adam": new_a[k]["test_loss"],
        "trust_lambda_finite": new_t[k]["lambda_finite"],
        "adam_lambda_finite": new_a[k]["lambda_finite"],
        "trust_cpu_s": new_t[k]["cpu_s"],
        "adam_cpu_s": new_a[k]["cpu_s"],
    }
    for k in seeds
}
rows = [
    f"| {k} | {v['mean']:+.4f} ± {v['se']:.4f} | {v['n']} | {v['above']} |"
    for k, v in table.items()
    if "mean" in v
]
mean = (
    {a: statistics.mean(r[k]["test_loss"] for k in seeds) for a, r in (("a", new_a), ("t", new_t))}
    if seeds
    else {}
)
means = (
    [f"mean test loss, seeds 18–35: Adam {mean['a']:.4f}, TrustRprop {mean['t']:.4f}"]
    if len(seeds) > 1
    else []
)
lam = (
    {
        arm: {
            "mean_of_means": statistics.mean(r[k]["lambda_summary"]["mean"] for k in seeds),
            "largest": max(r[k]["lambda_summary"]["max"] for k in seeds),
            "all_finite": all(r[k]["finite"] and r[k]["lambda_finite"] for k in seeds),
        }
        for arm, r in (("adam", new_a), ("trust", new_t))
    }
    if seeds
    else {}
)
table["lambda_18_35"] = lam
lam_lines = (
    [
        f"final λ, seeds 18–35 (mean of the layer means; largest layer): Adam "
        f"{lam['adam']['mean_of_means']:.2g}, {lam['adam']['largest']:.2g}; TrustRprop "
        f"{lam['trust']['mean_of_means']:.2g}, {lam['trust']['largest']:.2g}; all finite: "
        f"{lam['adam']['all_finite'] and lam['trust']['all_finite']}"
    ]
    if lam
    else []
)
md = "\n".join(
    [
        "Fashion MLP, `TrustRprop` − Adam(lr 0.3), held-out test loss (mean ± s.e.)",
        "",
        "| seeds | difference | seeds | above 0 |",
        "|---|---|---:|---:|",
        *rows,
        "",
        *means,
        "",
        *lam_lines,
    ]
)
(HERE / "table.md").write_text(md + "\n")
(HERE / "table.json").write_text(json.dumps(table, indent=2) + "\n")
print(md)
