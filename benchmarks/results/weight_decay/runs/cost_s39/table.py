"""The first step after a hyper step charged (this folder) minus the stored final defaults
(../final_s38_overhead, OverheadBudget(0.5) charging only its timed blocks): held-out test
loss paired by seed, and the hyper steps.

``python benchmarks/results/weight_decay/runs/cost_s39/table.py``"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(path: Path, setting: str) -> tuple[float, int]:
    r = json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]
    return r["test_loss"], r.get("hyper_steps")


def paired(d: list[float]) -> str:
    n, m = len(d), sum(d) / len(d)
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n)
    return f"{m:+.4f} ± {se:.4f} (n={n}, above 0 in {sum(x > 0 for x in d)})"


rows = ["| setting | charged − stored default | hyper steps stored / charged |", "|---|---|---|"]
for s in ("digits_small", "mnist_mlp"):
    new = [run(HERE / f"{s}_seed{k}.json", s) for k in range(9)]
    old = [run(HERE.parent / "final_s38_overhead" / f"{s}_seed{k}.json", s) for k in range(9)]
    hs = f"{sum(o[1] for o in old) / 9:.1f} / {sum(n[1] for n in new) / 9:.1f}"
    rows.append(f"| {s} | {paired([n[0] - o[0] for n, o in zip(new, old)])} | {hs} |")
text = "\n".join(rows)
print(text)
(HERE / "table.md").write_text(text + "\n")
