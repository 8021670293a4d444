# ruff: noqa: E501
"""Session 59: TailHoldRprop(tail=0.2) (tail) against today's default (ctl), alternating run by run
(run.sh); the rule: ../../rules_s59/tailhold59-rule.txt. usage: python table.py (writes table.md)."""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent


def mainjob(arm: str, seed: int) -> dict | None:
    p = here / f"mainjob_{arm}_seed{seed}.json"
    return json.loads(p.read_text())["runs"][0] if p.is_file() else None


def digits(arm: str, seed: int) -> dict | None:
    p = here / f"weight_decay_{arm}_digits_small_seed{seed}.json"
    if not p.is_file():
        return None
    return json.loads(p.read_text())["settings"]["digits_small"]["runs"]["learned_per_layer"]


def summary(name: str, pairs: list[tuple[int, dict, dict]]) -> list[str]:
    d = [s["test_loss"] - c["test_loss"] for _, c, s in pairs]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    per = ", ".join(f"{x:+.4f}" for x in d)
    ctl = statistics.fmean(c["test_loss"] for _, c, _ in pairs)
    st = statistics.fmean(s["test_loss"] for _, _, s in pairs)
    return [
        f"| {name} | {len(d)} | {ctl:.4f} | {st:.4f} | {statistics.fmean(d):+.4f} ± {se:.4f} "
        f"| {sum(x > 0 for x in d)}/{len(d)} | {per} |"
    ]


def main() -> None:
    rows = [
        "| protocol | pairs | test ctl | test tail | tail − ctl (mean ± s.e.) | tail worse | per pair |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for name, get, seeds in (
        ("main job, last weights (sampling seeds 18–29)", mainjob, range(18, 30)),
        ("digits_small, best-validation epoch (seeds 54–62)", digits, range(54, 63)),
    ):
        pairs = [(k, get("ctl", k), get("tail", k)) for k in seeds]
        pairs = [p for p in pairs if p[1] is not None and p[2] is not None]
        if pairs:
            rows += summary(name, pairs)
    (here / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
