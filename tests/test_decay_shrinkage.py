"""Per-element decay with James–Stein shrinkage toward the layer (:class:`ShrunkToLayer`,
eq. shrink): the deviations move only where the validation data tell elements apart.

Known answer (float64, closed form): a ridge whose training design is orthogonal (XᵀX/N = I,
the least-squares solution 1 in every coordinate), so w*_e(λ) = 1/(1 + λ_e), and whose
validation targets come from w_val: the population-optimal decay is λ_e = 1/w_val,e − 1.
With w_val = 0.5 everywhere every element wants the same λ = 1 and the validation minibatches
carry only noise per element; with w_val = 0.25 / 0.8 on the two halves they want λ = 3 / 0.25
(log-ratio 2.48). Then the drop-in on a small real network: shrinkage off where it has no
evidence, its state checkpointed with the outer optimizer, a resumed fit equal to a straight one.
"""

from __future__ import annotations

import math

import lightning_problems
import pytest
import torch
from lightning_problems import RidgeData, TanhRegressor
from torch import Tensor

from hypertorch_sid import (
    ConfigurationError,
    LearnedWeightDecay,
    ShrinkageStep,
    ShrunkToLayer,
    TiedToLayer,
    TrustRprop,
    WeightDecay,
)
from hypertorch_sid.core.decay import shrinkage

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*λ will barely move.*"),
]


