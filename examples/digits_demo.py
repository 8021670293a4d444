"""Learn per-feature weight decay on scikit-learn's bundled digits (odd vs even): the paper's convex
setting (the main job, ``bash scripts/main.sh``, is ``examples/lightning_digits.py``).

``python examples/digits_demo.py`` compares what users do
today — a grid search over one weight decay, each value trained to convergence — with SID tuning
one weight decay per pixel while the model trains. Both are scored on the same validation and
test splits; the cost column counts passes over the training set (epochs). No download: the
digits ship with scikit-learn (``examples/datasets.py`` splits them).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Split, load_digits_odd_even, to_loader  # examples/datasets.py

from hypertorch_sid import Batches, EstimatedCurvature, SIDConfig, SIDHyperOptimizer


def _loss(w: torch.Tensor, b: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(X @ w + b, y.to(X.dtype))


def _accuracy(w: torch.Tensor, b: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> float:
    return float(((X @ w + b > 0).long() == y).double().mean())


def grid_search(data: Split, grid: Sequence[float], steps: int) -> dict[str, float]:
    """Train to convergence for each λ in ``grid`` (full-batch L-BFGS); keep the best on val."""
    best: dict[str, float] = {"val_loss": float("inf")}
    for lam in grid:
        w = torch.zeros(data.n_features, dtype=data.X_train.dtype, requires_grad=True)
        b = torch.zeros((), dtype=data.X_train.dtype, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

        def closure(w=w, b=b, lam=lam, opt=opt) -> torch.Tensor:
            opt.zero_grad()
            loss = _loss(w, b, data.X_train, data.y_train) + 0.5 * lam * (w**2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            val = float(_loss(w, b, data.X_val, data.y_val))
        if val < best["val_loss"]:
            best = {
                "val_loss": val,
                "test_acc": _accuracy(w.detach(), b.detach(), data.X_test, data.y_test),
                "lambda": lam,
            }
    return best


def sid_tuning(data: Split, outer_steps: int, seed: int) -> dict[str, float]:
    """Per-feature λ = exp(ρ) tuned by SID (Stoch dec, warm-started, σ₂ = 1) with Adam on ρ."""
    torch.manual_seed(seed)
    dtype = data.X_train.dtype
    w = torch.zeros(data.n_features, dtype=dtype, requires_grad=True)
    b = torch.zeros((), dtype=dtype, requires_grad=True)
    rho = torch.full((data.n_features,), -4.0, dtype=dtype, requires_grad=True)

    def inner_loss(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        X, y = batch
        return _loss(w, b, X, y) + 0.5 * (rho.exp() * w**2).sum()

    def outer_loss(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return _loss(w, b, *batch)

    train = to_loader(data.X_train, data.y_train, batch_size=50, seed=seed)
    steps = len(train)  # one epoch for each solve
    hopt = SIDHyperOptimizer(
        [rho],
        [w, b],
        inner_loss,
        outer_loss,
        torch.optim.Adam([rho], lr=0.1),
        full_train_batch=(data.X_train, data.y_train),
        config=SIDConfig(
            inner_steps=steps,
            adjoint_steps=steps,
            step_size="decreasing",
            sigma2=1.0,
            curvature=EstimatedCurvature(every=10),
            batches=Batches(d2="full"),
        ),
    )
    hopt.step(train, (data.X_val, data.y_val))
    first_val_loss = hopt.last["outer_loss"]
    for _ in range(outer_steps - 1):
        hopt.step(train, (data.X_val, data.y_val))
    with torch.no_grad():
        val = float(outer_loss((data.X_val, data.y_val)))
    return {
        "val_loss": val,
        "val_loss_first_step": first_val_loss,
        "test_acc": _accuracy(w.detach(), b.detach(), data.X_test, data.y_test),
        "lambda_min": float(rho.detach().exp().min()),
        "lambda_median": float(rho.detach().exp().median()),
        "lambda_max": float(rho.detach().exp().max()),
        "epochs": hopt.cost.epochs(data.n_train),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer-steps", type=int, default=60, help="hypergradient steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    data = load_digits_odd_even(seed=args.seed, dtype=torch.float64)
    grid = [10.0**e for e in range(-6, 2)]
    print(
        f"digits odd vs even: {data.n_train} train / {data.n_val} val / {data.n_test} test, "
        f"{data.n_features} pixels"
    )
    t0 = time.perf_counter()
    grid_result = grid_search(data, grid, steps=200)
    grid_result["seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sid_result = sid_tuning(data, args.outer_steps, args.seed)
    sid_result["seconds"] = time.perf_counter() - t0

    print(f"\n{'method':<38} {'val loss':>9} {'test acc':>9} {'seconds':>8}")
    print(
        f"{f'grid search, 1 λ ({len(grid)} values)':<38} {grid_result['val_loss']:>9.4f} "
        f"{100 * grid_result['test_acc']:>8.1f}% {grid_result['seconds']:>8.1f}"
    )
    print(
        f"{f'SID, 64 λ ({args.outer_steps} hypersteps)':<38} {sid_result['val_loss']:>9.4f} "
        f"{100 * sid_result['test_acc']:>8.1f}% {sid_result['seconds']:>8.1f}"
    )
    print(
        f"\ngrid's best λ = {grid_result['lambda']:.0e}; SID's λ range "
        f"[{sid_result['lambda_min']:.2e}, {sid_result['lambda_max']:.2e}], median "
        f"{sid_result['lambda_median']:.2e}; SID read {sid_result['epochs']:.0f} epochs of data"
    )
    results = {"grid_search": grid_result, "sid": sid_result}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
