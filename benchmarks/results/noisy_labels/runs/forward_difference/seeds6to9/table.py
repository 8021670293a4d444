"""Seeds 6-9, forward difference against ForwardMode, paired by seed: writes table.md here.

python benchmarks/results/noisy_labels/runs/forward_difference/seeds6to9/table.py
"""

import json
import math
import statistics as st
from pathlib import Path

here = Path(__file__).resolve().parent
METHODS = ("plain", "drop_in_fm", "drop_in_fd")
rows = [
    "| setting | seeds | plain | ForwardMode | forward difference "
    "| FD − FM, points (per seed) | CPU × plain: FM / FD |",
    "|---|---|---|---|---|---|---|",
]
for name in ("mnist", "fashion"):
    for setting, v in json.loads((here / f"{name}.json").read_text())["settings"].items():
        r = v["runs"]
        acc = {m: [x["test_acc"] * 100 for x in r[m]] for m in METHODS}
        mean = {m: st.mean(a) for m, a in acc.items()}
        diff = [b - a for a, b in zip(acc["drop_in_fm"], acc["drop_in_fd"])]
        se = st.stdev(diff) / math.sqrt(len(diff))
        plain_cpu = sum(x["cpu_s"] for x in r["plain"])
        cpu = {m: sum(x["cpu_s"] for x in r[m]) / plain_cpu for m in METHODS}
        per_seed = ", ".join(f"{d:+.1f}" for d in diff)
        rows.append(
            f"| {setting} | {len(diff)} | {mean['plain']:.1f} | {mean['drop_in_fm']:.1f} "
            f"| {mean['drop_in_fd']:.1f} | {st.mean(diff):+.2f} ± {se:.2f} ({per_seed}) "
            f"| {cpu['drop_in_fm']:.2f} / {cpu['drop_in_fd']:.2f} |"
        )
(here / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
