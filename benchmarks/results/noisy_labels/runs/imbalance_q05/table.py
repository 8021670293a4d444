"""Paired table of imbalance.json: ExpectedError(q=0.5) (default) − "mean_loss", by seed."""

import json
import sys
from pathlib import Path

import numpy as np

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("imbalance.json")
runs = json.loads(path.read_text())["settings"]["mnist_imbalance"]["runs"]
seeds = json.loads(path.read_text())["args"]["seeds"]


def cell(v: np.ndarray) -> str:
    return f"{100 * v.mean():.1f} ± {100 * v.std(ddof=1) / np.sqrt(len(v)):.1f}"


print(f"seeds {seeds}; mean ± s.e. over seeds (%)")
print("| method | objective | test accuracy | classes 3 and 8 | CPU (s) |")
print("| --- | --- | --- | --- | --- |")
for m, obj in [("plain", "-"), ("inverse_freq", "-"), ("per_class", "ExpectedError(q=0.5)"),
               ("per_class_mean_loss", "mean_loss"), ("drop_in", "ExpectedError(q=0.5)"),
               ("drop_in_mean_loss", "mean_loss")]:  # fmt: skip
    acc = np.array([r["test_acc"] for r in runs[m]])
    mino = np.array([r["minority_acc"] for r in runs[m]])
    cpu = np.mean([r["cpu_s"] for r in runs[m]])
    print(f"| {m} | {obj} | {cell(acc)} | {cell(mino)} | {cpu:.1f} |")
print("\npaired, ExpectedError(q=0.5) − mean_loss (points): mean ± s.e., wins of the default")
for new, old in [("per_class", "per_class_mean_loss"), ("drop_in", "drop_in_mean_loss")]:
    for key in ("test_acc", "minority_acc"):
        d = 100 * np.array([a[key] - b[key] for a, b in zip(runs[new], runs[old], strict=True)])
        se = d.std(ddof=1) / np.sqrt(len(d))
        print(f"{new:10s} {key:13s} {d.mean():+.2f} ± {se:.2f}  ({int((d > 0).sum())} of "
              f"{len(d)} better, {int((d < 0).sum())} worse)  by seed: "
              + " ".join(f"{x:+.1f}" for x in d))  # fmt: skip
