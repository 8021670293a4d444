"""Warm-started curvature refreshes (eq. lanczoswarm) and Lanczos' stopping rule (eq.
lanczosstop), counted in Hessian–vector products, never timed."""

from __future__ import annotations

import math

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import hypertorch_sid.core.estimation as estimation
from hypertorch_sid import (
    ConfigurationError,
    EstimatedCurvature,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
    estimate_curvature,
    lanczos_extremes,
)
from hypertorch_sid.core.cost import Cost
from hypertorch_sid.core.estimation import CurvatureEstimate, CurvatureProbe, warm_start_vector

f64 = torch.float64


def _spectrum_matrix(eigenvalues: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=f64))
    return Q @ torch.diag(eigenvalues) @ Q.T


class _Counted:
    """A symmetric matrix as a Lanczos operator, its products counted."""

    def __init__(self, A: torch.Tensor) -> None:
        self.A, self.products = A, 0

    def __call__(self, v):
        self.products += 1
        return [self.A @ v[0]]


def _known_spectrum() -> tuple[torch.Tensor, torch.Tensor]:
    """A (n = 300, spectrum −1, a bulk in [0, 8], 10) and a small symmetric perturbation of it."""
    n = 300
    eig = torch.cat(
        [
            torch.tensor([-1.0], dtype=f64),
            torch.linspace(0, 8, n - 2, dtype=f64),
            torch.tensor([10.0], dtype=f64),
        ]
    )
    A = _spectrum_matrix(eig)
    g = torch.Generator().manual_seed(5)
    E = torch.randn(n, n, generator=g, dtype=f64)
    E = (E + E.T) / 2
    return A, A + 0.05 * E / torch.linalg.matrix_norm(E, 2)


def test_a_warm_started_re_estimate_after_a_small_perturbation_needs_far_fewer_products():
    A, B = _known_spectrum()
    true = torch.linalg.eigvalsh(B)
    lam_min, lam_max = float(true[0]), float(true[-1])
    like = [torch.zeros(A.shape[0], dtype=f64)]
    tol = 1e-3
    first = lanczos_extremes(_Counted(A), like, 60, seed=0, tol=tol, vectors=True)
    assert first.vectors is not None
    cold_op, warm_op = _Counted(B), _Counted(B)
    cold = lanczos_extremes(cold_op, like, 60, seed=1, tol=tol)
    start = warm_start_vector(first.vectors, seed=1)
    warm = lanczos_extremes(warm_op, like, 60, seed=1, tol=tol, start=start, vectors=True)
    for res in (cold, warm):  # both settled (eq. lanczosstop) and both ends found
        L = res.theta_max + res.error_max
        assert max(res.error_max, res.error_min) <= tol * L
        assert L >= lam_max and L - lam_max <= 2 * tol * L
        assert abs(res.theta_min - lam_min) <= 2 * tol * L
    assert warm_op.products == warm.steps and cold_op.products == cold.steps
    assert 2 * warm_op.products <= cold_op.products  # measured: 7 against 15
    # the kept Ritz vectors are unit and near the eigenvectors of B's ends
    evecs = torch.linalg.eigh(B).eigenvectors
    assert warm.vectors is not None
    for y, u in zip(warm.vectors, (evecs[:, 0], evecs[:, -1])):
        assert math.isclose(float(y[0].norm()), 1.0, rel_tol=1e-12)
        assert abs(float(y[0] @ u)) > 0.99


def test_without_the_options_lanczos_is_the_cold_run_it_was():
    """Off (no start, no tol, no vectors): bit for bit the run before the options existed
    (the same recurrence from _random_unit(seed), all iters steps, no basis kept)."""
    A = _spectrum_matrix(torch.linspace(-1.0, 4.0, 50, dtype=f64))
    like = [torch.zeros(50, dtype=f64)]
    res = lanczos_extremes(lambda v: [A @ v[0]], like, 12, seed=3)
    alphas, betas = estimation.lanczos(lambda v: [A @ v[0]], estimation._random_unit(like, 3), 12)
    theta, S = estimation.ritz_pairs(alphas, betas)
    assert res.steps == 12 and res.vectors is None
    assert (res.theta_min, res.theta_max) == (float(theta[0]), float(theta[-1]))
    assert res.error_max == abs(betas[-1]) * float(S[-1, -1].abs())
    est = estimate_curvature(_Map(A), [0], iters=12, seed=3)
    assert est.ritz is None and est.iterations == 12
    assert est.L == res.theta_max + res.error_max and est.lambda_min == res.theta_min


