"""Never a silent wrong answer (issue 29), core half: one test per family of the issue.

Each test reproduces a case that returned a wrong result with no error and no warning (or failed
naming the wrong cause), against the closed-form float64 ridge oracle of ``problems.py``:

1. assumptions checked only once (a map expanding after the first batch, α·L > 2);
2. settings that cannot reach the answer (α far too small, ``inner_steps=0`` on an untrained w,
   too few adjoint steps);
3. inputs that contradict each other (the penalty twice, part of w detached in E, a
   ``full_train_batch`` that is not the training set);
4. state that is not what the solve needs (edited constants in a state_dict, BatchNorm buffers);
5. λ where the outer optimizer cannot move it (Adam's ε above the hypergradient);
7. messages that blame the wrong thing; a skipped step that distorts the solver state.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from problems import make_ridge, relative_error, split_settings
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, DivergenceError, SIDHyperOptimizer
from hypertorch_sid.core.config import Batches, FeasibleSet, SIDConfig
from hypertorch_sid.core.divergence import Recover
from hypertorch_sid.core.errors import ConvergenceWarning

f64 = torch.float64


def _make(*args, **kwargs) -> SIDHyperOptimizer:
    """``SIDHyperOptimizer`` with the :class:`SIDConfig` fields among ``kwargs`` (and the batch
    sources ``inner_batches``/``adjoint_batches``/``d2_batches``, ``projection``) in its config."""
    batches = {k[: -len("_batches")]: kwargs.pop(k) for k in list(kwargs) if k.endswith("_batches")}
    if batches:
        kwargs["batches"] = Batches(**batches)
    if "projection" in kwargs:
        kwargs["feasible_set"] = FeasibleSet(project=kwargs.pop("projection"))
    kwargs, settings = split_settings(kwargs)
    return SIDHyperOptimizer(*args, config=SIDConfig(**settings), **kwargs)


def _sid(p, steps: int = 400, **kwargs) -> SIDHyperOptimizer:
    """Full-batch solves with η = 1 (``problems.full_batch_sid``) whose settings (``inner_steps``,
    ``outer_loss`` ...) may be changed."""
    settings = dict(
        inner_loss=p.inner_loss, outer_loss=p.outer_loss, inner_steps=steps, adjoint_steps=steps,
        step_size="constant", eta=1.0, inner_batches="full", adjoint_batches="full",
        d2_batches="full", full_train_batch=p.train(),
    )  # fmt: skip
    settings.update(kwargs)
    return _make([p.log_lam], [p.w], **settings)


def _top_curvature(p) -> float:
    n = p.X.shape[0]
    H = p.X.T @ p.X / n + torch.diag(p.lam())
    return float(torch.linalg.eigvalsh(H).max())


def _convergence_warnings(record) -> list[str]:
    return [str(r.message) for r in record if issubclass(r.category, ConvergenceWarning)]


# ====================================================================== 1. checked once


def test_expansive_alpha_never_reaches_lambda():
    """α·L = 2.5 with constant steps: the first step() wrote a hypergradient 38× too large."""
    p = make_ridge(per_feature=False)
    opt = torch.optim.SGD([p.log_lam], lr=0.1)
    sid = _sid(p, steps=10, alpha=2.5 / _top_curvature(p), outer_optimizer=opt)
    before = p.log_lam.detach().clone()
    with pytest.raises(DivergenceError, match="not a contraction|expand"):
        sid.step([p.train()], p.val())
    assert torch.equal(p.log_lam.detach(), before)


def test_map_contracting_on_first_batch_only_is_caught():
    """A general map with factor 0.5 on the first batch (where the contraction is checked) and
    1.1 on all others: the slow growth inside each solve must stop the hypergradient."""
    w = torch.zeros(3, dtype=f64, requires_grad=True)
    lam = torch.tensor([0.3], dtype=f64, requires_grad=True)
    ones = torch.ones(3, dtype=f64)

    def phi(batch):
        factor, x = batch
        return [factor * w + lam * x]

    batches = [(0.5, ones)] + [(1.1, ones)] * 200
    sid = _make(
        [lam],
        [w],
        outer_loss=lambda b: ((w - 1) ** 2).sum(),
        fixed_point_map=phi,
        inner_steps=10,
        adjoint_steps=10,
        step_size="constant",
        eta=1.0,
    )
    with pytest.raises(DivergenceError, match="grew"):
        sid.hypergradient(iter(batches), None)


# ====================================================================== 2. cannot reach


def test_alpha_far_too_small_warns():
    p = make_ridge(per_feature=False)
    sid = _sid(p, steps=50, alpha=0.01 / _top_curvature(p))  # 100× too small
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sid.hypergradient([p.train()], p.val())
    said = _convergence_warnings(rec)
    assert said and "inner solve" in said[0] and "alpha" in said[0], said


def test_untrained_w_without_inner_steps_warns():
    """inner_steps=0 on w = 0 returned an exact zero hypergradient, silently."""
    p = make_ridge(per_feature=False)
    sid = _sid(p, steps=50, inner_steps=0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sid.hypergradient([p.train()], p.val())
    said = _convergence_warnings(rec)
    assert said and "inner_steps=0" in said[0], said


def test_too_few_adjoint_steps_warns():
    p = make_ridge(per_feature=False)
    sid = _sid(p, steps=400, adjoint_steps=2, eta=0.5)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sid.hypergradient([p.train()], p.val())  # cold start: said at once
    said = _convergence_warnings(rec)
    assert said and "adjoint" in said[0] and "adjoint_steps" in said[0], said
    assert "[1 of 1 hyper steps" in said[0], said


def test_persistent_unconverged_adjoint_is_said_with_a_count_not_every_step():
    """Warm-started, a non-convergence that persists is said (after ``patience`` steps), then
    at the 10th, 100th, … such hyper step with the tally — not at every hyper step."""
    p = make_ridge(per_feature=False)
    sid = _sid(p, steps=400, adjoint_steps=2, eta=0.5)
    sid.hypergradient([p.train()], p.val())  # cold start, so that the next ones are warm
    sid.guard.reported = 0  # count from the warm-started steps on
    said: list[str] = []
    for _ in range(13):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            sid.hypergradient([p.train()], p.val())
        said.append(" | ".join(_convergence_warnings(rec)))
    warned = [i for i, s in enumerate(said) if s]
    # reported from the warm step that completes `patience` in a row (the cold one counts),
    # i.e. warm steps 1, 2, ... give reports 1, 2, ...; said at reports 1 and 10 only
    assert len(warned) == 2, said
    assert "adjoint_steps" in said[warned[0]] and "[1 of" in said[warned[0]], said
    assert "[10 of" in said[warned[1]] and "100th" in said[warned[1]], said
    assert warned[1] - warned[0] == 9, warned


def test_converged_oracle_run_is_quiet():
    """The checks cost no false alarm where the answer is right."""
    p = make_ridge()
    sid = _sid(p)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        g = sid.hypergradient([p.train()], p.val())
    assert not _convergence_warnings(rec)
    assert relative_error(g[0], p.exact_hypergradient()) < 1e-8


# ====================================================================== 3. contradictions


def test_penalty_inside_inner_loss_and_given_is_refused():
    """The penalty both in inner_loss and as penalty=: the answer was a doubled penalty's."""
    p = make_ridge()
    sid = _sid(p, penalty=lambda: [p.log_lam.exp()])
    with pytest.raises(ConfigurationError, match="penalty"):
        sid.hypergradient([p.train()], p.val())


