"""The two references for datasets/mnist_oddeven.py: λ = 0 and the best single shared λ on a grid
(picked by validation loss f, as a user would), each inner problem solved by L-BFGS in float64
(‖∇g‖ ≤ 1e-7 or 1000 iterations), λ decreasing, each solve warm-started at the previous w.
    python benchmarks/results/regularization_selection/baselines.py   (writes baselines.json)"""

import json
import os
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

HERE = Path(__file__).resolve().parent
DEFAULT_NPZ = HERE.parents[3] / "benchmark_bilevel" / "mnist_oddeven.npz"
NPZ = Path(os.environ.get("MNIST_ODDEVEN_NPZ", DEFAULT_NPZ))
GRID = [float(10.0**e) for e in np.arange(0, -5.5, -0.5)] + [0.0]  # λ decreasing, warm starts


def solve(X, y, lam, w0):
    def g(w):
        m = y * (X @ w)
        return (
            np.logaddexp(0, -m).mean() + 0.5 * lam * w @ w,
            X.T @ (-y * expit(-m)) / len(y) + lam * w,
        )

    res = minimize(g, w0, jac=True, method="L-BFGS-B",
                   options=dict(gtol=1e-7, maxiter=1000))  # fmt: skip
    return res.x


def main():
    d = {k: np.asarray(v, np.float64) for k, v in np.load(NPZ).items()}
    rows, w = [], np.zeros(d["X_train"].shape[1])
    for lam in GRID:
        w = solve(d["X_train"], d["y_train"], lam, w)
        rows.append(dict(
            lam=lam,
            val_loss=float(np.logaddexp(0, -d["y_val"] * (d["X_val"] @ w)).mean()),
            val_error=float(np.mean(np.sign(d["X_val"] @ w) != d["y_val"])),
            test_error=float(np.mean(np.sign(d["X_test"] @ w) != d["y_test"])),
        ))  # fmt: skip
        print(rows[-1], flush=True)
    best = min(rows[:-1], key=lambda r: r["val_loss"])
    out = dict(zero=rows[-1], best_shared=best, grid=rows, data=str(NPZ.name))
    (HERE / "baselines.json").write_text(json.dumps(out, indent=1) + "\n")
    print("λ=0:", rows[-1], "\nbest shared:", best)


if __name__ == "__main__":
    main()
