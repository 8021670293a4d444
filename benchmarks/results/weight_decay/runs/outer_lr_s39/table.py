"""Paired held-out test loss, learned per layer: TrustRprop(lr=1.0) − the default (rerun at the
same time where there is one, else the stored runs of ../final_s38_overhead). Writes table.md."""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_look_ahead_table import learned_runs  # noqa: E402

stored = here.parent / "final_s38_overhead"
SETTINGS = ["news_mlp", "digits_small", "mnist_mlp", "fashion_mlp", "digits_mlp", "mnist_cnn",
            "fashion_cnn"]  # fmt: skip


def test_losses(folder: Path, stem: str, setting: str) -> dict[int, float]:
    runs = learned_runs(str(folder / f"{stem}_seed[0-9].json"), setting)
    return {seed: r["test_loss"] for seed, r in runs.items()}


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
    lr1, old = test_losses(here, f"{s}_lr1", s), test_losses(stored, s, s)
    ctl = test_losses(here, f"{s}_ctl", s)
    now = paired(lr1, ctl) if ctl else ""
    rows.append(f"| {s} | {now} | {paired(lr1, old)} | {paired(ctl, old) if ctl else ''} |")
(here / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
