"""The outer steps on log λ: SignalGatedAdam (Adam gated by the t-statistic of the recent
hypergradients) and TrustRprop (Rprop with the rise of λ held to what the next hyper step can
judge, eq. decaytrust).

Known answers: the squared weights of a bias-corrected average (eq. effw) against a brute-force
sum; κ = 0 is Adam bit for bit; a constant hypergradient, however small, moves ρ at Adam's rate
after the first hyper step; pure-noise hypergradients leave ρ within a bound far inside Adam's
random walk; the state resumes exactly. Then a small CNN + BatchNorm through the drop-in.
TrustRprop: torch's Rprop bit for bit where the trust bound does not bind; the λ path of a
constant hypergradient (geometric, then arithmetic once bound); a sign flip answered at the
next step where Adam keeps going; noise a bounded walk; resume; an MLP and a CNN + BN through
the drop-in.
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import trainer
from test_scale_invariance import CNN, _data
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    LearnedWeightDecay,
    SignalGatedAdam,
    TrustRprop,
    TrustShrinkageStep,
)
from hypertorch_sid.core.outer_step import effective_weight
from hypertorch_sid.core.watch import warn_if_lambda_stuck

f64 = torch.float64


def _run(opt_of, grads, start=0.0):
    """ρ after each of ``grads`` (a list of tensors) fed to ``opt_of([ρ])``."""
    rho = torch.full_like(grads[0], start).requires_grad_(True)
    opt = opt_of([rho])
    out = []
    for g in grads:
        rho.grad = g.clone()
        opt.step()
        out.append(rho.detach().clone())
    return torch.stack(out), opt


@pytest.mark.parametrize("beta", [0.5, 0.9, 0.99])
def test_effective_weight_is_the_sum_of_squared_weights(beta):
    for t in (1, 2, 5, 40, 400):
        w = [(1 - beta) * beta ** (t - s) / (1 - beta**t) for s in range(1, t + 1)]
        assert math.fsum(w) == pytest.approx(1.0, rel=1e-12)
        assert effective_weight(beta, t) == pytest.approx(math.fsum(x * x for x in w), rel=1e-10)
    assert effective_weight(beta, 1) == 1.0
    assert effective_weight(beta, 10_000) == pytest.approx((1 - beta) / (1 + beta), rel=1e-9)


def test_kappa_zero_is_adam_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(4, generator=g, dtype=f64) * 10.0 ** (-i % 7) for i in range(30)]
    adam, _ = _run(lambda p: torch.optim.Adam(p, lr=0.3), grads)
    gated, _ = _run(lambda p: SignalGatedAdam(p, lr=0.3, kappa=0.0), grads)
    assert torch.equal(adam, gated)


@pytest.mark.parametrize("size", [1e-8, 1e-2, 3.0])
def test_a_consistent_signal_moves_at_adams_rate_after_three_steps(size):
    """Constant g: the first three steps are held (ν ≤ 2: too few values to judge), then
    c = 1 and each step is Adam's, lr · m̂/√v̂ = lr (eps = 0: the test is of the gate, not of
    Adam's eps)."""
    grads = [torch.full((3,), size, dtype=f64)] * 12
    rho, opt = _run(lambda p: SignalGatedAdam(p, lr=0.3, eps=0.0), grads)
    assert torch.equal(rho[2], torch.zeros(3, dtype=f64))
    steps = rho[3:] - rho[2:-1]
    torch.testing.assert_close(steps, torch.full_like(steps, -0.3), rtol=1e-9, atol=0)
    assert opt.last_gate == pytest.approx(1.0, abs=1e-12) and not opt.held_back
    # with noise of a tenth of the signal the gate is open within a few hyper steps
    gen = torch.Generator().manual_seed(1)
    noisy = [size * (1 + 0.1 * torch.randn(3, generator=gen, dtype=f64)) for _ in range(12)]
    rho, opt = _run(lambda p: SignalGatedAdam(p, lr=0.3, eps=0.0), noisy)
    assert opt.last_gate > 0.95
    assert float(rho[-1].max()) < -0.3 * 8