def test_outer_loss_detaching_part_of_w_warns():
    p = make_ridge(d=4)
    w1 = torch.zeros(2, dtype=f64, requires_grad=True)
    w2 = torch.zeros(2, dtype=f64, requires_grad=True)

    def w():
        return torch.cat([w1, w2])

    def inner(batch):
        X, y = batch
        return 0.5 * ((X @ w() - y) ** 2).mean() + 0.5 * (p.log_lam.exp() * w() ** 2).sum()

    def outer(batch):
        X, y = batch
        return 0.5 * ((X @ torch.cat([w1, w2.detach()]) - y) ** 2).mean()

    sid = _make(
        [p.log_lam], [w1, w2], inner, outer, inner_steps=20, adjoint_steps=20,
        step_size="constant", eta=1.0, full_train_batch=p.train(), inner_batches="full",
        adjoint_batches="full", d2_batches="full",
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"inner parameter 1"):
        sid.hypergradient([p.train()], p.val())


def test_full_train_batch_that_is_not_the_training_set_is_refused():
    p = make_ridge()
    loader = DataLoader(TensorDataset(p.X, p.y), batch_size=20)
    sid = _make(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss, inner_steps=5, adjoint_steps=5,
        full_train_batch=(p.X[:50], p.y[:50]), d2_batches="full",
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="full_train_batch"):
        sid.hypergradient(loader, p.val())


# ====================================================================== 4. state


def _state_with(sid, **constants):
    state = copy.deepcopy(sid.state_dict())
    state["constants"].update(constants)
    return state


@pytest.mark.parametrize(
    "edit, named",
    [({"alpha": 1e-9}, "alpha"), ({"alpha": -0.1}, "alpha"), ({"q": 1.5}, "q"), ({"L": -1.0}, "L")],
)
def test_loaded_constants_are_validated(edit, named):
    p = make_ridge()
    sid = _sid(p, steps=20)
    sid.hypergradient([p.train()], p.val())
    fresh = _sid(make_ridge(), steps=20)
    with pytest.raises(ConfigurationError, match=named):
        fresh.load_state_dict(_state_with(sid, **edit))


