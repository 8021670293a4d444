"""The small measurements of issue 28 (3 seeds, learned per layer): HorizonDamping and
max_overhead=0.25 against today's default, paired by seed on the held-out test loss.

Reads ``benchmarks/results/weight_decay/runs/issue28_small/*.json`` (each made by the
``bench_weight_decay.py`` command stored in it, with ``--reuse`` of
``runs/weight_decay_rerun_seed*`` for the grid) and prints one Markdown table.
``default_measured``: the default schedule with ``max_overhead=100`` (never binding), so the
budget records the hyper steps' share of the training's time; its λ and losses equal the
default's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_decay import paired_difference, search_pick  # noqa: E402

RUNS = Path(__file__).resolve().parent / "results" / "weight_decay" / "runs"
SMALL = RUNS / "issue28_small"
VARIANTS = ("default_measured", "horizon", "budget0.25", "budget0.25_predicted_rule")
SEEDS = (0, 1, 2)


def record(setting: str, variant: str, seed: int) -> dict | None:
    path = SMALL / f"{setting}_{variant}_seed{seed}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]


def grid_pick(setting: str, seed: int) -> dict:
    runs = json.loads((RUNS / f"weight_decay_rerun_seed{seed}.json").read_text())
    return search_pick(runs["settings"][setting]["runs"]["grid"])


def text(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f}"


def main() -> None:
    print("| setting | variant | test loss, seeds 0-2 | − default | − grid pick | hyper steps | "
          "hyper-step share of the training's time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for setting in ("digits_mlp", "mnist_mlp", "fashion_cnn"):
        base = [record(setting, "default_measured", s) for s in SEEDS]
        grid = [grid_pick(setting, s)["test_loss"] for s in SEEDS]
        for variant in VARIANTS:
            recs = [record(setting, variant, s) for s in SEEDS]
            if None in recs:
                continue
            test = [r["test_loss"] for r in recs]
            share = [r["budget"]["overhead"] for r in recs if r.get("budget")]
            print(
                f"| {setting} | {variant} | {', '.join(f'{t:.4f}' for t in test)} | "
                f"{text(paired_difference(test, [b['test_loss'] for b in base]))} | "
                f"{text(paired_difference(test, grid))} | "
                f"{', '.join(str(r['sid_cost']['hypergradients']) for r in recs)} | "
                f"{', '.join(f'{x:.3f}' for x in share)} |"
            )


if __name__ == "__main__":
    main()
