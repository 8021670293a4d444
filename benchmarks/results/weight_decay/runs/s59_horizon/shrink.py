"""Session 59 diagnostic: the decay's total shrink exponent S = η Σ_t λ_t (η = lr/(1 − μ) = 0.5,
the main job's SGD(0.05, momentum 0.9); λ the mean over layers, held between hyper steps) over the
fit, over steps 300–400 and 360–400, per arm of sessions 58 and 59, against the grid's constant
pick. usage: python shrink.py"""

import glob
import json
import statistics
from pathlib import Path

runs = Path(__file__).resolve().parents[1]
ETA, END, PICK = 0.5, 400, 2.5e-3


def shrink(path: list[dict], lo: int = 0) -> float:
    total = 0.0
    for i, p in enumerate(path):
        a, b = max(p["step"], lo), path[i + 1]["step"] if i + 1 < len(path) else END
        total += ETA * p["lam_mean"] * max(b - a, 0)
    return total


def main() -> None:
    print("| session, arm | runs | S (0–400) | S (300–400) | S (360–400) | test loss | val loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for folder, arms in (("s58_settle", ("ctl", "settle")), ("s59_horizon", ("ctl", "horizon"))):
        for arm in arms:
            files = sorted(glob.glob(str(runs / folder / f"mainjob_{arm}_seed*.json")))
            rs = [json.loads(Path(f).read_text())["runs"][0] for f in files]
            cells = [statistics.fmean(shrink(r["path"], lo) for r in rs) for lo in (0, 300, 360)]
            loss = [statistics.fmean(r[k] for r in rs) for k in ("test_loss", "val_loss")]
            print(f"| {folder}, {arm} | {len(rs)} | " + " | ".join(f"{x:.3f}" for x in cells)
                  + f" | {loss[0]:.4f} | {loss[1]:.4f} |")  # fmt: skip
    grid = [ETA * PICK * (END - lo) for lo in (0, 300, 360)]
    print("| grid's constant pick 2.5e-3 | | " + " | ".join(f"{x:.3f}" for x in grid) + " | | |")


if __name__ == "__main__":
    main()
