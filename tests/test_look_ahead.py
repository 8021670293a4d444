"""TrainedWeights: the validation gradient at the weights the training will reach (eq. trainedgrad).

On a quadratic whose validation loss has the training loss's curvature, E(w) = ½(w − c)ᵀH(w − c)
with H = ∇²ℓ̂, T gradient steps of step η from w_t reach w_{t+T} = w_t − Σ_T(H)∇₁ℓ̂(w_t) exactly,
so ∇₁E(w_{t+T}) = ∇₁E(w_t) − (I − (I − ηH)^T)∇₁ℓ̂(w_t): the strategy's target is exact where its
filter is (converged training; or ∇₁ℓ̂ along one eigenvector, the Rayleigh filter). float64.
"""

from __future__ import annotations

import math

import lightning_problems
import pytest
import torch
from lightning_problems import RidgeData, TanhRegressor
from problems import symmetric_with_spectrum

from hypertorch_sid import (
    Batches,
    CurrentWeights,
    EstimatedCurvature,
    LearnedWeightDecay,
    NoDamping,
    SIDConfig,
    SIDHyperOptimizer,
    TrainedWeights,
)
from hypertorch_sid.core.errors import ConfigurationError

D = torch.float64


class _Quadratic:
    """ℓ̂(w) = ½ wᵀAw − bᵀw + ½ Σ e^ρ w², E(w) = ½ (w − c)ᵀ H (w − c), H = A + diag(e^ρ)."""

    def __init__(self, d: int = 8, low: float = 0.05, high: float = 4.0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        spectrum = torch.logspace(math.log10(low), math.log10(high), d, dtype=D)
        self.A = symmetric_with_spectrum(spectrum, g)
        self.b = torch.randn(d, generator=g, dtype=D)
        self.c = torch.randn(d, generator=g, dtype=D)
        self.rho = torch.full((d,), math.log(1e-2), dtype=D, requires_grad=True)
        self.w = torch.zeros(d, dtype=D, requires_grad=True)  # an underfit start

    def H(self) -> torch.Tensor:
        return self.A + torch.diag(self.rho.detach().exp())

    def grad_l(self, w: torch.Tensor) -> torch.Tensor:
        return self.H() @ w - self.b

    def grad_E(self, w: torch.Tensor) -> torch.Tensor:
        return self.H() @ (w - self.c)

    def after(self, eta: float, steps: int) -> torch.Tensor:
        """w_{t+T}: T gradient steps on ℓ̂ from the current w."""
        w = self.w.detach().clone()
        for _ in range(steps):
            w = w - eta * self.grad_l(w)
        return w

    def train_gradient(self, n: int, curvature: bool) -> tuple[list[torch.Tensor], float | None]:
        g = self.grad_l(self.w.detach())
        h = float(g @ self.H() @ g / (g @ g)) if curvature else None
        return [g], h

    def inner_loss(self, batch: object) -> torch.Tensor:
        w = self.w
        return 0.5 * w @ self.A @ w - self.b @ w + 0.5 * (self.rho.exp() * w**2).sum()

    def outer_loss(self, batch: object) -> torch.Tensor:
        r = self.w - self.c
        return 0.5 * r @ self.H() @ r


def test_the_target_is_the_validation_gradient_after_a_converged_training() -> None:
    q, eta = _Quadratic(), 0.2
    look = TrainedWeights()
    look.observe(remaining_steps=3000, step_size=eta)  # ηh_min·T = 30: converged
    (target,) = look.target([q.grad_E(q.w.detach())], q.train_gradient)
    truth = q.grad_E(q.after(eta, 3000))
    torch.testing.assert_close(target, truth, rtol=1e-9, atol=1e-12)
    # the validation gradient at the (underfit) current weights is far from it
    assert float((q.grad_E(q.w.detach()) - truth).norm()) > 10 * float((target - truth).norm())


@pytest.mark.parametrize("steps", [1, 7, 60])
def test_the_rayleigh_filter_is_exact_along_an_eigenvector(steps: int) -> None:
    """w_t − w* along one eigenvector of H: ∇₁ℓ̂ is that eigenvector, its Rayleigh quotient the
    eigenvalue, and 1 − (1 − ηh)^T the exact share of it that T steps remove."""
    q, eta = _Quadratic(), 0.2
    h, V = torch.linalg.eigh(q.H())
    w_star = torch.linalg.solve(q.H(), q.b)
    with torch.no_grad():
        q.w.copy_(w_star + 1.5 * V[:, 3])
    look = TrainedWeights(filter="rayleigh")
    look.observe(remaining_steps=steps, step_size=eta)
    (target,) = look.target([q.grad_E(q.w.detach())], q.train_gradient)
    torch.testing.assert_close(target, q.grad_E(q.after(eta, steps)), rtol=1e-9, atol=1e-12)
    assert math.isclose(look.shrink(float(h[3])), 1 - (1 - eta * float(h[3])) ** steps)


def test_the_filter_ends_and_unknowns() -> None:
    look, converged = TrainedWeights(filter="rayleigh"), TrainedWeights()
    assert look.shrink(0.3) == 1.0  # T and η unknown: the training is taken to converge
    look.observe(remaining_steps=0, step_size=0.1)
    converged.observe(remaining_steps=0, step_size=0.1)
    assert look.shrink(0.3) == 0.0  # no step left: the current weights are the trained ones
    assert converged.shrink(0.3) == 1.0  # "converged" does not read the training's length
    look.observe(remaining_steps=10, step_size=0.1)
    assert look.shrink(-1.0) == 0.0  # negative curvature: the training does not remove it
    assert look.shrink(30.0) == 1.0 and look.train_batches == 1
    assert CurrentWeights().train_batches == 0


def _hopt(q: _Quadratic, look, outer=None) -> SIDHyperOptimizer:
    return SIDHyperOptimizer(
        [q.rho], [q.w], q.inner_loss, outer or q.outer_loss, None, full_train_batch=0,
        config=SIDConfig(
            inner_steps=0, adjoint_steps=1500, step_size="constant", damping=NoDamping(),
            look_ahead=look, curvature=EstimatedCurvature(iters=10),
            batches=Batches(adjoint="full", d2="full"),
        ),
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:.*far from a fixed point")
def test_sid_solves_the_adjoint_system_for_the_trained_weights_gradient() -> None:
    """Through Algorithm 1 the hypergradient with TrainedWeights is the implicit one of the
    outer loss E − ℓ̂ (λ held in ℓ̂): the adjoint system's right-hand side is eq. trainedgrad.
    At underfit weights (a fifth of the way to w*) it differs from the current-weights one."""
    q = _Quadratic()
    with torch.no_grad():
        q.w.copy_(0.2 * torch.linalg.solve(q.H(), q.b))

    def gap(batch: object) -> torch.Tensor:  # E − ℓ̂ with ℓ̂'s λ held: ∇₁ is the target
        w, lam = q.w, q.rho.detach().exp()
        inner = 0.5 * w @ q.A @ w - q.b @ w + 0.5 * (lam * w**2).sum()
        return q.outer_loss(batch) - inner

    g_trained = _hopt(q, TrainedWeights()).hypergradient([0], None)[0]
    g_gap = _hopt(q, CurrentWeights(), gap).hypergradient([0], None)[0]
    torch.testing.assert_close(g_trained, g_gap, rtol=1e-7, atol=1e-12)
    g_now = _hopt(q, CurrentWeights()).hypergradient([0], None)[0]
    assert float((g_trained - g_now).norm()) > 0.1 * float(g_now.norm())


@pytest.mark.parametrize("kwargs", [{"batches": 0}, {"filter": "exact"}])
def test_trained_weights_refuses_bad_settings(kwargs) -> None:
    with pytest.raises(ConfigurationError):
        TrainedWeights(**kwargs)
    with pytest.raises(ConfigurationError, match="look_ahead"):
        SIDConfig(look_ahead="trained")


def test_the_drop_in_with_trained_weights_on_a_tanh_network() -> None:
    """Seconds: a tanh network through LearnedWeightDecay(look_ahead=TrainedWeights()) trains
    with finite weights and λ, hears the horizon, and reads one training batch more per hyper
    step than the default (the ∇₁ℓ̂ of eq. trainedgrad)."""
    samples = {}
    for name, look in (("now", CurrentWeights()), ("trained", TrainedWeights())):
        cb = LearnedWeightDecay(1e-2, every_n_steps=5, look_ahead=look, max_overhead=None)
        trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
        trainer.fit(TanhRegressor(), datamodule=RidgeData())
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
        assert bool(torch.isfinite(lam).all()) and len(cb.history) == 6
        samples[name] = cb.sid.cost.samples
    assert look.remaining_steps == 0 and look.step_size is not None
    assert samples["trained"] == samples["now"] + 6 * 20  # one batch of 20 per hyper step
