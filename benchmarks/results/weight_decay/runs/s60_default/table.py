# ruff: noqa: E501
"""Session 60: the README table's learned column with the new default (ReachRprop), seeds 0-8,
against session 43's stored picks (the searches' deployments) and session 53's run of the old
default (runs/s53_late, arm ctl53); held-out test loss at the deployed epoch, paired by seed.
usage (from anywhere): python table.py   → table.md, table.json here"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
root = here.parents[1]
PICKS = {
    **json.loads((root / "weight_decay_deployment_9seeds_final_s43.json").read_text())[
        "deployment"
    ]["settings"],
    **json.loads((root / "weight_decay_deployment_9seeds_news_final_s43.json").read_text())[
        "deployment"
    ]["settings"],
}
#: session 53's run of the old default (ShrinkFallRprop), the README table's learned column before
OLD = {
    s: v["ctl"]
    for s, v in json.loads((root / "runs" / "s53_late" / "ctl53.json").read_text())["late"].items()
}
SETTINGS = [
    "mnist_mlp",
    "fashion_mlp",
    "mnist_cnn",
    "fashion_cnn",
    "digits_mlp",
    "digits_small",
    "news_mlp",
]


def run(folder: Path, stem: str, setting: str, seed: int) -> dict | None:
    path = folder / f"{stem}_{setting}_seed{seed}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]


def paired(xs: list[float]) -> dict:
    n = len(xs)
    se = statistics.stdev(xs) / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": statistics.fmean(xs), "se": se, "up": sum(x > 0 for x in xs)}


T95 = {
    1: 12.71,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def cell(d: dict) -> str:
    """mean ± s.e.; bold where the paired t-interval (95 %) excludes 0."""
    bold = abs(d["mean"]) > T95.get(d["n"] - 1, 1.96) * d["se"]
    text = f"{d['mean']:+.4f} ± {d['se']:.4f}".replace("-", "−")
    return f"**{text}**" if bold else text


def main() -> None:
    rows = [
        "| setting | seeds | no weight decay | grid's pick | Optuna's pick | learned (ReachRprop) | − grid's pick | − Optuna's pick | − no decay | − old default (s53) | cost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    data = {}
    for s in SETTINGS:
        runs = {k: run(here, "weight_decay_default", s, k) for k in range(9)}
        runs = {k: r for k, r in runs.items() if r}
        if not runs or s not in PICKS:
            continue
        seeds = sorted(runs)
        dep = PICKS[s]
        test = {k: runs[k]["test_loss"] for k in seeds}
        pick = {
            p: {k: dep[p]["seeds"][str(k)]["test_loss"] for k in seeds}
            for p in ("no WD", "grid pick", "Optuna pick")
        }
        diffs = {p: paired([test[k] - pick[p][k] for k in seeds]) for p in pick}
        old = OLD.get(s)
        old_d = [test[k] - old[k] for k in seeds] if old else []
        costs = [1 + runs[k]["budget"]["overhead"] for k in seeds if runs[k].get("budget")]
        m = {p: statistics.fmean(pick[p].values()) for p in pick}
        rows.append(
            f"| {s} | {len(seeds)} | {m['no WD']:.4f} | {m['grid pick']:.4f} | {m['Optuna pick']:.4f} | {statistics.fmean(test.values()):.4f} "
            f"| {cell(diffs['grid pick'])} | {cell(diffs['Optuna pick'])} | {cell(diffs['no WD'])} "
            f"| {cell(paired(old_d)) if len(old_d) > 1 else '–'} | {min(costs):.2f}–{max(costs):.2f} |"
        )
        data[s] = {
            "seeds": seeds,
            "test": test,
            "minus": diffs,
            "minus_old_default": old_d,
            "cost": costs,
        }
    md = "\n".join(rows) + "\n"
    (here / "table.md").write_text(md)
    (here / "table.json").write_text(json.dumps(data, indent=1))
    print(md)


if __name__ == "__main__":
    main()
