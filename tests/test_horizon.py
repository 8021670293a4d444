"""HorizonDamping on a quadratic, where the T-step-ahead hypergradient has a closed form.

ℓ(w, ρ) = ½ wᵀAw − bᵀw + ½ Σ e^ρ w² (A symmetric positive definite, a spread spectrum),
E(w) = ½‖w − c‖². From the fixed point w* the training's T more gradient steps (step η) leave w
at w*, and dE(w_T)/dρ (w₀ = w* held fixed) is −(e^ρ w*) ⊙ Σ_T(H)∇₁E(w*) (eq. horizon), which
autograd through the unrolled steps computes exactly. float64 throughout.
"""

from __future__ import annotations

import math

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import D as D_RIDGE
from lightning_problems import RidgeData
from problems import symmetric_with_spectrum
from torch.optim.optimizer import register_optimizer_step_post_hook

from hypertorch_sid import (
    Batches,
    EstimatedCurvature,
    FixedDamping,
    LearnedWeightDecay,
    NoDamping,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core.errors import ConfigurationError, DivergenceError
from hypertorch_sid.core.horizon import (
    HorizonDamping,
    HorizonSolver,
    effective_step_size,
    horizon_delta,
    horizon_filter,
)

D = torch.float64


class _Quadratic:
    def __init__(self, d: int = 10, low: float = 1e-3, high: float = 4.0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        spectrum = torch.logspace(math.log10(low), math.log10(high), d, dtype=D)
        self.A = symmetric_with_spectrum(spectrum, g)
        self.b = torch.randn(d, generator=g, dtype=D)
        self.c = torch.randn(d, generator=g, dtype=D)
        self.rho = torch.full((d,), math.log(1e-3), dtype=D, requires_grad=True)
        self.w = self.w_star().clone().requires_grad_()

    def H(self) -> torch.Tensor:
        return self.A + torch.diag(self.rho.detach().exp())

    def w_star(self) -> torch.Tensor:
        return torch.linalg.solve(self.H(), self.b)

    def grad_w(self, w: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        return self.A @ w - self.b + rho.exp() * w

    def inner_loss(self, batch: object) -> torch.Tensor:
        w = self.w
        return 0.5 * w @ self.A @ w - self.b @ w + 0.5 * (self.rho.exp() * w**2).sum()

    def outer_loss(self, batch: object) -> torch.Tensor:
        return 0.5 * ((self.w - self.c) ** 2).sum()

    def unrolled(self, eta: float, steps: int) -> torch.Tensor:
        """dE(w_T)/dρ through T gradient steps from w* (w₀ held fixed): the truth."""
        rho = self.rho.detach().clone().requires_grad_()
        w = self.w_star()
        for _ in range(steps):
            w = w - eta * self.grad_w(w, rho)
        (g,) = torch.autograd.grad(0.5 * ((w - self.c) ** 2).sum(), rho)
        return g

    def filtered(self, filt) -> torch.Tensor:
        """−(e^ρ w*) ⊙ F(H)∇₁E(w*) for a spectral filter F."""
        h, V = torch.linalg.eigh(self.H())
        w = self.w_star()
        f = torch.tensor([filt(float(x)) for x in h], dtype=D)
        return -(self.rho.detach().exp() * w) * (V @ (f * (V.T @ (w - self.c))))


@pytest.mark.parametrize("steps", [1, 7, 60, 400])
def test_horizon_filter_is_the_derivative_through_the_remaining_steps(steps: int) -> None:
    q, eta = _Quadratic(), 0.2
    exact = q.filtered(lambda h: horizon_filter(h, eta, steps))
    torch.testing.assert_close(q.unrolled(eta, steps), exact, rtol=1e-9, atol=1e-13)


def test_the_implicit_hypergradient_is_the_infinite_horizon() -> None:
    q, eta = _Quadratic(low=0.5), 0.2  # every direction converges within 2000 steps
    implicit = q.filtered(lambda h: 1.0 / h)
    torch.testing.assert_close(q.unrolled(eta, 2000), implicit, rtol=1e-9, atol=1e-13)


def test_horizon_delta_matches_the_filter_at_both_ends_and_within_23_percent() -> None:
    """1/(h + δ_T) against Σ_T(h) over eight decades of h (ηh < 1): equal at h → 0 and for
    ηhT ≫ 1, never below 0.77 of it in between (eq. horizondelta)."""
    eta, steps = 0.1, 500
    delta = horizon_delta(eta, steps)
    assert delta == 1.0 / 50.0
    hs = [10 ** (-8 + 8.9 * i / 399) for i in range(400)]
    ratios = [(1.0 / (h + delta)) / horizon_filter(h, eta, steps) for h in hs]
    assert min(ratios) > 0.765 and max(ratios) < 1.0 + 1e-6
    assert math.isclose(ratios[0], 1.0, rel_tol=1e-5) and math.isclose(
        ratios[-1], 1.0, rel_tol=3e-3
    )
    assert horizon_filter(0.0, eta, steps) == eta * steps and horizon_delta(eta, 0) == math.inf


@pytest.mark.parametrize("steps", [5, 50, 500])
def test_horizon_damped_hypergradient_is_near_the_truth_where_the_implicit_one_is_not(steps):
    """On a spectrum down to 1e-3 (flat directions the training does not converge along), the
    implicit hypergradient is far from dE(w_T)/dρ; the horizon-damped one is within 23 %."""
    q, eta = _Quadratic(), 0.2
    truth = q.unrolled(eta, steps)
    damped = q.filtered(lambda h: 1.0 / (h + horizon_delta(eta, steps)))
    implicit = q.filtered(lambda h: 1.0 / h)
    err = float((damped - truth).norm() / truth.norm())
    assert err < 0.23
    assert float((implicit - truth).norm() / truth.norm()) > 5 * err


def test_horizon_damping_through_the_adjoint_solver() -> None:
    """SIDHyperOptimizer with HorizonDamping(NoDamping()) solves α(H + δ_T)v = ∇₁E: its
    hypergradient is the closed form with 1/(h + δ_T), which anneals as T falls."""
    q, eta = _Quadratic(low=0.05), 0.2
    damping = HorizonDamping(NoDamping(), step_size=eta)
    hopt = SIDHyperOptimizer(
        [q.rho],
        [q.w],
        q.inner_loss,
        q.outer_loss,
        None,
        full_train_batch=0,
        config=SIDConfig(
            inner_steps=0,
            adjoint_steps=3000,
            step_size="constant",
            damping=damping,
            curvature=EstimatedCurvature(iters=10),
            batches=Batches(adjoint="full", d2="full"),
        ),
    )
    damping.observe(remaining_steps=40, step_size=None)
    assert damping.delta(None) == horizon_delta(eta, 40)
    g = hopt.hypergradient([0], None)
    assert math.isclose(hopt.delta, 1.0 / 8.0)
    expect = q.filtered(lambda h: 1.0 / (h + 1.0 / 8.0))
    torch.testing.assert_close(g[0], expect, rtol=1e-7, atol=1e-12)


def _horizon_solver_hopt(q: _Quadratic, solver: HorizonSolver) -> SIDHyperOptimizer:
    return SIDHyperOptimizer(
        [q.rho], [q.w], q.inner_loss, q.outer_loss, None, full_train_batch=0,
        config=SIDConfig(
            inner_steps=0, adjoint_solver=solver, damping=NoDamping(), step_size="constant",
            curvature=EstimatedCurvature(iters=10), batches=Batches(adjoint="full", d2="full"),
        ),
    )  # fmt: skip


@pytest.mark.parametrize("batches", [1, "full"])
@pytest.mark.parametrize("eta", [0.2, 0.45])
@pytest.mark.parametrize("steps", [1, 7, 60, 400])
def test_horizon_solver_is_the_derivative_through_the_remaining_steps(
    steps: int, eta, batches
) -> None:
    """HorizonSolver's hypergradient is dE(w_T)/dρ through the T remaining gradient steps
    (autograd through the unrolled steps), to rounding: Lanczos with as many steps as
    dimensions applies Σ_T exactly (eq. horizonsolve; at η = 0.45, ηh reaches 1.8, where the
    steps overshoot); T = ∞ is the implicit hypergradient."""
    q = _Quadratic()
    solver = HorizonSolver(batches=batches, iters=10, step_size=eta)
    solver.observe(remaining_steps=steps, step_size=None)
    (g,) = _horizon_solver_hopt(q, solver).hypergradient([0], None)
    torch.testing.assert_close(g, q.unrolled(eta, steps), rtol=1e-8, atol=1e-12)
    implicit = _horizon_solver_hopt(q, HorizonSolver(batches=1, iters=10))
    torch.testing.assert_close(implicit.hypergradient([0], None)[0], q.filtered(lambda h: 1 / h))


def test_horizon_solver_reads_negative_curvature_as_flat() -> None:
    """An indefinite Hessian: eigenvalues ≤ 0 get ηT (not the exponential growth of the unrolled
    steps); without a horizon the solve refuses, naming the fix."""
    q, eta, steps = _Quadratic(), 0.2, 30
    q.A = q.A - 0.5 * torch.eye(10, dtype=D)  # λ_min ≈ −0.5
    with torch.no_grad():
        q.w.copy_(q.w_star())  # the stationary point (a saddle)
    solver = HorizonSolver(batches=1, iters=10, steps=steps, step_size=eta)
    (g,) = _horizon_solver_hopt(q, solver).hypergradient([0], None)
    expect = q.filtered(lambda h: eta * steps if h <= 0 else horizon_filter(h, eta, steps))
    torch.testing.assert_close(g, expect, rtol=1e-8, atol=1e-12)
    with pytest.raises(DivergenceError, match="HorizonSolver"):
        _horizon_solver_hopt(q, HorizonSolver(batches=1, iters=10)).hypergradient([0], None)


def test_horizon_damping_observes_adds_to_its_base_and_caps() -> None:
    d = HorizonDamping(FixedDamping(0.3))
    assert d.delta(None) == 0.3  # nothing observed: the base alone
    d.observe(remaining_steps=100, step_size=0.05)
    assert math.isclose(d.delta(None), 0.3 + 1.0 / 5.0)
    d.observe(remaining_steps=10, step_size=float("nan"))  # a failed measurement keeps η
    assert math.isclose(d.delta(None), 0.3 + 2.0)
    d.observe(remaining_steps=0, step_size=None)
    assert d.delta(None) == 0.3 + d.max_delta
    d.observe(remaining_steps=None, step_size=None)  # unknown length: no horizon term
    assert d.delta(None) == 0.3
    half = HorizonDamping(FixedDamping(0.0), scale=0.5, step_size=0.1)
    half.observe(remaining_steps=20, step_size=7.0)  # the user's step size wins
    assert math.isclose(half.delta(None), 0.25)
    with pytest.raises(ConfigurationError, match="base must be a Damping"):
        HorizonDamping(0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="scale"):
        HorizonDamping(scale=-1.0)


class _Net(pl.LightningModule):
    """A user's module: a tanh MLP on the ridge data, plain SGD (its step size is its lr)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D_RIDGE, 8, dtype=D), torch.nn.Tanh(), torch.nn.Linear(8, 1, dtype=D)
        )
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_the_callback_tells_the_horizon_the_remaining_steps_and_the_measured_step_size():
    """max_steps = 30, a hyper step every 10: the damping sees T = 20, 10, 0 and η̂ = lr (plain
    SGD moves w by exactly lr·g, the decay's term included), and δ anneals upward."""
    seen: list[tuple[int | None, float | None]] = []

    class Recording(HorizonDamping):
        def observe(self, remaining_steps, step_size):
            seen.append((remaining_steps, step_size))
            super().observe(remaining_steps, step_size)

    damping = Recording(FixedDamping(0.0))
    cb = LearnedWeightDecay(1e-2, every_n_steps=10, damping=damping, max_overhead=None)
    deltas = []
    trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
    original = cb._hyper_step

    def hyper_step(trainer, module):
        original(trainer, module)
        deltas.append(cb.sid.delta)

    cb._hyper_step = hyper_step
    trainer.fit(_Net(lr=0.05), datamodule=RidgeData())
    assert [r for r, _ in seen] == [20, 10, 0]
    for _, eta in seen:
        assert math.isclose(eta, 0.05, rel_tol=1e-9)
    assert math.isclose(deltas[0], 1.0 / (0.05 * 20), rel_tol=1e-9)
    assert math.isclose(deltas[1], 1.0 / (0.05 * 10), rel_tol=1e-9)
    assert deltas[2] == damping.max_delta  # the last step: nothing left to look ahead to


def test_the_callback_tells_the_horizon_solver_the_remaining_steps():
    """The adjoint solver hears T and η as the damping does (HorizonSolver on the drop-in)."""
    solver = HorizonSolver(batches=1, iters=3)
    seen: list[tuple[int | None, float | None]] = []
    original = solver.observe

    def observe(remaining_steps, step_size):
        seen.append((remaining_steps, step_size))
        original(remaining_steps, step_size)

    object.__setattr__(solver, "observe", observe)
    cb = LearnedWeightDecay(
        1e-2, every_n_steps=10, adjoint_solver=solver, damping=NoDamping(), max_overhead=None
    )
    trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
    trainer.fit(_Net(lr=0.05), datamodule=RidgeData())
    assert [r for r, _ in seen] == [20, 10, 0]
    assert all(math.isclose(eta, 0.05, rel_tol=1e-9) for _, eta in seen)
    assert solver.remaining_steps == 0 and len(cb.history) == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batches": 0},
        {"batches": "half"},
        {"chunk": 0},
        {"iters": 0},
        {"fraction": 0.0},
        {"step_size": -1.0},
        {"steps": -1},
    ],
)
def test_horizon_solver_refuses_bad_settings(kwargs) -> None:
    with pytest.raises(ConfigurationError, match="HorizonSolver"):
        HorizonSolver(**kwargs)


def test_horizon_solver_fraction_shortens_the_look_ahead() -> None:
    """``fraction`` looks ahead over that share of the remaining steps: the unrolled truth at
    round(fraction·T)."""
    q, eta = _Quadratic(), 0.2
    solver = HorizonSolver(batches=1, iters=10, step_size=eta, fraction=0.25)
    solver.observe(remaining_steps=240, step_size=None)
    (g,) = _horizon_solver_hopt(q, solver).hypergradient([0], None)
    torch.testing.assert_close(g, q.unrolled(eta, 60), rtol=1e-8, atol=1e-12)


class _RMSpropNet(_Net):
    """An optimizer whose step size is not read from its state: the callback measures it."""

    def configure_optimizers(self):
        return torch.optim.RMSprop(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("net, probed", [(_Net, False), (_RMSpropNet, True)])
def test_the_step_size_is_measured_only_where_the_optimizer_gives_no_reading(net, probed):
    """SGD's η is read from the optimizer (no copy of the weights per hyper step); RMSprop's is
    the one-step response measured on the update before each hyper step."""
    seen: list[float | None] = []
    probes: list[bool] = []

    class Recording(HorizonDamping):
        def observe(self, remaining_steps, step_size):
            seen.append(step_size)
            super().observe(remaining_steps, step_size)

    cb = LearnedWeightDecay(
        1e-2, every_n_steps=10, damping=Recording(FixedDamping(0.0)), max_overhead=None
    )

    def after_step(optimizer, args, kwargs):  # the probe spans the update (session 56: taken
        probes.append(cb._step_probe is not None)  # inside the step, after the clip and decay)

    trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
    handle = register_optimizer_step_post_hook(after_step)
    try:
        trainer.fit(net(lr=0.05), datamodule=RidgeData())
    finally:
        handle.remove()
    assert len(seen) == 3 and all(eta is not None and eta > 0 for eta in seen)
    assert any(probes) is probed


# ---------------------------------------------------------------- η of momentum and Adam
def _unrolled_heavy_ball(q: _Quadratic, lr: float, mu: float, steps: int) -> torch.Tensor:
    """dE(w_T)/dρ through T steps of torch's SGD(momentum=μ) from w* (buffer 0): the truth."""
    rho = q.rho.detach().clone().requires_grad_()
    w, buf = q.w_star(), torch.zeros_like(q.b)
    for _ in range(steps):
        buf = mu * buf + q.grad_w(w, rho)
        w = w - lr * buf
    (g,) = torch.autograd.grad(0.5 * ((w - q.c) ** 2).sum(), rho)
    return g


@pytest.mark.parametrize("steps", [50, 200, 1000])
def test_heavy_ball_horizon_needs_the_effective_step_size(steps: int) -> None:
    """SGD with momentum 0.9 moves a flat direction lr/(1 − μ) per step: with that η (read from
    the optimizer) the horizon-damped hypergradient is within 23 % of the unrolled heavy-ball
    one once T(1 − μ) ≥ 5; with the bare lr it is 80–90 % off (δ_T ten times too large)."""
    q, lr, mu = _Quadratic(), 0.02, 0.9
    opt = torch.optim.SGD([torch.zeros(3, dtype=D, requires_grad=True)], lr=lr, momentum=mu)
    eta = effective_step_size([opt])
    assert eta is not None and math.isclose(eta, lr / (1 - mu), rel_tol=1e-12)
    truth = _unrolled_heavy_ball(q, lr, mu, steps)

    def err(step: float) -> float:
        damped = q.filtered(lambda h: 1.0 / (h + horizon_delta(step, steps)))
        return float((damped - truth).norm() / truth.norm())

    assert err(eta) < 0.23
    assert err(lr) > 0.75 and err(lr) > 3 * err(eta)


def _steady_step_per_unit_gradient(opt: torch.optim.Optimizer, p: torch.Tensor,
                                   g: torch.Tensor, steps: int = 300) -> torch.Tensor:  # fmt: skip
    """Run the optimizer on a constant gradient g; the last step's move per unit of g."""
    for _ in range(steps):
        before = p.detach().clone()
        p.grad = g.clone()
        opt.step()
    return (before - p.detach()) / g


def test_effective_step_size_is_the_steady_response_of_sgd_and_adam() -> None:
    """The η read from the optimizer's settings and state is what a real torch optimizer moves
    per step under a persistent gradient: heavy ball lr(1 − d)/(1 − μ); Adam per coordinate
    lr/(√v̂ + ε), pooled with weights v̂ = g² (float64, 300 steps of a constant gradient)."""
    g = torch.tensor([1e-3, 0.02, 0.5, 3.0], dtype=D)
    for mu, damp in ((0.9, 0.0), (0.5, 0.3), (0.0, 0.0)):
        p = torch.zeros(4, dtype=D, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.01, momentum=mu, dampening=damp)
        steady = _steady_step_per_unit_gradient(opt, p, g)
        eta = effective_step_size([opt])
        assert eta is not None
        torch.testing.assert_close(steady, torch.full_like(g, eta), rtol=1e-9, atol=0)
    p = torch.zeros(4, dtype=D, requires_grad=True)
    adam = torch.optim.Adam([p], lr=1e-3, eps=1e-8)
    assert effective_step_size([adam]) is None  # no second moment before the first step
    steady = _steady_step_per_unit_gradient(adam, p, g)
    pooled = float((g**2 * steady).sum() / (g**2).sum())
    eta = effective_step_size([adam])
    assert eta is not None and math.isclose(eta, pooled, rel_tol=1e-6)
    rms = torch.optim.RMSprop([torch.zeros(2, requires_grad=True)], lr=0.1)
    assert effective_step_size([rms]) is None  # not read: the callback measures it instead
