"""Look-ahead candidates on the two recipes that disagree: digits_small and 20 Newsgroups.

Held-out test loss, each candidate against the default (``CurrentWeights``) paired by seed:

* ``digits_small`` (the main job's recipe, 9 seeds): the candidate's runs
  ``runs/digits_small/digits_small_<arm>_seed*.json`` against the default's stored ones (as
  :mod:`issue28_look_ahead_table`), made by

      python benchmarks/bench_weight_decay.py --settings digits_small --seeds 0 1 2 3 4 5 6 7 8 \\
          --methods learned_per_layer --optuna-trials 0 --threads 1 \\
          --learned-kwargs '{"look_ahead": {"class": "<Class>", ...}}' \\
          --out benchmarks/results/weight_decay/runs/digits_small/digits_small_<arm>.json

* 20 Newsgroups (``check_20news_recipe.py``, 3 seeds): the candidate against the default run in
  the same process, ``benchmarks/results/check_20news/look_ahead_<arm>.json``, made by

      python benchmarks/check_20news_recipe.py --seeds 0 1 2 --checks weight_decay \\
          --no-searches --look-aheads <arm>=<Class> \\
          --out benchmarks/results/check_20news/look_ahead_<arm>.json

Which code each arm ran is in ``runs/digits_small/look_ahead_candidates.txt``.

    python benchmarks/issue28_look_ahead_candidates.py \\
        --out benchmarks/results/weight_decay/look_ahead_candidates.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from issue28_look_ahead_table import (  # noqa: E402
    default_pattern,
    learned_runs,
    paired,
    summary,
)

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "results" / "weight_decay" / "runs" / "digits_small"
NEWS = REPO / "benchmarks" / "results" / "check_20news"
#: (digits_small arm, 20 Newsgroups files, the arm's key in them, what it is)
ARMS = [
    ("trained", ["trajectory"], "trained", "`TrainedWeights()` (eq. trainedgrad, converged)"),
    ("valcurv1", ["valcurv"], "valcurv", "`ValidationCurvature(iters=1)` (eq. valcurvgrad)"),
    ("valcurv4", ["valcurv4"], "valcurv4", "`ValidationCurvature()` (4 Lanczos steps)"),
    ("shared", ["shared"], "shared", "SharedFit (eq. sharedfit; dropped)"),
    ("trajectory", ["trajectory"], "trajectory", "path filter; first hyper step at w_t"),
    ("trajectory_first", ["trajectory_first"], "trajectory_first",
     "path filter; first hyper step TrainedWeights' Rayleigh filter"),
    ("trajectory_wait", ["trajectory_wait"], "trajectory_wait",
     "path filter; first hyper step does not move λ"),
    ("trajectory_start", ["trajectory_start"], "trajectory_start",
     "path filter from the start; 0 at h_d ≤ 0"),
    ("trajectory_abs", ["trajectory_abs", "trajectory_abs_s3-8"], "trajectory_abs",
     "`TrajectoryWeights()` (eq. pathgrad: from the start, along \\|h_d\\|)"),
]  # fmt: skip


def news(files: list[str], arm: str) -> dict[str, Any] | None:
    """Per seed: the candidate's and the default's test loss, final λ, hyper steps."""
    runs: dict[str, Any] = {}
    for f in files:
        path = NEWS / f"look_ahead_{f}.json"
        if path.exists():
            runs.update(json.loads(path.read_text())["runs"]["weight_decay"])
    if not runs:
        return None
    seeds = sorted(runs, key=int)

    def read(who: str, key: str) -> list[Any]:
        return [runs[s][who][key] for s in seeds]

    out = {
        "seeds": [int(s) for s in seeds],
        "default": read("learned", "loss"),
        "arm": read(arm, "loss"),
        "no_wd": read("no_wd", "loss"),
        "lambda_end": read(arm, "lambda_end"),
        "hyper_steps": read(arm, "hyper_steps"),
        "default_hyper_steps": read("learned", "hyper_steps"),
    }
    out["difference"] = [a - d for a, d in zip(out["arm"], out["default"])]
    d = out["difference"]
    se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    out["mean"], out["se"] = statistics.mean(d), se
    return out


def _news_cell(n: dict[str, Any] | None) -> str:
    if n is None:
        return "–"
    if len(n["difference"]) > 3:
        return f"{n['mean']:+.4f} ± {n['se']:.4f} ({len(n['difference'])} seeds)"
    return " / ".join(f"{x:+.4f}" for x in n["difference"]) + f" (mean {n['mean']:+.4f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rows, table = [], {}
    for ds_arm, files, key, what in ARMS:
        old = learned_runs(default_pattern("digits_small"), "digits_small")
        new = learned_runs(str(RUNS / f"digits_small_{ds_arm}_seed[0-9].json"), "digits_small")
        d = paired(new, old) if new else None
        n = news(files, key)
        table[ds_arm] = {"what": what, "digits_small": d, "news": n}
        if new:
            table[ds_arm]["digits_small_arm"] = summary(new)
        ds = f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]" if d else "–"
        lam = f"{table[ds_arm]['digits_small_arm']['lambda_mean']:.2g}" if new else "–"
        steps = "–"
        if n:
            steps = f"{statistics.mean(n['hyper_steps']):.1f} / "
            steps += f"{statistics.mean(n['default_hyper_steps']):.1f}"
        rows.append(f"| {what} | {ds} | {lam} | {_news_cell(n)} | {steps} |")
    head = (
        "| look-ahead | digits_small: − default, mean ± s.e. [95 %] (9 seeds) | digits_small "
        "final λ | 20 Newsgroups: − default (seeds 0 / 1 / 2, or mean ± s.e.) | 20 Newsgroups "
        "hyper steps (arm / default) |\n|---|---|---|---|---|"
    )
    text = head + "\n" + "\n".join(rows) + "\n"
    a.out.write_text(text)
    a.out.with_suffix(".json").write_text(json.dumps(table, indent=1))
    print(text)


if __name__ == "__main__":
    main()
