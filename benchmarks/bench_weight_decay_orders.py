"""How much of "learned vs the grid's best" is batch-order noise? Retrain on fresh batch orders.

``bench_weight_decay.py`` compares one learned training with the best of 6 grid trainings, all on
one batch order. That best is the minimum of 6 noisy numbers, so it is optimistic: the same λ
trained on another batch order gives a higher validation loss on average. This script keeps each
seed's data split and initial weights and trains, on R fresh batch orders (the DataLoader's
shuffling and the callback's samplers; ``order = 1000·(seed + 1) + r``, r = 1..R):

* ``no_wd``       no weight decay;
* ``grid_pick``   the grid's pick: the value that won ``bench_weight_decay.py``'s grid on that seed
                  (read from ``<from>_seed<s>.json``, ``--from``), i.e. what a user of grid search
                  would train with;
* ``learned_*``   ``LearnedWeightDecay(1e-4, granularity=g)`` with the drop-in's defaults.

Reported per setting:

* σ: the standard deviation of one training's best validation loss over batch orders (no WD,
  pooled within seeds) — the resolution of any single comparison;
* the grid's best as ``bench_weight_decay.py`` measured it (min of 6, the seed's own order) and the
  grid's pick on fresh orders: their difference is the optimism of taking a minimum;
* each method's mean best validation loss (and mean test loss) on fresh orders, and [in brackets]
  how many of its fresh-order trainings reach the seed's grid best — ``bench_weight_decay.py``'s
  target, which the grid's own pick meets only as often as the noise allows;
* the paired difference learned − grid pick (same seed and order: same split, initial weights and
  batch order), its mean, its standard error and how many pairs the learned run wins; and the
  same paired difference of the test loss (of the best validation epoch's weights): what the
  tuning is for, free of the validation set the learned λ were fitted to.

Usage (from the repository root; run ``bench_weight_decay.py --seeds 0 1 2`` first)::

    python benchmarks/bench_weight_decay_orders.py              # 5 settings, seeds 0-2, 3 orders
    python benchmarks/bench_weight_decay_orders.py --settings digits_mlp --orders 2
    python benchmarks/bench_weight_decay_orders.py --quick      # seconds, temporary folder
    python benchmarks/bench_weight_decay_orders.py --resummarize results.json  # no training
    # after a change to the library: retrain the learned runs only, take no WD and the grid's
    # pick (trainings that do not use it) from the earlier result
    python benchmarks/bench_weight_decay_orders.py --methods learned_global learned_per_layer \
        learned_per_element \
        --reuse benchmarks/results/weight_decay_orders/weight_decay_orders.json

Writes JSON (``--out``, default
``benchmarks/results/weight_decay_orders/weight_decay_orders.json``),
a Markdown table and a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as bw  # noqa: E402  (settings, data, one training, reporting helpers)

DEFAULT_FROM = bw.REPO / "benchmarks" / "results" / "weight_decay" / "runs" / "weight_decay"
DEFAULT_OUT = (
    bw.REPO / "benchmarks" / "results" / "weight_decay_orders" / "weight_decay_orders.json"
)
METHODS = ("no_wd", "grid_pick", *(f"learned_{g}" for g in bw.GRANULARITIES))
LEARNED = tuple(m for m in METHODS if m.startswith("learned_"))


def order_seed(seed: int, r: int) -> int:
    """The r-th fresh batch order of ``seed`` (never one of the seeds' own orders)."""
    return 1000 * (seed + 1) + r


def grid_pick(source: Path, setting: str, seed: int, quick: bool) -> tuple[float, float]:
    """(the grid's winning weight decay, its best validation loss) of ``setting`` on ``seed``
    in ``bench_weight_decay.py``'s result file ``source``."""
    if quick:  # the smoke test runs no grid: the middle of the grid, no reference loss
        g = bw.SETTINGS[setting].grid
        return g[len(g) // 2], math.nan
    if not source.exists():
        raise SystemExit(
            f"{source} not found: run `python benchmarks/bench_weight_decay.py --seeds {seed}` "
            "first (or pass --from <stem> of its results)."
        )
    res = json.loads(source.read_text())
    try:
        grid = res["settings"][setting]["derived"]["grid"]
    except KeyError:
        raise SystemExit(f"{source} has no grid result for {setting}.") from None
    return float(grid["best_weight_decay"]), float(grid["best_val_loss"])


def run_setting(s: bw.Setting, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(config=bw.asdict(s), seeds={})
    for seed in args.seeds:
        root = args.fashion_data if s.data == "fashion" else args.data
        data = bw.make_data(s, root, seed)
        source = args.source.with_name(f"{args.source.name}_seed{seed}.json")
        pick, grid_best = grid_pick(source, s.name, seed, args.quick)
        bw.train_once(replace(s, epochs=1), data, seed, weight_decay=0.0)  # untimed warm-up
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
        if args.reuse is not None:
            runs.update(reused_runs(args, s.name, seed, pick))
        for r in range(1, args.orders + 1):
            order = order_seed(seed, r)
            for m in args.methods:
                if m in LEARNED:
                    rec = bw.train_once(
                        s, data, seed, granularity=m[len("learned_") :],
                        learned_init=args.learned_init, learned_kwargs=args.learned_kwargs,
                        order=order,
                    )  # fmt: skip
                else:
                    wd = pick if m == "grid_pick" else 0.0
                    rec = bw.train_once(s, data, seed, weight_decay=wd, order=order)
                rec["order"] = order
                runs[m].append(rec)
                log(f"  {s.name} seed {seed} order {order} {m}: {bw._brief(rec)}")
        out["seeds"][str(seed)] = dict(grid_pick=pick, grid_best=grid_best, runs=runs)
    return out


def reused_runs(
    args: argparse.Namespace, setting: str, seed: int, pick: float
) -> dict[str, list[dict[str, Any]]]:
    """The stored trainings (``--reuse``) of the methods not retrained, for ``seed``: the same
    grid pick and the same batch orders, or an error."""
    try:
        stored = json.loads(args.reuse.read_text())["settings"][setting]["seeds"][str(seed)]
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"--reuse: no {setting} seed {seed} in {args.reuse} ({err}).") from None
    orders = [order_seed(seed, r) for r in range(1, args.orders + 1)]
    if stored["grid_pick"] != pick:
        raise SystemExit(f"--reuse: {args.reuse} used another grid pick for {setting} seed {seed}.")
    taken = {m: recs for m, recs in stored["runs"].items() if m not in args.methods}
    for m, recs in taken.items():
        if [r["order"] for r in recs] != orders:
            raise SystemExit(f"--reuse: {args.reuse} trained {m} on other orders than {orders}.")
    return taken


def _val(rec: dict[str, Any]) -> float:
    v = rec["best_val_loss"]
    return float(v) if rec["finished"] and v is not None else math.nan


def _float(v: Any) -> float:
    """A number of the results, or NaN where strict JSON wrote null."""
    return math.nan if v is None else float(v)


def _standard_error(d: np.ndarray) -> float:
    return bw.paired_difference(d, np.zeros_like(d))["se"]


def summarize(res: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    """σ, the grid's best and, per method, its mean and its paired difference to the pick on the
    validation loss (what is tuned) and on the test loss (what the tuning is for)."""
    seeds = res["seeds"].values()
    within = [np.array([_val(r) for r in sd["runs"].get("no_wd", [])]) for sd in seeds]
    squares = sum(float(((v - v.mean()) ** 2).sum()) for v in within if len(v) > 1)
    dof = sum(len(v) - 1 for v in within if len(v) > 1)
    summary: dict[str, Any] = dict(
        sigma=math.sqrt(squares / dof) if dof > 0 else math.nan,
        grid_best_min_of_6=float(np.mean([_float(sd["grid_best"]) for sd in seeds])),
        methods={},
    )
    for m in methods:
        vals = [_val(r) for sd in seeds for r in sd["runs"][m]]
        tests = [_float(r["test_loss"]) for sd in seeds for r in sd["runs"][m]]
        row: dict[str, Any] = dict(
            mean=float(np.mean(vals)), mean_test_loss=float(np.mean(tests)), n=len(vals),
            finished=sum(r["finished"] for sd in seeds for r in sd["runs"][m]),
            # the target of bench_weight_decay.py, met by a training on a fresh order
            reach_grid_best=sum(
                _val(r) <= _float(sd["grid_best"]) for sd in seeds for r in sd["runs"][m]
            ),
        )  # fmt: skip
        if m != "grid_pick" and "grid_pick" in methods:
            pairs = [(a, b) for sd in seeds for a, b in zip(sd["runs"][m], sd["runs"]["grid_pick"])]
            d = np.array([_val(a) - _val(b) for a, b in pairs])
            d_test = np.array([_float(a["test_loss"]) - _float(b["test_loss"]) for a, b in pairs])
            row.update(
                minus_pick_each=[float(x) for x in d],
                minus_pick=float(d.mean()),
                minus_pick_se=_standard_error(d),
                wins=int((d <= 0).sum()),
                pairs=int(len(d)),
                test_minus_pick=float(d_test.mean()),
                test_minus_pick_se=_standard_error(d_test),
            )
        summary["methods"][m] = row
    return summary


def markdown_table(results: dict[str, Any]) -> str:
    methods = results["methods"]
    head = ["setting", "σ (one training)", "grid best, min of 6", *methods]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, res in results["settings"].items():
        sm = res["summary"]
        cells = [name, bw._f(sm["sigma"], ".4f"), bw._f(sm["grid_best_min_of_6"], ".4f")]
        for m in methods:
            row = sm["methods"][m]
            cell = bw._f(row["mean"], ".4f")
            if math.isfinite(sm["grid_best_min_of_6"]):
                cell += f" [{row['reach_grid_best']}/{row['n']}]"
            if "minus_pick" in row:
                cell += (
                    f" ({row['minus_pick']:+.4f} ± {bw._f(row['minus_pick_se'], '.4f')}, "
                    f"{row['wins']}/{row['pairs']}; test "
                    f"{row['test_minus_pick']:+.4f} ± {bw._f(row['test_minus_pick_se'], '.4f')})"
                )
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    others = [m for m in results["methods"] if m != "grid_pick"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        summary = results["settings"][name]["summary"]
        if math.isfinite(summary["sigma"]):
            ax.axhspan(-summary["sigma"], summary["sigma"], color="0.9", label="±σ (one training)")
        for i, m in enumerate(others):
            d = summary["methods"][m].get("minus_pick_each", [])  # none without the grid's pick
            ax.plot([i] * len(d), d, "o", alpha=0.6)
            if d:
                ax.plot([i - 0.2, i + 0.2], [np.mean(d)] * 2, "k-")
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xticks(range(len(others)), [m.replace("learned_", "") for m in others], rotation=30)
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("best val loss − grid's pick (same order)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", default=None,
                   help=f"any of {list(bw.SETTINGS)}; default {bw.DEFAULT_SETTINGS}")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--orders", type=int, default=3, help="fresh batch orders per seed (R)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--from", dest="source", type=Path, default=DEFAULT_FROM,
                   help="stem of bench_weight_decay.py's results: <stem>_seed<s>.json")  # fmt: skip
    p.add_argument("--learned-kwargs", type=json.loads, default={})
    p.add_argument("--learned-init", type=float, default=1e-4)
    p.add_argument("--data", type=Path, default=bw.DEFAULT_DATA)
    p.add_argument("--fashion-data", type=Path, default=bw.DEFAULT_FASHION)
    p.add_argument("--quick", action="store_true", help="tiny data, 1-2 epochs: seconds")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT})")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reuse", type=Path, default=None,
                   help="an earlier result JSON: take the trainings of the methods not in "
                   "--methods from it (same settings, seeds and orders)")  # fmt: skip
    p.add_argument("--resummarize", type=Path, default=None,
                   help="recompute the summary, table and figure of an existing results JSON "
                   "(no training)")  # fmt: skip
    args = p.parse_args(argv)
    if args.orders < 2 and not args.quick:
        p.error("--orders must be ≥ 2 (σ needs two batch orders)")
    names = args.settings or (["digits_mlp"] if args.quick else bw.DEFAULT_SETTINGS)
    unknown = [n for n in names if bw.ALIASES.get(n, n) not in bw.SETTINGS]
    if unknown:
        p.error(f"unknown setting(s) {unknown}; choose from {list(bw.SETTINGS)}")
    args.settings = list(dict.fromkeys(bw.ALIASES.get(n, n) for n in names))
    args.out = bw.out_path(args.out, args.quick, DEFAULT_OUT)
    return args


