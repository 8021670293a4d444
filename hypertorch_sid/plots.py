"""Pictures of a training from its logs: λ per layer or group, the hypergradient norm, the adjoint
residual, the damping and the curvature estimates, and the validation curves.

The callbacks log ``hyper/...`` metrics at every hyper step to every logger of the Trainer; this
module reads a Lightning ``CSVLogger`` folder (its ``metrics.csv``) and draws them::

    from pytorch_lightning.loggers import CSVLogger
    trainer = pl.Trainer(logger=CSVLogger("logs"), callbacks=[LearnedWeightDecay(1e-4)])
    ...
    from hypertorch_sid.plots import plot_training
    plot_training("logs", out="training.png")

or from a shell: ``python -m hypertorch_sid.plots logs -o training.png``. Needs matplotlib
(``pip install "hypertorch-sid[plots]"``); reading the log (:func:`read_metrics`) does not.

What each panel shows:

* **λ** (log scale), one line per layer / group / tensor (``hyper/<name>/<group>_mean``), or the
  single λ; with many values per name (per-element λ) the median with 25–75 % and 10–90 % quantile
  bands;
* **hypergradient norm** ‖∇̂f(λ)‖ (eq. gradestim) and the **adjoint residual** ‖Ψ̂(v) − v‖ (eq.
  backalg): a residual that does not fall says the adjoint solve is short of steps;
* **curvature and damping**: L̂ and λ̂_min of the Lanczos estimate and the damping δ;
* **validation**: every logged metric whose name starts with ``val`` (e.g. ``val_loss``), and the
  hyper step's own validation objective ``hyper/outer_loss``.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["find_metrics_file", "read_metrics", "plot_training", "main"]

Series = dict[str, tuple[list[float], list[float]]]


def find_metrics_file(logdir: str | Path) -> Path:
    """The ``metrics.csv`` of a CSVLogger folder: ``logdir`` itself if it is the file, else the
    newest ``metrics.csv`` below it (``logs/name/version_3/metrics.csv``)."""
    path = Path(logdir)
    if path.is_file():
        return path
    found = sorted(path.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"No metrics.csv under {str(path)!r}: pass the folder of a Lightning CSVLogger "
            "(pl.Trainer(logger=CSVLogger(folder))) or the metrics.csv file itself."
        )
    return found[-1]


def read_metrics(logdir: str | Path) -> Series:
    """Every metric of a CSV log as ``{name: (steps, values)}``, blank cells and non-numbers
    skipped, in the order logged."""
    series: Series = {}
    with open(find_metrics_file(logdir), newline="") as f:
        for row in csv.DictReader(f):
            step = _number(row.get("step"))
            if step is None:
                continue
            for name, cell in row.items():
                value = _number(cell)
                if name in ("step", "epoch") or value is None:
                    continue
                steps, values = series.setdefault(name, ([], []))
                steps.append(step)
                values.append(value)
    return series


def _number(cell: Any) -> float | None:
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


_SUFFIX = re.compile(r"_(mean|min|max|q\d+)$")
_FIXED = {
    "hyper/outer_loss", "hyper/hypergradient_norm", "hyper/adjoint_residual", "hyper/adjoint_eta",
    "hyper/alpha", "hyper/damping", "hyper/relative_adjoint_residual", "hyper/v_norm", "hyper/L",
    "hyper/lambda_min", "hyper/retries", "hyper/outer_lr", "hyper/train_samples",
    "hyper/val_samples", "hyper/step",
}  # fmt: skip


def lambda_names(series: Series) -> list[str]:
    """The λ summaries logged (``hyper/<name>`` with ``_mean``): the parts of a total
    (``weight_decay/fc1``) when there are some, else the totals."""
    names = sorted(
        {_SUFFIX.sub("", k) for k in series if k.startswith("hyper/") and k.endswith("_mean")}
        - _FIXED
    )
    parts = [n for n in names if n.count("/") > 1]
    return parts or names


def plot_training(logdir: str | Path, out: str | Path | None = None, *, title: str | None = None):
    """Draw the training's hyper steps from a CSV log (see the module docstring for the panels).
    Returns the matplotlib Figure; ``out`` (a .png, .pdf or .svg path) also saves it."""
    try:
        import matplotlib

        if out is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            'hypertorch_sid.plots needs matplotlib: pip install "hypertorch-sid[plots]"'
        ) from e
    series = read_metrics(logdir)
    if not any(k.startswith("hyper/") for k in series):
        raise ValueError(
            f"{find_metrics_file(logdir)} holds no hyper/ metrics: was the Trainer given a "
            "HyperOptimizationCallback or LearnedWeightDecay and this CSVLogger?"
        )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    _lambda_panel(axes[0, 0], series)
    _lines(axes[0, 1], series, ["hyper/hypergradient_norm", "hyper/adjoint_residual"], log=True)
    axes[0, 1].set_title("hypergradient norm, adjoint residual")
    _lines(axes[1, 0], series, ["hyper/L", "hyper/lambda_min", "hyper/damping"], log=False)
    axes[1, 0].set_title("curvature estimates L̂, λ̂_min and damping δ")
    val = [k for k in series if k.startswith("val")] + ["hyper/outer_loss"]
    _lines(axes[1, 1], series, val, log=False)
    axes[1, 1].set_title("validation")
    for ax in axes.flat:
        ax.set_xlabel("training step")
    if title:
        fig.suptitle(title)
    if out is not None:
        fig.savefig(out, dpi=120)
    return fig


def _lambda_panel(ax: Any, series: Series) -> None:
    names = lambda_names(series)
    for i, name in enumerate(names):
        color = f"C{i % 10}"
        label = name.removeprefix("hyper/")
        if f"{name}_q50" in series:
            steps, mid = series[f"{name}_q50"]
            for lo, hi, alpha in (("q10", "q90", 0.15), ("q25", "q75", 0.3)):
                if f"{name}_{lo}" in series and f"{name}_{hi}" in series:
                    ax.fill_between(
                        steps,
                        series[f"{name}_{lo}"][1],
                        series[f"{name}_{hi}"][1],
                        color=color,
                        alpha=alpha,
                        lw=0,
                    )
            ax.plot(steps, mid, color=color, label=f"{label} (median, 25-75 %, 10-90 %)")
        else:
            steps, mean = series[f"{name}_mean"]
            ax.plot(steps, mean, color=color, label=label)
    ax.set_yscale("log")
    ax.set_title("λ per layer / group" if len(names) > 1 else "λ")
    if names:
        ax.legend(fontsize="small")


def _lines(ax: Any, series: Series, names: Sequence[str], log: bool) -> None:
    drawn = False
    for name in names:
        if name in series:
            steps, values = series[name]
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=name)
            drawn = True
    if log and drawn and all(v > 0 for n in names if n in series for v in series[n][1]):
        ax.set_yscale("log")
    if drawn:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def main(argv: Sequence[str] | None = None) -> Path:
    """``python -m hypertorch_sid.plots LOGDIR [-o OUT]``: draw a CSV log's hyper steps."""
    parser = argparse.ArgumentParser(
        prog="python -m hypertorch_sid.plots", description=main.__doc__
    )
    parser.add_argument("logdir", help="a CSVLogger folder (or its metrics.csv)")
    parser.add_argument("-o", "--out", help="image to write (default LOGDIR/hyper_steps.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    logdir = Path(args.logdir)
    out = (
        Path(args.out)
        if args.out
        else (logdir if logdir.is_dir() else logdir.parent) / ("hyper_steps.png")
    )
    plot_training(logdir, out, title=args.title)
    print(out)
    return out


if __name__ == "__main__":
    main()