def _bn_run(with_module: bool):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).double()
    lam = torch.tensor(-2.0, dtype=f64, requires_grad=True)
    X, y = torch.randn(64, 4, dtype=f64), torch.randn(64, dtype=f64)
    params = list(net.parameters())

    def inner(batch):
        xb, yb = batch
        fit = ((net(xb).squeeze(-1) - yb) ** 2).mean()
        return fit + 0.5 * lam.exp() * sum((q**2).sum() for q in params)

    def outer(batch):
        xb, yb = batch
        return ((net(xb).squeeze(-1) - yb) ** 2).mean()

    sid = _make(
        [lam], params, inner, outer, inner_steps=5, adjoint_steps=5, alpha=0.05,
        module=net if with_module else None,
    )  # fmt: skip
    batches = [(X[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)] * 10
    g = sid.hypergradient(iter(batches), (X, y))
    return g, dict(net.named_buffers())


def test_batchnorm_statistics_without_module_are_those_of_the_inner_steps():
    """Without module=, hypergradient() also moved the statistics in its checks, adjoint and
    cross-term passes (num_batches_tracked 0 → 13): now only the inner steps do, as with it."""
    g_module, expected = _bn_run(True)
    g, buffers = _bn_run(False)
    assert int(expected["1.num_batches_tracked"]) == 5
    for name, b in buffers.items():
        assert torch.equal(b, expected[name]), name


# ====================================================================== 5. λ out of reach


def test_adam_eps_swallowing_the_hypergradient_warns():
    """λ₀ = 1e-30: the hypergradient on log λ is ~1e-31 and Adam's ε = 1e-8 swallowed it."""
    p = make_ridge(per_feature=False, log_lam0=math.log(1e-30))
    opt = torch.optim.Adam([p.log_lam], lr=0.1)
    sid = _sid(p, steps=50, outer_optimizer=opt)
    with pytest.warns(ConvergenceWarning, match="eps"):
        for _ in range(3):
            sid.step([p.train()], p.val())


# ====================================================================== 7. messages


def test_negative_initial_lambda_with_projection_names_lambda():
    p = make_ridge(per_feature=False)
    lam = torch.tensor([-0.5], dtype=f64, requires_grad=True)

    def inner(batch):
        X, y = batch
        return 0.5 * ((X @ p.w - y) ** 2).mean() + 0.5 * (lam * p.w**2).sum()

    with pytest.raises(ConfigurationError, match="initial"):
        _make(
            [lam], [p.w], inner, p.outer_loss, torch.optim.SGD([lam], lr=0.1),
            projection=lambda hs: hs[0].clamp_(min=0), inner_steps=5, adjoint_steps=5,
        )  # fmt: skip


def test_generator_as_validation_batch_is_refused():
    p = make_ridge()
    sid = _sid(p, steps=20)
    with pytest.raises(ConfigurationError, match="val_batch"):
        sid.hypergradient([p.train()], (b for b in [p.val()]))


def test_nested_tuple_batch_is_not_split():
    """((X1, X2), (y1, y2)) with all parts shaped alike was split into two batches silently."""
    p = make_ridge(d=2)
    X1, X2 = p.X_val[:, 0], p.X_val[:, 1]
    seen = []

    def outer(batch):
        (a, b), (y, _) = batch
        seen.append(a.shape)
        return 0.5 * ((torch.stack([a, b], 1) @ p.w - y) ** 2).mean()

    sid = _sid(p, steps=20, outer_loss=outer)
    nested = ((X1, X2), (p.y_val, p.y_val))
    with pytest.raises(ConfigurationError, match=r"\[val_batch\] for one batch"):
        sid.hypergradient([p.train()], nested)
    sid.hypergradient([p.train()], [nested])  # said as one batch: read as one
    assert seen == [X1.shape]


def test_fixed_point_map_under_no_grad_is_named():
    w = torch.zeros(3, dtype=f64, requires_grad=True)
    lam = torch.tensor([0.3], dtype=f64, requires_grad=True)

    def phi(batch):
        with torch.no_grad():
            return [0.5 * w + lam]

    sid = _make(
        [lam], [w], outer_loss=lambda b: ((w - 1) ** 2).sum(), fixed_point_map=phi,
        inner_steps=5, adjoint_steps=5, q=0.5,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="no_grad"):
        sid.hypergradient(iter([None] * 100), None)


def test_skipped_step_leaves_solver_state_as_it_was():
    """NaN validation labels: the step fails, but must not ratchet the damping or α."""
    p = make_ridge()
    sid = _sid(p, steps=50, on_divergence=Recover(2))
    sid.hypergradient([p.train()], p.val())
    constants = (sid.alpha, sid.delta, sid.L, sid.q)
    Xv, yv = p.val()
    bad = (Xv, torch.where(torch.arange(len(yv)) == 3, math.nan, yv))
    for _ in range(3):
        with pytest.raises(DivergenceError, match="validation"):
            sid.hypergradient([p.train()], bad)
    assert (sid.alpha, sid.delta, sid.L, sid.q) == constants
    g = sid.hypergradient([p.train()], p.val())
    assert relative_error(g[0], p.exact_hypergradient()) < 1e-6
