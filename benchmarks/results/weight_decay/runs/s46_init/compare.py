"""Session 46 diagnostic (run.sh): the default started at λ = 2.5e-3 on the Fashion-MNIST CNN,
paired by seed with session 45's same-hour default rerun (ctl, started at 1e-4) and the stored
grid and Optuna picks; held-out test loss. Writes compare.md."""

import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_beat_table import base_of, variant  # noqa: E402

DEPLOYMENT = here.parents[1] / "weight_decay_deployment_9seeds_final_s43.json"
SETTING = "fashion_cnn"


def paired(diffs: list[float]) -> str:
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    return (
        f"{statistics.mean(diffs):+.4f} ± {se:.4f} ({sum(d > 0 for d in diffs)} of {len(diffs)} up)"
    )


def main() -> None:
    picks = json.loads(DEPLOYMENT.read_text())["deployment"]["settings"][SETTING]
    arm, ctl, grid, opt = [], [], [], []
    for seed in range(9):
        path = here / f"init2.5e-3_{SETTING}_{base_of(seed)}_seed{seed}.json"
        run = json.loads(path.read_text())["settings"][SETTING]["runs"]["learned_per_layer"]
        arm.append(run["test_loss"])
        ctl.append(variant("ctl", SETTING, seed, here.parent / "s45_fastfall")["test_loss"])
        grid.append(picks["grid pick"]["seeds"][str(seed)]["test_loss"])
        opt.append(picks["Optuna pick"]["seeds"][str(seed)]["test_loss"])
    rows = [
        "| start 2.5e-3 − | paired, held-out test loss |",
        "|---|---|",
        f"| default (start 1e-4, ctl) | {paired([a - c for a, c in zip(arm, ctl)])} |",
        f"| grid's pick | {paired([a - g for a, g in zip(arm, grid)])} |",
        f"| Optuna's pick | {paired([a - o for a, o in zip(arm, opt)])} |",
    ]
    text = "\n".join(rows) + "\n"
    print(text)
    (here / "compare.md").write_text(text)


if __name__ == "__main__":
    main()
