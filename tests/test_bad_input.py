"""Bad input gets a clear error (what is wrong and how to fix it) or a documented guarded recovery.

Every case asserts the error type and, through ``match``, that the message names both the problem
and the fix; where the error can strike after the solves have started, it also checks that λ, w,
the adjoint warm start v and the outer optimizer's state were left as they were (issue 5).
"""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from problems import (
    equal,
    full_batch_sid,
    make_ridge,
    module_sid,
    relative_error,
    ridge_sid,
    sid_on,
    split_settings,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    AveragedMomentum,
    BackOff,
    Batches,
    ConfigurationError,
    ConstantStep,
    DivergenceError,
    EstimatedCurvature,
    FeasibleSet,
    KnownCurvature,
    LastIterate,
    SIDConfig,
    SIDHyperOptimizer,
    get_preset,
    theory_constants,
)


def curvature(problem):
    H = problem.X.T @ problem.X / problem.X.shape[0] + torch.diag(problem.lam())
    eig = torch.linalg.eigvalsh(H)
    return float(eig[-1]), float(eig[0])


class Snapshot:
    """λ, w, v and the outer optimizer's state, to check that a failure changed none of them."""

    def __init__(self, problem, hopt):
        self.problem, self.hopt = problem, hopt
        self.lam = problem.log_lam.detach().clone()
        self.w = problem.w.detach().clone()
        self.v = None if hopt.v is None else [x.clone() for x in hopt.v]
        opt = hopt.outer_optimizer
        self.opt = None if opt is None else copy.deepcopy(opt.state_dict())
        self.step = hopt.hyper_step

    def assert_unchanged(self):
        assert torch.equal(self.problem.log_lam.detach(), self.lam)
        assert torch.isfinite(self.problem.log_lam).all()
        assert torch.equal(self.problem.w.detach(), self.w)
        if self.v is None:
            assert self.hopt.v is None
        else:
            assert all(torch.equal(a, b) for a, b in zip(self.hopt.v, self.v))
        if self.opt is not None:
            assert equal(self.hopt.outer_optimizer.state_dict(), self.opt)
        assert self.hopt.hyper_step == self.step


# ====================================================================== divergence and NaN


@pytest.mark.parametrize(
    "solver, alpha_L",
    [
        (LastIterate(), 3.0),  # |1 − αL| = 2: not a contraction
        (AveragedMomentum(), 4.0),  # heavy ball (m = 0.5) is stable up to αL < 2(1 + m) = 3
    ],
)
def test_gd_step_above_two_over_l_raises_inner_divergence_and_restores_w(solver, alpha_L):
    problem = make_ridge()
    L, _ = curvature(problem)
    hopt = full_batch_sid(problem, 60, alpha=alpha_L / L, inner_solver=solver)
    with torch.no_grad():
        problem.w.fill_(0.1)
    snap = Snapshot(problem, hopt)
    with pytest.raises(DivergenceError, match=r"inner solve.*diverged.*alpha < 2/L.*backoff") as e:
        hopt.hypergradient([problem.train()], problem.val())
    assert e.value.quantity.startswith("inner") and e.value.step is not None
    snap.assert_unchanged()


def test_backoff_halves_alpha_and_then_matches_closed_form(caplog):
    problem = make_ridge()
    L, _ = curvature(problem)
    hopt = full_batch_sid(problem, 1500, alpha=3.5 / L, on_divergence=BackOff(3))
    with caplog.at_level(logging.WARNING, logger="hypertorch_sid"):
        g = hopt.hypergradient([problem.train()], problem.val())
    assert math.isclose(hopt.alpha, 1.75 / L)  # halved once: |1 − αL| = 0.75 < 1
    assert any("backing off: halving alpha" in r.message for r in caplog.records)
    assert relative_error(g[0], problem.exact_hypergradient()) < 1e-8


