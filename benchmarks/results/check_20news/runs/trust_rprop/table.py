"""20 Newsgroups recipe, weight-decay check: the default (TrustRprop) against the previous outer
step (Adam lr 0.3, same run: ``learned_adam``), no weight decay, the grid's pick, the default
without budget, and the stored old-default runs (``learned`` of ../../check_20news.json, seeds
0-2, and of ../../look_ahead_planned_trajectory.json, seeds 0-8). Held-out test loss, paired by
seed. Writes table.md and table.json next to this file.

    python benchmarks/results/check_20news/runs/trust_rprop/table.py [FOLDER]

(FOLDER: another run folder of the same layout, e.g. ../planned_trust; default this one.)
"""

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent
STORED = HERE.parents[1]


def seeds_of(path: Path) -> dict[int, dict]:
    return {int(k): v for k, v in json.loads(path.read_text())["runs"]["weight_decay"].items()}


runs: dict[int, dict] = {}
for f in sorted(HERE.glob("check_20news_seeds*.json")):
    runs.update(seeds_of(f))
stored = {
    "stored default (Adam), check_20news.json": seeds_of(STORED / "check_20news.json"),
    "stored default (Adam), look_ahead_planned_trajectory.json": seeds_of(
        STORED / "look_ahead_planned_trajectory.json"
    ),
}
seeds = sorted(runs)


def stats(d: list[float]) -> dict:
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return {"mean": statistics.mean(d), "se": se, "n": len(d), "above": sum(x > 0 for x in d)}


arms = {
    "no weight decay": {s: runs[s]["no_wd"] for s in seeds},
    "grid's pick (5 values)": {s: runs[s]["grid_pick"] for s in seeds},
    "previous outer step, Adam lr 0.3 (same run)": {s: runs[s]["learned_adam"] for s in seeds},
    "default without budget": {s: runs[s]["learned_no_budget"] for s in seeds},
    **{k: {s: v[s]["learned"] for s in seeds if s in v} for k, v in stored.items()},
}
new = {s: runs[s]["learned"] for s in seeds}
out = {
    "seeds": seeds,
    "default_mean_loss": statistics.mean(new[s]["loss"] for s in seeds),
    "default_lambda_end": [new[s]["lambda_end"] for s in seeds],
    "default_cpu_over_no_wd": [new[s]["cpu"] / runs[s]["no_wd"]["cpu"] for s in seeds],
    "adam_cpu_over_no_wd": [
        runs[s]["learned_adam"]["cpu"] / runs[s]["no_wd"]["cpu"] for s in seeds
    ],
    "against": {},
}
rows = []
for name, arm in arms.items():
    common = [s for s in seeds if s in arm]
    d = [new[s]["loss"] - arm[s]["loss"] for s in common]
    st = stats(d)
    st["arm_mean_loss"] = statistics.mean(arm[s]["loss"] for s in common)
    if "lambda_end" in arm[common[0]]:
        st["arm_lambda_end"] = [arm[s]["lambda_end"] for s in common]
    out["against"][name] = st
    rows.append(
        f"| {name} | {st['arm_mean_loss']:.4f} | {st['mean']:+.4f} ± {st['se']:.4f} "
        f"| {st['above']} of {st['n']} |"
    )
md = "\n".join(
    [
        f"20 Newsgroups recipe, seeds {seeds[0]}–{seeds[-1]}: the default (`TrustRprop`), mean "
        f"held-out test loss {out['default_mean_loss']:.4f}, λ at the end "
        f"{min(out['default_lambda_end']):.1e}–{max(out['default_lambda_end']):.1e}",
        "",
        "| against | its mean test loss | default − it | seeds above 0 |",
        "|---|---:|---|---|",
        *rows,
    ]
)
(HERE / "table.md").write_text(md + "\n")
(HERE / "table.json").write_text(json.dumps(out, indent=2) + "\n")
print(md)