def test_pure_noise_leaves_rho_within_a_bound():
    """g_t ~ N(0, σ²) i.i.d., 200 hyper steps, 64 independent entries: Adam's ρ walks about
    lr · √200 ≈ 4 (unit-size steps of random sign); the gated ρ stays within 2 of its start
    on every entry at every step, with an rms displacement below 0.15 of Adam's (0.11
    measured; seeds 0-3: 0.10-0.16)."""
    gen = torch.Generator().manual_seed(2)
    grads = [1e-6 * torch.randn(64, generator=gen, dtype=f64) for _ in range(200)]
    adam, _ = _run(lambda p: torch.optim.Adam(p, lr=0.3), grads)
    gated, opt = _run(lambda p: SignalGatedAdam(p, lr=0.3), grads)
    rms = lambda x: float(x.pow(2).mean().sqrt())  # noqa: E731
    assert rms(adam[-1]) > 3.0
    assert float(gated.abs().max()) < 2.0
    assert rms(gated[-1]) < 0.15 * rms(adam[-1])
    assert opt.last_gate < 0.1


def test_the_first_steps_are_held_and_say_so():
    rho = torch.zeros(2, requires_grad=True)
    opt = SignalGatedAdam([rho])
    for _ in range(3):
        rho.grad = torch.tensor([1.0, -1.0])
        opt.step()
    assert torch.equal(rho.detach(), torch.zeros(2)) and opt.held_back and opt.last_gate == 0.0


def test_a_held_step_is_not_reported_as_stuck():
    rho = torch.zeros(1, requires_grad=True)
    opt = SignalGatedAdam([rho])
    rho.grad = torch.ones(1)
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_lambda_stuck([torch.zeros(1)], [rho.detach()], [torch.ones(1)], opt)


def test_resume_from_the_state_dict_equals_a_straight_run():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(5, generator=gen, dtype=f64) + 0.5 for _ in range(20)]
    straight, _ = _run(lambda p: SignalGatedAdam(p, lr=0.1), grads)
    first, opt = _run(lambda p: SignalGatedAdam(p, lr=0.1), grads[:8])
    rho = first[-1].clone().requires_grad_(True)
    resumed = SignalGatedAdam([rho], lr=0.1)
    resumed.load_state_dict(opt.state_dict())
    for g in grads[8:]:
        rho.grad = g.clone()
        resumed.step()
    assert torch.equal(rho.detach(), straight[-1])


def test_bad_settings_name_the_cause():
    p = [torch.zeros(1, requires_grad=True)]
    for kw, match in (({"lr": 0.0}, "lr"), ({"kappa": -1.0}, "kappa"), ({"kappa": math.nan}, "kappa"),
                      ({"betas": (0.9, 1.0)}, r"betas\[1\]"), ({"eps": -1.0}, "eps"),
                      ({"betas": (0.0, 0.999)}, "never open")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=match):
            SignalGatedAdam(p, **kw)
    SignalGatedAdam(p, betas=(0.0, 0.999), kappa=0.0)  # Adam with β₁ = 0 is fine