def test_backoff_that_is_not_enough_still_raises():
    problem = make_ridge()
    L, _ = curvature(problem)
    hopt = full_batch_sid(
        problem, 60, alpha=20.0 / L, on_divergence=BackOff(2)
    )  # 20 → 10 → 5: never < 2
    with pytest.raises(DivergenceError, match="inner solve"):
        hopt.hypergradient([problem.train()], problem.val())
    assert math.isclose(hopt.alpha, 5.0 / L)
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_diverging_adjoint_solve_raises_and_restores_w():
    problem = make_ridge()
    L, mu = curvature(problem)
    # inner GD converges (α = 2/(L+μ)); the adjoint iteration I − 5αH has eigenvalues near −4.9
    hopt = full_batch_sid(problem, 60, alpha=2 / (L + mu), adjoint_step_size=ConstantStep(5.0))
    snap = Snapshot(problem, hopt)
    with pytest.raises(
        DivergenceError, match=r"adjoint solve.*diverged.*not a contraction.*η₀ = 5.*lower them"
    ) as e:
        hopt.hypergradient([problem.train()], problem.val())
    assert e.value.quantity.startswith("adjoint")
    snap.assert_unchanged()  # the inner solve ran, but w is back where it started


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_training_data_raises_and_leaves_lambda_and_w(bad):
    problem = make_ridge()
    X = problem.X.clone()
    X[17, 2] = bad
    loader = DataLoader(TensorDataset(X, problem.y), batch_size=10, shuffle=True)
    hopt = ridge_sid(
        problem, outer=torch.optim.Adam([problem.log_lam], lr=0.1), steps=40, alpha=0.3
    )
    hopt.step(problem.loader(10), problem.val())  # a good step first: v and Adam state exist
    snap = Snapshot(problem, hopt)
    with pytest.raises(
        DivergenceError,
        match=r"inner solve.*residual norm (nan|inf).*check the training data.*for NaN/Inf",
    ):
        hopt.step(loader, problem.val())
    snap.assert_unchanged()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_validation_data_raises_and_leaves_lambda_and_w(bad):
    problem = make_ridge()
    X_val = problem.X_val.clone()
    X_val[3, 0] = bad
    hopt = ridge_sid(problem, outer=torch.optim.Adam([problem.log_lam], lr=0.1), alpha=0.3)
    snap = Snapshot(problem, hopt)
    with pytest.raises(
        DivergenceError,
        match=r"outer gradient.*validation batch it read holds NaN/Inf.*repair those examples",
    ):
        hopt.step(problem.loader(10), (X_val, problem.y_val))
    snap.assert_unchanged()  # w had moved in the inner solve: restored


def test_nan_inner_loss_midway_raises_at_that_step():
    problem = make_ridge()
    calls = []

    def inner(batch):
        calls.append(None)
        loss = problem.inner_loss(batch)
        # the 5th inner step: one dependency check and the stall probe's ℓ̂ come first
        return loss * math.nan if len(calls) == 7 else loss

    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        inner,
        problem.outer_loss,
        None,
        config=SIDConfig(inner_steps=10, adjoint_steps=10, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(DivergenceError, match="inner solve w_t diverged at step 4") as e:
        hopt.hypergradient(problem.loader(10), problem.val())
    assert math.isnan(e.value.residual)
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_nan_outer_loss_raises():
    problem = make_ridge()
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        lambda b: problem.outer_loss(b) + torch.tensor(math.nan, dtype=torch.float64),
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(DivergenceError, match=r"outer gradient.*not finite"):
        hopt.hypergradient(problem.loader(10), problem.val())
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_nan_hypergradient_from_the_d2_term_leaves_lambda_w_v_and_optimizer():
    """Only the batch of the ∂₂Φ̂ term is bad: the solves succeed, the assembly does not."""
    problem = make_ridge()

    def inner(batch):
        X, y, poisoned = batch
        loss = problem.inner_loss((X, y))
        return loss * math.nan if poisoned else loss

    good, bad = (problem.X, problem.y, False), (problem.X, problem.y, True)
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        inner,
        problem.outer_loss,
        torch.optim.Adam([problem.log_lam], lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3, alpha=0.3, step_size="constant"),
    )
    hopt.step([good], problem.val())
    snap = Snapshot(problem, hopt)
    # 3 inner + 3 adjoint batches are good, the 7th (∂₂Φ̂) is poisoned
    with pytest.raises(DivergenceError, match=r"hypergradient diverged.*λ was left unchanged"):
        hopt.step([good] * 6 + [bad], problem.val())
    snap.assert_unchanged()


