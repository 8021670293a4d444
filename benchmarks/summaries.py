"""Write each benchmark summary's table (.md) and figure (.png) from its JSON, where the benchmark's
own script writes only the JSON. No training: it reads ``benchmarks/results/*/*.json`` (the
summaries, see ``benchmarks/results/README.md``) and takes seconds::

    python benchmarks/summaries.py            # writes what is missing
    python benchmarks/summaries.py --force    # rewrites every table and figure it knows
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GRID = "grid best (6 trainings)"


def seeds_table(d: dict[str, Any]) -> str:
    return d["table_markdown"]


def seeds_figure(d: dict[str, Any], out: Path) -> None:
    """Per setting, each method minus the grid's best of the same seed (mean ± s.e. over seeds),
    on the best validation loss and on the held-out test loss."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    settings = list(d["settings"])
    methods = [m for m in d["settings"][settings[0]] if m != GRID and "hindsight" not in m]
    width = 0.8 / len(methods)
    for ax, key, title in (
        (axes[0], "val", "best validation loss"),
        (axes[1], "test_loss", "held-out test loss"),
    ):
        for j, method in enumerate(methods):
            means, errs = [], []
            for s in settings:
                runs, grid = (
                    d["settings"][s].get(method, {}).get("seeds", {}),
                    d["settings"][s][GRID],
                )
                diffs = [
                    r[key] - grid["seeds"][k][key] for k, r in runs.items() if k in grid["seeds"]
                ]
                means.append(statistics.fmean(diffs) if diffs else float("nan"))
                n = len(diffs)
                errs.append(statistics.stdev(diffs) / n**0.5 if n > 1 else 0.0)
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(settings))]
            ax.bar(xs, means, width, yerr=errs, capsize=2, label=method)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(settings)), settings, rotation=15)
        ax.set_title(f"{title} − the grid's best (mean ± s.e. over seeds)")
    axes[0].legend(fontsize="small")
    fig.savefig(out, dpi=110)
    plt.close(fig)


def markdown_key(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda d: d[key]


def step_cost_table(d: dict[str, Any]) -> str:
    rows = ["| ratio | " + " | ".join(d["models"]) + " |", "|---|" + "---:|" * len(d["models"])]
    names = list(d["models"][next(iter(d["models"]))]["ratios"])
    for name in names:
        vals = [m["ratios"][name] for m in d["models"].values()]
        rows.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(rows)


def step_cost_figure(d: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    models = list(d["models"])
    names = list(d["models"][models[0]]["times"])
    for j, model in enumerate(models):
        times = d["models"][model]["times"]
        ax.bar([i + 0.4 * j for i in range(len(names))], [times[n]["median_ms"] for n in names],
               0.4, label=model)  # fmt: skip
    ax.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=15)
    ax.set(ylabel="median ms", title="cost of one step (1 thread, batch 128)")
    ax.legend()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def overhead_table(d: dict[str, Any]) -> str:
    rows = ["| configuration | seconds per epoch | seconds per hyper step |", "|---|---:|---:|"]
    for name, t in d["times"].items():
        hyper = "" if t["hyper_step_s"] is None else f"{t['hyper_step_s']:.3f}"
        rows.append(f"| {name} | {t['epoch_s']:.3f} | {hyper} |")
    rows += ["", "| ratio | value |", "|---|---:|"]
    rows += [f"| {k} | {v:.3f} |" for k, v in d["ratios"].items()]
    return "\n".join(rows)


def overhead_figure(d: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5), constrained_layout=True)
    ax.barh(list(d["times"]), [t["epoch_s"] for t in d["times"].values()])
    ax.set(xlabel="seconds per epoch", title="callback overhead (MLP, a hyper step every 8 steps)")
    fig.savefig(out, dpi=110)
    plt.close(fig)


def residual_table(d: dict[str, Any]) -> str:
    rows = ["| measurement | median ms |", "|---|---:|"]
    rows += [f"| {k} | {v:.2f} |" for k, v in d["median_ms"].items()]
    rows += [f"| ratio {k} | {v:.2f}× |" for k, v in d["ratios"].items()]
    return "\n".join(rows)


def residual_figure(d: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5), constrained_layout=True)
    ax.barh(list(d["median_ms"]), list(d["median_ms"].values()))
    ax.set(xlabel="median ms", title="residual norm: native precision vs float64 copy")
    fig.savefig(out, dpi=110)
    plt.close(fig)


def runs_table(d: dict[str, Any]) -> str:
    """A row per run of the JSON's ``runs`` list, its numeric and short fields as columns."""
    keys = [k for k, v in d["runs"][0].items() if isinstance(v, (int, float, str))]
    rows = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for run in d["runs"]:
        cells = [f"{run[k]:.4g}" if isinstance(run[k], float) else str(run[k]) for k in keys]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


#: summary JSON (relative to benchmarks/results) -> (table writer, figure writer or None)
SUMMARIES: dict[str, tuple[Callable[[dict], str] | None, Callable[[dict, Path], None] | None]] = {
    "weight_decay/weight_decay_9seeds.json": (seeds_table, seeds_figure),
    "weight_decay/weight_decay_heldout_optuna_seeds.json": (seeds_table, seeds_figure),
    "weight_decay_resnet18/weight_decay_resnet18_cpu.json": (seeds_table, seeds_figure),
    "weight_decay_orders/weight_decay_orders.json": (None, None),  # its script writes all three
    "peers/peers_n5000.json": (markdown_key("markdown"), None),
    "peers_timing/peers_timing_n5000.json": (markdown_key("markdown"), None),
    "adjoint_formulations/adjoint_formulations.json": (markdown_key("table_markdown"), None),
    "step_cost/step_cost.json": (step_cost_table, step_cost_figure),
    "callback_overhead/callback_overhead.json": (overhead_table, overhead_figure),
    "residual_norm/residual_norm.json": (residual_table, residual_figure),
    "sample_weight_cost/sample_weight_cost.json": (runs_table, None),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rewrite existing tables and figures")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for rel, (table, figure) in SUMMARIES.items():
        path = args.results / rel
        data = json.loads(path.read_text())
        md, png = path.with_suffix(".md"), path.with_suffix(".png")
        if table is not None and (args.force or not md.exists()):
            md.write_text(table(data).rstrip() + "\n")
            print(f"wrote {md}")
        if figure is not None and (args.force or not png.exists()):
            figure(data, png)
            print(f"wrote {png}")


if __name__ == "__main__":
    main()
