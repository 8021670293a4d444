"""Gauss–Newton curvature products (``hvp=GaussNewton(outputs, output_loss)``).

Oracles: for a model linear in w with a convex output loss, G = Jᵀ∇²_zL J is the Hessian, so the
products and the hypergradients equal the exact ones (ridge closed form, multinomial logistic
regression); on an MLP the product equals the explicit matrix JᵀHJ built from ``jacrev``, and it
is positive semi-definite where the Hessian is not. Then the core trains small networks with it.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from problems import make_ridge, sid_on, split_settings
from torch import nn

from hypertorch_sid import (
    Batches,
    ConfigurationError,
    ConjugateGradient,
    GaussNewton,
    GradientDescentMap,
    KnownCurvature,
    NoDamping,
    NoPreconditioner,
    SIDConfig,
    SIDHyperOptimizer,
    VarianceReduced,
)


def _ridge_gauss_newton(p, regularized: bool = True) -> GaussNewton:
    return GaussNewton(
        outputs=lambda b: b[0] @ p.w,
        output_loss=lambda z, b: 0.5 * ((z - b[1]) ** 2).mean(),
        regularizer=(lambda: 0.5 * (p.log_lam.exp() * p.w**2).sum()) if regularized else None,
    )


def _ridge_data_loss(p):
    return lambda b: 0.5 * ((b[0] @ p.w - b[1]) ** 2).mean()


def _ridge_penalty(p):
    return lambda: [p.log_lam.exp()]


@pytest.mark.parametrize(
    "map_kind",
    ["gradient descent + CG", "gradient descent + variance-reduced", "proximal + fixed point"],
)
def test_ridge_hypergradient_is_exact_with_gauss_newton_products(map_kind):
    """ℓ = ½ mean (Xw − y)² + ½ Σ λᵢwᵢ²: the output loss is convex and the model linear, so the
    Gauss–Newton system is the exact one; the hypergradient matches the closed form. The GD map
    takes the weight decay as the regularizer (its Hessian exact); the proximal map as penalty=."""
    p = make_ridge(n=200, d=5, seed=3)
    with torch.no_grad():
        p.w.copy_(p.w_star())
    if map_kind == "gradient descent + CG":
        kw = dict(
            inner_loss=p.inner_loss, hvp=_ridge_gauss_newton(p), adjoint_steps=20,
            adjoint_solver=ConjugateGradient(batches="full"),
        )  # fmt: skip
    elif map_kind == "gradient descent + variance-reduced":  # minibatch steps from the loader
        kw = dict(
            inner_loss=p.inner_loss, hvp=_ridge_gauss_newton(p), adjoint_steps=400,
            adjoint_solver=VarianceReduced(eta_scale=0.5), step_size="constant", eta=1.0,
        )  # fmt: skip
    else:
        kw = dict(
            inner_loss=_ridge_data_loss(p), penalty=_ridge_penalty(p), adjoint_steps=400,
            hvp=_ridge_gauss_newton(p, regularized=False), batches=Batches(adjoint="full", d2="full"),
            step_size="constant", eta=1.0,
        )  # fmt: skip
    kw, settings = split_settings(kw)
    hopt = SIDHyperOptimizer(
        [p.log_lam],
        [p.w],
        outer_loss=p.outer_loss,
        full_train_batch=p.train(),
        **kw,
        config=SIDConfig(
            inner_steps=0,
            damping=NoDamping(),
            preconditioner=NoPreconditioner(),
            curvature=KnownCurvature(5.0, 0.1),
            batches=Batches(d2="full"),
        ).replace(**settings),
    )
    (g,) = hopt.hypergradient(p.loader(50), p.val())
    torch.testing.assert_close(g, p.exact_hypergradient(), rtol=1e-7, atol=1e-12)


def _softmax_regression(seed: int):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(60, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (60,), generator=gen)
    W = (0.3 * torch.randn(4, 3, generator=gen, dtype=torch.float64)).requires_grad_(True)
    return X, y, W


def test_gauss_newton_is_the_hessian_of_a_linear_model_with_cross_entropy():
    X, y, W = _softmax_regression(0)
    loss = lambda b: F.cross_entropy(b[0] @ W, b[1])  # noqa: E731
    exact = GradientDescentMap(loss, [W], [], alpha=1.0)
    gn = GradientDescentMap(
        loss, [W], [], alpha=1.0,
        hvp=GaussNewton(lambda b: b[0] @ W, lambda z, b: F.cross_entropy(z, b[1])),
    )  # fmt: skip
    for seed in range(3):
        v = [torch.randn(4, 3, generator=torch.Generator().manual_seed(seed), dtype=W.dtype)]
        torch.testing.assert_close(
            gn.hessian_vector_product((X, y), v)[0],
            exact.hessian_vector_product((X, y), v)[0],
            rtol=1e-10,
            atol=1e-12,
        )


def _flat_mlp(seed: int):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4)).double()
    X = torch.randn(20, 3, dtype=torch.float64)
    y = torch.randint(0, 4, (20,))
    return net, X, y


@pytest.mark.parametrize("seed", [0, 1])
def test_gauss_newton_product_is_j_transpose_h_j_on_an_mlp_and_positive_semidefinite(seed):
    """Against the explicit matrix G = Jᵀ∇²_zL J (J by ``jacrev``, ∇²_zL by ``hessian``)."""
    from torch.func import functional_call, hessian, jacrev

    net, X, y = _flat_mlp(seed)
    params = list(net.parameters())
    names = [n for n, _ in net.named_parameters()]
    sizes = [p.numel() for p in params]

    def outputs_of(flat: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(flat, sizes)
        state = {n: c.reshape(p.shape) for n, c, p in zip(names, chunks, params)}
        return functional_call(net, state, (X,))

    flat = torch.cat([p.detach().flatten() for p in params])
    J = jacrev(outputs_of)(flat).reshape(-1, flat.numel())  # (20·4) × d
    z = outputs_of(flat).detach()
    Hz = hessian(lambda zz: F.cross_entropy(zz.reshape(20, 4), y))(z.flatten())
    G = J.T @ Hz @ J
    gn = GaussNewton(lambda b: net(b[0]), lambda zz, b: F.cross_entropy(zz, b[1]))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        v = torch.randn(flat.numel(), generator=gen, dtype=torch.float64)
        vs = [c.reshape(p.shape) for c, p in zip(torch.split(v, sizes), params)]
        Gv = torch.cat([g.flatten() for g in gn.product((X, y), params, vs)])
        torch.testing.assert_close(Gv, G @ v, rtol=1e-9, atol=1e-11)
    assert float(torch.linalg.eigvalsh(G).min()) > -1e-10  # PSD: a well-posed adjoint system
    H = hessian(lambda f: F.cross_entropy(outputs_of(f), y))(flat)
    assert float((H - G).norm()) > 1e-3 * float(G.norm())  # not the Hessian on a network


def test_gauss_newton_refuses_a_loss_it_does_not_reproduce():
    """The weight decay inside inner_loss but no regularizer: Gauss–Newton of the output loss
    would drop its Hessian; the first product says so and names the fixes."""
    p = make_ridge(n=100, d=4, seed=1)
    hopt = sid_on(
        p,
        inner_steps=5,
        adjoint_steps=5,
        hvp=_ridge_gauss_newton(p, regularized=False),
        curvature=KnownCurvature(5.0, 0.1),
    )
    with pytest.raises(ConfigurationError, match="GaussNewton.*regularizer=.*penalty="):
        hopt.hypergradient(p.loader(20), p.val())


def test_the_log_says_the_hypergradient_is_the_linearised_models(caplog):
    p = make_ridge(n=100, d=4, seed=1)
    hopt = sid_on(p, inner_steps=5, adjoint_steps=5, hvp=_ridge_gauss_newton(p))
    with caplog.at_level("INFO", logger="hypertorch_sid"):
        hopt.hypergradient(p.loader(20), p.val())
    assert "Gauss-Newton curvature: the linearised model's hypergradient" in caplog.text


def test_gauss_newton_needs_callables():
    with pytest.raises(ConfigurationError, match="two callables"):
        GaussNewton(outputs=None, output_loss=lambda z, b: z.sum())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="regularizer must be a callable"):
        GaussNewton(lambda b: b, lambda z, b: z.sum(), regularizer=1.0)  # type: ignore[arg-type]


# ------------------------------------------------------------------ networks, as users train them
sklearn = pytest.importorskip("sklearn.datasets")


def _digits():
    X, y = sklearn.load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    return X[:1000], y[:1000], X[1000:], y[1000:]


def _minibatches(X, y, seed: int, size: int = 32):
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y) - size + 1, size):
            yield X[perm[i : i + size]], y[perm[i : i + size]]


def _net(kind: str) -> nn.Module:
    if kind == "cnn+bn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8),
            nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10),
        )  # fmt: skip
    activation = nn.ReLU if kind == "mlp-relu" else nn.Tanh
    return nn.Sequential(nn.Linear(64, 64), activation(), nn.Linear(64, 10))


@pytest.mark.parametrize("kind", ["mlp-relu", "mlp-tanh", "cnn+bn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_core_trains_networks_with_gauss_newton_products(kind, seed):
    """Per-tensor weight decay in the inner loss (the GD map), Gauss–Newton products with the
    decay as regularizer, the rest at the defaults (Adam on log λ): every run finishes, λ and w
    stay finite, hypergradients stay bounded, and the network trains. α and δ come from the
    exact Hessian's estimate (the inner solve iterates the true gradient map); the adjoint
    system's products are the positive semi-definite Gauss–Newton ones."""
    torch.manual_seed(seed)
    net = _net(kind)
    Xtr, ytr, Xva, yva = _digits()
    params = list(net.parameters())
    log_lam = torch.full((len(params),), math.log(1e-3), requires_grad=True)
    ce = lambda b: F.cross_entropy(net(b[0]), b[1])  # noqa: E731
    decay = lambda: 0.5 * sum(l.exp() * (p**2).sum() for l, p in zip(log_lam, params))  # noqa: E731
    hopt = SIDHyperOptimizer(
        [log_lam],
        params,
        lambda b: ce(b) + decay(),
        ce,
        functools.partial(torch.optim.Adam, lr=0.1)([log_lam]),
        module=net,
        config=SIDConfig(
            inner_steps=100,
            adjoint_steps=50,
            hvp=GaussNewton(lambda b: net(b[0]), lambda z, b: F.cross_entropy(z, b[1]), decay),
        ),
    )
    net.eval()
    with torch.no_grad():
        untrained = float(F.cross_entropy(net(Xva), yva))
    stream = _minibatches(Xtr, ytr, seed)
    for _ in range(4):
        hopt.step(stream, (Xva, yva))
        assert hopt.last["hypergradient_norm"] < 1e3
    gen = torch.Generator().manual_seed(seed)
    batch = next(stream)
    for _ in range(3):
        v = [torch.randn(p.shape, generator=gen) for p in params]
        gv = hopt.phi.curvature_product(batch, v)
        assert sum(float((a * b).sum()) for a, b in zip(v, gv)) >= 0
    assert torch.isfinite(log_lam).all() and all(torch.isfinite(p).all() for p in params)
    net.eval()
    with torch.no_grad():
        trained = float(F.cross_entropy(net(Xva), yva))
    assert trained < 0.5 * untrained
