"""Adjoint formulations on non-convex networks, side by side (issue 9, item 1).

The paper's adjoint system (I − ∂₁Φᵀ)v = ∇₁E assumes a contraction; a network's Hessian has
negative eigenvalues. Each candidate is a strategy the core already has, passed to the drop-in
``LearnedWeightDecay`` (every other setting at its default):

* **damped (default)** — ``CurvatureDamping()``: solve (∇²ℓ + δI)v = ∇₁E with δ = 1.5·max(0, −λ̂_min)
  from the Lanczos estimate, α = 2/(L̂ + λ̂_min + 2δ): a contraction by construction;
* **undamped (the paper's map)** — ``NoDamping()``: α = 2/(L̂ + μ̂) on the raw Hessian;
* **α = the training's lr** — the map the training actually iterates, w − η∇ℓ (SGD's η), damped
  or not;
* **truncated** — ``warm_start_adjoint=False``, undamped: each hyper step sums k = 3 terms of the
  Neumann series Σ (I − α∇²ℓ)ʲ α∇₁E from v = 0 (bounded by construction, biased);
* **re-estimated every hyper step** — the default, with ``EstimatedCurvature(every=1)`` (follows the
  sharpness, 10× the estimates);
* **Gauss–Newton** — ``hvp=GaussNewton(outputs, output_loss)``: the adjoint system's curvature is
  Jᵀ∇²_zL J (positive semi-definite) plus the decay's exact Hessian, with α and δ from the exact
  Hessian's estimate as in the default. The drop-in cannot split the user's loss by itself, so
  the benchmark passes ``outputs = model(x)`` and ``output_loss = cross-entropy``.

Per setting and seed: runs that finish, hyper steps accepted (the rest were skipped after a
detected divergence), the best validation loss and the final λ. The no-weight-decay training of
the same seed is the reference. JSON and a figure go to
``benchmarks/results/adjoint_formulations/``.

    python benchmarks/bench_adjoint_formulations.py                 # digits + MNIST MLP, 3 seeds
    python benchmarks/bench_adjoint_formulations.py --quick         # seconds (tiny, 1 seed)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as wd  # noqa: E402  (the settings, data and training loop)

from hypertorch_sid import CurvatureDamping, GaussNewton, NoDamping  # noqa: E402
from hypertorch_sid.lightning import CALLBACK_CONFIG  # noqa: E402

OUT = wd.REPO / "benchmarks" / "results" / "adjoint_formulations" / "adjoint_formulations.json"


def _gauss_newton(model: Any) -> dict[str, Any]:
    return {
        "hvp": GaussNewton(
            outputs=lambda b: model(b[0]), output_loss=lambda z, b: F.cross_entropy(z, b[1])
        )
    }


def formulations(lr: float) -> dict[str, Any]:
    """Name → ``LearnedWeightDecay`` keywords, or a function of the model returning them; ``lr``
    is the training optimizer's step."""
    return {
        "damped (default)": {"damping": CurvatureDamping()},
        "undamped (paper's map)": {"damping": NoDamping()},
        "alpha = training lr, damped": {"alpha": lr},
        "alpha = training lr, undamped": {"alpha": lr, "damping": NoDamping()},
        "truncated (k = 3 from v = 0, undamped)": {
            "damping": NoDamping(),
            "warm_start_adjoint": False,
        },
        "re-estimated every hyper step": {"curvature": replace(CALLBACK_CONFIG.curvature, every=1)},
        "Gauss-Newton products (damped as the default)": _gauss_newton,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"granularity": args.granularity, "seeds": args.seeds, "settings": {}}
    for name in args.settings:
        s = wd.SETTINGS[name]
        if args.quick:  # tiny data; enough epochs for a few hyper steps
            s = replace(wd.quick_setting(s), epochs=8)
        per: dict[str, Any] = {"no_wd": [], "formulations": {}}
        for seed in args.seeds:
            data = wd.make_data(s, args.data, seed)
            if not per["no_wd"]:
                wd.train_once(replace(s, epochs=1), data, seed)  # untimed warm-up
            plain = wd.train_once(s, data, seed)
            per["no_wd"].append(_row(plain))
            print(f"{name} seed {seed} no WD: {plain['best_val_loss']:.4f}", flush=True)
            for label, kw in formulations(s.lr).items():
                rec = wd.train_once(s, data, seed, granularity=args.granularity, learned_kwargs=kw)
                row = _row(rec)
                per["formulations"].setdefault(label, []).append(row)
                print(
                    f"{name} seed {seed} {label}: finished {row['finished']}, "
                    f"val {row['best_val_loss']:.4f}, accepted {row['accepted']}/"
                    f"{row['attempted']}, λ {row['lambda_mean']:.3g}",
                    flush=True,
                )
        out["settings"][name] = per
    return out


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    every = rec.get("every_n_steps")
    lam = rec.get("lambda_summary") or {}
    return {
        "finished": bool(rec["finished"]) and bool(rec.get("finite")),
        "error": rec.get("error"),
        "best_val_loss": rec["best_val_loss"],
        "wall_s": rec["wall_s"],
        "accepted": rec.get("hyper_steps") or 0,
        "attempted": rec["optimizer_steps"] // every if every else 0,  # 0: no callback
        "lambda_mean": float(lam.get("mean", math.nan)),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| setting | formulation | runs finished | hyper steps accepted | best val loss "
        "(median over seeds) | − no WD | final λ (median) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, per in result["settings"].items():
        base = statistics.median(r["best_val_loss"] for r in per["no_wd"])
        lines.append(f"| {name} | no weight decay | {len(per['no_wd'])}/{len(per['no_wd'])} | "
                     f"– | {base:.4f} | 0 | 0 |")  # fmt: skip
        for label, rows in per["formulations"].items():
            done = sum(r["finished"] for r in rows)
            acc = sum(r["accepted"] for r in rows)
            att = sum(r["attempted"] for r in rows)
            vals = [r["best_val_loss"] for r in rows if r["finished"]]
            med = statistics.median(vals) if vals else math.nan
            lam = statistics.median(r["lambda_mean"] for r in rows)
            lines.append(
                f"| {name} | {label} | {done}/{len(rows)} | {acc}/{att} | {med:.4f} | "
                f"{med - base:+.4f} | {lam:.2g} |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(result["settings"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        per = result["settings"][name]
        labels = ["no WD", *per["formulations"]]
        series = [[r["best_val_loss"] for r in per["no_wd"]]]
        series += [[r["best_val_loss"] for r in rows] for rows in per["formulations"].values()]
        for i, ys in enumerate(series):
            ax.scatter([i] * len(ys), ys, s=18)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("best validation loss")
        ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", nargs="+", default=["digits_mlp", "mnist_mlp"],
                   choices=list(wd.SETTINGS))  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--granularity", default="per_layer", choices=wd.GRANULARITIES)
    p.add_argument("--data", type=Path, default=wd.DEFAULT_DATA)
    p.add_argument("--quick", action="store_true", help="tiny data, 1 seed: seconds")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.quick:
        args.settings, args.seeds = ["digits_mlp"], [0]
    torch.set_num_threads(args.threads)
    for name in ("pytorch_lightning", "lightning", "lightning_fabric", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.ERROR)
    start = time.perf_counter()
    result = run(args)
    result["total_wall_s"] = time.perf_counter() - start
    result["command"] = " ".join(["bench_adjoint_formulations.py", *(argv or sys.argv[1:])])
    result["table_markdown"] = table(result)
    out = args.out or (OUT.with_name("adjoint_formulations_quick.json") if args.quick else OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(wd._clean(result), indent=1))
    plot(result, out.with_suffix(".png"))
    print("\n" + result["table_markdown"] + f"\n\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
