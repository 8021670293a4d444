# ruff: noqa: E501
"""Session 59: the pooled step-size probe on a real manual-optimisation fit (before/after).
usage: python table.py (reads before.json, now.json; writes table.md)."""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent


def runs(name: str, arm: str) -> dict[int, dict]:
    data = json.loads((here / f"{name}.json").read_text())["runs"]
    return {r["seed"]: r for r in data if r["arm"] == arm}


def mean_se(xs: list[float]) -> str:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    return f"{statistics.fmean(xs):+.4f} ± {se:.4f}"


def main() -> None:
    before, now, own = runs("before", "learned"), runs("now", "learned"), runs("now", "own")
    seeds = sorted(set(before) & set(now) & set(own))
    rows = [
        "| seed | η̂ before (median) | η̂ pooled (median) | λ end before (body, head) | λ end pooled | test before | test pooled | test own λ = 1e-4 |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for s in seeds:
        b, n, o = before[s], now[s], own[s]
        eb = statistics.median(e for e in b["eta_probed"] if e is not None)
        en = statistics.median(e for e in n["eta_probed"] if e is not None)
        lb = ", ".join(f"{v:.1e}" for v in b["lambda_end"].values())
        ln = ", ".join(f"{v:.1e}" for v in n["lambda_end"].values())
        rows.append(
            f"| {s} | {eb:.3f} | {en:.3f} | {lb} | {ln} | {b['test_loss']:.4f} | "
            f"{n['test_loss']:.4f} | {o['test_loss']:.4f} |"
        )
    d_probe = [now[s]["test_loss"] - before[s]["test_loss"] for s in seeds]
    d_own = [now[s]["test_loss"] - own[s]["test_loss"] for s in seeds]
    rows += [
        "",
        f"pooled − before (test loss, paired): {mean_se(d_probe)}, "
        f"worse {sum(x > 0 for x in d_probe)}/{len(d_probe)}",
        f"pooled − own λ = 1e-4 (test loss, paired): {mean_se(d_own)}, "
        f"worse {sum(x > 0 for x in d_own)}/{len(d_own)}",
    ]
    (here / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
