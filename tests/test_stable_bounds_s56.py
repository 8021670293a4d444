"""λ's stability bound read from one optimizer parameter group (``StableBounds.bound``), the
closed forms of its docstring, without a fit."""

import math

import pytest

from hypertorch_sid.lightning import WeightDecayProblem


def test_the_bound_of_a_group_is_the_closed_form():
    coupled = WeightDecayProblem().stability
    sgd = {"lr": 0.1, "momentum": 0.9, "nesterov": False}
    assert coupled.bound(sgd) == pytest.approx(2 * 1.9 / 0.1 / 2)  # (1 + m)/η before an L̂
    assert coupled.bound({"lr": 0.1, "betas": (0.9, 0.999)}) == pytest.approx(10.0)  # Adam 1/η
    assert coupled.bound({**sgd, "nesterov": True}) == pytest.approx(10.0)
    assert coupled.bound({"lr": 0.0, "momentum": 0.9}) == math.inf  # a frozen group
    assert WeightDecayProblem(decoupled=True).stability.bound(sgd) == pytest.approx(5.0)  # 0.5/η


def test_the_bound_leaves_room_for_the_data_curvature():
    stability = WeightDecayProblem().stability
    sgd = {"lr": 0.1, "momentum": 0.0}  # stable while L + λ < 2/η = 20
    stability.data_curvature = lambda: 12.0
    assert stability.bound(sgd) == pytest.approx((20 - 12) / 2)
    stability.data_curvature = lambda: 26.0  # an estimate past the limit: 1 % of it, told once
    with pytest.warns(UserWarning, match="stability limit"):
        assert stability.bound(sgd) == pytest.approx(0.005 * 20)
    assert stability.bound(sgd) == pytest.approx(0.1)