# ====================================================================== a real CNN + BatchNorm
def test_on_a_cnn_with_batchnorm_lambda_moves_no_further_than_adam():
    """A conv+BN network, 12 hyper steps from λ₀ = 1e-3: the gated step is Adam's scaled by
    c ∈ [0, 1], so no log λ moves more than lr per hyper step after the held ones, and on
    average less than Adam's (measured |Δ log λ|: conv1 / BN1 / conv2 1.8 / 1.9 / 1.0 against
    Adam's 3.2 / 3.4 / 2.3; BN2 and the output layer 0.02 against 1.6 / 1.9); λ stays finite."""
    X, y = _data()
    moved = {}
    for name, kw in (
        ("adam", {"outer_lr": 0.3}),
        ("gated", {"outer_optimizer": functools.partial(SignalGatedAdam, lr=0.3)}),
    ):
        pl.seed_everything(0, verbose=False)
        cb = LearnedWeightDecay(1e-3, every_n_steps=2, max_overhead=None, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer(callbacks=[cb], max_epochs=4).fit(
                CNN(),
                DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
                DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
            )
        assert cb.sid is not None and cb.sid.hyper_step >= 10
        lam = torch.stack([v.mean() for v in cb.decay_values().values()])
        assert bool(torch.isfinite(lam).all())
        moved[name] = (lam / 1e-3).log().abs()
        if name == "gated":
            opt = cb.sid.outer_optimizer
            assert isinstance(opt, SignalGatedAdam) and 0.0 <= opt.last_gate <= 1.0
    assert float(moved["gated"].max()) <= 0.3 * (cb.sid.hyper_step - 3) + 1e-6
    assert float(moved["gated"].mean()) < float(moved["adam"].mean())


# ====================================================================== TrustRprop
def _observed_run(opt_of, grads, start=0.0, remaining=None, eta=None):
    """As ``_run``, calling ``observe(remaining[i], eta)`` before step i."""
    rho = torch.full_like(grads[0], start).requires_grad_(True)
    opt = opt_of([rho])
    out = []
    for i, g in enumerate(grads):
        if remaining is not None:
            opt.observe(remaining[i], eta)
        rho.grad = g.clone()
        opt.step()
        out.append(rho.detach().clone())
    return torch.stack(out), opt


def test_trust_rprop_is_torch_rprop_where_the_bound_does_not_bind():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(6, generator=g, dtype=f64) * 10.0 ** (-i % 5) for i in range(40)]
    torch_rprop, _ = _run(lambda p: torch.optim.Rprop(p, lr=0.3, step_sizes=(1e-2, 2.0)), grads)
    unobserved, opt = _run(lambda p: TrustRprop(p), grads)
    assert torch.equal(torch_rprop, unobserved) and not opt.bound
    # observed, with a bound far above any rise (λ ≤ e^{Σ Δ}): the same path
    loose, opt = _observed_run(
        lambda p: TrustRprop(p, trust=1e8), grads, remaining=list(range(4000, 0, -100)), eta=0.1
    )
    assert torch.equal(torch_rprop, loose) and not opt.bound


def test_trust_rprop_constant_hypergradient_known_lambda_path():
    """g = −1 (more decay) from λ₀ = 1e-4, η = 0.5, R = 400 at every step, δ = 0.1: δ/(ηR) =
    5e-4. Δ_t = 0.3 · 1.2^(t−1) (eq. signsize) while λ·(e^Δ − 1) < 5e-4, so λ_t = 1e-4 ·
    e^(Σ Δ); from then on the bound holds it and λ rises by exactly 5e-4 per step (eq.
    decaytrust: the next Δ, 1.2 times the move made, overshoots the bound again)."""
    grads = [torch.full((2,), -1.0, dtype=f64)] * 16
    rho, opt = _observed_run(
        lambda p: TrustRprop(p, trust=0.1), grads, start=math.log(1e-4),
        remaining=[400] * 16, eta=0.5,
    )  # fmt: skip
    lam = rho[:, 0].exp().tolist()
    free, expected, delta = [], 1e-4, 0.3
    while expected * (math.exp(delta) - 1) < 5e-4:
        expected *= math.exp(delta)
        free.append(expected)
        delta = min(delta * 1.2, 2.0)
    k = len(free)
    assert k == 5  # Σ Δ = 2.23 (λ = 9.3e-4) after 5 steps; the 6th (Δ = 0.75) would add 1e-3
    assert lam[:k] == pytest.approx(free, rel=1e-12)
    rises = [b - a for a, b in zip(lam[k - 1 :], lam[k:])]
    assert rises == pytest.approx([5e-4] * len(rises), rel=1e-9)
    assert opt.bound
    # the bound is δ/(ηR): a quarter of the steps left, four times the rise
    late, _ = _observed_run(
        lambda p: TrustRprop(p, trust=0.1), grads, start=math.log(1e-1),
        remaining=[100] * 16, eta=0.5,
    )  # fmt: skip
    assert (late[1:, 0].exp() - late[:-1, 0].exp()).tolist() == pytest.approx([2e-3] * 15)
    # g = +1: λ falls, never held
    down, _ = _observed_run(
        lambda p: TrustRprop(p, trust=0.1), [torch.ones(1, dtype=f64)] * 10,
        remaining=[400] * 10, eta=0.5,
    )  # fmt: skip
    expected = -sum(min(0.3 * 1.2**i, 2.0) for i in range(10))
    assert float(down[-1]) == pytest.approx(expected, rel=1e-12)