def test_apply_refuses_a_nan_hypergradient_without_touching_adam_state():
    problem = make_ridge()
    opt = torch.optim.Adam([problem.log_lam], lr=0.1)
    hopt = ridge_sid(problem, outer=opt, alpha=0.3)
    hopt.apply([torch.ones(5, dtype=torch.float64)])
    snap = Snapshot(problem, hopt)
    g = torch.ones(5, dtype=torch.float64)
    g[1] = math.nan
    with pytest.raises(
        DivergenceError, match=r"hypergradient.*outer optimizer were left unchanged"
    ):
        hopt.apply([g])
    snap.assert_unchanged()
    assert all(torch.isfinite(s).all() for s in opt.state[problem.log_lam].values())
    hopt.apply([torch.ones(5, dtype=torch.float64)])  # the run goes on with finite λ
    assert torch.isfinite(problem.log_lam).all() and hopt.hyper_step == 2


def test_outer_step_overflow_restores_lambda():
    problem = make_ridge()
    hopt = ridge_sid(problem, outer=torch.optim.SGD([problem.log_lam], lr=1e308), alpha=0.3)
    before = problem.log_lam.detach().clone()
    with pytest.raises(DivergenceError, match=r"hyperparameters.*λ was restored.*outer learning"):
        hopt.apply([torch.full((5,), 1e10, dtype=torch.float64)])
    assert torch.equal(problem.log_lam.detach(), before) and hopt.hyper_step == 0


# ====================================================================== λ and w themselves


def lam_w(dtype=torch.float64):
    return torch.zeros(3, dtype=dtype, requires_grad=True), torch.zeros(3, requires_grad=True)


def build(hyper, inner, outer_optimizer=None, **kwargs):
    hyper_list = hyper if isinstance(hyper, list) else [hyper]
    inner_list = inner if isinstance(inner, list) else [inner]

    def loss(_):
        return sum((w**2).sum() for w in inner_list) + sum(h.sum() for h in hyper_list)

    kwargs, settings = split_settings(kwargs)
    return SIDHyperOptimizer(
        hyper,
        inner,
        loss,
        loss,
        outer_optimizer,
        **kwargs,
        config=SIDConfig(inner_steps=5, adjoint_steps=5).replace(**settings),
    )


def test_hyperparameter_that_is_not_a_leaf():
    raw = torch.zeros(3, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"hyperparameters\[0\] is not a leaf.*log_lam"):
        build(raw.exp(), torch.zeros(3, requires_grad=True))


def test_hyperparameter_that_does_not_require_grad():
    with pytest.raises(ConfigurationError, match=r"does not require grad.*requires_grad=True"):
        build(torch.zeros(3), torch.zeros(3, requires_grad=True))


def test_integer_hyperparameter():
    with pytest.raises(ConfigurationError, match=r"dtype torch.int64; use a float dtype"):
        build(torch.zeros(3, dtype=torch.long), torch.zeros(3, requires_grad=True))


def test_hyperparameter_that_is_also_an_inner_parameter():
    w = torch.zeros(3, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"also inner parameters.*different tensors"):
        build([w], [w, torch.zeros(2, requires_grad=True)])


def test_hyperparameter_with_another_dtype_than_the_model():
    lam, w = lam_w(dtype=torch.float64)  # w is float32
    with pytest.raises(ConfigurationError, match=r"different dtypes.*use one dtype"):
        build(lam, w)


def test_hyperparameter_on_another_device_than_the_model():
    lam = torch.zeros(3, device="meta", requires_grad=True)
    with pytest.raises(
        ConfigurationError, match=r"different devices.*\['cpu', 'meta'\].*one device"
    ):
        build(lam, torch.zeros(3, requires_grad=True))


@pytest.mark.cuda
def test_hyperparameter_on_cuda_with_the_model_on_cpu():
    lam = torch.zeros(3, device="cuda", requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"different devices.*move them to one device"):
        build(lam, torch.zeros(3, requires_grad=True))


