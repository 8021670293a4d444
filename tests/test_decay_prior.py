"""Per-element weight decay tied to its layer: λ_e = λ_layer · exp(s_e) (eq. tied) with the prior
Σ s_e² / (2σ²n) in the outer objective (eq. prior).

Oracles (float64): the closed-form ridge hypergradient of the untied λ through the chain rule,
central finite differences of the closed-form objective, the per-layer hypergradient (the tied
model at s = 0 is per-layer decay), hand-computed projections and priors.
"""

from __future__ import annotations

import copy
import math

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import D, RidgeData
from problems import full_batch_sid, make_ridge, relative_error
from torch import Tensor

from hypertorch_sid import (
    ConfigurationError,
    LearnedWeightDecay,
    SIDHyperOptimizer,
    TiedToLayer,
    Untied,
    WeightDecay,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*λ will barely move.*"),
]

SCALE = 0.5


def _tied_ridge(samples: int | None = None):
    """The ridge of ``make_ridge`` (per-feature λ) with its λ written as λ_layer · exp(s)."""
    problem = make_ridge(d=5)
    decay = WeightDecay(
        [("layer.w", problem.w)], 1.0, "per_element", elements=TiedToLayer(SCALE, samples)
    )
    with torch.no_grad():
        rho = problem.log_lam.mean() + 0.2  # s ≠ 0 and not centred: the prior's gradient shows
        decay.hyperparameters[0].fill_(rho)
        decay.hyperparameters[1].copy_(problem.log_lam - rho)
    return problem, decay


def _sid(problem, decay: WeightDecay, n: int) -> list[Tensor]:
    def inner_loss(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w - y) ** 2).mean() + decay.penalty()

    hopt = SIDHyperOptimizer(
        decay.hyperparameters,
        [problem.w],
        inner_loss,
        lambda batch: problem.outer_loss(batch) + decay.prior(n),
        config=full_batch_sid(problem, steps=400).config,
        full_train_batch=problem.train(),
    )
    return hopt.hypergradient(problem.loader(50), problem.val())


@torch.no_grad()
def _objective(problem, decay: WeightDecay, n: int) -> float:
    """f(ρ, s) = E(w*(λ)) + Σ s²/(2σ²n), w* in closed form."""
    X, y, Xv, yv = problem.X, problem.y, problem.X_val, problem.y_val
    lam = decay.lambda_of(decay.entries[0])
    w = torch.linalg.solve(X.T @ X / len(X) + torch.diag(lam), X.T @ y / len(X))
    return float(0.5 * ((Xv @ w - yv) ** 2).mean() + decay.prior(n))


def test_tied_hypergradient_is_the_chain_rule_of_the_untied_one():
    """∂f/∂ρ_layer = Σ_e ∂E/∂log λ_e and ∂f/∂s_e = ∂E/∂log λ_e + s_e/(σ²n), with ∂E/∂log λ_e the
    ridge's closed form; and both equal central differences of the closed-form objective."""
    problem, decay = _tied_ridge()
    n = len(problem.X_val)
    g = _sid(problem, decay, n)
    g_e = problem.exact_hypergradient()  # ∂E/∂log λ_e at the same λ
    s = decay.hyperparameters[1].detach()
    assert relative_error(g[0], g_e.sum().reshape(1)) < 1e-6
    assert relative_error(g[1], g_e + s / (SCALE**2 * n)) < 1e-6
    eps = 1e-6
    fd = []
    for h in decay.hyperparameters:
        for i in range(h.numel()):
            with torch.no_grad():
                h.view(-1)[i] += eps
                up = _objective(problem, decay, n)
                h.view(-1)[i] -= 2 * eps
                down = _objective(problem, decay, n)
                h.view(-1)[i] += eps
            fd.append((up - down) / (2 * eps))
    assert relative_error(torch.cat([x.flatten() for x in g]), torch.tensor(fd).double()) < 1e-6