def test_trust_rprop_fall_eta_grows_only_the_steps_that_lower_lambda():
    """fall_eta = 2: a hypergradient that keeps saying "less decay" (g = +1) lowers ρ by
    0.3, 0.6, 1.2, 2.0, 2.0 (Δ ×2 per agreeing step, clipped at Δ_max); one that keeps saying
    "more decay" (g = −1) still raises it by 0.3 · 1.2^k; after a fall and a flip, the rise
    grows by 1.2 again. fall_eta = η₊ is Rprop bit for bit."""
    fall, _ = _run(lambda p: TrustRprop(p, fall_eta=2.0), [torch.ones(1, dtype=f64)] * 5)
    assert fall[:, 0].tolist() == pytest.approx([-0.3, -0.9, -2.1, -4.1, -6.1], rel=1e-12)
    rise, _ = _run(lambda p: TrustRprop(p, fall_eta=2.0), [-torch.ones(1, dtype=f64)] * 4)
    assert rise[:, 0].tolist() == pytest.approx([0.3 * sum(1.2**i for i in range(k + 1))
                                                 for k in range(4)], rel=1e-12)  # fmt: skip
    grads = [torch.ones(1, dtype=f64)] * 3 + [-torch.ones(1, dtype=f64)] * 3
    back, _ = _run(lambda p: TrustRprop(p, fall_eta=2.0), grads)
    r = back[:, 0].tolist()  # falls 0.3, 0.6, 1.2; the flip holds and halves Δ to 0.6
    assert r[3] == r[2] == pytest.approx(-2.1) and r[4] - r[3] == pytest.approx(0.6)
    assert r[5] - r[4] == pytest.approx(0.6 * 1.2)  # a rise grows by η₊, not by fall_eta
    g = torch.Generator().manual_seed(1)
    noisy = [torch.randn(6, generator=g, dtype=f64) for _ in range(30)]
    same, _ = _run(lambda p: TrustRprop(p, fall_eta=1.2), noisy)
    rprop = lambda p: torch.optim.Rprop(p, lr=0.3, step_sizes=(1e-2, 2.0))  # noqa: E731
    assert torch.equal(same, _run(rprop, noisy)[0])


def test_trust_rprop_answers_a_flip_at_the_next_step_where_adam_keeps_going():
    """Five hyper steps of g = +1, then g = −1: Rprop stops at the flip (no move, Δ halved to
    0.3·1.2⁴/2) and moves back by that at the next; Adam (lr 0.3) keeps lowering ρ for two
    more steps on its momentum."""
    grads = [torch.ones(1, dtype=f64)] * 5 + [-torch.ones(1, dtype=f64)] * 4
    rho, opt = _run(lambda p: TrustRprop(p), grads)
    r = rho[:, 0].tolist()
    d5 = 0.3 * 1.2**4
    assert r[4] == pytest.approx(-0.3 * sum(1.2**i for i in range(5)), rel=1e-12)
    assert r[5] == r[4]  # the flip: no move
    assert r[6] - r[5] == pytest.approx(d5 / 2, rel=1e-12)
    assert r[7] - r[6] == pytest.approx(d5 / 2 * 1.2, rel=1e-12)
    adam, _ = _run(lambda p: torch.optim.Adam(p, lr=0.3), grads)
    a = adam[:, 0].tolist()
    assert a[5] < a[4] and a[6] < a[5]  # still falling two steps after the flip