def test_hyperparameter_missing_from_outer_optimizer():
    lam, w = lam_w(torch.float32)
    other = torch.zeros(1, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"not in outer_optimizer.*Adam\(hyperparameters"):
        build(lam, w, torch.optim.Adam([other]))


def test_outer_optimizer_holding_inner_parameters():
    lam, w = lam_w(torch.float32)
    with pytest.raises(
        ConfigurationError, match=r"holds inner parameters.*only the hyperparameters"
    ):
        build(lam, w, torch.optim.Adam([lam, w]))


def test_inner_loss_not_depending_on_an_inner_parameter():
    problem = make_ridge()
    unused = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w, unused],
        problem.inner_loss,
        problem.outer_loss,
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(
        ConfigurationError, match=r"inner parameters at positions \[1\]: leave them out"
    ):
        hopt.hypergradient(problem.loader(10), problem.val())


def test_inner_loss_not_depending_on_lambda():
    problem = make_ridge()
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        lambda b: problem.outer_loss(b),
        problem.outer_loss,
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match=r"none of the hyperparameters.*Use λ inside"):
        hopt.hypergradient(problem.loader(10), problem.val())


@pytest.mark.parametrize("foreign", [False, True])
def test_outer_loss_depending_on_neither_w_nor_lambda(foreign):
    problem = make_ridge()
    other = torch.ones(1, dtype=torch.float64, requires_grad=True)

    def outer(batch):
        X, y = batch
        return (other * y).sum() if foreign else y.sum()

    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        outer,
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match=r"depends on neither.*computed from w and/or λ"):
        hopt.hypergradient(problem.loader(10), problem.val())
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


# ====================================================================== the feasible set Λ


def raw_weight_decay_problem(lam0):
    """Ridge with λ itself (not log λ) learned: Λ = {λ ≥ 0}."""
    problem = make_ridge(n=100, d=4)
    lam = torch.full((4,), lam0, dtype=torch.float64, requires_grad=True)

    def inner(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w - y) ** 2).mean() + 0.5 * (lam * problem.w**2).sum()

    return problem, lam, inner


def nonnegative(hs):
    return bool((hs[0] >= 0).all())


def raw_decay_sid(problem, lam, inner, outer=None, full_train_batch=None, **settings):
    """SID on :func:`raw_weight_decay_problem`'s λ with the outer optimizer ``outer`` and
    ``SIDConfig(**settings)``."""
    return SIDHyperOptimizer(
        [lam],
        [problem.w],
        inner,
        problem.outer_loss,
        outer,
        full_train_batch=full_train_batch,
        config=SIDConfig(**settings),
    )


def test_projection_keeps_weight_decay_nonnegative_under_a_huge_outer_step():
    problem, lam, inner = raw_weight_decay_problem(0.1)
    hopt = raw_decay_sid(
        problem,
        lam,
        inner,
        torch.optim.SGD([lam], lr=1e6),
        full_train_batch=problem.train(),
        inner_steps=50,
        adjoint_steps=50,
        step_size="constant",
        curvature=EstimatedCurvature(every=1),
        feasible_set=FeasibleSet(project=lambda hs: hs[0].clamp_(min=0), contains=nonnegative),
    )
    clamped = []
    for _ in range(3):
        before = lam.detach().clone()
        g = hopt.step([problem.train()], problem.val())
        assert (lam.detach() >= 0).all() and torch.isfinite(lam).all()
        clamped.append((before - 1e6 * g[0] < 0) & (lam.detach() == 0))
    assert any(c.any() for c in clamped)  # some λᵢ would have gone far below 0 without it


def test_infeasible_initial_value_is_refused():
    problem, lam, inner = raw_weight_decay_problem(-0.1)
    with pytest.raises(
        ConfigurationError,
        match=r"initial hyperparameters are outside the feasible set.*Initialise λ inside",
    ):
        raw_decay_sid(
            problem,
            lam,
            inner,
            inner_steps=5,
            adjoint_steps=5,
            feasible_set=FeasibleSet(contains=nonnegative),
        )


