"""ReachRprop(settle=…) (session 58): the floor of eq. reachstep aims to arrive settle·R₁ steps
before the end (eq. reachsettle) and is off after it, where the step is ShrinkFallRprop's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_reach_rprop_s57 import _steps  # one hyper step per (g, R)

from hypertorch_sid import ConfigurationError
from hypertorch_sid.core.outer_step import ReachRprop, ShrinkFallRprop, reach_step

f64 = torch.float64


def test_a_held_sign_crosses_span_by_the_settle_point():
    """R = 200, 180, …, 0 (pace 20), settle 0.25 of R₁ = 200: the floor counts the hyper steps
    until R = 50, n_t = 1 + (R_t − 50)/20 = 8.5, 7.5, …, 1.5 at R = 180 … 60, so ρ has moved by
    Δ₀ + Σ Δ_reach(n_t) by R = 60 (at least span: the last n is 1.5, not 1)."""
    span, lefts = math.log(100.0), list(range(200, -1, -20))
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], lr=0.01, step_sizes=(0.01, 2.0), trust=math.inf, span=span, settle=0.25)
    path = _steps(opt, rho, [-1.0] * len(lefts), lefts)
    settled = lefts.index(60)
    ns = [1 + (r - 50) / 20 for r in lefts[1 : settled + 1]]
    expected = 0.01 + sum(min(reach_step(span, 1.2, n), 2.0) for n in ns)
    assert path[settled] == pytest.approx(expected, rel=1e-12)
    assert path[settled] >= span - 1e-9


def test_after_the_settle_point_the_step_is_shrink_fall_rprops_own():
    """From R ≤ settle·R₁ the floor is 0: the step sizes grow by η₊ from the last one as
    ShrinkFallRprop's do (a twin that took the same steps so far moves the same from there)."""
    lefts = list(range(200, -1, -20))
    rho = torch.zeros(1, dtype=f64, requires_grad=True)
    opt = ReachRprop([rho], lr=0.01, trust=math.inf, settle=0.25)
    _steps(opt, rho, [-1.0] * 8, lefts[:8])  # through R = 60
    plain_rho = rho.detach().clone().requires_grad_(True)
    plain = ShrinkFallRprop([plain_rho], lr=0.01, trust=math.inf)
    plain.load_state_dict(copy.deepcopy(opt.state_dict()))
    tail = [-1.0, 1.0, -1.0]
    assert _steps(opt, rho, tail, lefts[8:]) == _steps(plain, plain_rho, tail, lefts[8:])
    assert opt.reach == 0.0


def test_settle_zero_is_the_session_57_reach_rprop():
    grads, lefts = [-1.0, -1.0, 1.0, -1.0, -1.0], [100, 80, 60, 40, 20]
    a = torch.zeros(1, dtype=f64, requires_grad=True)
    b = torch.zeros(1, dtype=f64, requires_grad=True)
    assert _steps(ReachRprop([a], trust=math.inf), a, grads, lefts) == _steps(
        ReachRprop([b], trust=math.inf, settle=0.0), b, grads, lefts
    )


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0, math.nan, "0.2"])
def test_a_bad_settle_is_named(bad):
    with pytest.raises(ConfigurationError, match="settle"):
        ReachRprop([torch.zeros(1, requires_grad=True)], settle=bad)
