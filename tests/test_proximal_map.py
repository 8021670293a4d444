"""ProximalGradientMap: Φ̂ = (w − α∇ĝ)/(1 + αc(λ)) — same fixed point and hypergradient as the GD
map of ĝ + ½⟨c, w²⟩, contracting for large λ where the GD map with the same α does not."""

from __future__ import annotations

import pytest
import torch
from problems import full_batch_sid, make_ridge, relative_error

from hypertorch_sid import (
    Batches,
    ConfigurationError,
    ContractionMap,
    DivergenceError,
    EstimatedCurvature,
    NoPreconditioner,
    ProximalGradientMap,
    SIDConfig,
    SIDHyperOptimizer,
)


def data_loss(problem):
    def loss(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w - y) ** 2).mean()

    return loss


def penalty(problem):
    return lambda: [problem.log_lam.exp()]


@pytest.mark.parametrize("per_feature", [False, True])
def test_products_equal_autograd_of_the_explicit_map(per_feature):
    """value and both vjps against autograd through Φ written out by hand (ContractionMap)."""
    problem = make_ridge(n=50, d=4, per_feature=per_feature, log_lam0=0.5)
    with torch.no_grad():
        problem.w.copy_(
            torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        )
    alpha, batch = 0.3, problem.train()
    prox = ProximalGradientMap(
        data_loss(problem), penalty(problem), [problem.w], [problem.log_lam], alpha
    )

    def explicit(b):
        (g,) = torch.autograd.grad(data_loss(problem)(b), problem.w, create_graph=True)
        return [(problem.w - alpha * g) / (1 + alpha * problem.log_lam.exp())]

    ref = ContractionMap(explicit, [problem.w], [problem.log_lam])
    v = [torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))]
    torch.testing.assert_close(prox.value(batch)[0], ref.value(batch)[0], rtol=1e-12, atol=0)
    for wrt_hyper in (False, True):
        got, want = prox.vjp(batch, v, wrt_hyper), ref.vjp(batch, v, wrt_hyper)
        torch.testing.assert_close(got[0][0], want[0][0], rtol=1e-12, atol=1e-15)
        if wrt_hyper:
            torch.testing.assert_close(got[1][0], want[1][0], rtol=1e-12, atol=1e-15)


def test_fixed_point_is_the_ridge_solution():
    problem = make_ridge(n=200, d=5, log_lam0=1.0)
    with torch.no_grad():
        problem.w.copy_(problem.w_star())
    prox = ProximalGradientMap(
        data_loss(problem), penalty(problem), [problem.w], [problem.log_lam], alpha=0.7
    )
    torch.testing.assert_close(prox.value(problem.train())[0], problem.w_star(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("per_feature", [False, True])
def test_full_batch_hypergradient_matches_closed_form(per_feature):
    problem = make_ridge(n=200, d=5, per_feature=per_feature, log_lam0=-1.0)
    hopt = full_batch_sid(
        problem,
        800,
        inner_loss=data_loss(problem),
        penalty=penalty(problem),
        curvature=EstimatedCurvature(iters=300),
        preconditioner=NoPreconditioner(),
    )
    g = hopt.hypergradient([problem.train()], problem.val())
    assert relative_error(g[0], problem.exact_hypergradient()) < 1e-8
    # α came from ĝ's curvature alone: 2/(L_g + μ_g), L_g = λ_max(XᵀX/n)
    L_g = float(torch.linalg.eigvalsh(problem.X.T @ problem.X / 200)[-1])
    assert abs(hopt.L - L_g) / L_g < 1e-3


def test_large_penalty_contracts_where_the_gd_map_with_the_same_alpha_diverges():
    """λ ≈ 3000 ≫ L_g: GD with α = 2/L_g explodes; the prox map with that α gets the exact
    hypergradient."""
    problem = make_ridge(n=200, d=5, per_feature=True, log_lam0=8.0)
    L_g = float(torch.linalg.eigvalsh(problem.X.T @ problem.X / 200)[-1])
    alpha = 1.9 / L_g
    prox = full_batch_sid(
        problem, steps=300, inner_loss=data_loss(problem), penalty=penalty(problem), alpha=alpha
    )
    g = prox.hypergradient([problem.train()], problem.val())
    assert relative_error(g[0], problem.exact_hypergradient()) < 1e-8

    problem = make_ridge(n=200, d=5, per_feature=True, log_lam0=8.0)
    gd = full_batch_sid(problem, steps=300, inner_loss=problem.inner_loss, alpha=alpha)
    with pytest.raises(DivergenceError):
        gd.hypergradient([problem.train()], problem.val())


def test_stochastic_prox_sid_converges_to_closed_form():
    problem = make_ridge(n=400, d=5, per_feature=True, log_lam0=-1.0)
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        inner_loss=data_loss(problem),
        outer_loss=problem.outer_loss,
        penalty=penalty(problem),
        full_train_batch=problem.train(),
        config=SIDConfig(inner_steps=3000, adjoint_steps=3000, batches=Batches(d2="full")),
    )
    g = hopt.hypergradient(problem.loader(10), problem.val())
    assert relative_error(g[0], problem.exact_hypergradient()) < 0.05


@pytest.mark.parametrize(
    "coefficients, match",
    [
        (lambda p: [], r"returned 0 item\(s\) for 1 inner parameter"),
        (lambda p: [torch.ones(3, dtype=torch.float64)], "does not broadcast"),
        (lambda p: [-torch.ones(5, dtype=torch.float64)], "negative or non-finite"),
        (lambda p: [torch.full((5,), float("nan"), dtype=torch.float64)], "negative or non-finite"),
    ],
)
def test_bad_penalty_is_named(coefficients, match):
    problem = make_ridge(n=50, d=5)
    prox = ProximalGradientMap(
        data_loss(problem), lambda: coefficients(problem), [problem.w], [problem.log_lam], 0.1
    )
    with pytest.raises(ConfigurationError, match=match):
        prox.value(problem.train())


def test_penalty_with_fixed_point_map_is_refused():
    problem = make_ridge(n=50, d=5)
    with pytest.raises(ConfigurationError, match="cannot be combined with fixed_point_map"):
        SIDHyperOptimizer(
            [problem.log_lam],
            [problem.w],
            outer_loss=problem.outer_loss,
            fixed_point_map=lambda b: [problem.w],
            penalty=penalty(problem),
        )
    with pytest.raises(ConfigurationError, match="penalty must be a callable"):
        ProximalGradientMap(data_loss(problem), 3.0, [problem.w], [problem.log_lam], 0.1)