def test_step_leaving_the_feasible_set_without_projection_restores_lambda():
    problem, lam, inner = raw_weight_decay_problem(0.1)
    hopt = raw_decay_sid(
        problem,
        lam,
        inner,
        torch.optim.SGD([lam], lr=1.0),
        inner_steps=5,
        adjoint_steps=5,
        alpha=0.5,
        step_size="constant",
        feasible_set=FeasibleSet(contains=nonnegative),
    )
    before = lam.detach().clone()
    with pytest.raises(
        ConfigurationError, match=r"left the feasible set.*λ was restored.*projection"
    ):
        hopt.apply([torch.ones(4, dtype=torch.float64)])  # λ ← 0.1 − 1 < 0
    assert torch.equal(lam.detach(), before) and hopt.hyper_step == 0


# ====================================================================== data


def test_empty_training_loader():
    problem = make_ridge()
    empty = DataLoader(TensorDataset(problem.X[:0], problem.y[:0]), batch_size=10)
    for source in (empty, []):
        hopt = ridge_sid(problem, alpha=0.3, step_size="constant")
        with pytest.raises(ConfigurationError, match=r"train_batches is empty.*non-empty data"):
            hopt.hypergradient(source, problem.val())


def test_empty_validation_loader():
    problem = make_ridge()
    hopt = ridge_sid(problem, alpha=0.3, step_size="constant")
    empty = DataLoader(TensorDataset(problem.X_val[:0], problem.y_val[:0]), batch_size=10)
    with pytest.raises(ConfigurationError, match="validation DataLoader is empty"):
        hopt.hypergradient(problem.loader(10), empty)
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_one_shot_iterator_shorter_than_the_steps_asked_for_leaves_w():
    problem = make_ridge()
    hopt = ridge_sid(problem, steps=20, alpha=0.3, step_size="constant")
    with pytest.raises(
        ConfigurationError, match=r"one-shot iterator and ran out after 200 samples.*re-iterable"
    ):
        hopt.hypergradient(iter(problem.loader(20)), problem.val())  # 10 batches < 1 + 20 + 20
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_batch_of_another_shape_midway_leaves_w():
    problem = make_ridge()
    batches = [(problem.X[i : i + 10], problem.y[i : i + 10]) for i in range(0, 100, 10)]
    batches[5] = (torch.cat([batches[5][0], batches[5][0]], 1), batches[5][1])  # 10 features
    hopt = ridge_sid(problem, steps=8, alpha=0.3, step_size="constant")
    # the loss's own error (batches may differ in shape: padded sequences of varying length)
    with pytest.raises(RuntimeError, match=r"size mismatch"):
        hopt.hypergradient(batches, problem.val())
    assert torch.equal(problem.w.detach(), torch.zeros(5, dtype=torch.float64))


def test_training_data_that_is_not_iterable():
    problem = make_ridge()
    with pytest.raises(ConfigurationError, match=r"train_batches must be an iterable.*DataLoader"):
        ridge_sid(problem, alpha=0.3).hypergradient(42, problem.val())


# ====================================================================== steps and schedules


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(adjoint_steps=0), r"adjoint_steps \(k\) must be an integer ≥ 1, got 0"),
        (dict(inner_steps=-1), r"inner_steps \(t\) must be an integer ≥ 0, got -1"),
        (dict(adjoint_steps=-5), r"adjoint_steps \(k\) must be an integer ≥ 1, got -5"),
        (dict(inner_steps=10.0), r"inner_steps \(t\) must be an integer ≥ 0, got 10.0"),
        (dict(adjoint_steps="10"), r"adjoint_steps \(k\) must be an integer ≥ 1, got '10'"),
        (dict(inner_steps=True), r"inner_steps \(t\) must be an integer ≥ 0, got True"),
        (lambda: dict(on_divergence=BackOff(-1)), r"retries must be an integer ≥ 0"),
        (lambda: dict(batches=Batches(d2=0)), r"d2_batches \(J\) must be an integer ≥ 1"),
        (dict(step_size="decaying"), r"unknown step_size 'decaying'.*'constant', 'decreasing'"),
        (dict(adjoint_step_size="adam"), r"unknown adjoint_step_size 'adam'.*StepSchedule"),
        (dict(hvp="backward"), r"hvp must be 'reverse' or 'forward'"),
        (dict(hvp="forward"), r"hvp='forward' needs module="),
        (dict(mode="test"), r"mode must be 'train' or 'eval'"),
        (
            lambda: dict(batches=Batches(inner="minibatch")),
            r"inner_batches must be 'stochastic' or 'full'",
        ),
        (dict(batches=Batches(d2="full")), r"need full_train_batch=<one batch holding the whole"),
        (dict(divergence_factor=1.0), r"divergence_factor must be a number > 1"),
        (dict(outer_loss=None), r"outer_loss must be a callable"),
        (dict(inner_loss=None), r"give inner_loss\(batch\).*or fixed_point_map"),
    ],
)
def test_bad_configuration_is_refused_at_construction(kwargs, match):
    problem = make_ridge()
    args = dict(
        hyperparameters=[problem.log_lam],
        inner_parameters=[problem.w],
        inner_loss=problem.inner_loss,
        outer_loss=problem.outer_loss,
        inner_steps=5,
        adjoint_steps=5,
    )
    with pytest.raises(ConfigurationError, match=match):
        args.update(kwargs() if callable(kwargs) else kwargs)  # a bad strategy refuses itself
        args, settings = split_settings(args)
        SIDHyperOptimizer(**args, config=SIDConfig(**settings))