def test_trust_rprop_a_flip_is_a_held_step_not_stuck():
    rho = torch.zeros(1, requires_grad=True)
    opt = TrustRprop([rho])
    for g in (1.0, -1.0):
        before = rho.detach().clone()
        rho.grad = torch.tensor([g])
        opt.step()
    assert torch.equal(rho.detach(), before) and opt.held_back
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_lambda_stuck([before], [rho.detach()], [torch.ones(1)], opt)


def test_trust_rprop_pure_noise_is_a_bounded_walk():
    """g_t ~ N(0, σ²) i.i.d., 200 steps, 64 entries: the sign flips every other step on average,
    so Δ falls to Δ_min = 0.01 and the walk all but stops: the median entry's largest
    excursion is about 1 (1.01–1.09 on seeds 0–3) and the final rms 1.35–1.92 against Adam's
    4.0–5.1. Not a hard bound: a run of k equal signs (chance 2^−k per step) grows Δ by 1.2^k,
    and the farthest of the 64 entries went 4.5–13.6 (Adam's 11–16)."""
    gen = torch.Generator().manual_seed(2)
    grads = [1e-6 * torch.randn(64, generator=gen, dtype=f64) for _ in range(200)]
    adam, _ = _run(lambda p: torch.optim.Adam(p, lr=0.3), grads)
    rprop, opt = _run(lambda p: TrustRprop(p), grads)
    rms = lambda x: float(x.pow(2).mean().sqrt())  # noqa: E731
    assert float(rprop.abs().max(0).values.median()) < 1.2
    assert rms(rprop[-1]) < 0.4 * rms(adam[-1])
    sizes = opt.state[opt.param_groups[0]["params"][0]]["step_size"]
    assert float(sizes.median()) == pytest.approx(0.01) and float(sizes.max()) < 0.05
    assert rms(rprop[-1] - rprop[99]) < 0.5  # the second hundred steps barely move


def test_trust_rprop_resume_equals_a_straight_run():
    gen = torch.Generator().manual_seed(3)
    grads = [-(torch.randn(5, generator=gen, dtype=f64) + 1.5) for _ in range(20)]
    remaining = [1000 - 25 * i for i in range(20)]
    make = lambda p: TrustRprop(p, trust=0.02)  # noqa: E731
    straight, opt = _observed_run(make, grads, math.log(1e-3), remaining, eta=0.4)
    assert opt.bound
    first, opt = _observed_run(make, grads[:8], math.log(1e-3), remaining[:8], eta=0.4)
    rho = first[-1].clone().requires_grad_(True)
    resumed = make([rho])
    resumed.load_state_dict(opt.state_dict())
    for g, r in zip(grads[8:], remaining[8:]):
        resumed.observe(r, 0.4)
        rho.grad = g.clone()
        resumed.step()
    assert torch.equal(rho.detach(), straight[-1])


def test_trust_rprop_bad_settings_name_the_cause():
    p = [torch.zeros(1, requires_grad=True)]
    for kw, match in (({"lr": 0.0}, "lr"), ({"etas": (1.0, 1.2)}, r"etas\[0\]"),
                      ({"etas": (0.5, 0.9)}, r"etas\[1\]"), ({"trust": 0.0}, "trust"),
                      ({"step_sizes": (0.1, 0.01)}, r"step_sizes\[1\]"),
                      ({"trust": True}, "trust"), ({"fall_eta": 0.8}, "fall_eta")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=match):
            TrustRprop(p, **kw)
    TrustRprop(p, trust=math.inf)  # Rprop


