"""The seed paper's problem (Grazzi et al. 2021, section 5) as a dataset of benchopt's bilevel
benchmark: MNIST odd vs even, binary logistic regression without bias, one L2 coefficient per
pixel (784), on the paper's split (5000 train / 5000 validation from MNIST's training images,
the 10000 test images; pixels in [0, 1]; labels ±1, odd = +1), built offline by our
``benchmarks/benchopt/make_mnist_oddeven.py`` and copied into the benchmark by
``get_benchmark.sh``. The objective is the benchmark's regularisation selection (its
``ijcnn1.py``) with the paper's mean-normalised losses:

    g(w, x) = mean_train ψ(y xᵀw) + ½ Σᵢ exp(xᵢ) wᵢ²,    f(w) = mean_val ψ(y xᵀw),

ψ(u) = log(1 + e^{−u}); λ = exp(x) (the benchmark's 'exp' parametrisation; the paper's λ itself).
``metrics`` adds the held-out test error of the returned w (``test_error``) and of the inner
solution w*(λ) (``test_error_star``), with the validation loss ``value_func`` = f(w*(λ)) and
``value`` = ‖∇f(w*(λ))‖² w.r.t. x by implicit differentiation, in float64 numpy (scipy's L-BFGS
to ‖∇g‖ ≤ 1e-9 and a direct solve; ijcnn1.py's jaxopt is not needed).
The data file: env ``MNIST_ODDEVEN_NPZ`` or ``mnist_oddeven.npz`` in the benchmark's folder.
"""

from benchopt import BaseDataset, safe_import_context

with safe_import_context() as import_ctx:
    import os
    from functools import partial
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    import numpy as np
    from scipy.optimize import minimize
    from scipy.special import expit


def loss_sample(inner_var, outer_var, x, y):
    return -jax.nn.log_sigmoid(y * jnp.dot(inner_var, x))


def loss(inner_var, outer_var, X, y):
    batched_loss = jax.vmap(loss_sample, in_axes=(None, None, 0, 0))
    return jnp.mean(batched_loss(inner_var, outer_var, X, y), axis=0)


def data_file():
    default = Path(__file__).resolve().parents[1] / "mnist_oddeven.npz"
    path = Path(os.environ.get("MNIST_ODDEVEN_NPZ", default))
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: build it with hypertorch_sid's "
            "benchmarks/benchopt/make_mnist_oddeven.py --out <it> (or set MNIST_ODDEVEN_NPZ)."
        )
    return path


class Dataset(BaseDataset):
    """MNIST odd/even, one L2 coefficient per pixel (the SID paper's problem)."""

    name = "mnist_oddeven"
    install_cmd = "conda"
    requirements = []
    parameters = {"reg_parametrization": ["exp"]}

    def get_data(self):
        d = np.load(data_file())
        X_train, y_train = jnp.array(d["X_train"]), jnp.array(d["y_train"])
        X_val, y_val = jnp.array(d["X_val"]), jnp.array(d["y_val"])
        self.n_samples_inner, self.dim_inner = X_train.shape
        self.n_samples_outer = X_val.shape[0]
        self.dim_outer = X_train.shape[1]

        @partial(jax.jit, static_argnames=("batch_size"))
        def f_inner(inner_var, outer_var, start=0, batch_size=1):
            x = jax.lax.dynamic_slice(X_train, (start, 0), (batch_size, X_train.shape[1]))
            y = jax.lax.dynamic_slice(y_train, (start,), (batch_size,))
            res = loss(inner_var, outer_var, x, y)
            return res + jnp.dot(jnp.exp(outer_var) * inner_var, inner_var) / 2

        @partial(jax.jit, static_argnames=("batch_size"))
        def f_outer(inner_var, outer_var, start=0, batch_size=1):
            x = jax.lax.dynamic_slice(X_val, (start, 0), (batch_size, X_val.shape[1]))
            y = jax.lax.dynamic_slice(y_val, (start,), (batch_size,))
            return loss(inner_var, outer_var, x, y)

        f_inner_fb = partial(f_inner, batch_size=X_train.shape[0], start=0)
        f_outer_fb = partial(f_outer, batch_size=X_val.shape[0], start=0)
        Xt, yt = np.asarray(d["X_train"], np.float64), np.asarray(d["y_train"], np.float64)
        Xv, yv = np.asarray(d["X_val"], np.float64), np.asarray(d["y_val"], np.float64)
        Xs, ys = np.asarray(d["X_test"], np.float64), np.asarray(d["y_test"], np.float64)

        def inner_star(lam, w0):
            def g(w):
                m = yt * (Xt @ w)
                val = np.logaddexp(0, -m).mean() + 0.5 * lam @ (w * w)
                grad = Xt.T @ (-yt * expit(-m)) / len(yt) + lam * w
                return val, grad

            return minimize(g, w0, jac=True, method="L-BFGS-B", options=dict(gtol=1e-9)).x

        def test_error(w):
            return float(np.mean(np.sign(Xs @ np.asarray(w, np.float64)) != ys))

        def metrics(inner_var, outer_var):
            w = np.asarray(inner_var, np.float64)
            lam = np.exp(np.asarray(outer_var, np.float64))
            ws = inner_star(lam, w)
            mv = yv * (Xv @ ws)
            grad_f = Xv.T @ (-yv * expit(-mv)) / len(yv)
            p = expit(yt * (Xt @ ws))
            hess = (Xt.T * (p * (1 - p))) @ Xt / len(yt) + np.diag(lam)
            hypergrad = -(lam * ws) * np.linalg.solve(hess, grad_f)  # ∂f/∂x, x = log λ
            return dict(
                value_func=float(np.logaddexp(0, -mv).mean()),
                value=float(hypergrad @ hypergrad),
                inner_distance=float(np.sum((ws - w) ** 2)),
                norm_outer_var=float(np.sum(np.asarray(outer_var, np.float64) ** 2)),
                norm_regul=float(lam @ lam),
                test_error=test_error(w),
                test_error_star=test_error(ws),
            )

        def init_var(key):  # as ijcnn1.py: w₀ ~ N(0, I), λ₀ ~ U[0, 1]
            keys = jax.random.split(key, 2)
            inner_var0 = jax.random.normal(keys[0], (self.dim_inner,))
            outer_var0 = jnp.log(jax.random.uniform(keys[1], (self.dim_outer,)))
            return inner_var0, outer_var0

        return dict(
            pb_inner=(f_inner, self.n_samples_inner, self.dim_inner, f_inner_fb),
            pb_outer=(f_outer, self.n_samples_outer, self.dim_outer, f_outer_fb),
            metrics=metrics,
            init_var=init_var,
        )