def test_numpy_integer_steps_are_accepted():
    problem = make_ridge()
    hopt = sid_on(problem, inner_steps=np.int64(5), adjoint_steps=np.int32(3), alpha=0.3)
    assert (hopt.inner_steps, hopt.adjoint_steps) == (5, 3)
    assert type(hopt.inner_steps) is int and type(hopt.adjoint_steps) is int


def test_unknown_preset_name():
    problem = make_ridge()
    with pytest.raises(ConfigurationError, match=r"unknown preset 'stoch'; choose one of batch, "):
        SIDHyperOptimizer(
            config=get_preset("stoch").config(total_epochs=1, n_train=200, batch_size=10),
            hyperparameters=[problem.log_lam],
            inner_parameters=[problem.w],
            inner_loss=problem.inner_loss,
            outer_loss=problem.outer_loss,
        )


def test_decreasing_steps_for_a_general_map_without_q():
    lam = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        outer_loss=lambda _: (w**2).sum(),
        fixed_point_map=lambda _: [0.5 * w + lam],
        config=SIDConfig(inner_steps=5, adjoint_steps=5, step_size="decreasing"),
    )
    with pytest.raises(ConfigurationError, match=r"general fixed-point map need.*pass q=\.\.\."):
        hopt.hypergradient([None], None)


def test_general_map_returning_the_wrong_shapes():
    lam = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        outer_loss=lambda _: (w**2).sum(),
        fixed_point_map=lambda _: [torch.cat([w, lam])],
        config=SIDConfig(inner_steps=5, adjoint_steps=5, step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match=r"shapes \[\(4,\)\].*\[\(2,\)\].*one tensor per"):
        hopt.hypergradient([None], None)


def test_theory_constants_reject_mu_above_l_and_alpha_above_two_over_l():
    with pytest.raises(ConfigurationError, match=r"mu \(2\) must not exceed L \(1\)"):
        theory_constants(L=1.0, mu=2.0)
    with pytest.raises(ConfigurationError, match=r"not a contraction.*Use alpha < 2/L = 0.2"):
        theory_constants(L=10.0, mu=1.0, alpha=0.2)  # q = |1 − 2| = 1
    with pytest.raises(ConfigurationError, match="mu must be a finite positive number"):
        theory_constants(L=10.0, mu=0.0)
    problem = make_ridge()
    hopt = ridge_sid(
        problem,
        alpha=0.5,
        curvature=KnownCurvature(10.0, 1.0),
    )  # decreasing steps need q(α, L, μ)
    with pytest.raises(ConfigurationError, match="not a contraction"):
        hopt.hypergradient(problem.loader(10), problem.val())


def test_step_and_apply_without_outer_optimizer():
    problem = make_ridge()
    hopt = ridge_sid(problem, alpha=0.3)
    with pytest.raises(ConfigurationError, match=r"step\(\) needs outer_optimizer"):
        hopt.step(problem.loader(10), problem.val())
    with pytest.raises(ConfigurationError, match=r"apply\(\) needs outer_optimizer"):
        hopt.apply([torch.zeros(5, dtype=torch.float64)])


