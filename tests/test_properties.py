"""Property-based tests (hypothesis): SID against exact hypergradients on random problems.

* random linear contractions Φ(w, λ) = A w + B λ + c, ‖A‖₂ ≤ 0.9, with E(w, λ) = ½‖w − w̄‖² + ½ s‖λ‖²:
  ∇f(λ) = Bᵀ(I − A)⁻ᵀ(w(λ) − w̄) + s λ by one linear solve (eq. linsystem);
* random small ridge problems (n, d, scalar or per-feature λ): the closed form of ``problems.py``;
* the outer step never writes a non-finite λ, whatever the hypergradient holds.
"""

from __future__ import annotations

import copy
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import equal, make_ridge, sid_on

from hypertorch_sid import Batches, DivergenceError, KnownCurvature, SIDConfig, SIDHyperOptimizer

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)


@PROPERTY
@given(
    d=st.integers(1, 6),
    m=st.integers(1, 4),
    q=st.floats(0.0, 0.9),
    eta=st.floats(0.5, 1.0),
    s=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_full_batch_sid_matches_exact_hypergradient_of_random_linear_contraction(
    d, m, q, eta, s, seed
):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    A = randn(d, d)
    A = q * A / torch.linalg.matrix_norm(A, ord=2).clamp_min(1e-12)  # ‖A‖₂ = q ≤ 0.9
    B, c, target = randn(d, m), randn(d), randn(d)
    lam = randn(m).requires_grad_(True)
    w = randn(d).requires_grad_(True)  # any start: the solve forgets it
    I = torch.eye(d, dtype=torch.float64)
    w_star = torch.linalg.solve(I - A, B @ lam.detach() + c)
    exact = B.T @ torch.linalg.solve((I - A).T, w_star - target) + s * lam.detach()

    # KM iteration x ← (1 − η)x + ηΦ(x) contracts by (1 − η) + ηq: steps for a 1e-13 residual
    rate = 1 - eta + eta * q
    steps = max(1, math.ceil(math.log(1e-13) / math.log(rate))) if rate > 0 else 1
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        outer_loss=lambda _: 0.5 * ((w - target) ** 2).sum() + 0.5 * s * (lam**2).sum(),
        fixed_point_map=lambda _: [A @ w + B @ lam + c],
        config=SIDConfig(inner_steps=steps, adjoint_steps=steps, step_size="constant", eta=eta),
    )
    g = hopt.hypergradient([None], None)[0]
    torch.testing.assert_close(w.detach(), w_star, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(g, exact, rtol=1e-6, atol=1e-9 * (1 + float(exact.norm())))


@PROPERTY
@given(
    n=st.integers(5, 40),
    d=st.integers(1, 8),
    per_feature=st.booleans(),
    log_lam0=st.floats(-2.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_full_batch_sid_matches_closed_form_of_random_ridge(n, d, per_feature, log_lam0, seed):
    problem = make_ridge(n=n, d=d, per_feature=per_feature, seed=seed, log_lam0=log_lam0)
    H = problem.X.T @ problem.X / n + torch.diag(problem.lam())
    eig = torch.linalg.eigvalsh(H)
    L, mu = float(eig[-1]), float(eig[0])
    q = (L - mu) / (L + mu)  # GD with α = 2/(L+μ) (Corollary 4.3)
    steps = max(1, math.ceil(math.log(1e-14) / math.log(q))) if q > 0 else 1
    hopt = sid_on(
        problem,
        full_train_batch=problem.train(),
        inner_steps=steps,
        adjoint_steps=steps,
        step_size="constant",
        eta=1.0,
        curvature=KnownCurvature(L, mu),
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )
    exact = problem.exact_hypergradient()
    g = hopt.hypergradient([problem.train()], problem.val())[0]
    assert g.shape == problem.log_lam.shape and g.dtype == torch.float64
    torch.testing.assert_close(g, exact, rtol=1e-6, atol=1e-9 * (1 + float(exact.norm())))


@PROPERTY
@given(
    values=st.lists(
        st.one_of(st.floats(-10, 10), st.sampled_from([math.nan, math.inf, -math.inf])),
        min_size=3,
        max_size=3,
    ),
    adam=st.booleans(),
)
def test_outer_step_never_writes_non_finite_lambda(values, adam):
    lam = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([lam], lr=0.1) if adam else torch.optim.SGD([lam], lr=0.1)
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        lambda _: ((w - lam) ** 2).sum(),
        lambda _: (w**2).sum(),
        opt,
        config=SIDConfig(alpha=0.5, step_size="constant"),
    )
    hopt.apply([torch.ones(3, dtype=torch.float64)])  # optimizer state exists
    before, state = lam.detach().clone(), copy.deepcopy(opt.state_dict())
    g = torch.tensor(values, dtype=torch.float64)
    if torch.isfinite(g).all():
        hopt.apply([g])
        assert torch.isfinite(lam).all() and hopt.hyper_step == 2
        if not adam:
            torch.testing.assert_close(lam.detach(), before - 0.1 * g)
    else:
        try:
            hopt.apply([g])
        except DivergenceError as err:
            assert err.quantity == "hypergradient"
        else:  # pragma: no cover - the test fails here
            raise AssertionError("a non-finite hypergradient was applied")
        assert torch.equal(lam.detach(), before) and equal(opt.state_dict(), state)
    hopt.apply([torch.ones(3, dtype=torch.float64)])  # the run goes on, finite
    assert torch.isfinite(lam).all()
