"""Wall time to a target hypergradient error, the library vs torchopt's CG, repeated.

``bench_peers.py`` times each (method, budget) once, on a coarse budget grid. This script brackets
each method's crossing of the errors 1e-1 and 1e-2 with finer budgets and times every case
``--repeats`` times, interleaved (a load change on the shared machine hits all methods alike),
reporting medians. Same problem, data and accounting as ``bench_peers.py`` (MNIST odd/even
logistic regression, 784 per-pixel weight decays, n_tr = n_val = 5000, float64, 1 thread).

    # ~4 minutes: writes benchmarks/results/peers_timing/peers_timing_n5000.json
    python benchmarks/bench_peers_timing.py
    python benchmarks/bench_peers_timing.py --quick  # seconds, synthetic data, temporary directory
    python benchmarks/bench_peers_timing.py --draw 1 # another minibatch order: ..._draw1.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peers as bp  # noqa: E402  (the problem, the methods and the error metric)

#: (method, budgets in epochs): brackets around each method's crossings of 1e-1 and 1e-2
CASES: dict[str, list[float]] = {
    "SID defaults, full_train_batch given": [16, 18, 20, 22, 25, 30, 35, 40, 50],
    "SID defaults, minibatches from a loader": [16, 18, 20, 22, 25, 30, 35, 40, 50],
    "SID defaults, one-shot minibatch stream": [14, 16, 18, 20, 25, 30, 35, 40, 50],
    "torchopt CG (SGD inner)": [40, 45, 50, 80, 100],
}
QUICK_CASES: dict[str, list[float]] = {name: [4, 8] for name in CASES}


def method(name: str, ctx: Any) -> Any:
    if name == "SID defaults, full_train_batch given":
        return lambda E: bp._sid(ctx, E, full_train_batch=ctx.train)
    if name == "SID defaults, minibatches from a loader":
        return lambda E: bp._sid(ctx, E)
    if name == "SID defaults, one-shot minibatch stream":
        return lambda E: bp._sid(ctx, E, one_shot=True)
    return lambda E: bp.torchopt_method("cg", False)(ctx, E)


def run(ctx: Any, cases: dict[str, list[float]], repeats: int) -> list[dict[str, Any]]:
    """Every (method, budget) ``repeats`` times, round-robin; median seconds per case."""
    runs = [(name, E, method(name, ctx)) for name, budgets in cases.items() for E in budgets]
    seconds: dict[tuple[str, float], list[float]] = {(n, E): [] for n, E, _ in runs}
    result: dict[tuple[str, float], Any] = {}
    for _ in range(repeats):
        for name, E, f in runs:
            torch.manual_seed(ctx.seed)
            start = time.perf_counter()
            res = f(E)
            seconds[(name, E)].append(time.perf_counter() - start)
            result[(name, E)] = res
    rows = []
    for (name, E), ts in seconds.items():
        res = result[(name, E)]
        rows.append(
            {
                "method": name,
                "budget": E,
                "epochs": res["samples"] / ctx.n,
                "rel_error": bp.rel_error(res["g"], ctx.truth),
                "seconds_median": statistics.median(ts),
                "seconds": ts,
            }
        )
    return rows


def first_reaching(
    rows: list[dict[str, Any]], name: str, target: float, by: str = "epochs"
) -> dict | None:
    """The case of ``name`` reaching ``target`` with the fewest epochs (``by="epochs"``) or the
    fewest median seconds (``by="seconds_median"``): they differ where a larger budget switches
    to a cheaper solver (``Automatic``: CG from 10 products on)."""
    met = [r for r in rows if r["method"] == name and r["rel_error"] <= target]
    return min(met, key=lambda r: r[by]) if met else None


def summary(rows: list[dict[str, Any]], names: list[str]) -> str:
    """Per method and target: the fewest epochs and the fewest seconds that reach it."""
    lines = [
        "| method | ≤ 0.1: fewest epochs (ep, s) | ≤ 0.1: fewest s (ep, s) "
        "| ≤ 0.01: fewest epochs (ep, s) | ≤ 0.01: fewest s (ep, s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        cells = []
        for target in (1e-1, 1e-2):
            for by in ("epochs", "seconds_median"):
                r = first_reaching(rows, name, target, by)
                cells.append(
                    "not reached" if r is None else f"{r['epochs']:.0f}, {r['seconds_median']:.2f}"
                )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Relative error against median seconds, one line per method, the targets dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["method"] for r in rows):
        own = sorted((r for r in rows if r["method"] == name), key=lambda r: r["budget"])
        ax.plot([r["seconds_median"] for r in own], [r["rel_error"] for r in own], "o-", label=name)
    for target in (1e-1, 1e-2):
        ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="median seconds (1 thread)", ylabel="‖ĝ − ∇f‖² / ‖∇f‖²", yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic data, tiny budgets")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--draw", type=int, default=0,
        help="seed of the minibatch order only (same λ, data and truth); != 0 adds _draw<d> to "
        "the file name",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if bp.installed("torchopt") is None:
        cases = {
            k: v for k, v in (QUICK_CASES if args.quick else CASES).items() if "torchopt" not in k
        }
    else:
        cases = QUICK_CASES if args.quick else CASES
    if args.quick:
        train, val = bp.synthetic_odd_even(200, 200, 0, 50)
        ctx = bp.make_context(train, val, 20, 0)
        out_dir = args.out or Path(tempfile.mkdtemp(prefix="bench_peers_timing_"))
        repeats = min(args.repeats, 2)
    else:
        train, val = bp.load_mnist_odd_even(bp.DEFAULT_DATA, args.n, args.n, 0)
        ctx = bp.make_context(train, val, 50, 0)
        out_dir = args.out or bp.RESULTS.parent / "peers_timing"
        repeats = args.repeats
    ctx.seed = args.draw
    for name, budgets in cases.items():  # warm-up: imports, first calls
        method(name, ctx)(min(budgets))
    rows = run(ctx, cases, repeats)
    lines = ["| method | budget E | epochs | rel. error | median s [min, max] |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['budget']:g} | {r['epochs']:.1f} | {r['rel_error']:.3e} | "
            f"{r['seconds_median']:.2f} [{min(r['seconds']):.2f}, {max(r['seconds']):.2f}] |"
        )
    lines += ["", summary(rows, list(cases))]
    table = "\n".join(lines)
    print(table)
    report = {
        "experiment": "wall time to a target error, repeated and interleaved",
        "config": {"n": ctx.n, "repeats": repeats, "quick": args.quick, "threads": 1,
                   "draw": args.draw,
                   "cases": cases, "data": "synthetic" if args.quick else "MNIST odd/even"},
        "rows": rows,
        "markdown": table,
    }  # fmt: skip
    suffix = ("_quick" if args.quick else "") + (f"_draw{args.draw}" if args.draw else "")
    path = out_dir / f"peers_timing_n{ctx.n}{suffix}.json"
    return bp.write_report(report, path, lambda png: plot(rows, png))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
