"""Paper, appendix (Figure 3): hypergradient error of the 8 SID variants, multinomial MNIST.

Multinomial logistic regression W ∈ R^{784×10} (no bias, pixels in [0, 1]) on the MNIST training
set split 30000/30000 (``datasets.mnist_multiclass_halves``):

    f(λ) = CE_val(W(λ)),   W(λ) = argmin_W CE_train(W) + ½ Σ_j λ_j ‖W_j‖²,

mean cross-entropies (λ in mean units, λ_sum = 30000 λ; see ``paper_mnist_binary.py``), one λ or
one λ_j = e^{ε_j}, ε_j ~ U[−2, 2] per pixel. All 8 presets of the appendix's method table
(``SIDHyperOptimizer.from_preset``, minibatch 300) and "SID default" (two-phase steps with the
library's estimated L, μ; see ``_paper_common.error_ladder``) spend the same total epochs;
α = 2/(L+μ) with L = ½λ_max(XᵀX)/n + max λ (½ bounds the softmax Hessian), μ = min λ.

Ground truth: Newton-CG on the inner problem (‖∇ℓ‖ ≤ 1e-11) and CG on the linear system (relative
residual 1e-13), float64.

Full mode is reduced to fit a 2-core machine: λ ∈ {1e-3, 1e-2, 1e-1, 1} × 2 runs and 2
per-feature runs, budgets of 4, 8, 16, 32 epochs (the paper: 4 values × 5 runs and 10 runs;
``--lambdas``, ``--seeds``, ``--per-feature-seeds`` choose a part, ``--merge`` pools it with the
runs already in ``--out``). ``--quick`` runs one λ on a 1200/1200 subset in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import _paper_common as common
import datasets  # examples/datasets.py
import torch
import torch.nn.functional as F

FULL = dict(n=None, lambdas=[1e-3, 1e-2, 1e-1, 1.0], seeds=[0, 1], per_feature_seeds=[0, 1])
FULL["epochs"] = [4, 8, 16, 32]
QUICK = dict(n=1200, lambdas=[1e-1], seeds=[0], per_feature_seeds=[], epochs=[4, 16])
BATCH_SIZE = 300
METHODS = [*common.PRESET_LABELS, "sid_default"]
LABELS = {**common.PRESET_LABELS, "sid_default": "SID two-phase (estimated L, μ)"}


def inner_loss(W: torch.Tensor, lam: torch.Tensor, batch: tuple) -> torch.Tensor:
    """CE(XW, y) + ½ Σ_j λ_j ‖W_j‖² (λ a scalar or one value per pixel)."""
    x, y = batch
    return F.cross_entropy(x @ W, y) + 0.5 * (lam * (W * W).sum(1)).sum()


def outer_loss(W: torch.Tensor, lam: torch.Tensor, batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(x @ W, y)


def one_run(lam: torch.Tensor, seed: int, cfg: dict) -> dict:
    split = datasets.mnist_multiclass_halves(seed=seed, dtype=torch.float64)
    n = cfg["n"] or split.n_train
    train = (split.X_train[:n], split.y_train[:n])
    val = (split.X_val[:n], split.y_val[:n])
    L = 0.5 * float(torch.linalg.eigvalsh(train[0].T @ train[0])[-1]) / n
    return common.error_ladder(
        inner_loss,
        outer_loss,
        lam,
        train,
        val,
        w_shape=(split.n_features, split.n_classes),
        methods=METHODS,
        epochs=cfg["epochs"],
        batch_size=BATCH_SIZE,
        seed=seed,
        L=L + float(lam.max()),
        mu=float(lam.min()),
    )


def plot(results: list[dict], cfg: dict, png: Path) -> None:
    common.plot_settings(results, METHODS, LABELS, png, "MNIST 10 classes")
    print(common.markdown_tables(results, METHODS, LABELS))


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], "mnist_multiclass.json", extra=_extra_args)
    common.require_data()
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("lambdas", "seeds", "per_feature_seeds"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.plot_only:
        saved = json.loads(args.out.read_text())
        return plot(saved["results"], saved["config"], args.out.with_suffix(".png"))
    settings = [
        (f"λ = {lam:g}", [(torch.tensor(lam, dtype=torch.float64), s) for s in cfg["seeds"]])
        for lam in cfg["lambdas"]
    ]
    per_feature = common.per_feature_lambdas(cfg["per_feature_seeds"], 784, seed0=2000)
    if per_feature:
        settings.append(("λ_j = exp(ε_j), ε_j ~ U[−2, 2]", per_feature))

    results = common.run_settings(
        settings,
        one_run,
        cfg,
        METHODS,
        lambda row: (
            f"q = {row['q']:.6f}, ‖∇f‖² = {row['exact_norm2']:.3g} "
            f"(exact: {row['exact_seconds']:.0f}s), at {cfg['epochs'][-1]} epochs"
        ),
    )

    if args.merge and args.out.exists():
        results = common.merge_results(
            json.loads(args.out.read_text())["results"], results, METHODS, cfg["epochs"]
        )
        cfg["note"] = "pooled runs of several invocations (--merge); see each setting's runs"
    png = args.out.with_suffix(".png")
    plot(results, cfg, png)
    common.save_json(
        args.out,
        {
            "experiment": "MNIST multinomial logistic regression, hypergradient squared error",
            "quick": args.quick,
            "config": {
                **cfg,
                "batch_size": BATCH_SIZE,
                "dtype": "float64",
                "loss": "mean-normalised; lambda in mean units (lambda_sum = n * lambda)",
                "pixels": "[0, 1] (x / 255)",
                "bias": False,
            },
            "results": results,
            "figure": png.name,
        },
    )


def _extra_args(parser) -> None:
    parser.add_argument("--lambdas", type=float, nargs="*", help="values of one λ (mean units)")
    parser.add_argument("--seeds", type=int, nargs="*", help="run seeds for each one-λ value")
    parser.add_argument(
        "--per-feature-seeds", type=int, nargs="*", help="run seeds of the per-feature λ setting"
    )
    parser.add_argument(
        "--merge", action="store_true", help="pool these runs with those already in --out"
    )


if __name__ == "__main__":
    main()
