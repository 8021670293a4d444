"""Shared helpers of the paper-reproduction scripts (``examples/paper_*.py``).

* exact hypergradients for the ground truth: a converged Newton (or Newton-CG) solve of the inner
  problem and a direct (or CG) solve of the linear system (I − ∂₁Φ)ᵀ v = ∇₁E, in float64;
* hypergradient estimates of :class:`~hypertorch_sid.SIDHyperOptimizer` presets over a ladder of
  epoch budgets (each budget is one fresh Algorithm 1 run from w = 0, v = 0);
* command line, JSON and plotting boilerplate.

The losses are written as pure functions ``fn(w, lam, batch) -> scalar`` so that the same code
serves the library (through closures over leaf tensors) and the exact solves (through
``torch.func``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets  # examples/datasets.py
import numpy as np
import torch
from torch import Tensor

from hypertorch_sid import (
    FixedPointIteration,
    GradientDescentMap,
    KnownCurvature,
    SIDConfig,
    SIDHyperOptimizer,
    estimate_curvature,
    get_preset,
    theory_constants,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"

LossFn = Callable[[Tensor, Tensor, Any], Tensor]

#: display names of the presets (the appendix's method table)
PRESET_LABELS = {
    "batch": "Batch",
    "stoch_const": "Stoch const",
    "stoch_dec": "Stoch dec",
    "stoch_batch": "Stoch/Batch",
    "batch_stoch": "Batch/Stoch",
    "batch_75_25": "Batch 75%/25%",
    "stoch_const_75_25": "Stoch const 75%/25%",
    "stoch_dec_75_25": "Stoch dec 75%/25%",
}


# ------------------------------------------------------------------------------ command line
def parse_args(
    description: str,
    default_out: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """``--quick`` (seconds, used by the tests), ``--out`` (JSON path; the PNG goes beside it),
    ``--data`` (data root), ``--threads``, and the script's own options added by
    ``extra(parser)``.

    Without ``--out``, a full run writes ``results/<default_out>`` (the committed results) and a
    ``--quick`` run writes into a fresh temporary folder, so smoke runs never overwrite them.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny run for tests (seconds)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON output (default results/{default_out}; with --quick a temporary folder)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"data root holding mnist/, 20news/ (default ${datasets.DATA_ENV_VAR} or "
        "../shared/data relative to the repository)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    args.out = default_out_path(args.out, args.quick, default_out)
    datasets.use_data_root(args.data)
    torch.set_num_threads(args.threads)
    return args


def default_out_path(out: Path | None, quick: bool, default_out: str) -> Path:
    """``out`` if given, else ``results/<default_out>`` for a full run and a file in a new
    temporary folder for a ``--quick`` run (which must not replace the committed results)."""
    if out is not None:
        return out
    if quick:
        return Path(tempfile.mkdtemp(prefix="hypertorch_sid_quick_")) / default_out
    return RESULTS / default_out


def require_data() -> None:
    """Exit with a clear message when the offline data sets are missing."""
    if datasets.default_data_root() is None:
        raise SystemExit(
            "data not found: put the data sets in ../shared/data (relative to the repository), "
            f"set {datasets.DATA_ENV_VAR} or pass --data."
        )


def save_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
    print(f"wrote {path}")


def _jsonable(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x)}")


