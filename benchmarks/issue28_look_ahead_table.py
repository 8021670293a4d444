"""Learned per layer with ``look_ahead=TrainedWeights()`` against today's default, paired by seed.

Held-out test loss of the deployed (best validation epoch) weights, nine seeds per setting: the
default's stored runs (``benchmarks/results/network_cost/runs/default05/``; for ``digits_small``
the default arm of ``runs/digits_small/digits_small_seed*.json``) against the runs made by

    python benchmarks/bench_weight_decay.py --settings S --seeds 0 1 2 3 4 5 6 7 8 \\
        --methods learned_per_layer --optuna-trials 0 --threads 1 \\
        --learned-kwargs '{"look_ahead": {}}' --out RUNS/S_trained.json

Writes a Markdown and a JSON table (``--out``): per setting the mean ± s.e. [95 %] of the paired
difference, the final λ, the hyper steps and the budget's measured overhead of each arm.

    python benchmarks/issue28_look_ahead_table.py --arm trained \\
        --out benchmarks/results/weight_decay/look_ahead_trained_vs_default.md
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "weight_decay" / "runs"
DEFAULT = REPO / "benchmarks" / "results" / "network_cost" / "runs" / "default05"
SETTINGS = ["news_mlp", "digits_small", "mnist_mlp", "fashion_mlp", "digits_mlp", "mnist_cnn",
            "fashion_cnn"]  # fmt: skip
#: settings whose default runs are stored with their no-WD training (the files of the seeds)
WITH_PLAIN = {"digits_small", "news_mlp"}
#: two-sided 97.5 % Student-t quantiles by degrees of freedom
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def learned_runs(
    pattern: str, setting: str, method: str = "learned_per_layer"
) -> dict[int, dict[str, Any]]:
    """The ``method`` record (learned per layer) of each seed's file matching ``pattern``."""
    out = {}
    for f in sorted(glob.glob(pattern)):
        if f.endswith("_seeds.json"):
            continue
        d = json.loads(Path(f).read_text())
        rec = d["settings"].get(setting, {}).get("runs", {}).get(method)
        if rec is not None:
            out[int(d["seed"])] = rec
    return out


def default_pattern(setting: str) -> str:
    if setting in WITH_PLAIN:
        return str(RUNS / setting / f"{setting}_seed[0-9].json")
    return str(DEFAULT / f"{setting}_default05_seed[0-9].json")


def arm_pattern(setting: str, arm: str, folder: Path | None = None) -> str:
    """The arm's per-seed files: ``folder`` (``--runs``) or where the look-ahead runs are."""
    if folder is not None:
        return str(folder / f"{setting}_{arm}_seed[0-9].json")
    if setting == "digits_small":
        return str(RUNS / "digits_small" / f"digits_small_{arm}_seed[0-9].json")
    return str(RUNS / "look_ahead" / f"{setting}_{arm}_seed[0-9].json")


def paired(new: dict[int, dict], old: dict[int, dict]) -> dict[str, float] | None:
    seeds = sorted(set(new) & set(old))
    d = [new[s]["test_loss"] - old[s]["test_loss"] for s in seeds]
    if len(d) < 2:
        return None
    mean, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    t = T975.get(len(d) - 1, 2.306)
    return {"mean": mean, "se": se, "lo": mean - t * se, "hi": mean + t * se, "n": len(d)}


def summary(recs: dict[int, dict], plain: dict[int, dict] | None = None) -> dict[str, float]:
    """Means over the seeds; ``plain``: the same seeds' no-WD trainings (another process), for
    the CPU-time ratio."""

    def mean(key: Any) -> float:
        return statistics.mean(key(r) for r in recs.values())

    cpu_ratio = (
        statistics.mean(r["cpu_s"] / plain[s]["cpu_s"] for s, r in recs.items())
        if plain and set(recs) <= set(plain)
        else math.nan
    )
    return {
        "cpu_ratio": cpu_ratio,
        "test_loss": mean(lambda r: r["test_loss"]),
        "lambda_mean": mean(lambda r: r["lambda_summary"]["mean"]),
        "hyper_steps": mean(lambda r: r["hyper_steps"] or 0),
        "overhead": mean(lambda r: (r.get("budget") or {}).get("overhead", math.nan)),
        "cpu_s": mean(lambda r: r["cpu_s"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", default="trained")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--runs", type=Path, default=None, help="folder of the arm's per-seed files")
    p.add_argument(
        "--digits-small-arm", default=None, help="digits_small's arm, where named otherwise"
    )
    p.add_argument(
        "--against",
        default=None,
        help="the baseline's arm (its runs, e.g. a default rerun) "
        "instead of the stored default runs",
    )
    a = p.parse_args()
    rows, table = [], {}
    for s in SETTINGS:
        base = default_pattern(s) if a.against is None else arm_pattern(s, a.against, a.runs)
        old = learned_runs(base, s)
        arm = a.digits_small_arm if s == "digits_small" and a.digits_small_arm else a.arm
        new = learned_runs(arm_pattern(s, arm, a.runs), s)
        if not new or not old:
            continue
        d = paired(new, old)
        old = {k: v for k, v in old.items() if k in new}  # the seeds both arms ran
        plain = learned_runs(default_pattern(s), s, "no_wd") if s in WITH_PLAIN else None
        table[s] = {"difference": d, "default": summary(old, plain), a.arm: summary(new, plain)}
        so, sn = table[s]["default"], table[s][a.arm]
        diff = (
            f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] ({d['n']})"
            if d
            else "–"
        )
        rows.append(
            f"| {s} | {diff} | {so['test_loss']:.4f} / {sn['test_loss']:.4f} | "
            f"{so['lambda_mean']:.2g} / {sn['lambda_mean']:.2g} | "
            f"{so['hyper_steps']:.1f} / {sn['hyper_steps']:.1f} | "
            f"{so['overhead']:.2f} / {sn['overhead']:.2f} | "
            f"{so['cpu_ratio']:.2f} / {sn['cpu_ratio']:.2f} |"
        )
    base = a.against or "default"
    head = (
        f"| setting | {a.arm} − {base}: mean ± s.e. [95 %] (n) | mean test loss ({base} / "
        f"{a.arm}) | final λ, mean | hyper steps | budget's overhead (measured in-run) | "
        "CPU time × no WD's (same seed, stored file) |\n"
        "|---|---|---|---|---|---|---|"
    )
    text = head + "\n" + "\n".join(rows) + "\n"
    a.out.write_text(text)
    a.out.with_suffix(".json").write_text(json.dumps({"arm": a.arm, "settings": table}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
