"""Issue 28, items 2 and 4: a learned-decay variant against what the searches deploy.

Pairs by seed, on the held-out test loss, a variant's runs (``runs/issue28_beat/weight_decay_<arm>
_<setting>_<base>_seed<N>.json``, each made by ``benchmarks/issue28_beat_run_arm.sh <setting>
<arm> '<learned kwargs>'``, the command stored in it) with the stored grid pick, Optuna pick, no
decay and today's default of the same seed, as the deployment summary
``weight_decay_deployment_9seeds_recover.json`` holds them (no grid or Optuna training is rerun).
Also the work of the hyper steps (Hessian–vector and curvature products, variant against the
default; the stored runs ran on another machine and load, so their times do not compare) and
the variant's λ per layer at the end (in the JSON).

Usage: ``python benchmarks/issue28_beat_table.py --arm held --settings fashion_cnn mnist_cnn``
(prints a Markdown table; ``--out`` writes it and a JSON beside it). ``--runs FOLDER`` reads the
variant's files from another folder (``issue28_beat_run_arm.sh`` with ``OUT=FOLDER``),
``--deployment FILE...`` pairs with other stored summaries (their settings merged, e.g. session
43's ``weight_decay_deployment_9seeds_final_s43.json`` and ``_news_final_s43.json``: today's
default as "learned per_layer"), ``--control ARM`` adds the variant − another arm of the same
folder (e.g. the default rerun in the same hour).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_decay import paired_difference  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "weight_decay"
RUNS = RESULTS / "runs" / "issue28_beat"
DEPLOYMENT = RESULTS / "weight_decay_deployment_9seeds_recover.json"
BASE = {0: "rerun", 1: "rerun", 2: "rerun", 3: "heldout", 4: "heldout", 5: "heldout"}
REFERENCES = ("grid pick", "Optuna pick", "no WD", "learned per_layer")


def base_of(seed: int) -> str:
    return BASE.get(seed, "heldout2")


def variant(
    arm: str, setting: str, seed: int, runs: Path = RUNS, method: str | None = None
) -> dict | None:
    """The arm's learned run of a seed (None if its file is missing): ``method`` (e.g.
    ``"learned_per_layer"`` of a file that trained two), else the one learned method its run
    trained (per layer, or METHOD of run_arm.sh). A run made with ``--reuse`` also holds the
    stored file's learned runs, copied (``reused["methods"]``): they are not the arm's."""
    path = runs / f"weight_decay_{arm}_{setting}_{base_of(seed)}_seed{seed}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())["settings"][setting]
    copied = set((record.get("reused") or {}).get("methods") or ())
    trained = [k for k in record["runs"] if k.startswith("learned_") and k not in copied]
    if method is None:
        if len(trained) != 1:
            raise ValueError(
                f"{path} trained {len(trained)} learned methods ({', '.join(trained) or 'none'}):"
                " name the one to read (method=...)."
            )
        method = trained[0]
    if method not in trained:
        raise ValueError(
            f"{path} did not train {method} (trained: {', '.join(trained) or 'none'};"
            f" copied with --reuse: {', '.join(sorted(copied)) or 'none'})."
        )
    return record["runs"][method]


def text(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['low']:+.4f}, {d['high']:+.4f}] ({d['n']})"


def versus(pattern: str, setting: str, seeds: list[int]) -> list[float] | None:
    """The learned per-layer test loss of another stored run per seed (``{setting}``,
    ``{seed}`` in ``pattern``), or None where one is missing."""
    out = []
    for n in seeds:
        path = Path(pattern.format(setting=setting, seed=n))
        if not path.is_file():
            return None
        runs = json.loads(path.read_text())["settings"][setting]["runs"]
        out.append(runs["learned_per_layer"]["test_loss"])
    return out


def table(
    arm: str,
    settings: list[str],
    against: str | None = None,
    runs_dir: Path = RUNS,
    deployments: tuple[Path, ...] = (DEPLOYMENT,),
    control: str | None = None,
) -> tuple[str, dict]:
    dep: dict = {}
    for path in deployments:
        dep.update(json.loads(path.read_text())["deployment"]["settings"])
    extra = (" − `--versus` |" if against else "") + (
        f" − {control} (same hour) |" if control else ""
    )
    lines = [
        f"| setting | seeds | {arm}: mean test loss | − grid pick | − Optuna pick | − no WD | "
        "− default | products: variant / default |" + extra,
        "|---|---:|---:|---|---|---|---|---:|" + "---|" * extra.count("|"),
    ]
    out: dict = {}
    for s in settings:
        seeds = [n for n in range(9) if variant(arm, s, n, runs_dir) is not None]
        runs = {n: variant(arm, s, n, runs_dir) for n in seeds}
        mine = [runs[n]["test_loss"] for n in seeds]
        refs = {r: [dep[s][r]["seeds"][str(n)]["test_loss"] for n in seeds] for r in REFERENCES}
        diffs = {r: paired_difference(mine, v) for r, v in refs.items()}
        products = _products(s, seeds, runs)
        out[s] = dict(seeds=seeds, test_loss=mine, differences=diffs, products=products,
                      lambda_by_slot={n: runs[n]["lambda_by_slot"] for n in seeds})  # fmt: skip
        mean = sum(mine) / len(mine) if mine else math.nan
        lines.append(
            f"| {s} | {len(seeds)} | {mean:.4f} | {text(diffs['grid pick'])} | "
            f"{text(diffs['Optuna pick'])} | {text(diffs['no WD'])} | "
            f"{text(diffs['learned per_layer'])} | {products[0]:.0f} / {products[1]:.0f} |"
            + (f" {_versus_text(against, s, seeds, mine, out[s])} |" if against else "")
            + (f" {_control_text(control, s, seeds, mine, out[s], runs_dir)} |" if control else "")
        )
    return "\n".join(lines), out


def _versus_text(pattern: str, setting: str, seeds: list[int], mine: list[float],
                 record: dict) -> str:  # fmt: skip
    other = versus(pattern, setting, seeds)
    if other is None:
        return "missing"
    record["versus"] = {"pattern": pattern, "difference": paired_difference(mine, other)}
    return text(record["versus"]["difference"])


def _control_text(control: str, setting: str, seeds: list[int], mine: list[float],
                  record: dict, runs_dir: Path) -> str:  # fmt: skip
    other = [variant(control, setting, n, runs_dir) for n in seeds]
    if any(o is None for o in other):
        return "missing"
    d = paired_difference(mine, [o["test_loss"] for o in other])  # type: ignore[index]
    record["control"] = {"arm": control, "test_loss": [o["test_loss"] for o in other],  # type: ignore[index]
                         "difference": d}  # fmt: skip
    return text(d)


def _products(setting: str, seeds: list[int], runs: dict) -> tuple[float, float]:
    """Hessian–vector and curvature products of the variant and of today's default (the
    ``runs/final_recover`` run of the same seed), summed over the seeds: the work the hyper
    steps did (wall times of runs on another machine and load do not compare)."""

    def count(rec: dict) -> float:
        c = rec.get("sid_cost") or {}
        return float(c.get("jacobian_vector_products", 0) + c.get("curvature_products", 0))

    mine = sum(count(runs[n]) for n in seeds)
    default = 0.0
    for n in seeds:
        path = (
            RESULTS / "runs" / "final_recover"
            / f"weight_decay_default_{setting}_{base_of(n)}_seed{n}.json"
        )  # fmt: skip
        if not path.is_file():  # a setting final_recover did not run (news_mlp, digits_small)
            return mine, math.nan
        default += count(json.loads(path.read_text())["settings"][setting]["runs"]
                         ["learned_per_layer"])  # fmt: skip
    return mine, default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="held")
    p.add_argument("--settings", nargs="+", default=["fashion_cnn", "mnist_cnn"])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--versus", default=None, help="another learned run per seed: a path with {setting}, {seed}"
    )
    p.add_argument("--runs", type=Path, default=RUNS, help="folder of the variant's files")
    p.add_argument("--deployment", type=Path, nargs="+", default=[DEPLOYMENT],
                   help="stored deployment summaries to pair with (settings merged)")  # fmt: skip
    p.add_argument("--control", default=None, help="another arm in --runs to pair with")
    args = p.parse_args()
    md, data = table(args.arm, args.settings, args.versus, args.runs, tuple(args.deployment),
                     args.control)  # fmt: skip
    print(md)
    if args.out is not None:
        args.out.write_text(md + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
