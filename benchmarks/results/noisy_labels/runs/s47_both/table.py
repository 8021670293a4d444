"""Table of the session-47 run (run.sh), or of the run in the folder given (session 48's
s48_both): test accuracy per method, the paired differences (drop_in_decay − drop_in, decay −
plain), the gap recovered (a ratio of means), CPU × plain and the learned λ. Writes table.md
beside the run's JSON files."""

from __future__ import annotations

import json
import math
import statistics as st
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
METHODS = ["plain", "decay", "drop_in", "drop_in_decay", "oracle"]


def paired(a: list[float], b: list[float]) -> str:
    d = [x - y for x, y in zip(a, b)]
    se = st.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    up = sum(x > 0 for x in d)
    return f"{100 * st.mean(d):+.2f} ± {100 * se:.2f} ({up} of {len(d)} up)"


def gap(m: list[float], p: list[float], o: list[float]) -> str:
    return f"{100 * (st.mean(m) - st.mean(p)) / (st.mean(o) - st.mean(p)):.0f} %"


def main() -> None:
    lines = [
        "| setting | " + " | ".join(METHODS) + " | drop_in_decay − drop_in (points) | "
        "decay − plain | gap recovered: drop_in / drop_in_decay | CPU × plain: drop_in / "
        "drop_in_decay / decay | mean λ at the end (drop_in_decay; decay) |",
        "|" + "---|" * (len(METHODS) + 6),
    ]
    for path in sorted(HERE.glob("*.json")):
        for name, setting in json.loads(path.read_text())["settings"].items():
            runs = setting["runs"]
            acc = {m: [r["test_acc"] for r in runs[m]] for m in METHODS if m in runs}
            cpu = {m: [r["cpu_s"] for r in runs[m]] for m in METHODS if m in runs}
            cells = [f"{100 * st.mean(acc[m]):.1f}" for m in METHODS]
            ratio = [
                f"{st.mean(c / p for c, p in zip(cpu[m], cpu['plain'])):.2f}"
                for m in ("drop_in", "drop_in_decay", "decay")
            ]
            lam = [
                st.mean(st.mean(r["weight_decay"].values()) for r in runs[m])
                for m in ("drop_in_decay", "decay")
            ]
            lines.append(
                f"| {name} (seeds {len(acc['plain'])}) | " + " | ".join(cells)
                + f" | {paired(acc['drop_in_decay'], acc['drop_in'])}"
                + f" | {paired(acc['decay'], acc['plain'])}"
                + f" | {gap(acc['drop_in'], acc['plain'], acc['oracle'])} / "
                + f"{gap(acc['drop_in_decay'], acc['plain'], acc['oracle'])}"
                + f" | {' / '.join(ratio)} | {lam[0]:.2g}; {lam[1]:.2g} |"
            )  # fmt: skip
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
