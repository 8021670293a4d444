"""Logistic regression: SID against finite differences of f(λ) = E(w(λ)) with a Newton solve."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hypertorch_sid import Batches, SIDConfig, SIDHyperOptimizer


def data(seed=0, n=300, d=6):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(2 * n, d, generator=gen, dtype=torch.float64)
    y = (X @ torch.randn(d, generator=gen, dtype=torch.float64) > 0).double()
    y = torch.where(torch.rand(2 * n, generator=gen, dtype=torch.float64) < 0.1, 1 - y, y)
    return X[:n], y[:n], X[n:], y[n:]


def train_loss(w, log_lam, X, y):
    return F.binary_cross_entropy_with_logits(X @ w, y) + 0.5 * (log_lam.exp() * w**2).sum()


def newton_solve(log_lam, X, y, iters=50):
    w = torch.zeros(X.shape[1], dtype=torch.float64)
    for _ in range(iters):
        g = torch.func.grad(train_loss)(w, log_lam, X, y)
        H = torch.func.hessian(train_loss)(w, log_lam, X, y)
        w = w - torch.linalg.solve(H, g)
    return w


def f(log_lam, X, y, Xv, yv):
    w = newton_solve(log_lam, X, y)
    return float(F.binary_cross_entropy_with_logits(Xv @ w, yv))


def test_hypergradient_matches_finite_differences_of_converged_solve():
    X, y, Xv, yv = data()
    log_lam = torch.tensor([-2.0, -1.0, -3.0, 0.0, -2.5, -1.5], dtype=torch.float64)
    eps = 1e-5
    fd = torch.zeros(6, dtype=torch.float64)
    for i in range(6):
        e = torch.zeros(6, dtype=torch.float64)
        e[i] = eps
        fd[i] = (f(log_lam + e, X, y, Xv, yv) - f(log_lam - e, X, y, Xv, yv)) / (2 * eps)

    lam_t = log_lam.clone().requires_grad_(True)
    w = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [lam_t],
        [w],
        inner_loss=lambda b: train_loss(w, lam_t, *b),
        outer_loss=lambda b: F.binary_cross_entropy_with_logits(b[0] @ w, b[1]),
        full_train_batch=(X, y),
        config=SIDConfig(
            inner_steps=3000,
            adjoint_steps=3000,
            step_size="constant",
            eta=1.0,
            batches=Batches(inner="full", adjoint="full", d2="full"),
        ),
    )
    g = hopt.hypergradient([(X, y)], (Xv, yv))[0]
    assert torch.allclose(g, fd, rtol=1e-5, atol=1e-8), (g, fd)
    # the estimated L, μ gave a valid contraction
    assert 0 < hopt.q < 1


def test_stochastic_hypergradient_approaches_finite_differences():
    X, y, Xv, yv = data(seed=1)
    log_lam = torch.full((6,), -2.0, dtype=torch.float64)
    eps = 1e-5
    fd = torch.stack(
        [
            torch.tensor(
                (
                    f(log_lam + eps * torch.eye(6, dtype=torch.float64)[i], X, y, Xv, yv)
                    - f(log_lam - eps * torch.eye(6, dtype=torch.float64)[i], X, y, Xv, yv)
                )
                / (2 * eps)
            )
            for i in range(6)
        ]
    )
    lam_t = log_lam.clone().requires_grad_(True)
    w = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, y),
        batch_size=30,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    hopt = SIDHyperOptimizer(
        [lam_t],
        [w],
        inner_loss=lambda b: train_loss(w, lam_t, *b),
        outer_loss=lambda b: F.binary_cross_entropy_with_logits(b[0] @ w, b[1]),
        config=SIDConfig(inner_steps=4000, adjoint_steps=4000, step_size="decreasing"),
    )
    g = hopt.hypergradient(loader, (Xv, yv))[0]
    assert float((g - fd).norm() / fd.norm()) < 0.1
