"""The two references for datasets/mnist_oddeven.py: λ = 0 and the best single shared λ on a grid
(picked by validation loss f, as a user would), each inner problem solved by L-BFGS in float64.
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
GRID = [0.0] + [float(10.0**e) for e in np.arange(-6, 0.5, 0.5)]


def solve(X, y, lam):
    def g(w):
        m = y * (X @ w)
        return (
            np.logaddexp(0, -m).mean() + 0.5 * lam * w @ w,
            X.T @ (-y * expit(-m)) / len(y) + lam * w,
        )

    res = minimize(g, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B",
                   options=dict(gtol=1e-9, maxiter=5000))  # fmt: skip
    return res.x


def main():
    d = {k: np.asarray(v, np.float64) for k, v in np.load(NPZ).items()}
    rows = []
    for lam in GRID:
        w = solve(d["X_train"], d["y_train"], lam)
        rows.append(dict(
            lam=lam,
            val_loss=float(np.logaddexp(0, -d["y_val"] * (d["X_val"] @ w)).mean()),
            val_error=float(np.mean(np.sign(d["X_val"] @ w) != d["y_val"])),
            test_error=float(np.mean(np.sign(d["X_test"] @ w) != d["y_test"])),
        ))  # fmt: skip
        print(rows[-1], flush=True)
    best = min(rows[1:], key=lambda r: r["val_loss"])
    out = dict(zero=rows[0], best_shared=best, grid=rows, data=str(NPZ.name))
    (HERE / "baselines.json").write_text(json.dumps(out, indent=1) + "\n")
    print("λ=0:", rows[0], "\nbest shared:", best)


if __name__ == "__main__":
    main()
