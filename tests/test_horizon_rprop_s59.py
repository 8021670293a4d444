"""HorizonRprop (session 59): ShrinkFallRprop's move in log λ scaled by the share of the fit a
change of λ can still act on, s_t = (1 − e^(−R_t/(τR₁))) / (1 − e^(−1/τ)) (eq. horizonscale)."""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import lightning_problems as lp
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import D, ridge_data
from test_reach_rprop_s57 import _steps  # one hyper step per (g, R)
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, LearnedWeightDecay
from hypertorch_sid.core.outer_step import HorizonRprop, ShrinkFallRprop, horizon_scale

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval.*"),
    pytest.mark.filterwarnings("ignore:.*hyper steps.*barely move.*"),
]

f64 = torch.float64


def test_horizon_scale_closed_form():
    """1 at R₁, 0 at the end, (1 − e^(−1))/(1 − e^(−4)) with a quarter left at τ = 0.25, R_t/R₁
    at τ = ∞, capped at 1 past R₁."""
    assert horizon_scale(400, 400, 0.25) == pytest.approx(1.0, rel=1e-15)
    assert horizon_scale(0, 400, 0.25) == 0.0
    assert horizon_scale(100, 400, 0.25) == pytest.approx(
        (1 - math.exp(-1)) / (1 - math.exp(-4)), rel=1e-14
    )
    assert horizon_scale(40, 400, 0.25) == pytest.approx(
        (1 - math.exp(-0.4)) / (1 - math.exp(-4)), rel=1e-14
    )
    assert horizon_scale(100, 400, math.inf) == 0.25
    assert horizon_scale(500, 400, 0.25) == 1.0


def test_a_held_sign_moves_by_the_scaled_rprop_steps():
    """R = 200, 180, …, 20 with the sign held ("more decay"): Δ_t = Δ₀ η₊^(t−1) (clipped at
    Δ_max) as Rprop's, and ρ moves by s_t Δ_t at each step; ShrinkFallRprop's ρ by Δ_t."""
    lefts = list(range(200, 0, -20))
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = HorizonRprop([rho], lr=0.1, step_sizes=(0.01, 2.0), trust=math.inf, memory=0.25)
    path = _steps(opt, rho, [-1.0] * len(lefts), lefts)
    sizes = [min(0.1 * 1.2**t, 2.0) for t in range(len(lefts))]
    scales = [(1 - math.exp(-r / 50)) / (1 - math.exp(-4)) for r in lefts]
    expected = [
        sum(s * d for s, d in zip(scales[: k + 1], sizes[: k + 1])) for k in range(len(lefts))
    ]
    assert path == pytest.approx(expected, rel=1e-12)
    assert float(opt.state[rho]["step_size"][0]) == pytest.approx(sizes[-1], rel=1e-12)
    plain_rho = torch.zeros(1, dtype=f64, requires_grad=True)
    plain = ShrinkFallRprop([plain_rho], lr=0.1, trust=math.inf)
    full = _steps(plain, plain_rho, [-1.0] * len(lefts), lefts)
    assert full[-1] == pytest.approx(sum(sizes), rel=1e-12)
    assert path[-1] < 0.75 * full[-1]  # the late steps are the ones cut


def test_a_flip_stops_and_halves_as_rprop():
    """A flip: no move, Δ ← Δ η₋ (unscaled); the next agreeing step moves s_t Δ."""
    lefts = [100, 80, 60, 40]
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = HorizonRprop([rho], lr=0.2, trust=math.inf, memory=0.5)
    path = _steps(opt, rho, [-1.0, 1.0, 1.0, 1.0], lefts)
    s = [(1 - math.exp(-r / 50)) / (1 - math.exp(-2)) for r in lefts]
    assert path[0] == pytest.approx(0.2 * s[0], rel=1e-12)
    assert path[1] == path[0]  # the flip: λ held
    assert path[2] == pytest.approx(path[1] - 0.1 * s[2], rel=1e-12)
    assert path[3] == pytest.approx(path[2] - 0.12 * s[3], rel=1e-12)


def test_unobserved_it_is_shrink_fall_rprop_bit_for_bit():
    grads = [-1.0, -1.0, 1.0, -1.0, -1.0, -1.0]
    a = torch.zeros(2, dtype=f64, requires_grad=True)
    b = torch.zeros(2, dtype=f64, requires_grad=True)
    assert _steps(HorizonRprop([a]), a, grads, [None] * 6) == _steps(
        ShrinkFallRprop([b]), b, grads, [None] * 6
    )