def test_at_zero_deviation_the_layer_hypergradient_is_the_per_layer_one():
    """A network (tanh MLP, float64, full batch): tied per element with s = 0 gives each layer's
    ρ exactly per-layer decay's hypergradient — per-element decay starts as per-layer decay."""
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 4, generator=gen).double(), torch.randn(64, 1, generator=gen).double()
    Xv, yv = torch.randn(64, 4, generator=gen).double(), torch.randn(64, 1, generator=gen).double()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    base = base.double()
    grads = {}
    for granularity in ("per_layer", "per_element"):
        net = copy.deepcopy(base)
        decay = WeightDecay(list(net.named_parameters()), 0.05, granularity)

        def inner_loss(batch, net=net, decay=decay):
            return ((net(batch[0]) - batch[1]) ** 2).mean() + decay.penalty()

        def outer_loss(batch, net=net, decay=decay):
            E = ((net(batch[0]) - batch[1]) ** 2).mean()
            prior = decay.prior(len(Xv))
            return E if prior is None else E + prior

        config = full_batch_sid(make_ridge(), steps=50).config.replace(eta=0.1)
        hopt = SIDHyperOptimizer(
            decay.hyperparameters, list(net.parameters()), inner_loss, outer_loss,
            config=config, full_train_batch=(X, y),
        )  # fmt: skip
        grads[granularity] = hopt.hypergradient([(X, y)], (Xv, yv))
    torch.testing.assert_close(grads["per_element"][0], grads["per_layer"][0], rtol=1e-10, atol=0)


def test_projection_keeps_every_element_under_its_bound():
    """λ_layer onto [0, min bound of its tensors]; then s_e ≤ log(bound / λ_layer)."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for parameterization in ("log", "projection"):
        decay = WeightDecay(list(net.named_parameters()), 0.5, "per_element", parameterization)
        with torch.no_grad():
            decay.hyperparameters[0].copy_(
                torch.tensor([5.0, -3.0])
            )  # layer "1": λ < 0 if projected
            for s in decay.hyperparameters[1:]:
                s.copy_(torch.linspace(-2, 4, s.numel()).reshape(s.shape))
        bounds = [2.0, 3.0, 1.0, math.inf]
        decay.project(bounds)
        for e, u in zip(decay.entries, bounds):
            lam = decay.lambda_of(e).detach()
            assert float(lam.min()) >= 0 and float(lam.max()) <= u * (1 + 1e-6), (e.name, lam)
        layer = decay.parameterization.transform(decay.hyperparameters[0].detach())
        assert float(layer[0]) == pytest.approx(2.0)  # min(2, 3) of layer "0"'s tensors
        if parameterization == "projection":
            assert float(layer[1]) == 0.0


def test_prior_value_and_bad_settings():
    w = torch.ones(2, 3, requires_grad=True)
    decay = WeightDecay([("a.w", w)], 0.1, "per_element", elements=TiedToLayer(scale=2.0))
    with torch.no_grad():
        decay.hyperparameters[1].fill_(0.5)
    assert float(decay.prior(10).detach()) == pytest.approx(6 * 0.25 / (2 * 4.0 * 10))
    assert WeightDecay([("a.w", w)], 0.1, "per_layer").prior(10) is None
    assert WeightDecay([("a.w", w)], 0.1, "per_element", elements=Untied()).prior(10) is None
    with pytest.raises(ConfigurationError, match=r"TiedToLayer\(samples=n\)"):
        decay.prior(None)
    for bad in (0.0, -1.0, True, "1"):
        with pytest.raises(ConfigurationError, match="scale must be a number > 0"):
            TiedToLayer(scale=bad)
    with pytest.raises(ConfigurationError, match=r"use Untied\(\)"):
        TiedToLayer(scale=math.inf)
    with pytest.raises(ConfigurationError, match="elements must be 'tied', 'untied'"):
        LearnedWeightDecay(1e-3, granularity="per_element", elements="free")


class _Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(D, 1, dtype=torch.float64)

    def training_step(self, batch, batch_idx):
        X, y = batch
        return 0.5 * ((self.net(X).squeeze(-1) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_drop_in_adds_the_prior_for_its_validation_set():
    """n is the validation set's size; the logged outer loss is E + Σ s²/(2σ²n); s moves."""
    data = RidgeData()
    cb = LearnedWeightDecay(
        1e-2, granularity="per_element", elements="tied", every_n_steps=2, max_overhead=None
    )
    trainer = lightning_problems.trainer([cb], max_steps=8, limit_val_batches=0)
    trainer.fit(_Linear(), datamodule=data)
    n = len(data.yv)
    assert cb.problem.validation_size() == n
    decay = cb.problem.decay
    s = torch.cat([h.detach().flatten() for h in decay.hyperparameters[1:]])
    assert float(s.abs().max()) > 0  # the deviations learned
    assert float(decay.prior(n)) == pytest.approx(float(s.pow(2).sum()) / (2 * n), rel=1e-12)
    values = cb.decay_values()
    layer = float(decay.parameterization.transform(decay.hyperparameters[0].detach())[0])
    torch.testing.assert_close(
        values["net.weight"], layer * decay.hyperparameters[1].detach().exp()
    )
