"""Step-size schedules of the solves: constant (Thm 4.1), decreasing (Thm 4.2), two-phase."""

from __future__ import annotations

import math

import pytest
import torch
from problems import make_ridge, relative_error, sid_on

from hypertorch_sid import (
    Batches,
    FixedPointIteration,
    KnownCurvature,
    TwoPhaseStep,
    auto_switch,
    make_schedule,
)


def test_two_phase_is_constant_then_decreasing_from_the_switch():
    s = TwoPhaseStep(eta=0.8, switch=5, beta=20.0, gamma=25.0)
    assert [s(t) for t in range(5)] == [0.8] * 5
    assert [s(t) for t in (5, 6, 15)] == [20 / 25, 20 / 26, 20 / 35]


@pytest.mark.parametrize("steps, q", [(1000, 0.9), (1000, 0.999), (7, 0.5)])
def test_auto_switch_is_min_of_half_the_steps_and_7_beta(steps, q):
    beta = 2 / (1 - q * q)
    assert auto_switch(steps, beta) == min(steps // 2, math.ceil(7 * beta))
    s = make_schedule("two_phase", q=q, steps=steps)
    assert s.switch == auto_switch(steps, beta) and s.beta == pytest.approx(beta)
    assert make_schedule("two_phase", q=q, steps=steps, switch=3).switch == 3
    assert make_schedule("two_phase", q=q).switch == 0  # steps unknown: purely decreasing


def test_optimizer_switches_each_solve_by_its_own_length():
    problem = make_ridge()
    opt = sid_on(
        problem, inner_steps=400, adjoint_steps=30, step_size="two_phase", q=0.99, alpha=0.1
    )
    inner, adjoint = opt._schedules()
    beta = 2 / (1 - 0.99**2)
    assert (inner.switch, adjoint.switch) == (min(200, math.ceil(7 * beta)), 15)


def _stochastic_ridge_error(step_size: str, seed: int) -> float:
    problem = make_ridge(n=400, d=10, seed=seed, log_lam0=-5.0, per_feature=False)
    with torch.no_grad():  # ill-conditioned: μ ≈ 0.01, L ≈ 1.5, q ≈ 0.99
        for X in (problem.X, problem.X_val):
            X[:, 5:] *= 0.1
    eig = torch.linalg.eigvalsh(problem.X.T @ problem.X / 400 + problem.lam()[0] * torch.eye(10))
    opt = sid_on(
        problem,
        full_train_batch=problem.train(),
        inner_steps=600,
        adjoint_steps=600,
        step_size=step_size,
        adjoint_solver=FixedPointIteration(),
        curvature=KnownCurvature(float(eig[-1]), float(eig[0])),
        batches=Batches(d2="full"),
    )
    g = opt.hypergradient(problem.loader(50, seed=seed), problem.val())
    return relative_error(g[0], problem.exact_hypergradient())


def test_two_phase_beats_decreasing_when_the_contraction_is_slow():
    """q ≈ 0.99 and t = k = 600 ≈ 3β: η_t = β/(γ+t) decays before the slow directions' initial
    error is gone, while a constant phase of ⌈7β⌉ ∧ t/2 steps clears it first (the remark after
    Thm 4.2). Mean relative error over 3 seeds at the same budget (measured: 0.0045 vs 0.032)."""
    two = [_stochastic_ridge_error("two_phase", s) for s in range(3)]
    dec = [_stochastic_ridge_error("decreasing", s) for s in range(3)]
    assert sum(two) / 3 < 0.5 * sum(dec) / 3, (two, dec)
    assert max(two) < 0.1