# ------------------------------------------------------------------------------ exact solves
def conjugate_gradient(
    matvec: Callable[[Tensor], Tensor], b: Tensor, rtol: float = 1e-12, maxiter: int = 10_000
) -> tuple[Tensor, int, float]:
    """Solve A x = b for symmetric positive definite A; returns (x, iterations, ‖r‖/‖b‖)."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r.flatten(), r.flatten())
    bnorm = math.sqrt(float(rr)) or 1.0
    for it in range(1, maxiter + 1):
        ap = matvec(p)
        step = rr / torch.dot(p.flatten(), ap.flatten())
        x = x + step * p
        r = r - step * ap
        rr_new = torch.dot(r.flatten(), r.flatten())
        if math.sqrt(float(rr_new)) <= rtol * bnorm:
            return x, it, math.sqrt(float(rr_new)) / bnorm
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, maxiter, math.sqrt(float(rr)) / bnorm


def exact_hypergradient(
    inner_fn: LossFn,
    outer_fn: LossFn,
    lam: Tensor,
    train: Any,
    val: Any,
    w0: Tensor,
    hessian: Callable[[Tensor, Tensor, Any], Tensor] | None = None,
    gtol: float = 1e-11,
    max_newton: int = 100,
) -> dict[str, Any]:
    """∇f(λ) = ∇₂E − ∇²₂₁ℓ (∇²₁₁ℓ)⁻¹ ∇₁E at the exact inner solution w(λ), in float64.

    The inner problem min_w ℓ(w, λ) (strongly convex) is solved by Newton's method with
    backtracking until ‖∇₁ℓ‖ ≤ ``gtol``: with a dense Hessian when ``hessian(w, lam, batch)``
    (returning the ``(w.numel(), w.numel())`` matrix ∇²₁₁ℓ) is given, else by Newton-CG
    (Hessian–vector products by ``torch.func``). The linear system ∇²₁₁ℓ u = ∇₁E — equivalently
    (I − ∂₁Φ)ᵀ v = ∇₁E for the GD map, whose α cancels — is solved directly (dense) or by CG to
    a relative residual of 1e-13. Everything runs in float64.
    """
    lam = lam.detach().double()
    w = w0.detach().double().clone()
    grad_w = torch.func.grad(inner_fn, argnums=0)

    def hvp(v: Tensor) -> Tensor:
        return torch.func.jvp(lambda x: grad_w(x, lam, train), (w,), (v,))[1]

    start = time.perf_counter()
    newton_steps, cg_iters = 0, 0
    value = float(inner_fn(w, lam, train))
    for newton_steps in range(1, max_newton + 1):  # noqa: B007
        g = grad_w(w, lam, train)
        gnorm = float(g.norm())
        if gnorm <= gtol:
            break
        if hessian is not None:
            step = torch.linalg.solve(hessian(w, lam, train), g.flatten()).reshape(w.shape)
        else:
            step, its, _ = conjugate_gradient(hvp, g, rtol=min(0.1, math.sqrt(gnorm)))
            cg_iters += its
        t = 1.0
        while gnorm > 1e-6 and t > 1e-10:  # Armijo backtracking, far from the solution only
            cand = w - t * step
            new_value = float(inner_fn(cand, lam, train))
            if new_value <= value - 1e-4 * t * float((g * step).sum()):
                break
            t /= 2
        cand = w - t * step
        new_value = float(inner_fn(cand, lam, train))
        w, value = cand, new_value
    g = grad_w(w, lam, train)
    inner_grad_norm = float(g.norm())
    lam_ = lam.clone().requires_grad_(True)
    w_ = w.clone().requires_grad_(True)
    E = outer_fn(w_, lam_, val)
    g1, g2 = torch.autograd.grad(E, (w_, lam_), allow_unused=True)
    g2 = torch.zeros_like(lam) if g2 is None else g2
    if hessian is not None:
        H = hessian(w, lam, train)
        u = torch.linalg.solve(H, g1.flatten()).reshape(w.shape)
        lin_res = float((H @ u.flatten() - g1.flatten()).norm() / g1.norm())
    else:
        u, its, lin_res = conjugate_gradient(hvp, g1, rtol=1e-13)
        cg_iters += its
    # ∇²₂₁ℓ u = ∂_λ ⟨∇₁ℓ(w, λ), u⟩
    mixed = torch.func.grad(lambda lm: (grad_w(w, lm, train) * u).sum())(lam)
    hypergrad = g2 - mixed
    return {
        "hypergradient": hypergrad,
        "w": w,
        "inner_grad_norm": inner_grad_norm,
        "linear_residual": lin_res,
        "newton_steps": newton_steps,
        "cg_iterations": cg_iters,
        "outer_loss": float(E.detach()),
        "seconds": time.perf_counter() - start,
    }


# ------------------------------------------------------------------------------ SID estimates
def sid_estimate(
    preset: str | None,
    epochs: float,
    *,
    inner_fn: LossFn,
    outer_fn: LossFn,
    lam: Tensor,
    w_init: Tensor,
    train_loader: Any,
    full_train: Any,
    val: Any,
    n_train: int,
    batch_size: int,
    **kwargs: Any,
) -> tuple[Tensor, SIDHyperOptimizer]:
    """One hypergradient of Algorithm 1 from w = ``w_init``, v = 0 with a budget of ``epochs``.

    ``preset`` names one of the paper's variants (t, k from the appendix's epoch rule); with
    ``preset=None`` the caller's ``kwargs`` (e.g. ``inner_steps``, ``step_size``) are the
    :class:`SIDConfig`; with a preset they change its config.
    """
    w = w_init.detach().clone().requires_grad_(True)
    lam = lam.detach().clone().requires_grad_(True)
    common = dict(
        hyperparameters=[lam],
        inner_parameters=[w],
        inner_loss=lambda b: inner_fn(w, lam, b),
        outer_loss=lambda b: outer_fn(w, lam, b),
        full_train_batch=full_train,
    )
    if preset is None:
        # the paper's fixed-point adjoint iteration: with full_train_batch given, the library's
        # default (Automatic) may run conjugate gradients instead, which is not the paper's SID
        kwargs.setdefault("adjoint_solver", FixedPointIteration())
        opt = SIDHyperOptimizer(**common, config=SIDConfig(**kwargs))
    else:
        config = get_preset(preset).config(epochs, n_train, batch_size).replace(**kwargs)
        opt = SIDHyperOptimizer(**common, config=config)
    (g,) = opt.hypergradient(train_loader, val)
    return g.detach(), opt


def squared_error(estimate: Tensor, exact: Tensor) -> float:
    """‖∇̂f − ∇f‖² (the quantity of the paper's Figures 1–2)."""
    return float(((estimate.double() - exact.double()) ** 2).sum())


def error_ladder(
    inner_fn: LossFn,
    outer_fn: LossFn,
    lam: Tensor,
    train: tuple[Tensor, Tensor],
    val: Any,
    *,
    w_shape: tuple[int, ...],
    methods: Sequence[str],
    epochs: Sequence[float],
    batch_size: int,
    seed: int,
    L: float,
    mu: float,
    hessian: Callable[[Tensor, Tensor, Any], Tensor] | None = None,
    reference_epochs: float | None = None,
) -> dict[str, Any]:
    """Squared hypergradient errors of ``methods`` at each budget in ``epochs`` (one run, w of
    shape ``w_shape``).

    Methods are preset names (α = 2/(L+μ) from the given L, μ) or ``"sid_default"``: L, μ
    estimated by the library (``estimate_curvature``, power iteration at w = 0) and two-phase
    steps, η = 1 for t₀ = min(t/2, ⌈7β⌉) steps (7β ≈ ln(10³)/(1−q): the constant phase has then
    shrunk the initial error ~10³-fold and sits at its noise floor), then β/(γ + t − t₀).
    Every estimate starts from w = 0, v = 0; all methods of a run see the same minibatch order.
    ``reference_epochs`` adds the paper's ground truth (Batch with that budget) and its error.
    """
    n = int(train[0].shape[0])
    w0 = torch.zeros(w_shape, dtype=train[0].dtype)
    exact = exact_hypergradient(inner_fn, outer_fn, lam, train, val, w0, hessian=hessian)
    truth = exact["hypergradient"]
    kw = dict(
        inner_fn=inner_fn,
        outer_fn=outer_fn,
        lam=lam,
        w_init=w0,
        full_train=train,
        val=val,
        n_train=n,
        batch_size=batch_size,
    )
    w_, lam_ = w0.clone().requires_grad_(True), lam.clone().requires_grad_(True)
    phi = GradientDescentMap(lambda b: inner_fn(w_, lam_, b), [w_], [lam_], alpha=1.0)
    est = estimate_curvature(phi, [train])
    errors: dict[str, list[float]] = {m: [] for m in methods}
    used: dict[str, list[float]] = {m: [] for m in methods}  # epochs actually spent
    seconds = dict.fromkeys(methods, 0.0)
    for budget in epochs:
        for method in methods:
            loader = datasets.to_loader(train[0], train[1], batch_size, seed=seed)
            start = time.perf_counter()
            if method == "sid_default":
                steps = round(budget / 2 * n / batch_size)
                g, opt = sid_estimate(
                    None,
                    budget,
                    train_loader=loader,
                    inner_steps=steps,
                    adjoint_steps=steps,
                    step_size="two_phase",  # switch: auto_switch, min(t/2, ⌈7β⌉)
                    curvature=KnownCurvature(est.L, est.mu),
                    **kw,
                )
            else:
                g, opt = sid_estimate(
                    method, budget, train_loader=loader, curvature=KnownCurvature(L, mu), **kw
                )
            seconds[method] += time.perf_counter() - start
            errors[method].append(squared_error(g, truth))
            used[method].append(opt.cost.epochs(n))
    row = {
        "seed": seed,
        "L": L,
        "mu": mu,
        "q": theory_constants(L, mu).q,
        "estimated_L": est.L,
        "estimated_mu": est.mu,
        "exact_norm2": float((truth**2).sum()),
        "exact_newton_steps": exact["newton_steps"],
        "exact_cg_iterations": exact["cg_iterations"],
        "exact_inner_grad_norm": exact["inner_grad_norm"],
        "exact_linear_residual": exact["linear_residual"],
        "exact_seconds": exact["seconds"],
    }
    if reference_epochs is not None:
        start = time.perf_counter()
        ref, _ = sid_estimate(
            "batch", reference_epochs, train_loader=[train], curvature=KnownCurvature(L, mu), **kw
        )
        row["reference_sq_error"] = squared_error(ref, truth)
        row["reference_seconds"] = time.perf_counter() - start
    return {**row, "errors": errors, "epochs_used": used, "seconds": seconds}


def per_feature_lambdas(seeds: int | Sequence[int], d: int, seed0: int) -> list[tuple[Tensor, int]]:
    """The paper's per-feature λᵢ = exp(εᵢ), εᵢ ~ U[−2, 2], one draw per run seed (``seeds``, or
    ``range(seeds)`` for an int); the draw of run ``s`` is seeded with ``seed0 + s``."""
    draws = []
    for s in range(seeds) if isinstance(seeds, int) else seeds:
        gen = torch.Generator().manual_seed(seed0 + s)
        eps = torch.rand(d, generator=gen, dtype=torch.float64) * 4 - 2
        draws.append((eps.exp(), s))
    return draws


def run_settings(
    settings: Sequence[tuple[str, Sequence[tuple[Any, int]]]],
    one_run: Callable[[Any, int, dict], dict],
    cfg: dict,
    methods: Sequence[str],
    describe: Callable[[dict], str],
) -> list[dict]:
    """Run ``one_run(λ, seed, cfg)`` for every setting and seed; print a line each; summarise."""
    results = []
    for name, runs in settings:
        rows = []
        for lam, seed in runs:
            row = one_run(lam, seed, cfg)
            rows.append(row)
            print(
                f"{name} seed {seed}: {describe(row)}, "
                + ", ".join(f"{m} {row['errors'][m][-1]:.3g}" for m in methods),
                flush=True,
            )
        results.append(summarize(name, rows, methods, cfg["epochs"]))
    return results


def merge_results(
    old: Sequence[dict], new: Sequence[dict], methods: Sequence[str], epochs: Sequence[float]
) -> list[dict]:
    """Settings of an earlier run (``old``) and a new one, runs of the same setting pooled (a new
    run replaces an old one with the same seed), re-summarised; one-λ settings sorted by λ, then
    per-feature λ."""
    pooled: dict[str, dict[int, dict]] = {}
    for result in [*old, *new]:
        if list(result["epochs"]) != list(epochs):
            raise SystemExit(
                f"cannot merge {result['setting']!r}: budgets {result['epochs']} != {list(epochs)}"
            )
        runs = pooled.setdefault(result["setting"], {})
        runs.update({row["seed"]: row for row in result["runs"]})
    return [
        summarize(name, [runs[s] for s in sorted(runs)], methods, epochs)
        for name, runs in sorted(pooled.items(), key=lambda item: _setting_order(item[0]))
    ]


def _setting_order(name: str) -> tuple[int, float]:
    """One-λ settings ("λ = 0.01") by value, then the others (per-feature λ) as they came."""
    if name.startswith("λ = "):
        return (0, float(name[len("λ = ") :]))
    return (1, 0.0)


def summarize(name: str, rows: list[dict], methods: Sequence[str], epochs: Sequence[float]) -> dict:
    """Mean/std over runs of the squared errors, and SID default / Stoch dec per budget."""
    errs = {m: np.array([r["errors"][m] for r in rows]) for m in methods}
    mean = {m: errs[m].mean(axis=0) for m in methods}
    out = {
        "setting": name,
        "runs": rows,
        "epochs": list(epochs),
        "mean_errors": {m: mean[m].tolist() for m in methods},
        "std_errors": {m: errs[m].std(axis=0).tolist() for m in methods},
        "mean_exact_norm2": float(np.mean([r["exact_norm2"] for r in rows])),
    }
    if "sid_default" in methods and "stoch_dec" in methods:
        out["sid_default_over_stoch_dec"] = (mean["sid_default"] / mean["stoch_dec"]).tolist()
    if "reference_sq_error" in rows[0]:
        out["mean_reference_sq_error"] = float(np.mean([r["reference_sq_error"] for r in rows]))
    return out


def plot_settings(
    results: list[dict],
    methods: Sequence[str],
    labels: dict[str, str],
    path: Path,
    title: str,
    reference_label: str | None = None,
) -> None:
    """One panel per setting: mean ± std squared error against epochs, per method."""
    fig, axes = new_figure(len(results))
    for ax, res in zip(axes, results):
        errs = {labels[m]: np.array([r["errors"][m] for r in res["runs"]]) for m in methods}
        plot_errors(ax, res["epochs"], errs, f"{title}, {res['setting']}")
        if reference_label and "mean_reference_sq_error" in res:
            ref = res["mean_reference_sq_error"]
            lowest = min(min(v) for v in res["mean_errors"].values())
            if ref >= 1e-2 * lowest:
                ax.axhline(ref, color="gray", ls="--", lw=1, label=reference_label)
            else:  # far below the curves: say it instead of squashing the axis
                ax.text(
                    0.98,
                    0.02,
                    f"{reference_label}: {ref:.1e}",
                    transform=ax.transAxes,
                    ha="right",
                    va="bottom",
                    fontsize=7,
                    color="gray",
                )
        ax.set_ylabel("‖∇̂f − ∇f‖²")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def markdown_tables(results: list[dict], methods: Sequence[str], labels: dict[str, str]) -> str:
    """One Markdown table per setting: mean squared error per method and budget, and the ratio
    SID default / Stoch dec (the README's tables)."""
    out = []
    for res in results:
        runs = res["runs"]
        head = (
            f"**{res['setting']}** (q = {np.mean([r['q'] for r in runs]):.6f}, "
            f"‖∇f‖² = {res['mean_exact_norm2']:.3g}, {len(runs)} runs)"
        )
        budgets = " | ".join(f"{e:g} ep" for e in res["epochs"])
        rows = [head, "", f"| method | {budgets} |", "|---|" + "---:|" * len(res["epochs"])]
        for m in methods:
            cells = " | ".join(f"{x:.2e}" for x in res["mean_errors"][m])
            name = f"**{labels[m]}**" if m == "sid_default" else labels[m]
            rows.append(f"| {name} | {cells} |")
        if "sid_default_over_stoch_dec" in res:
            cells = " | ".join(f"{x:.3g}" for x in res["sid_default_over_stoch_dec"])
            rows.append(f"| ours / Stoch dec | {cells} |")
        out.append("\n".join(rows))
    return "\n\n".join(out)


# ------------------------------------------------------------------------------ plotting
def plot_errors(
    ax: Any, epochs: Sequence[float], errors: dict[str, np.ndarray], title: str
) -> None:
    """Mean (line) and ± std (band) of squared errors over runs, log scale, per method."""
    for label, errs in errors.items():
        errs = np.asarray(errs, dtype=float)
        mean, std = errs.mean(axis=0), errs.std(axis=0)
        (line,) = ax.plot(epochs, mean, marker="o", markersize=3, label=label)
        ax.fill_between(  # mean ± std; on the log axis the lower edge stops at the best run
            epochs,
            np.maximum(mean - std, errs.min(axis=0)),
            mean + std,
            color=line.get_color(),
            alpha=0.2,
        )
    ax.set_yscale("log")
    ax.set_xlabel("epochs")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def new_figure(panels: int, cols: int = 3) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(cols, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    axes = axes.flatten().tolist()
    for ax in axes[panels:]:
        ax.axis("off")
    return fig, axes[:panels]


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