class _Map:
    """ℓ̂ = ½ wᵀAw on every batch: a map for :func:`estimate_curvature`."""

    def __init__(self, A: torch.Tensor) -> None:
        self.A = A
        self.inner_parameters = [torch.zeros(A.shape[0], dtype=f64)]

    def hessian_vector_product(self, batch, v):
        return [self.A @ v[0]]


def test_bad_warm_start_settings_name_the_fix():
    with pytest.raises(ConfigurationError, match="needs minibatches='mean'"):
        EstimatedCurvature(warm_start=True, minibatches="each")
    with pytest.raises(ConfigurationError, match="warm_start must be True or False"):
        EstimatedCurvature(warm_start="yes")
    for tol in (0.0, 1.0, -0.1, math.nan):
        with pytest.raises(ConfigurationError, match=r"tol must be a number in \(0, 1\)"):
            EstimatedCurvature(tol=tol)
    assert EstimatedCurvature(warm_start=True, tol=0.05).tol == 0.05


class _Quadratic:
    """ℓ = ½ wᵀ(H + diag λ)w − bᵀw, E = ½‖w − target‖²: the estimate reads H + diag λ."""

    def __init__(self, seed: int = 0) -> None:
        d = 120
        g = torch.Generator().manual_seed(seed)
        eig = torch.cat([torch.tensor([-0.5], dtype=f64), torch.linspace(-0.3, 4.5, d - 2, dtype=f64),
                         torch.tensor([5.0], dtype=f64)])  # fmt: skip
        self.H = _spectrum_matrix(eig, seed)
        self.b = torch.randn(d, generator=g, dtype=f64)
        self.target = torch.randn(d, generator=g, dtype=f64)
        self.w = torch.randn(d, generator=g, dtype=f64).requires_grad_()
        self.log_lam = torch.full((d,), -4.0, dtype=f64, requires_grad=True)

    def inner_loss(self, batch):
        w = self.w
        return 0.5 * w @ self.H @ w - self.b @ w + 0.5 * (self.log_lam.exp() * w**2).sum()

    def outer_loss(self, batch):
        return 0.5 * ((self.w - self.target) ** 2).sum()

    def hopt(self) -> SIDHyperOptimizer:
        curvature = EstimatedCurvature(batches="full", iters=40, every=1, warm_start=True, tol=1e-3)
        return SIDHyperOptimizer(
            [self.log_lam], [self.w], self.inner_loss, self.outer_loss,
            torch.optim.SGD([self.log_lam], lr=0.5), full_train_batch=0,
            config=SIDConfig(inner_steps=0, adjoint_steps=5, step_size="constant",
                             curvature=curvature),
        )  # fmt: skip


def _estimate_products(hopt: SIDHyperOptimizer) -> int:
    """Curvature products of one hyper step (a refresh at every hyper step)."""
    before = hopt.cost.curvature_products
    hopt.step([0], 0)
    return hopt.cost.curvature_products - before


def test_warm_starts_refresh_cheaply_and_a_resume_starts_cold():
    """Every hyper step re-estimates: the first cold, the next from the last Ritz vectors (λ moved
    a little). A checkpoint holds no Ritz vectors: a fresh optimizer loading it, and the same one
    loading it again, start their next estimate cold (as many products as a cold estimate)."""
    q = _Quadratic()
    hopt = q.hopt()
    cold = _estimate_products(hopt)
    warm = [_estimate_products(hopt) for _ in range(3)]
    assert hopt.probe.last is not None and hopt.curvature_estimate.ritz is not None
    assert max(warm) * 2 <= cold  # measured: cold 19, warm 8-9
    saved = hopt.state_dict()
    # a cold estimate at this point, for reference: what a resume must cost
    q_ref = _Quadratic()
    with torch.no_grad():
        q_ref.w.copy_(q.w)
        q_ref.log_lam.copy_(q.log_lam)
    reference = q_ref.hopt()
    reference.load_state_dict(saved)
    assert reference.probe.last is None  # cleanly absent after the resume
    cold_again = _estimate_products(reference)
    assert cold_again > max(warm) and reference.probe.last is not None
    hopt.load_state_dict(saved)  # the same optimizer, rewound: its Ritz vectors are dropped
    assert hopt.probe.last is None
    assert _estimate_products(hopt) == cold_again  # the same cold run, product for product


