"""ReachRprop (session 57): Rprop's step on log λ held at or above the size that can still cross
``span`` with the hyper steps left (eqs. reachstep, reachpace in ``hypertorch_sid.core.outer_step``)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hypertorch_sid import ConfigurationError
from hypertorch_sid.core.outer_step import ReachRprop, ShrinkFallRprop, reach_step

f64 = torch.float64


def _steps(opt: torch.optim.Optimizer, rho: torch.Tensor, grads: list[float], lefts: list) -> list:
    """One hyper step per (g, R): observe(R, η = 1), then step; returns ρ after each."""
    out = []
    for g, left in zip(grads, lefts, strict=True):
        opt.observe(left, None if left is None else 1.0)
        rho.grad = torch.full_like(rho, g)
        opt.step()
        out.append(float(rho.detach()[0]))
    return out


def test_reach_step_is_the_first_of_a_geometric_run_that_covers_span():
    """Δ_reach(n) · Σ_{k<n} η₊ᵏ = span; at η₊ = 1 it is span / n."""
    for n in (1, 2, 5, 11):
        d = reach_step(4.0, 1.2, n)
        assert sum(d * 1.2**k for k in range(n)) == pytest.approx(4.0, rel=1e-12)
    assert reach_step(4.0, 1.0, 8) == pytest.approx(0.5)
    assert reach_step(3.0, 1.2, 1) == pytest.approx(3.0)


def test_a_held_sign_crosses_span_with_the_hyper_steps_left():
    """A hypergradient that says "more decay" (g < 0) at every hyper step, R = 200, 180, …, 0
    (pace 20, 11 hyper steps), Δ₀ = Δ_min = 0.01, no trust bound: from the second step Δ is
    Δ_reach(n_t) with n_t = 1 + R_t / 20 = 10, 9, …, 1 (it binds each time: Δ_reach(n − 1) >
    η₊ Δ_reach(n)), so ρ moves by Δ₀ + Σ_{n=1}^{10} min(Δ_reach(n), Δ_max) — at least span."""
    span, lefts = math.log(100.0), list(range(200, -1, -20))
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], lr=0.01, step_sizes=(0.01, 2.0), trust=math.inf, span=span)
    path = _steps(opt, rho, [-1.0] * len(lefts), lefts)
    expected = 0.01 + sum(min(reach_step(span, 1.2, n), 2.0) for n in range(1, 11))
    assert path[-1] == pytest.approx(expected, rel=1e-12)
    assert path[-1] >= span
    # ShrinkFallRprop on the same hypergradients: 0.01 · Σ 1.2ᵏ, far short of span
    rho2 = torch.zeros(1, dtype=f64, requires_grad=True)
    plain = ShrinkFallRprop([rho2], lr=0.01, step_sizes=(0.01, 2.0), trust=math.inf)
    short = _steps(plain, rho2, [-1.0] * len(lefts), lefts)[-1]
    assert short == pytest.approx(0.01 * sum(1.2**k for k in range(11)), rel=1e-12)
    assert short < 0.4


def test_the_pace_counts_the_hyper_steps_the_budget_skipped():
    """Hyper steps at R = 300 and 240 (one due step skipped: pace 60), so n = 1 + 240/60 = 5 at the
    second: Δ = Δ_reach(5) (the third step, R = 180, pace 60: n = 4, Δ_reach(4))."""
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], lr=0.01, trust=math.inf, span=2.0)
    path = _steps(opt, rho, [-1.0, -1.0, -1.0], [300, 240, 180])
    assert path[1] - path[0] == pytest.approx(reach_step(2.0, 1.2, 5), rel=1e-12)
    assert path[2] - path[1] == pytest.approx(reach_step(2.0, 1.2, 4), rel=1e-12)


def test_without_the_fits_length_or_early_it_is_shrink_fall_rprop():
    """R unknown: ShrinkFallRprop bit for bit, flips included; a long fit's early steps (n large,
    Δ_reach < Δ_min) too."""
    grads = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0]
    for lefts in ([None] * 8, list(range(10_000, 9_000, -125))):
        a = torch.zeros(2, dtype=f64, requires_grad=True)
        b = torch.zeros(2, dtype=f64, requires_grad=True)
        ra = ReachRprop([a], trust=math.inf)
        sb = ShrinkFallRprop([b], trust=math.inf)
        assert _steps(ra, a, grads, lefts) == _steps(sb, b, grads, lefts)


def test_a_flip_still_stops_lambda_and_the_state_resumes():
    """At a flip ρ does not move (eq. signstep) whatever the floor; the pace's start is in the
    state_dict, so a restored optimizer takes the same next step."""
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], trust=math.inf, span=3.0)
    path = _steps(opt, rho, [-1.0, -1.0, 1.0], [100, 80, 60])
    assert path[2] == path[1]
    saved = copy.deepcopy(opt.state_dict())  # (state_dict shares the state's tensors)
    twin_rho = rho.detach().clone().requires_grad_(True)
    twin = ReachRprop([twin_rho], trust=math.inf, span=3.0)
    twin.load_state_dict(saved)
    assert _steps(opt, rho, [1.0], [40]) == _steps(twin, twin_rho, [1.0], [40])


def test_a_fit_resumed_to_a_longer_one_restarts_the_pace():
    """R = 100, 80 (pace 20), then a resume told R = 300 (the fit made longer): no floor at that
    step, then the pace counts from it: R = 260 after one hyper step is pace 40, n = 7.5."""
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], trust=math.inf, span=2.0)
    _steps(opt, rho, [-1.0, -1.0, -1.0], [100, 80, 300])
    assert opt.reach == 0.0
    _steps(opt, rho, [-1.0], [260])
    assert opt.reach == pytest.approx(reach_step(2.0, 1.2, 1 + 260 / 40), rel=1e-12)


def test_a_bad_span_is_named():
    with pytest.raises(ConfigurationError, match="span"):
        ReachRprop([torch.zeros(1, requires_grad=True)], span=0.0)