def write(results: dict[str, Any], out: Path) -> None:
    """The summary of every setting, then JSON, Markdown and PNG at ``out``."""
    for res in results["settings"].values():
        res["summary"] = summarize(res, results["methods"])
    results["table_markdown"] = markdown_table(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(bw._clean(results), indent=1, allow_nan=False))
    out.with_suffix(".md").write_text(results["table_markdown"] + "\n")
    plot(results, out.with_suffix(".png"))
    print("\n" + results["table_markdown"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.resummarize is not None:
        results = json.loads(args.resummarize.read_text())
        write(results, args.resummarize)
        return results
    torch.set_num_threads(args.threads)
    for name in ("pytorch_lightning", "lightning", "lightning_fabric", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.WARNING)
    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    methods = args.methods
    if args.reuse is not None:  # the summary covers the reused methods too, in the usual order
        stored = json.loads(args.reuse.read_text()).get("methods", [])
        methods = [m for m in METHODS if m in args.methods or m in stored]
    results: dict[str, Any] = dict(
        benchmark="weight_decay_orders", command=command, quick=args.quick, seeds=args.seeds,
        orders=args.orders, methods=methods, learned_init=args.learned_init,
        learned_kwargs=args.learned_kwargs, threads=torch.get_num_threads(),
        reused_from=None if args.reuse is None else str(args.reuse), settings={},
    )  # fmt: skip
    t0 = time.perf_counter()
    for name in args.settings:
        s = bw.quick_setting(bw.SETTINGS[name]) if args.quick else bw.SETTINGS[name]
        results["settings"][name] = run_setting(s, args, lambda msg: print(msg, flush=True))
    results["total_wall_s"] = time.perf_counter() - t0
    write(results, args.out)
    print(f"\ntotal {results['total_wall_s']:.0f} s; wrote {args.out} (.md, .png)")
    return results


if __name__ == "__main__":
    main()