def test_no_move_at_the_end_and_trust_binding_keeps_rprops_size():
    """R = 0: s = 0, ρ stays. Where eq. decaytrust binds, Δ becomes the move made / s_t, so
    the next step is η₊ times what Rprop's bound step would be (not scaled twice)."""
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = HorizonRprop([rho], lr=0.5, trust=math.inf)
    assert _steps(opt, rho, [-1.0, -1.0], [100, 0]) == [pytest.approx(0.5, rel=1e-12)] * 2
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = HorizonRprop([rho], lr=1.0, step_sizes=(1e-4, 2.0), trust=0.1, memory=0.25)
    opt.observe(100, 1e-12)  # first step s = 1 (R₁ = 100), the bound far off
    rho.grad = torch.full_like(rho, -1.0)
    opt.step()
    rho0 = float(rho.detach()[0])
    opt.observe(50, 1.0)  # δ/(ηR) = 0.1/50: the rise of λ is held
    rho.grad = torch.full_like(rho, -1.0)
    opt.step()
    assert opt.bound
    top = math.log(math.exp(rho0) + 0.1 / 50)
    assert float(rho.detach()[0]) == pytest.approx(top, rel=1e-12)
    s = (1 - math.exp(-2)) / (1 - math.exp(-4))
    assert float(opt.state[rho]["step_size"][0]) == pytest.approx((top - rho0) / s, rel=1e-9)


def test_the_first_horizon_is_kept_in_the_state():
    """R₁ is saved with the state: a twin loaded mid-fit scales as the original."""
    lefts = [200, 150, 100, 50, 25]
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = HorizonRprop([rho], trust=math.inf)
    _steps(opt, rho, [-1.0] * 2, lefts[:2])
    twin_rho = rho.detach().clone().requires_grad_(True)
    twin = HorizonRprop([twin_rho], trust=math.inf)
    twin.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert _steps(opt, rho, [-1.0] * 3, lefts[2:]) == _steps(twin, twin_rho, [-1.0] * 3, lefts[2:])
    assert twin.scale == pytest.approx(horizon_scale(25, 200, 0.25), rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -0.25, math.nan, "0.25", True, None])
def test_a_bad_memory_is_named(bad):
    with pytest.raises(ConfigurationError, match="memory"):
        HorizonRprop([torch.zeros(1, requires_grad=True)], memory=bad)


class _Plain(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, 1, bias=False, dtype=f64)
        torch.nn.init.zeros_(self.lin.weight)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.lin(x).squeeze(-1) - y) ** 2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Recording(HorizonRprop):
    seen: list[tuple[int, float]] = []

    def observe(self, remaining_steps: int | None, eta: float | None) -> None:
        super().observe(remaining_steps, eta)
        self._seen_left = remaining_steps

    def step(self, closure=None):  # type: ignore[override]
        out = super().step(closure)
        _Recording.seen.append((self._seen_left, self.scale))
        return out


def test_the_drop_in_takes_it_and_scales_by_the_steps_left():
    """LearnedWeightDecay(outer_optimizer=partial(HorizonRprop, …)) on a ridge fit: each hyper
    step's s_t is eq. horizonscale of the steps the callback reported, from 1 down."""
    _Recording.seen = []
    X, y, Xv, yv = ridge_data(n=120, n_val=60)
    train = DataLoader(TensorDataset(X, y), batch_size=20)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=30)
    cb = LearnedWeightDecay(
        1e-2, granularity="global", every_n_steps=3, adjoint_steps=3, max_overhead=None,
        outer_optimizer=functools.partial(_Recording, lr=0.3, memory=0.25),
    )  # fmt: skip
    lp.trainer([cb], max_epochs=5, limit_val_batches=0).fit(_Plain(), train, val)
    seen = _Recording.seen
    assert len(seen) >= 5
    first = seen[0][0]
    assert seen[0][1] == pytest.approx(1.0)
    for left, scale in seen:
        assert scale == pytest.approx(horizon_scale(left, first, 0.25), rel=1e-12)
    assert seen[-1][1] < 0.3
