"""ShrinkFallRprop (session 52): the first fall of λ sized by the decay's own shrink of the weights
(eqs. shrinkrate, shrinkshare, shrinkfall in ``hypertorch_sid.core.outer_step``)."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import trainer
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, LearnedWeightDecay
from hypertorch_sid.core.outer_step import (
    ReachRprop,
    ShrinkFallRprop,
    ShrinkReading,
    TrustRprop,
    shrink_floor,
    shrink_share,
)

f64 = torch.float64


def _sgd(eta: float, n: int = 10) -> ShrinkReading:
    return ShrinkReading(torch.full((n,), 0.5, dtype=f64), gain=eta)


def test_shrink_share_and_floor_of_a_uniform_rate_are_closed_form():
    """SGD: s_i = ηλ for every element, S(λ) = 1 − exp(−ηλR), and the floor is
    λ_f = −log(1 − δ)/(ηR): η = 1, R = 100, λ = 1e-2 → S = 1 − e⁻¹, λ_f = 1.0536e-3."""
    r = [_sgd(1.0)]
    assert shrink_share(r, 1e-2, 100) == pytest.approx(1 - math.exp(-1.0), rel=1e-12)
    floor = shrink_floor(r, 1e-2, 100, trust=0.1, max_fall=5.0)
    assert floor == pytest.approx(math.log(-math.log(0.9) / 100), abs=1e-3)
    assert shrink_share(r, math.exp(floor), 100) <= 0.1  # the floor is on the safe side
    # S(λ) ≤ δ: no floor; a fall past max_fall: the cap
    assert shrink_floor(r, 1e-4, 100, trust=0.1, max_fall=5.0) == -math.inf
    assert shrink_floor([_sgd(1e4)], 1e-2, 100, 0.1, 5.0) == pytest.approx(math.log(1e-2) - 5)


def test_adams_rate_is_lr_per_step_where_the_data_do_not_move_a_weight():
    """Adam with σ = 0 (only the decay in v̂): s = lr λ/(λ|w| + ε) ≈ lr/|w| whatever λ, until
    λ|w| nears ε; with σ ≫ λ|w| it is lr λ/σ. Elements are averaged in S."""
    w = torch.tensor([0.01, 0.01], dtype=f64)
    idle = ShrinkReading(w, data_sq=torch.zeros(2, dtype=f64), lr=1e-3, eps=1e-8)
    assert idle.rate(1e-4) == pytest.approx(torch.full((2,), 1e-3 * 1e-4 / (1e-6 + 1e-8)))
    assert float(idle.rate(1e-2)[0]) == pytest.approx(0.1, rel=2e-4)  # ≈ lr/|w|
    busy = ShrinkReading(w, data_sq=torch.full((2,), 1e-4, dtype=f64), lr=1e-3, eps=1e-8)
    assert float(busy.rate(1e-4)[0]) == pytest.approx(1e-3 * 1e-4 / 1e-2, rel=1e-4)
    both = [idle, busy]
    R = 50
    expected = 0.5 * (-math.expm1(-R * float(idle.rate(1e-4)[0]))) + 0.5 * (
        -math.expm1(-R * float(busy.rate(1e-4)[0]))
    )
    assert shrink_share(both, 1e-4, R) == pytest.approx(expected, rel=1e-12)


def _steps(opt, rho, grads, readings=None, remaining=100):
    out = []
    for g in grads:
        opt.observe(remaining, 1.0)
        if readings is not None:
            opt.observe_shrink(remaining, {0: readings})
        rho.grad = g.clone()
        opt.step()
        out.append(rho.detach().clone())
    return out


def test_the_first_fall_goes_to_the_floor_then_steps_are_trust_rprops():
    """Two slots, λ = 1e-2, R = 100, g = +1 ("less decay") twice. Slot 0 shrinks at η = 1
    (S = 0.63 > δ): its first step lands on log(1.0536e-3) (2.25 below, not Rprop's 0.3); at the
    second, S at the floor is ≤ δ and the step is Rprop's 0.36. Slot 1 (η = 1e-3, S = 0.001) is
    TrustRprop's throughout."""
    rho = torch.full((2,), math.log(1e-2), dtype=f64, requires_grad=True)
    opt = ShrinkFallRprop([rho])
    readings = [[_sgd(1.0)], [_sgd(1e-3)]]
    g = torch.ones(2, dtype=f64)
    first, second = _steps(opt, rho, [g, g], readings)
    assert float(first[0]) == pytest.approx(math.log(-math.log(0.9) / 100), abs=1e-3)
    assert float(first[1]) == pytest.approx(math.log(1e-2) - 0.3, abs=1e-12)
    assert float(second[0]) == pytest.approx(float(first[0]) - 0.36, abs=1e-12)
    assert float(second[1]) == pytest.approx(math.log(1e-2) - 0.66, abs=1e-12)
    assert opt.fell == []  # the second step: no floor below ρ


def test_after_a_rise_a_fall_is_trust_rprops_and_without_readings_it_is_trust_rprop():
    """Eq. shrinkfall acts only while a slot has only fallen: g = −1 (a rise), then +1 (a flip:
    no move), then +1 with S ≫ δ — Rprop's step, not the floor. Unobserved, every step equals
    TrustRprop's bit for bit."""
    grads = [torch.tensor([s], dtype=f64) for s in (-1.0, 1.0, 1.0, 1.0)]
    rho = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    fall = _steps(ShrinkFallRprop([rho]), rho, grads, [[_sgd(1e3)]])
    ref_rho = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    ref = _steps(TrustRprop([ref_rho]), ref_rho, grads)
    assert torch.equal(torch.stack(fall), torch.stack(ref))
    rho2 = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    g = [torch.ones(1, dtype=f64)] * 5
    ref_rho2 = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    assert torch.equal(
        torch.stack(_steps(ShrinkFallRprop([rho2]), rho2, g)),
        torch.stack(_steps(TrustRprop([ref_rho2]), ref_rho2, g)),
    )


def test_the_fall_is_capped_by_max_fall_and_bad_values_are_named():
    rho = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    opt = ShrinkFallRprop([rho], max_fall=2.0)
    (out,) = _steps(opt, rho, [torch.ones(1, dtype=f64)], [[_sgd(1e6)]])
    assert float(out[0]) == pytest.approx(math.log(1e-2) - 2.0, abs=1e-12)
    assert opt.fell == [0] and "max_fall=2.0" in repr(opt)
    for bad in (0.0, -1.0, math.inf, True):
        with pytest.raises(ConfigurationError, match="max_fall"):
            ShrinkFallRprop([rho], max_fall=bad)


def test_a_resumed_state_keeps_which_slots_rose():
    rho = torch.full((1,), math.log(1e-2), dtype=f64, requires_grad=True)
    opt = ShrinkFallRprop([rho])
    _steps(opt, rho, [torch.tensor([-1.0], dtype=f64)], [[_sgd(1e3)]])
    again = ShrinkFallRprop([rho])
    again.load_state_dict(opt.state_dict())
    assert not again.wants_shrink()  # the one slot has risen: no readings needed
    rho.grad = torch.ones(1, dtype=f64)
    again.observe(100, 1.0)
    again.step()  # torch casts the loaded state to ρ's dtype: still a step, not a TypeError
    assert not again.wants_shrink()


class _Bag(pl.LightningModule):
    """A bag of words: 200 inputs, each sample has 3 of them; Adam, as the 20 Newsgroups MLP."""

    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.net = torch.nn.Sequential(torch.nn.Linear(200, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 3))  # fmt: skip

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _bag_fit(optimizer: str, outer) -> LearnedWeightDecay:
    g = torch.Generator().manual_seed(0)
    X = torch.zeros(256, 200)
    X.scatter_(1, torch.randint(0, 200, (256, 3), generator=g), 1.0)
    y = torch.randint(0, 3, (256,), generator=g)
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(1e-4, every_n_steps=4, max_overhead=None, outer_optimizer=outer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(callbacks=[cb], max_epochs=3).fit(
            _Bag(optimizer),
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    return cb


class _Recording(ShrinkFallRprop):
    """Keeps S(λ) per slot as observed before each hyper step, and the slots eq. shrinkfall
    lowered."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.shares: list[list[float]] = []
        self.falls: list[list[int]] = []

    def observe_shrink(self, remaining_steps, readings):
        lam = self.param_groups[0]["params"][0].detach().exp().tolist()
        self.shares.append([shrink_share(r, x, remaining_steps) for r, x in zip(readings[0], lam)])
        super().observe_shrink(remaining_steps, readings)

    def step(self, closure=None):
        out = super().step(closure)
        self.falls.append(list(self.fell))
        return out


def test_through_the_drop_in_adam_reads_a_large_share_and_sgd_is_trust_rprop():
    """Adam on a bag of words (200 inputs, 3 a sample): the first layer's idle weights are moved
    by about lr per step by the decay, and the callback reads S(1e-4) > δ for it (the output
    layer, dense, far less). With SGD at λ₀ = 1e-4 (S = ηλR = 0.5·1e-4·18 ≪ δ) no floor binds
    and λ is TrustRprop's to the last bit."""
    adam = _bag_fit("adam", _Recording)
    first = adam.sid.outer_optimizer.shares[0]
    assert first[0] > 0.1 and first[1] < 0.01
    sgd = _bag_fit("sgd", _Recording)
    assert not any(sgd.sid.outer_optimizer.falls)
    assert all(s <= 0.1 for shares in sgd.sid.outer_optimizer.shares for s in shares)
    ref = _bag_fit("sgd", functools.partial(TrustRprop, lr=0.3, step_sizes=(0.01, 2.0)))
    assert type(ref.sid.outer_optimizer) is TrustRprop
    drop_in = _bag_fit("sgd", None)  # ReachRprop, the default since session 57 (wd57-rule.txt)
    assert type(drop_in.sid.outer_optimizer) is ReachRprop
    for name, value in ref.decay_values().items():
        assert torch.equal(sgd.decay_values()[name], value)


class _Counted(list):
    """Per slot readings that count their lookups (as the callback's lazy ShrinkReadings)."""

    def __init__(self, slots):
        super().__init__(slots)
        self.looked_up: list[int] = []

    def __getitem__(self, k):
        self.looked_up.append(k)
        return super().__getitem__(k)


def test_the_step_looks_up_only_slots_still_descending_with_less_decay():
    """g = (+1, −1, +1): slot 0 falls (looked up, eq. shrinkfall), slot 1 rises (not looked up),
    slot 2 falls; next step slot 1 has risen (never looked up again), slots 0 and 2 are."""
    rho = torch.full((3,), math.log(1e-2), dtype=f64, requires_grad=True)
    opt = ShrinkFallRprop([rho])
    g = torch.tensor([1.0, -1.0, 1.0], dtype=f64)
    for expected in ([0, 2], [0, 2]):
        readings = _Counted([[_sgd(1.0)], [_sgd(1.0)], [_sgd(1e-3)]])
        opt.observe(100, 1.0)
        opt.observe_shrink(100, {0: readings})
        rho.grad = g.clone()
        opt.step()
        assert readings.looked_up == expected


def test_readings_are_taken_only_where_the_fall_may_act_and_never_per_element_for_sgd():
    """The callback's readings are lazy (session 52, wd52b): an SGD MLP's shrink is in closed
    form (one gain per tensor), so a whole fit takes no per-element reading of the optimizers'
    state; Adam's are taken only for slots the outer step looks up, each slot once per hyper
    step. On the Adam bag of words the first hypergradient says "more decay" for both layers
    (λ rises, no slot descends after): no reading at all, where reading every slot before each
    hyper step (the recording) took 4 — and λ comes out the same."""
    sgd = _bag_fit("sgd", ShrinkFallRprop)
    assert sgd.problem.shrink.reads == 0
    readings = sgd.problem.shrink.readings()
    assert len(readings) == 2 and all(r.weight is None for slot in readings for r in slot)
    assert sgd.problem.shrink.reads == 0
    adam = _bag_fit("adam", ShrinkFallRprop)
    assert adam.problem.shrink.reads == 0
    lazy = adam.problem.shrink.readings()
    lazy[1]
    lazy[1]
    assert adam.problem.shrink.reads == 2  # slot 1's weight and bias, once
    eager = _bag_fit("adam", _Recording)
    assert eager.problem.shrink.reads == 4
    for name, value in eager.decay_values().items():
        assert torch.equal(adam.decay_values()[name], value)
