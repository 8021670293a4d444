"""PlannedBudget (../final_s38) minus OverheadBudget (this folder, the default), both with
TrustRprop, held-out test loss paired by seed; and TrustRprop + OverheadBudget here minus
../outer_flip's trR10 runs (the same rule before the per-step charge).

``python benchmarks/results/weight_decay/runs/final_s38_overhead/table.py``"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def loss(path: Path, setting: str) -> tuple[float, int]:
    r = json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]
    return r["test_loss"], r.get("hyper_steps")


def paired(d: list[float]) -> str:
    n = len(d)
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    return f"{m:+.4f} ± {se:.4f} (n={n}, above 0 in {sum(x > 0 for x in d)})"


rows = [
    "| setting | planned − overhead (both TrustRprop) | hyper steps planned / overhead "
    "| overhead here − outer_flip trR10 |",
    "|---|---|---|---|",
]
out = {}
for s in ("mnist_mlp", "fashion_mlp", "fashion_cnn", "mnist_cnn", "digits_small", "news_mlp"):
    seeds = [k for k in range(9) if (HERE / f"{s}_seed{k}.json").exists()]
    if not seeds:
        continue
    p = [loss(HERE.parent / "final_s38" / f"{s}_seed{k}.json", s) for k in seeds]
    o = [loss(HERE / f"{s}_seed{k}.json", s) for k in seeds]
    t = [loss(HERE.parent / "outer_flip" / f"{s}_trR10_seed{k}.json", s) for k in seeds
         if (HERE.parent / "outer_flip" / f"{s}_trR10_seed{k}.json").exists()]  # fmt: skip
    d = [a[0] - b[0] for a, b in zip(p, o)]
    hs = f"{sum(a[1] for a in p) / len(p):.1f} / {sum(b[1] for b in o) / len(o):.1f}"
    dt = paired([b[0] - c[0] for b, c in zip(o, t)]) if len(t) == len(o) else "n/a"
    rows.append(f"| {s} | {paired(d)} | {hs} | {dt} |")
    out[s] = {"seeds": seeds, "planned": p, "overhead": o}
text = "\n".join(rows)
print(text)
(HERE / "table.md").write_text(text + "\n")
(HERE / "table.json").write_text(json.dumps(out, indent=1))