class _MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _mlp_data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(256, 8, generator=g)
    y = (X[:, :3] @ torch.randn(3, 3, generator=g)).argmax(1)
    return X, y


class _Recording(TrustRprop):
    """TrustRprop that keeps (bound δ/(ηR), largest rise of λ) of every step."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.steps: list[tuple[float, float]] = []

    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        before, bound = [p.detach().exp() for p in ps], self.max_rise
        out = super().step(closure)
        rise = max(float((p.detach().exp() - b).max()) for p, b in zip(ps, before))
        self.steps.append((bound, rise))
        return out


@pytest.mark.parametrize("net", ["mlp", "cnn_bn"])
def test_trust_rprop_through_the_drop_in_keeps_lambda_finite_and_its_rises_bounded(net):
    """λ₀ = 1e-3, a hyper step every 2 training steps: the callback tells the optimizer R and η
    before every hyper step (the bound is finite at each but the last, at R = 0), every rise of λ is within it, λ
    moved and stays finite and positive."""
    X, y = _mlp_data() if net == "mlp" else _data()
    model = _MLP() if net == "mlp" else CNN()
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(
        1e-3, every_n_steps=2, max_overhead=None, outer_optimizer=_Recording
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(callbacks=[cb], max_epochs=4).fit(
            model,
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    opt = cb.sid.outer_optimizer
    assert isinstance(opt, _Recording) and len(opt.steps) == cb.sid.hyper_step >= 10
    # bounded at every hyper step but one at the fit's last step (R = 0: no training left)
    assert all(math.isfinite(bound) for bound, _ in opt.steps[:-1])
    assert all(rise <= bound * (1 + 1e-4) for bound, rise in opt.steps)
    lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
    assert bool(torch.isfinite(lam).all()) and float(lam.min()) > 0
    assert float((lam / 1e-3).log().abs().max()) > 0.3  # λ moved


def test_the_drop_ins_outer_step_is_trust_rprop_starting_at_outer_lr():
    """The drop-in's default outer step (per layer, log λ) is TrustRprop with Δ₀ = outer_lr; a
    smaller outer_lr also lowers Δ_min (a user's 1e-4 is not raised to 0.01 after one step);
    per element (``"layer_then_shrunk"``) the same on the layers' λ; ``"tied"`` and with
    projection it stays Adam."""
    rho = [torch.zeros(2, requires_grad=True)]
    for kw, first, low in (({}, 0.3, 1e-2), ({"outer_lr": 1e-4}, 1e-4, 1e-4)):
        opt = LearnedWeightDecay(**kw).outer_optimizer(rho)
        assert isinstance(opt, TrustRprop)
        assert opt.defaults["lr"] == first and opt.defaults["step_sizes"][0] == low
    per_element = LearnedWeightDecay(granularity="per_element")  # layer_then_shrunk: as per layer
    made = per_element.outer_optimizer([rho[0], torch.zeros(3, requires_grad=True)])
    assert isinstance(made, TrustShrinkageStep) and made.defaults["lr"] == 0.3
    for kw in (
        {"granularity": "per_element", "elements": "tied"},
        {"parameterization": "projection"},
    ):
        cb = LearnedWeightDecay(**kw)
        made = cb.outer_optimizer(rho) if cb.outer_optimizer is not None else None
        assert not isinstance(made, TrustRprop)


class _Observing(TrustRprop):
    """TrustRprop that keeps the η it is told before each hyper step."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.etas: list[float | None] = []

    def observe(self, remaining_steps, eta):
        self.etas.append(eta)
        super().observe(remaining_steps, eta)


class _AdamMLP(_MLP):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


@pytest.mark.parametrize("decoupled", [False, True])
def test_trust_rprops_bound_reads_the_shrink_rate_of_the_decay_it_bounds(decoupled):
    """Eq. decaytrust bounds the shrink λ causes per training step: coupled decay (λw added to
    Adam's gradient) shrinks by η_Adam·λ = lr/√v̂·λ, decoupled decay (w ← w(1 − lr·λ)) by lr·λ
    whatever Adam's gain. The outer step is told η_Adam (≫ lr early in a fit, v̂ small) in the
    first case and exactly lr in the second."""
    X, y = _mlp_data()
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(
        1e-3, decoupled=decoupled, every_n_steps=2, max_overhead=None,
        outer_optimizer=_Observing,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(callbacks=[cb], max_epochs=2).fit(
            _AdamMLP(),
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    etas = cb.sid.outer_optimizer.etas
    assert len(etas) >= 5 and all(e is not None for e in etas)
    if decoupled:
        assert all(e == pytest.approx(3e-3, rel=1e-12) for e in etas)
    else:
        assert all(e > 10 * 3e-3 for e in etas)  # Adam's gain lr/√v̂ on small gradients


class _StopAt(pl.Callback):
    """Ends the fit after ``steps`` optimizer steps, as early stopping would: the trainer cannot
    know its length in advance."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.global_step >= self.steps


class _Told(_Recording):
    """_Recording that also keeps the R it is told before each hyper step."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.told: list[int | None] = []

    def observe(self, remaining_steps, eta):
        self.told.append(remaining_steps)
        super().observe(remaining_steps, eta)


def _fit_of_unknown_length(**trainer_kw) -> LearnedWeightDecay:
    X, y = _mlp_data()
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(1e-3, every_n_steps=2, max_overhead=None, outer_optimizer=_Told)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer(callbacks=[cb, _StopAt(24)], **trainer_kw).fit(
            _MLP(),
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    cb.said = [str(w.message) for w in said]  # type: ignore[attr-defined]
    return cb


def test_a_fit_of_unknown_length_bounds_lambdas_rises_by_the_steps_run_and_says_so():
    """max_epochs=-1 stopped by a callback (early stopping's case): R is the steps run so far
    (Gott's estimate), so every rise of λ is bounded (eq. decaytrust) where it used to be
    Rprop's unbounded step (the main job's recipe, seed 0: λ 0.33 and test loss 2.23), and the
    user is told once how R was taken and how to give the exact one."""
    cb = _fit_of_unknown_length(max_epochs=-1)
    opt = cb.sid.outer_optimizer
    assert cb.sid.hyper_step >= 10
    assert opt.told == [2 * (j + 1) for j in range(len(opt.told))]  # the steps run so far
    assert all(math.isfinite(bound) for bound, _ in opt.steps)
    assert all(rise <= bound * (1 + 1e-4) for bound, rise in opt.steps)
    unknown = [m for m in cb.said if "length is unknown" in m]
    assert len(unknown) == 1 and "max_steps" in unknown[0]


def test_a_fit_limited_by_max_time_takes_its_horizon_from_the_pace_so_far():
    """max_time alone (Lightning's Timer): R = the steps the time left allows at the pace so far
    (finite: an hour at milliseconds per step), and no unknown-length warning."""
    cb = _fit_of_unknown_length(max_epochs=-1, max_time={"hours": 1})
    told = cb.sid.outer_optimizer.told
    assert len(told) >= 10 and all(r is not None and 1000 < r < 10**9 for r in told)
    assert not [m for m in cb.said if "length is unknown" in m]


def test_a_known_length_is_the_exact_horizon():
    """max_steps known: R = the steps left (the horizon as before), no warning."""
    cb = _fit_of_unknown_length(max_steps=24)
    told = cb.sid.outer_optimizer.told
    assert told == [24 - 2 * (j + 1) for j in range(len(told))]
    assert not [m for m in cb.said if "length is unknown" in m]
