# ruff: noqa: E501
"""Session 60: the main job's λ paths per arm (mean over layers, geometric mean over the 12
sampling seeds [min, max]) at steps 200, 260, 300 and the end, and the decay's total shrink
S = η Σ_t λ_t (η = lr/(1 − μ) = 0.5, λ held between hyper steps) over steps 0–400 and 300–400;
writes paths.md here. usage: python paths.py"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
ETA, STEPS, LAM0 = 0.5, 400, 1e-4


def lam_at(path: list[dict], step: int) -> float:
    lam = LAM0
    for e in path:
        if e["step"] > step:
            break
        lam = e["lam_mean"]
    return lam


def shrink(path: list[dict], lo: int, hi: int) -> float:
    return ETA * sum(lam_at(path, t) for t in range(lo, hi))


def main() -> None:
    rows = [
        "| arm | λ at 200 | λ at 260 | λ at 300 | λ at the end | S 0–400 | S 300–400 | test | val |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for arm in ("ctl", "reach"):
        runs = [
            json.loads(p.read_text())["runs"][0]
            for p in sorted(here.glob(f"mainjob_{arm}_seed*.json"))
        ]
        cells = []
        for step in (200, 260, 300, STEPS):
            xs = [lam_at(r["path"], step) for r in runs]
            g = math.exp(statistics.fmean(math.log(x) for x in xs))
            cells.append(f"{g:.1e} [{min(xs):.1e}, {max(xs):.1e}]")
        s_all = statistics.fmean(shrink(r["path"], 0, STEPS) for r in runs)
        s_late = statistics.fmean(shrink(r["path"], 300, STEPS) for r in runs)
        test = statistics.fmean(r["test_loss"] for r in runs)
        val = statistics.fmean(r["val_loss"] for r in runs)
        rows.append(
            f"| {arm} ({len(runs)}) | "
            + " | ".join(cells)
            + f" | {s_all:.3f} | {s_late:.3f} | {test:.4f} | {val:.4f} |"
        )
    text = "\n".join(rows) + "\n"
    (here / "paths.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
