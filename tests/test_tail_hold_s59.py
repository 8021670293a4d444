"""TailHoldRprop (session 59): eq. decaytrust with δ = 0 in the fit's last ``tail`` share
(eq. tailhold): λ may fall or hold there, never rise; before it, ShrinkFallRprop step for step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_reach_rprop_s57 import _steps  # one hyper step per (g, R)

from hypertorch_sid import ConfigurationError
from hypertorch_sid.core.outer_step import ShrinkFallRprop, TailHoldRprop

f64 = torch.float64
LEFTS = list(range(200, -1, -20))  # R₁ = 200; tail 0.2 → no rise from R = 40 on


def _pair(**kw):
    a = torch.zeros(1, dtype=f64, requires_grad=True)
    b = torch.zeros(1, dtype=f64, requires_grad=True)
    return (TailHoldRprop([a], **kw), a), (ShrinkFallRprop([b], **kw_plain(kw)), b)


def kw_plain(kw):
    return {k: v for k, v in kw.items() if k != "tail"}


def test_before_the_tail_it_is_shrink_fall_rprop_and_in_the_tail_no_rise():
    grads = [-1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]  # mostly "more decay"
    (held, a), (plain, b) = _pair(lr=0.1, trust=math.inf, tail=0.2)
    path, ref = _steps(held, a, grads, LEFTS), _steps(plain, b, grads, LEFTS)
    first_tail = LEFTS.index(40)
    assert path[:first_tail] == ref[:first_tail]
    assert all(p == path[first_tail - 1] for p in path[first_tail:])  # held from R = 40 on
    assert ref[-1] > path[-1] + 0.5  # the plain step kept rising


def test_a_fall_in_the_tail_is_taken():
    """ "Less decay" (g > 0) in the tail moves ρ down as ShrinkFallRprop would."""
    grads = [1.0] * len(LEFTS)
    (held, a), (plain, b) = _pair(lr=0.1, trust=math.inf, tail=0.2)
    assert _steps(held, a, grads, LEFTS) == _steps(plain, b, grads, LEFTS)


def test_tail_zero_is_shrink_fall_rprop():
    grads = [-1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    (held, a), (plain, b) = _pair(lr=0.1, tail=0.0)
    assert _steps(held, a, grads, LEFTS) == _steps(plain, b, grads, LEFTS)


def test_unobserved_it_is_shrink_fall_rprop():
    grads = [-1.0] * 6
    (held, a), (plain, b) = _pair(lr=0.1, trust=math.inf, tail=0.9)
    assert _steps(held, a, grads, [None] * 6) == _steps(plain, b, grads, [None] * 6)


def test_the_tail_start_survives_a_checkpoint_and_restarts_on_a_longer_fit():
    grads = [-1.0] * len(LEFTS)
    (held, a), _ = _pair(lr=0.1, trust=math.inf, tail=0.2)
    _steps(held, a, grads[:5], LEFTS[:5])  # R = 200 … 120
    b = a.detach().clone().requires_grad_(True)
    twin = TailHoldRprop([b], lr=0.1, trust=math.inf, tail=0.2)
    twin.load_state_dict(copy.deepcopy(held.state_dict()))
    assert _steps(twin, b, grads[5:], LEFTS[5:]) == _steps(held, a, grads[5:], LEFTS[5:])
    # resumed to a longer fit (R grows): R₁ restarts, so R = 40 of a new 1000 may rise
    before = float(b.detach()[0])
    _steps(twin, b, [-1.0, -1.0], [1000, 900])
    assert float(b.detach()[0]) > before


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0, math.nan, "0.2", True])
def test_a_bad_tail_is_named(bad):
    with pytest.raises(ConfigurationError, match="TailHoldRprop: tail"):
        TailHoldRprop([torch.zeros(1, requires_grad=True)], tail=bad)
