# ruff: noqa: E501
"""Session 59: HorizonRprop(memory=0.25) (horizon) against today's default (ctl), alternating run by
run (run.sh); the rule: ../../rules_s59/horizon-rule.txt. usage: python table.py (writes table.md)."""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
PICK = 2.5e-3  # the grid's pick on the main job's recipe


def mainjob(arm: str, seed: int) -> dict | None:
    p = here / f"mainjob_{arm}_seed{seed}.json"
    return json.loads(p.read_text())["runs"][0] if p.is_file() else None


def digits(arm: str, seed: int) -> dict | None:
    p = here / f"weight_decay_{arm}_digits_small_seed{seed}.json"
    if not p.is_file():
        return None
    return json.loads(p.read_text())["settings"]["digits_small"]["runs"]["learned_per_layer"]


def mean_se(d: list[float]) -> str:
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    return f"{statistics.fmean(d):+.4f} ± {se:.4f}"


def summary(name: str, pairs: list[tuple[int, dict, dict]], key: str = "test_loss") -> list[str]:
    d = [s[key] - c[key] for _, c, s in pairs]
    per = ", ".join(f"{x:+.4f}" for x in d)
    ctl = statistics.fmean(c[key] for _, c, _ in pairs)
    new = statistics.fmean(s[key] for _, _, s in pairs)
    return [
        f"| {name} | {len(d)} | {ctl:.4f} | {new:.4f} | {mean_se(d)} "
        f"| {sum(x > 0 for x in d)}/{len(d)} | {per} |"
    ]


def geo(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def lam_at(path: list[dict], step: int) -> float:
    """λ (mean over layers) in force at training step ``step``: after the last hyper step before it."""
    before = [p["lam_mean"] for p in path if p["step"] <= step]
    return before[-1] if before else path[0]["lam_mean"]


def paths(pairs: list[tuple[int, dict, dict]]) -> list[str]:
    rows = [
        "",
        "λ (mean over layers) in force at steps 300 and 340 and at the end, geometric mean over the "
        f"pairs [min, max]; the grid's pick {PICK:g}:",
        "",
        "| arm | λ at 300 | λ at 340 | λ at the end | end above the pick | val loss at the last weights |",
        "|---|---|---|---|---:|---|",
    ]
    for i, arm in ((1, "ctl"), (2, "horizon")):
        runs = [p[i] for p in pairs]
        cells = []
        for step in (300, 340, 10**9):
            xs = [lam_at(r["path"], step) for r in runs]
            cells.append(f"{geo(xs):.2e} [{min(xs):.1e}, {max(xs):.1e}]")
        end = [r["path"][-1]["lam_mean"] for r in runs]
        val = [r["val_loss"] for r in runs]
        rows.append(
            f"| {arm} | {' | '.join(cells)} | {sum(x > PICK for x in end)}/{len(end)} "
            f"| {statistics.fmean(val):.4f} [{min(val):.4f}, {max(val):.4f}] |"
        )
    rows += ["", "Per pair, λ at the end (ctl → horizon): " + ", ".join(
        f"{k}: {c['path'][-1]['lam_mean']:.1e} → {s['path'][-1]['lam_mean']:.1e}" for k, c, s in pairs
    )]  # fmt: skip
    return rows


def main() -> None:
    head = [
        "| protocol | pairs | ctl | horizon | horizon − ctl (mean ± s.e.) | horizon worse | per pair |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    rows = ["Held-out test loss:", "", *head]
    jobs = [(k, mainjob("ctl", k), mainjob("horizon", k)) for k in range(18, 30)]
    jobs = [p for p in jobs if p[1] is not None and p[2] is not None]
    digs = [(k, digits("ctl", k), digits("horizon", k)) for k in range(54, 63)]
    digs = [p for p in digs if p[1] is not None and p[2] is not None]
    if jobs:
        rows += summary("main job, last weights (sampling seeds 18–29)", jobs)
    if digs:
        rows += summary("digits_small, best-validation epoch (seeds 54–62)", digs)
    if jobs:
        rows += ["", "The main job's own validation loss at the last weights:", "", *head]
        rows += summary("main job, last weights (sampling seeds 18–29)", jobs, "val_loss")
        rows += paths(jobs)
    (here / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
