# ruff: noqa: E501
"""Session 57: ReachRprop (reach) against today's default (ctl), run alternately seed by seed
(run.sh); the rule: ../../rules_s57/wd57-rule.txt.

usage (from anywhere): python table.py NAME SETTING:SEED,SEED,... [SETTING:...]
writes NAME.{md,json} here: per setting reach − ctl (held-out test loss at the deployed checkpoint,
paired by seed), seeds worse, hyper steps, the budget's final overhead, the final mean λ; on seeds
0-8 also each arm − the grid's / Optuna's pick / no decay (session 43's stored deployments).
"""

import json
import math
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
DEPLOYED = here.parents[1] / "weight_decay_deployment_9seeds_final_s43.json"


def run(arm: str, setting: str, seed: int) -> dict | None:
    path = here / f"weight_decay_{arm}_{setting}_seed{seed}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]


def paired(xs: list[float]) -> dict:
    n = len(xs)
    se = statistics.stdev(xs) / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": statistics.fmean(xs), "se": se, "up": sum(x > 0 for x in xs)}


def f(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f}"


def geo(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(x, 1e-300)) for x in xs))


def main() -> None:
    name, specs = sys.argv[1], sys.argv[2:]
    picks = json.loads(DEPLOYED.read_text())["deployment"]["settings"]
    rows = [
        "| setting | seeds | test ctl | test reach | reach − ctl | reach worse | per seed reach − ctl "
        "| hyper steps reach / ctl | overhead max reach / ctl | final λ reach / ctl (geometric) |",
        "|---|---|---:|---:|---|---:|---|---|---|---|",
    ]
    extra, data = [], {}
    for spec in specs:
        setting, _, seeds = spec.partition(":")
        seeds = [int(s) for s in seeds.split(",")]
        pairs = [(s, run("ctl", setting, s), run("reach", setting, s)) for s in seeds]
        pairs = [(s, c, r) for s, c, r in pairs if c is not None and r is not None]
        if not pairs:
            continue
        d = [r["test_loss"] - c["test_loss"] for _, c, r in pairs]
        st = paired(d)
        hs = ([r["hyper_steps"] for _, _, r in pairs], [c["hyper_steps"] for _, c, _ in pairs])
        ov = (
            [r["budget"]["overhead"] for _, _, r in pairs],
            [c["budget"]["overhead"] for _, c, _ in pairs],
        )
        lam = (
            [r["lambda_summary"]["mean"] for _, _, r in pairs],
            [c["lambda_summary"]["mean"] for _, c, _ in pairs],
        )
        mean_c = statistics.fmean(c["test_loss"] for _, c, _ in pairs)
        mean_r = statistics.fmean(r["test_loss"] for _, _, r in pairs)
        rows.append(
            f"| {setting} | {seeds[0]}-{seeds[-1]} ({st['n']}) | {mean_c:.4f} | {mean_r:.4f} | {f(st)} "
            f"| {st['up']}/{st['n']} | {', '.join(f'{x:+.4f}' for x in d)} "
            f"| {statistics.fmean(hs[0]):.1f} / {statistics.fmean(hs[1]):.1f} "
            f"| {max(ov[0]):.3f} / {max(ov[1]):.3f} | {geo(lam[0]):.2g} / {geo(lam[1]):.2g} |"
        )
        data[setting] = {
            "seeds": [s for s, _, _ in pairs], "reach_minus_ctl": st, "per_seed": d,
            "test_ctl": [c["test_loss"] for _, c, _ in pairs], "test_reach": [r["test_loss"] for _, _, r in pairs],
            "hyper_steps": {"reach": hs[0], "ctl": hs[1]}, "overhead": {"reach": ov[0], "ctl": ov[1]},
            "final_lambda": {"reach": lam[0], "ctl": lam[1]},
        }  # fmt: skip
        dep = picks.get(setting)
        if dep and all(s < 9 for s, _, _ in pairs):
            cells = []
            for arm, k in (("reach", 2), ("ctl", 1)):
                for pick in ("grid pick", "Optuna pick", "no WD"):
                    xs = [
                        p[k]["test_loss"] - dep[pick]["seeds"][str(p[0])]["test_loss"]
                        for p in pairs
                    ]
                    cells.append(f(paired(xs)))
                    data[setting][f"{arm}_minus_{pick}"] = paired(xs)
            extra.append(f"| {setting} | " + " | ".join(cells) + " |")
    md = "\n".join(rows)
    if extra:
        md += (
            "\n\n| setting | reach − grid pick | reach − Optuna pick | reach − no WD | ctl − grid pick "
            "| ctl − Optuna pick | ctl − no WD |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(extra)
        )
    (here / f"{name}.md").write_text(md + "\n")
    (here / f"{name}.json").write_text(json.dumps(data, indent=1))
    print(md)


if __name__ == "__main__":
    main()
