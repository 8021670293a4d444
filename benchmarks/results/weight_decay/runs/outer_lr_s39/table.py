"""Paired held-out test loss, learned per layer: TrustRprop(lr=1.0) − the default (rerun at the
same time where there is one, else the stored runs of ../final_s38_overhead). Writes table.md."""

import json
import re
from pathlib import Path

here = Path(__file__).parent
stored = here.parent / "final_s38_overhead"
SETTINGS = ["news_mlp", "digits_small", "mnist_mlp", "fashion_mlp", "digits_mlp", "mnist_cnn",
            "fashion_cnn"]  # fmt: skip


def test_losses(folder: Path, stem: str) -> dict[int, float]:
    out = {}
    for f in folder.glob(f"{stem}_seed*.json"):
        if re.search(r"_seed\d+\.json$", f.name):
            d = json.loads(f.read_text())
            run = next(iter(d["settings"].values()))["runs"]["learned_per_layer"]
            out[d["seed"]] = run["test_loss"]
    return out


def paired(a: dict[int, float], b: dict[int, float]) -> str:
    d = [a[k] - b[k] for k in sorted(set(a) & set(b))]
    n = len(d)
    m = sum(d) / n
    se = (sum((x - m) ** 2 for x in d) / (n - 1)) ** 0.5 / n**0.5
    return f"{m:+.4f} ± {se:.4f} ({sum(x < 0 for x in d)} of {n} lower)"


rows = [
    "| setting | lr 1.0 − default rerun now | lr 1.0 − stored default | default rerun − stored |",
    "|---|---|---|---|",
]
for s in SETTINGS:
    lr1, old = test_losses(here, f"{s}_lr1"), test_losses(stored, s)
    ctl = test_losses(here, f"{s}_ctl")
    now = paired(lr1, ctl) if ctl else ""
    rows.append(f"| {s} | {now} | {paired(lr1, old)} | {paired(ctl, old) if ctl else ''} |")
(here / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
