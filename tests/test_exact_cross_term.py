"""The cross term of eq. gradestim from the regularizer alone (``regularizer=``).

When λ enters ℓ̂ only through a batch-independent R(w, λ) (weight decay), ∂₂Φ̂ᵀv = −α∇²₂₁R Sv
for every minibatch ζ, so it is computed from R without a forward pass through the data.
Oracles: the minibatch product ``vjp(batch, v, wrt_hyper=True)`` on any batch (ridge in float64;
a ReLU MLP, a tanh MLP and a CNN with BatchNorm in float32), the ridge's closed-form
hypergradient, and the drop-in's own maps (coupled, decoupled with Adam's preconditioner, per
element, weights only).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from lightning_problems import LIGHTNING_NOISE
from problems import full_batch_sid, make_ridge, relative_error
from torch import nn

from hypertorch_sid import ConfigurationError, LearnedWeightDecay, SIDConfig, SIDHyperOptimizer
from hypertorch_sid.core.maps import GradientDescentMap

pytestmark = [*LIGHTNING_NOISE]


def _ridge_regularizer(problem):
    return lambda: 0.5 * (problem.log_lam.exp() * problem.w**2).sum()


@pytest.mark.parametrize("per_feature", [True, False])
def test_the_regularizer_product_is_the_minibatch_product_on_ridge(per_feature):
    """On every minibatch, with damping and a diagonal preconditioner: the same ∂₂Φ̂ᵀv."""
    p = make_ridge(per_feature=per_feature)
    with torch.no_grad():
        p.w.copy_(torch.randn(p.w.shape, dtype=p.w.dtype))
    phi = GradientDescentMap(
        p.inner_loss, [p.w], [p.log_lam], alpha=0.3, regularizer=_ridge_regularizer(p)
    )
    phi.damping = 0.2
    phi.scale = [torch.rand(p.w.shape, dtype=p.w.dtype) + 0.5]
    assert phi.hyper_vjp_is_exact
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        v = [torch.randn(p.w.shape, generator=gen, dtype=p.w.dtype)]
        idx = torch.randperm(len(p.y), generator=gen)[:16]
        sampled = phi.vjp((p.X[idx], p.y[idx]), v, wrt_hyper=True)[1]
        exact = phi.exact_hyper_vjp(v)
        assert exact is not None and sampled is not None
        torch.testing.assert_close(exact[0], sampled[0], rtol=1e-12, atol=1e-14)


def test_ridge_hypergradient_from_the_regularizer_is_the_closed_form():
    """Full-batch SID with the cross term from R: the exact hypergradient, and no batch read."""
    a, b = make_ridge(), make_ridge()
    exact = a.exact_hypergradient()
    plain = full_batch_sid(a)
    sampled = plain.hypergradient([a.train()], a.val())[0]
    hopt = full_batch_sid(b, regularizer=_ridge_regularizer(b))
    from_r = hopt.hypergradient([b.train()], b.val())[0]
    assert relative_error(from_r, exact) < 1e-6
    torch.testing.assert_close(from_r, sampled, rtol=1e-10, atol=1e-14)
    # the first step's check reads one batch of the stream (here the full one), as J did;
    # later steps read none for the cross term
    assert plain.cost.samples == hopt.cost.samples
    hopt.hypergradient([b.train()], b.val())
    plain.hypergradient([a.train()], a.val())
    assert plain.cost.samples - hopt.cost.samples == len(a.y)


def test_a_data_term_that_reads_lambda_is_refused_at_the_first_hypergradient():
    """Data weights exp(λ) in the data term as well: R alone is not ∂₂ℓ̂, and it says so."""
    p = make_ridge(per_feature=False)

    def inner(batch):
        X, y = batch
        weight = p.log_lam.exp()  # λ also scales the data term
        return 0.5 * weight * ((X @ p.w - y) ** 2).mean() + _ridge_regularizer(p)()

    hopt = full_batch_sid(p, inner_loss=inner, regularizer=_ridge_regularizer(p))
    with pytest.raises(ConfigurationError, match="not the only part of inner_loss that reads λ"):
        hopt.hypergradient([p.train()], p.val())
    assert torch.equal(p.w.detach(), torch.zeros_like(p.w))  # w restored: no partial state


def test_bad_regularizer_settings_are_refused():
    p = make_ridge()
    kw = dict(inner_loss=p.inner_loss, outer_loss=p.outer_loss)
    with pytest.raises(ConfigurationError, match="regularizer must be a callable"):
        SIDHyperOptimizer([p.log_lam], [p.w], regularizer=1.0, **kw)
    with pytest.raises(ConfigurationError, match="exclude each other"):
        SIDHyperOptimizer(
            [p.log_lam], [p.w], penalty=lambda: [p.log_lam.exp()],
            regularizer=_ridge_regularizer(p), **kw,
        )  # fmt: skip
    with pytest.raises(ConfigurationError, match="cannot be combined with fixed_point_map"):
        SIDHyperOptimizer(
            [p.log_lam], [p.w], outer_loss=p.outer_loss, regularizer=_ridge_regularizer(p),
            fixed_point_map=lambda batch: [p.w - 0.1 * p.w],
        )  # fmt: skip


# ------------------------------------------------------------------------------ networks
def _net(kind: str) -> nn.Module:
    if kind == "cnn_bn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4),
            nn.ReLU(), nn.Flatten(), nn.Linear(64, 3),
        )  # fmt: skip
    act = nn.ReLU() if kind == "mlp_relu" else nn.Tanh()
    return nn.Sequential(nn.Linear(16, 32), act, nn.Linear(32, 3))


def _minibatches(X, y, seed, size=32):
    gen = torch.Generator().manual_seed(seed)
    while True:
        idx = torch.randperm(len(y), generator=gen)[:size]
        yield X[idx], y[idx]


@pytest.mark.parametrize("kind", ["mlp_relu", "mlp_tanh", "cnn_bn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_networks_get_the_sampled_hypergradient_without_its_forward_pass(kind, seed):
    """The core with its defaults, twice from the same state and stream: the first hypergradient
    with the cross term from R equals the sampled one, and no minibatch is read for it after."""
    torch.manual_seed(seed)
    X, y = torch.randn(256, 16), torch.randint(0, 3, (256,))
    Xv, yv = torch.randn(64, 16), torch.randint(0, 3, (64,))
    results = []
    for use_r in (False, True):
        torch.manual_seed(seed)
        net = _net(kind)
        params = list(net.parameters())
        log_lam = torch.full((len(params),), math.log(1e-2), requires_grad=True)

        def reg(net=net, log_lam=log_lam):
            return 0.5 * sum(ll.exp() * (w**2).sum() for ll, w in zip(log_lam, net.parameters()))

        def inner(batch, net=net, reg=reg):
            return F.cross_entropy(net(batch[0]), batch[1]) + reg()

        hopt = SIDHyperOptimizer(
            [log_lam],
            params,
            inner,
            lambda b, net=net: F.cross_entropy(net(b[0]), b[1]),
            torch.optim.Adam([log_lam], lr=0.1),
            module=net,
            regularizer=reg if use_r else None,
            config=SIDConfig(inner_steps=20, adjoint_steps=20),
        )
        stream = _minibatches(X, y, seed)
        g = hopt.hypergradient(stream, (Xv, yv))
        results.append((g[0], hopt.cost, hopt.phi.hyper_vjp_is_exact))
    (sampled, cost_s, exact_s), (from_r, cost_r, exact_r) = results
    assert not exact_s and exact_r
    torch.testing.assert_close(from_r, sampled, rtol=1e-4, atol=1e-9)
    # the first step's check reads the batch J = 1 reads, and adds the product from R
    assert cost_r.samples == cost_s.samples
    assert cost_r.jacobian_vector_products == cost_s.jacobian_vector_products + 1


# ------------------------------------------------------------------------------ the drop-in
def _dropin_fit(cb, optimizer):
    from test_weight_decay import MLP, _fit

    model = MLP(optimizer=optimizer)
    _fit(model, [cb], max_steps=12)
    return cb


@pytest.mark.parametrize(
    "granularity, decoupled, apply_to, optimizer",
    [
        ("global", False, "all", functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)),
        ("per_layer", False, "weights", functools.partial(torch.optim.SGD, lr=0.05)),
        ("per_element", False, "all", functools.partial(torch.optim.Adam, lr=0.01)),
        ("per_layer", True, "all", functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0)),
    ],
)
def test_the_drop_in_computes_the_cross_term_from_its_decay(
    granularity, decoupled, apply_to, optimizer
):
    """LearnedWeightDecay's ℓ̂ = ℓ + ½Σ Pλw²: the map reads no batch for ∂₂Φ̂ᵀv, and what it
    computes from the decay is the minibatch product on training batches (P: AdamW's √v̂ + ε)."""
    cb = LearnedWeightDecay(
        1e-2,
        granularity=granularity,
        decoupled=decoupled,
        apply_to=apply_to,
        every_n_steps=2,
        max_overhead=None,
    )
    _dropin_fit(cb, optimizer)
    assert cb.sid is not None and cb.sid.hyper_step >= 5
    phi = cb.sid.phi
    assert phi.hyper_vjp_is_exact
    # k products per adjoint solve, one from R per hypergradient, one for the first check
    gen = torch.Generator().manual_seed(0)
    v = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for w in phi.inner_parameters]
    batch = next(iter(cb.data.train_stream.take(1)))
    sampled = phi.vjp(batch, v, wrt_hyper=True)[1]
    exact = phi.exact_hyper_vjp(v)
    assert sampled is not None and exact is not None
    for a, b in zip(exact, sampled):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-14)


def test_the_proximal_drop_in_keeps_the_sampled_cross_term():
    """With ``proximal=True`` ∂₂Φ̂ᵀv reads ĝ's gradient: it depends on ζ and is sampled."""
    cb = LearnedWeightDecay(1e-2, proximal=True, every_n_steps=2)
    _dropin_fit(cb, functools.partial(torch.optim.SGD, lr=0.05))
    assert not cb.sid.phi.hyper_vjp_is_exact
