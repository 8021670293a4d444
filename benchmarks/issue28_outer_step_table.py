"""Issue 28, the outer step: a learned arm against the current default, paired by seed.

Reads ``runs/outer_step/<setting>_<arm>_seed<N>.json`` (each made by the command stored in it:
``bench_weight_decay.py --settings S --seeds 0 … 8 --methods learned_per_layer --optuna-trials 0
--threads 1 --learned-kwargs '{"outer_optimizer": {"class_path": …, "init_args": …}}'``) and the
default's ``network_cost/runs/default05/<setting>_default05_seed<N>.json``; writes, per arm and
setting, the held-out test loss of arm − default (mean ± s.e., a 95 % t interval), the final λ
(geometric mean over seeds of the mean over layers) and the hyper steps, to ``--out`` (.md and
.json)::

    python benchmarks/issue28_outer_step_table.py --arms gate2 gate1 \
        --out benchmarks/results/weight_decay/runs/outer_step/table.md
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ARMS = ROOT / "weight_decay" / "runs" / "outer_step"
DEFAULT = ROOT / "network_cost" / "runs" / "default05"
SETTINGS = ("mnist_cnn", "fashion_cnn", "fashion_mlp", "mnist_mlp", "digits_mlp")
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31}


def _runs(pattern: str, folder: Path) -> dict[int, dict]:
    out = {}
    for path in folder.glob(pattern):
        seed = re.search(r"_seed(\d+)\.json$", path.name)
        if seed:
            res = json.loads(path.read_text())
            out[int(seed.group(1))] = next(iter(res["settings"].values()))["runs"][
                "learned_per_layer"
            ]
    return out


def _row(arm: str, setting: str) -> dict | None:
    new = _runs(f"{setting}_{arm}_seed[0-9].json", ARMS)
    base = _runs(f"{setting}_default05_seed[0-9].json", DEFAULT)
    seeds = sorted(set(new) & set(base))
    if len(seeds) < 2:
        return None
    d = [new[s]["test_loss"] - base[s]["test_loss"] for s in seeds]
    n, m = len(d), sum(d) / len(d)
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n)
    half = T975.get(n - 1, 1.96) * se
    lam = lambda runs: math.exp(  # noqa: E731
        sum(math.log(runs[s]["lambda_summary"]["mean"]) for s in seeds) / n
    )
    return {
        "arm": arm, "setting": setting, "seeds": seeds, "diff": d, "mean": m, "se": se,
        "ci": [m - half, m + half], "lambda_arm": lam(new), "lambda_default": lam(base),
        "hyper_steps_arm": sum(new[s]["hyper_steps"] for s in seeds) / n,
        "hyper_steps_default": sum(base[s]["hyper_steps"] for s in seeds) / n,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", default=["gate2"])
    p.add_argument("--out", type=Path, default=ARMS / "table.md")
    args = p.parse_args()
    rows = [r for a in args.arms for s in SETTINGS if (r := _row(a, s))]
    lines = [
        "| arm | setting | test loss: arm − default, mean ± s.e. [95 %] (n) | final λ arm / "
        "default (geometric mean) | hyper steps arm / default |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['setting']} | {r['mean']:+.4f} ± {r['se']:.4f} "
            f"[{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] ({len(r['seeds'])}) | "
            f"{r['lambda_arm']:.2g} / {r['lambda_default']:.2g} | "
            f"{r['hyper_steps_arm']:.1f} / {r['hyper_steps_default']:.1f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