def test_the_ritz_vectors_move_with_the_preconditioner():
    """An eigenvector u of S∇²ℓS is the direction Su of w; under S' it reads S'⁻¹Su: on a diagonal
    Hessian the coordinate axes stay the eigenvectors under any S, and stay put."""
    moved: list = []

    class _Phi:
        scale = None

    probe = CurvatureProbe(
        _Phi(), SIDConfig(), Cost(), module=None, full_batch=None, mean=None,  # type: ignore[arg-type]
        on_rescale=lambda old, new: moved.append((old, new)),
    )  # fmt: skip
    e0, e3 = torch.zeros(5, dtype=f64), torch.zeros(5, dtype=f64)
    e0[0], e3[3] = 1.0, 1.0
    probe.last = CurvatureEstimate(1.0, 0.1, False, 3, 0.1, 0.0, ([e0], [e3]))
    S = [torch.tensor([2.0, 1.0, 1.0, 0.5, 3.0], dtype=f64)]
    probe.set_scale(S)
    assert probe.last.ritz is not None
    torch.testing.assert_close(probe.last.ritz[0][0], e0)
    torch.testing.assert_close(probe.last.ritz[1][0], e3)
    y = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=f64) / math.sqrt(2)
    probe.last = CurvatureEstimate(1.0, 0.1, False, 3, 0.1, 0.0, ([y], [e3]))
    S2 = [torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0], dtype=f64)]
    probe.set_scale(S2)  # S⁻¹... : y_w = S y, read as S2⁻¹ S y = (2, 0.5, 0, 0, 0)/√2, unit
    expected = torch.tensor([2.0, 0.5, 0.0, 0.0, 0.0], dtype=f64)
    torch.testing.assert_close(probe.last.ritz[0][0], expected / expected.norm())
    assert len(moved) == 2 and probe.phi.scale is S2


class _DigitsMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10)
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_a_digits_mlp_trains_with_warm_refreshes_that_agree_with_cold_twenty_step_estimates(
    monkeypatch,
):
    """The drop-in's curvature (2 batches × 10 steps) warm-started with tol = 0.05, refreshed at
    every second hyper step, no budget: it trains to finite weights, every warm refresh stops
    early, and each agrees with a cold 20-step estimate on the same batches at the same point:
    L within 10 % of it and λ_min within 0.1 · L (the rule settles both ends to 0.05 · L̂; a
    small residual says near *an* eigenvalue, so λ_min is the looser one)."""
    X, y, Xv, yv = lightning_problems.digits_split(256, 128)
    train = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=64)
    original = estimation.estimate_curvature
    seen: list[tuple[bool, CurvatureEstimate, CurvatureEstimate]] = []

    def spy(phi, batches, iters=20, **kw):
        est = original(phi, batches, iters, **kw)
        raw = getattr(phi, "phi", phi)  # not counted: a reference, not the fit's work
        ref = original(raw, batches, 20, mu=kw.get("mu"), seed=1234)
        seen.append((kw.get("start") is not None, est, ref))
        return est

    monkeypatch.setattr(estimation, "estimate_curvature", spy)
    curvature = EstimatedCurvature(batches=2, iters=10, every=2, warm_start=True, tol=0.05)
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None, curvature=curvature)
    trainer = lightning_problems.trainer([cb], max_steps=64, limit_val_batches=0)
    module = _DigitsMLP()
    trainer.fit(module, train, val)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    warm = [(est, ref) for was_warm, est, ref in seen if was_warm]
    assert len(warm) >= 5 and not seen[0][0]  # the first estimate cold, the refreshes warm
    assert all(est.iterations < 10 for est, _ in warm)  # every warm refresh stopped early
    for est, ref in warm:
        assert abs(est.L - ref.L) <= 0.1 * ref.L, (est, ref)
        assert abs(est.lambda_min - ref.lambda_min) <= 0.1 * ref.L, (est, ref)


def test_the_benchmark_takes_a_warm_started_curvature_as_json():
    """``--learned-kwargs '{"curvature": {"class_path": ..., "init_args": ...}}'`` (run.sh of
    s47_curv): the strategy object, built as given."""
    import importlib
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, folder)
    try:
        bench = importlib.import_module("bench_weight_decay")
    finally:
        sys.path.remove(folder)
    init = {"batches": 2, "iters": 10, "every": 10, "warm_start": True, "tol": 0.05}
    spec_ = {"class_path": "hypertorch_sid.core.estimation.EstimatedCurvature", "init_args": init}
    kwargs = bench._with_strategies({"curvature": spec_}, "default")
    assert kwargs["curvature"] == EstimatedCurvature(**init)