def _ridge_fit(
    signal: bool,
    elements,
    seed: int,
    d: int = 20,
    n: int = 400,
    b: int = 20,
    granularity="per_element",
):
    """300 hyper steps on validation minibatches of b, exact hypergradients of the closed-form
    ridge; returns (deviations s, the shrinkage factor c of the last step or None, the path of
    log λ_layer). ``granularity="per_layer"``: the per-layer default's TrustRprop on log λ (no
    deviations: s and c None)."""
    g = torch.Generator().manual_seed(seed)
    N = 100
    Q, _ = torch.linalg.qr(torch.randn(N, d, generator=g, dtype=torch.float64))
    X = Q * math.sqrt(N)
    y = X @ torch.ones(d, dtype=torch.float64)
    w_val = torch.full((d,), 0.5, dtype=torch.float64)
    if signal:
        w_val[: d // 2], w_val[d // 2 :] = 0.25, 0.8
    Xv = torch.randn(n, d, generator=g, dtype=torch.float64)
    yv = Xv @ w_val + torch.randn(n, generator=g, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    decay = WeightDecay([("layer.w", w)], 0.5, granularity, elements=elements)
    make = elements.outer_optimizer(0.3) if granularity == "per_element" else None
    if granularity != "per_element":
        make = lambda hs: TrustRprop(hs, 0.3, step_sizes=(1e-2, 2.0))  # noqa: E731
    opt = make(decay.hyperparameters) if make else torch.optim.Adam(decay.hyperparameters, 0.3)
    path = []
    for _ in range(300):
        elements.observe(b / n)
        lam = decay.lambda_of(decay.entries[0])
        w_star = torch.linalg.solve(X.T @ X / N + torch.diag(lam.expand(d)), X.T @ y / N)
        idx = torch.randint(0, n, (b,), generator=g)
        E = 0.5 * ((Xv[idx] @ w_star - yv[idx]) ** 2).mean()
        opt.zero_grad()
        E.backward()
        opt.step()
        decay.project()
        path.append(float(decay.hyperparameters[0][0].detach()))
    if granularity != "per_element":
        return None, None, path
    s = decay.hyperparameters[1].detach()
    return s, opt.state[decay.hyperparameters[1]].get("shrinkage"), path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_per_element_signal_leaves_the_deviations_near_zero(seed):
    """Every element wants λ = 1: the shrunk deviations stay small (rms < 0.45) while free ones
    (the same parameterisation, Adam, no prior: TiedToLayer with a negligible prior) wander
    three times as far; the layer's own λ is learned either way."""
    s, c, _ = _ridge_fit(False, ShrunkToLayer(), seed)
    free, _, _ = _ridge_fit(False, TiedToLayer(scale=1e6, samples=400), seed)
    rms, rms_free = float(s.pow(2).mean().sqrt()), float(free.pow(2).mean().sqrt())
    assert rms < 0.45, rms
    assert rms < rms_free / 3, (rms, rms_free)
    assert c is not None and 0 <= c <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_element_signal_moves_the_deviations_to_the_optimum(seed):
    """Half the elements want λ = 3, half 0.25: the deviations separate the halves by about
    log 12 = 2.48 (within 1), the right way round."""
    s, _, _ = _ridge_fit(True, ShrunkToLayer(), seed)
    gap = float(s[:10].mean() - s[10:].mean())
    assert abs(gap - math.log(12)) < 1.0, gap


def test_shrinkage_factor_oracle():
    """eq. shrink on hand-made averages with a known spread and noise: noise half the spread
    → c = 1/2; the floor b/n doubling the noise → 0; negligible noise → 1; too few steps for
    a noise estimate, or fewer than 3 elements → 0."""
    beta, t = 0.9, 50
    c1 = 1 - beta**t
    w2 = (1 - beta) / (1 + beta) * (1 - beta ** (2 * t)) / c1**2  # Σ w_t²
    m = torch.tensor([1.0, -1.0, 0.0, 2.0, -2.0], dtype=torch.float64)  # Σ(m − m̄)² = 10
    p = m.numel()
    margin = (p - 1) / p * (1 + 2 * math.sqrt(2 / (p - 1)))  # centred, two χ² s.d. high

    def square(var: float) -> Tensor:  # the uncorrected average of g² for σ_e² = var
        return (m.pow(2) + var * (1 - w2)) * c1

    half = 0.5 * 10 / (p * w2 * margin)  # σ² with noise = spread / 2
    assert shrinkage(m * c1, square(half), beta, t, share=0.0) == pytest.approx(0.5)
    assert shrinkage(m * c1, square(half), beta, t, share=w2) == pytest.approx(0.0)
    assert shrinkage(m * c1, square(1e-9), beta, t, share=0.0) == pytest.approx(1.0, abs=1e-6)
    assert shrinkage(m * c1, square(half), beta, 5, share=0.0) == 0.0  # 5 (1 − β) < 1
    assert shrinkage(m[:2] * c1, square(half)[:2], beta, t, share=0.0) == 0.0


def test_bad_settings_are_refused():
    for bad in (0.0, 1.0, -0.5, True, "0.9"):
        with pytest.raises(ConfigurationError, match=r"beta must be in \(0, 1\)"):
            ShrunkToLayer(beta=bad)
    assert isinstance(
        LearnedWeightDecay(1e-3, granularity="per_element", elements="shrunk").elements,
        ShrunkToLayer,
    )


def _MLP() -> TanhRegressor:
    return TanhRegressor(hidden=16, seed=0, momentum=0.9)


def _fit(max_epochs: int, ckpt=None, **kw):
    cb = LearnedWeightDecay(
        1e-2, granularity="per_element", elements="shrunk", every_n_steps=2, max_overhead=None
    )  # no clock-read budget: a resumed fit must repeat the straight one exactly
    trainer = lightning_problems.trainer([cb], max_epochs=max_epochs, limit_val_batches=0, **kw)
    module = _MLP()
    trainer.fit(module, datamodule=RidgeData(batch_size=20), ckpt_path=ckpt)
    return cb, trainer, module


def test_drop_in_on_a_small_network_uses_the_shrinkage_step():
    """A tanh MLP: the drop-in's outer optimizer is the model's ShrinkageStep, told the share
    b/n of the validation set; λ stays finite and positive; the factors are in [0, 1]."""
    cb, _, _ = _fit(6)
    opt = cb.sid.outer_optimizer
    assert isinstance(opt, ShrinkageStep)
    assert 0 < cb.elements.share <= 1
    decay = cb.problem.decay
    lam = decay.summary()
    assert bool(torch.isfinite(lam).all()) and float(lam.min()) > 0
    factors = [opt.state[s]["shrinkage"] for s in decay.hyperparameters[1:]]
    assert all(0 <= c <= 1 for c in factors)
    assert decay.prior(100) is None  # no prior term: the step is the regulariser


def test_resume_equals_a_straight_fit(tmp_path):
    """The averages and step counts live in the outer optimizer's state: a fit stopped and
    resumed from its checkpoint ends with the λ of a straight fit."""
    straight, _, _ = _fit(4)
    _, trainer, _ = _fit(2, default_root_dir=tmp_path)
    path = tmp_path / "half.ckpt"
    trainer.save_checkpoint(path)
    resumed, _, _ = _fit(4, ckpt=str(path))
    for a, b in zip(straight.rho, resumed.rho):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-10, atol=1e-12)
    sa = straight.sid.outer_optimizer.state
    sb = resumed.sid.outer_optimizer.state
    for pa, pb in zip(straight.rho[1:], resumed.rho[1:]):
        assert sa[pa]["step"] == sb[pb]["step"]
        torch.testing.assert_close(sa[pa]["mean"], sb[pb]["mean"], rtol=1e-10, atol=1e-14)