def test_losses_that_are_not_scalars():
    problem = make_ridge()
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        lambda b: problem.w * problem.log_lam,
        problem.outer_loss,
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match="inner_loss.*must return a scalar tensor"):
        hopt.hypergradient(problem.loader(10), problem.val())
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        lambda b: b[0] @ problem.w,
        None,
        config=SIDConfig(inner_steps=5, adjoint_steps=5, alpha=0.3, step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match="outer_loss.*must return a scalar tensor"):
        hopt.hypergradient(problem.loader(10), problem.val())


# ====================================================================== BatchNorm and dropout


class ModeRecorder(nn.Module):
    """Identity that records ``self.training`` at every forward pass."""

    def __init__(self):
        super().__init__()
        self.log: list = []

    def forward(self, x):
        self.log.append(self.training)
        return x


def bn_dropout_problem(seed=0):
    torch.manual_seed(seed)
    recorder = ModeRecorder()
    net = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), recorder, nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 1)
    )
    with torch.no_grad():  # running statistics that differ from a fresh BatchNorm's
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
        net[1].num_batches_tracked.fill_(7)
    log_lam = torch.tensor([-2.0], requires_grad=True)
    X, y = torch.randn(64, 4), torch.randn(64, 1)
    Xv, yv = torch.randn(32, 4), torch.randn(32, 1)

    def inner(batch):
        penalty = sum((p**2).sum() for p in net.parameters())
        return ((net(batch[0]) - batch[1]) ** 2).mean() + 0.5 * log_lam.exp() * penalty

    def outer(batch):
        recorder.log.append("E")
        loss = ((net(batch[0]) - batch[1]) ** 2).mean()
        recorder.log.append("/E")
        return loss

    batches = [(X[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    return net, recorder, log_lam, inner, outer, batches, (Xv, yv)


@pytest.mark.parametrize("hvp", ["reverse", "forward"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_adjoint_solve_keeps_batchnorm_statistics_and_uses_one_mode(mode, hvp):
    net, recorder, log_lam, inner, outer, batches, val = bn_dropout_problem()
    hopt = module_sid(
        net,
        log_lam,
        inner,
        outer,
        inner_steps=0,
        adjoint_steps=6,
        step_size="constant",
        eta=0.5,
        mode=mode,
        hvp=hvp,
        curvature=EstimatedCurvature(iters=5),
        batches=Batches(d2=2),
    )
    net.train(mode == "eval")  # the opposite mode: the solve must switch, then switch back
    buffers = {n: b.clone() for n, b in net.named_buffers()}
    for _ in range(2):  # the first call also checks dependencies and estimates L, μ
        hopt.hypergradient(batches, val)
    for name, b in net.named_buffers():
        assert torch.equal(b, buffers[name]), name
    assert all(m.training == (mode == "eval") for m in net.modules())
    inside, outside, depth = [], [], 0  # forwards inside / outside outer_loss
    for flag in recorder.log:
        if flag in ("E", "/E"):
            depth += 1 if flag == "E" else -1
        else:
            (inside if depth else outside).append(flag)
    assert inside == [False, False]  # ∇E in eval mode, once per call
    # dependency check, power iterations, k adjoint products and J ∂₂ products: all in `mode`
    assert len(outside) >= 2 * (6 + 2)
    assert set(outside) == {mode == "train"}


def test_eval_mode_makes_the_adjoint_map_deterministic_despite_dropout():
    net, _, log_lam, inner, outer, batches, val = bn_dropout_problem()

    def hypergradient(mode):
        hopt = module_sid(
            net,
            log_lam,
            inner,
            outer,
            inner_steps=0,
            adjoint_steps=5,
            step_size="constant",
            eta=0.5,
            alpha=0.1,
            mode=mode,
            warm_start_adjoint=False,
        )
        return hopt.hypergradient(batches, val)[0]

    assert torch.equal(hypergradient("eval"), hypergradient("eval"))
    assert not torch.equal(hypergradient("train"), hypergradient("train"))  # fresh dropout masks
