"""FD every 30 (this folder) against FD every 40 and ForwardMode every 40 (../mnist.json,
../fashion.json), paired by seed: test accuracy points (mean ± s.e.) and CPU × plain.

python benchmarks/results/noisy_labels/runs/forward_difference/every30_heldout/compare.py
"""

import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent


def mean_se(xs: list[float]) -> str:
    return f"{st.mean(xs):+.2f} ± {st.stdev(xs) / len(xs) ** 0.5:.2f}"


print("| setting | every 30 | − FD every 40 | − ForwardMode every 40 | CPU × plain (every 30) |")
print("| --- | --- | --- | --- | --- |")
for ds in ("mnist", "fashion"):
    if not (HERE / f"{ds}.json").exists():
        continue
    new = json.loads((HERE / f"{ds}.json").read_text())["settings"]
    old = json.loads((HERE.parent / f"{ds}.json").read_text())["settings"]
    for name, s in new.items():
        e30 = [100 * x["test_acc"] for x in s["runs"]["drop_in"]]
        fd = [100 * x["test_acc"] for x in old[name]["runs"]["drop_in_fd"]]
        fm = [100 * x["test_acc"] for x in old[name]["runs"]["drop_in"]]
        cpu = sum(x["cpu_s"] for x in s["runs"]["drop_in"]) / sum(
            x["cpu_s"] for x in s["runs"]["plain"]
        )
        print(
            f"| {name} | {st.mean(e30):.1f} | {mean_se([a - b for a, b in zip(e30, fd)])} "
            f"| {mean_se([a - b for a, b in zip(e30, fm)])} | {cpu:.2f} |"
        )
