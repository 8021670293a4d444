"""SIDHyperOptimizer's contract: warm start, presets, estimation, cost, state, dtypes, devices."""

from __future__ import annotations

import math

import pytest
import torch
from problems import full_batch_sid, make_ridge, module_sid, relative_error, ridge_sid

from hypertorch_sid import (
    PRESETS,
    Batches,
    BatchStream,
    ConfigurationError,
    EstimatedCurvature,
    GradientDescentMap,
    KnownCurvature,
    NoPreconditioner,
    SIDConfig,
    SIDHyperOptimizer,
    estimate_curvature,
    get_preset,
)


def test_warm_start_beats_cold_start_over_50_outer_steps():
    """Same budget per outer step; warm-started w and v track w(λ), v(λ) as λ moves."""

    def run(warm):
        problem = make_ridge(n=200, d=10, seed=2, log_lam0=-2.0)
        opt = torch.optim.SGD([problem.log_lam], lr=0.5)
        hopt = ridge_sid(
            problem, steps=5, outer=opt, warm_start_adjoint=warm, step_size="decreasing"
        )
        loader = problem.loader(100, seed=0)
        errors = []
        for _ in range(50):
            if not warm:
                problem.w.data.zero_()
            g = hopt.hypergradient(loader, problem.val())
            errors.append(relative_error(g[0], problem.exact_hypergradient()))
            hopt.apply(g)
        return sum(errors[10:]) / len(errors[10:])

    warm, cold = run(True), run(False)
    assert warm < 0.6 * cold, (warm, cold)


def test_presets_follow_the_appendix_rule():
    # 20news: 20 epochs, n_tr = 5657, batch 50 -> the paper's t = k = 1131 and Batch t = k = 10
    assert get_preset("stoch_dec").steps(20, 5657, 50) == (1131, 1131)
    assert get_preset("batch").steps(20, 5657, 50) == (10, 10)
    assert get_preset("batch_75_25").steps(20, 5657, 50) == (15, 5)
    assert get_preset("stoch_const_75_25").steps(20, 5657, 50) == (1697, 566)
    assert get_preset("stoch_batch").steps(20, 5657, 50) == (1131, 10)
    assert get_preset("batch_stoch").steps(20, 5657, 50) == (10, 1131)
    assert len(PRESETS) == 8
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("stoch")


def test_from_preset_configures_schedules_and_batches():
    problem = make_ridge()
    hopt = SIDHyperOptimizer(
        hyperparameters=[problem.log_lam],
        inner_parameters=[problem.w],
        inner_loss=problem.inner_loss,
        outer_loss=problem.outer_loss,
        full_train_batch=problem.train(),
        config=get_preset("stoch_batch").config(total_epochs=4, n_train=200, batch_size=10),
    )
    assert (hopt.inner_steps, hopt.adjoint_steps) == (40, 2)
    assert (hopt.inner_batches, hopt.adjoint_batches) == ("stochastic", "full")
    hopt.hypergradient(problem.loader(10), problem.val())
    inner, adjoint = hopt._schedules()
    assert inner(10) < inner(0)  # SGD dec
    assert adjoint(10) == adjoint(0) == 1.0  # GD
    assert hopt.cost.inner_samples == 40 * 10
    assert hopt.cost.adjoint_samples == 2 * 200


def test_curvature_estimate_matches_eigenvalues():
    problem = make_ridge(n=300, d=6, seed=4)
    lam = problem.lam()
    H = problem.X.T @ problem.X / 300 + torch.diag(lam)
    eig = torch.linalg.eigvalsh(H)
    phi = GradientDescentMap(problem.inner_loss, [problem.w], [problem.log_lam], alpha=1.0)
    est = estimate_curvature(phi, [problem.train()], iters=200)
    assert math.isclose(est.L, float(eig[-1]), rel_tol=1e-6)
    assert math.isclose(est.mu, float(eig[0]), rel_tol=1e-4)
    assert not est.mu_floored


def test_estimated_step_is_two_over_l_plus_mu_and_logged(caplog):
    """With estimate_batches='full' the estimate runs on the full batch: exact constants."""
    problem = make_ridge(n=300, d=6, seed=4)
    hopt = ridge_sid(
        problem,
        full_train_batch=problem.train(),
        curvature=EstimatedCurvature(batches="full", iters=200),
        preconditioner=NoPreconditioner(),
    )
    with caplog.at_level("INFO", logger="hypertorch_sid"):
        hopt.hypergradient(problem.loader(10), problem.val())
    eig = torch.linalg.eigvalsh(problem.X.T @ problem.X / 300 + torch.diag(problem.lam()))
    assert math.isclose(hopt.alpha, 2 / float(eig[0] + eig[-1]), rel_tol=1e-4)
    assert any("estimated L" in r.message for r in caplog.records)


def test_curvature_estimate_reads_minibatches_even_with_a_full_batch_given():
    """A given full batch is not read 20 times per estimate unless asked (batches='full'), and is
    read where the minibatches would read as many samples."""
    problem = make_ridge(n=300, d=6, seed=4)
    for batches, per_product in ((4, 10), (40, 300), ("full", 300)):
        hopt = ridge_sid(
            problem, steps=5, full_train_batch=problem.train(), curvature=EstimatedCurvature(batches=batches),
            preconditioner=NoPreconditioner(),
        )  # fmt: skip
        hopt.hypergradient(problem.loader(10), problem.val())
        c = hopt.cost
        assert c.curvature_samples == per_product * c.curvature_products, batches
    with pytest.raises(ConfigurationError, match=r"batches='full'.*needs full_train_batch"):
        ridge_sid(problem, steps=5, curvature=EstimatedCurvature(batches="full"))


def test_cost_accounting_counts_samples_and_products():
    problem = make_ridge()
    hopt = ridge_sid(
        problem,
        steps=7,
        alpha=0.5,
        curvature=KnownCurvature(3.0, 0.1),
        batches=Batches(d2=3),
    )
    hopt.hypergradient(problem.loader(10), problem.val())
    c = hopt.cost
    assert c.inner_samples == 70 and c.adjoint_samples == 70
    assert c.samples == 70 + 70 + 30
    assert c.gradient_evals == 7 and c.jacobian_vector_products == 7 + 3
    assert c.hypergradients == 1
    assert math.isclose(c.epochs(200), 170 / 200)


def test_inner_and_adjoint_draw_different_batches():
    problem = make_ridge()
    seen = []

    def inner_loss(batch):
        seen.append(batch[2])
        return problem.inner_loss(batch[:2])

    batches = [(problem.X[i : i + 10], problem.y[i : i + 10], i) for i in range(0, 200, 10)]
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        inner_loss,
        problem.outer_loss,
        None,
        config=SIDConfig(
            inner_steps=4, adjoint_steps=4, alpha=0.5, curvature=KnownCurvature(3.0, 0.1)
        ),
    )
    hopt.hypergradient(batches, problem.val())
    # one dependency check (batch 0; the stall probe re-reads it before and after the inner
    # solve), 4 inner steps, 4 adjoint steps, one ∂₂ batch: all different batches
    assert seen == [0, 0, 10, 20, 30, 40, 0, 50, 60, 70, 80, 90]


def test_state_dict_round_trip_reproduces_trajectory():
    def fresh():
        problem = make_ridge(seed=7)
        opt = torch.optim.Adam([problem.log_lam], lr=0.05)
        return problem, ridge_sid(problem, outer=opt, steps=10)

    batches = [make_ridge(seed=7).train()]
    problem, hopt = fresh()
    for _ in range(3):
        hopt.step(batches, problem.val())
    state = hopt.state_dict()
    w_saved = problem.w.detach().clone()
    for _ in range(3):
        hopt.step(batches, problem.val())
    reference = problem.log_lam.detach().clone()

    problem2, hopt2 = fresh()
    problem2.w.data.copy_(w_saved)
    hopt2.load_state_dict(state)
    assert hopt2.hyper_step == 3 and hopt2.v is not None
    for _ in range(3):
        hopt2.step(batches, problem2.val())
    assert torch.equal(problem2.log_lam.detach(), reference)


def _assert_same_state(a, b, where="state"):
    """``a`` and ``b`` hold the same nested dicts, lists, tensors (dtype, shape, values), numbers."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert (
            torch.equal(a, b)
            or torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(), b.nan_to_num())
        ), where
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def test_state_dict_survives_torch_save_weights_only(tmp_path):
    problem = make_ridge()
    hopt = ridge_sid(problem, outer=torch.optim.Adam([problem.log_lam], lr=0.1))
    hopt.step(problem.loader(10), problem.val())
    saved = hopt.state_dict()
    torch.save(saved, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    _assert_same_state(state, saved)
    problem2 = make_ridge()
    hopt2 = ridge_sid(problem2, outer=torch.optim.Adam([problem2.log_lam], lr=0.1))
    hopt2.load_state_dict(state)
    _assert_same_state(hopt2.state_dict(), saved)
    assert torch.equal(problem2.log_lam.detach(), problem.log_lam.detach())


def test_float32_problem_stays_float32_and_float64_stays_float64():
    for dtype in (torch.float32, torch.float64):
        problem = make_ridge(dtype=dtype)
        g = ridge_sid(problem).hypergradient(problem.loader(10), problem.val())
        assert g[0].dtype == dtype and problem.w.dtype == dtype


def test_module_parameters_and_forward_hvp_agree_with_reverse():
    torch.manual_seed(0)
    X, y = torch.randn(64, 5), torch.randn(64, 1)
    results = []
    for hvp in ("reverse", "forward"):
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        log_lam = torch.zeros(1, requires_grad=True)

        def inner(b, net=net, log_lam=log_lam):
            pen = sum((p**2).sum() for p in net.parameters())
            return ((net(b[0]) - b[1]) ** 2).mean() + 0.5 * log_lam.exp() * pen

        def outer(b, net=net):
            return ((net(b[0]) - b[1]) ** 2).mean()

        hopt = module_sid(
            net,
            log_lam,
            inner,
            outer,
            inner_steps=5,
            adjoint_steps=5,
            alpha=0.1,
            hvp=hvp,
            curvature=KnownCurvature(5.0, 0.5),
        )
        results.append(hopt.hypergradient([(X, y)], (X, y))[0])
    assert torch.allclose(results[0], results[1], rtol=1e-4, atol=1e-6)


def test_batch_stream_reiterates_loaders_and_reports_exhausted_generators():
    stream = BatchStream([1, 2], "x")
    assert [next(stream) for _ in range(5)] == [1, 2, 1, 2, 1]
    gen = BatchStream(iter([torch.zeros(3, 2)]), "train_batches")
    next(gen)
    with pytest.raises(ValueError, match="one-shot iterator"):
        next(gen)
    with pytest.raises(ValueError, match="empty"):
        next(BatchStream([], "train_batches"))


@pytest.mark.cuda
def test_cuda_tensors_stay_on_cuda():
    problem = make_ridge(device="cuda")
    g = ridge_sid(problem).hypergradient([problem.train()], problem.val())
    assert g[0].is_cuda and problem.w.is_cuda
    problem_cpu = make_ridge()
    hopt = ridge_sid(
        problem_cpu,
        steps=400,
        step_size="constant",
        eta=1.0,
        full_train_batch=problem_cpu.train(),
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )
    g_cpu = hopt.hypergradient([problem_cpu.train()], problem_cpu.val())
    assert relative_error(g_cpu[0], problem_cpu.exact_hypergradient()) < 1e-8


def test_reestimate_every_tracks_curvature_as_lambda_grows():
    problem = make_ridge(n=200, d=5, log_lam0=-3.0)
    hopt = ridge_sid(
        problem,
        outer=torch.optim.SGD([problem.log_lam], lr=1.0),
        curvature=EstimatedCurvature(iters=100, every=1),
        full_train_batch=problem.train(),
        preconditioner=NoPreconditioner(),
    )
    hopt.step([problem.train()], problem.val())
    alpha0 = hopt.alpha
    with torch.no_grad():
        problem.log_lam.fill_(2.0)  # λ = e² ≈ 7.4: L grows, α must shrink
    eig = torch.linalg.eigvalsh(problem.X.T @ problem.X / 200 + torch.diag(problem.lam()))
    hopt.step([problem.train()], problem.val())
    assert hopt.alpha < alpha0
    assert math.isclose(hopt.alpha, 2 / float(eig[0] + eig[-1]), rel_tol=1e-2)


def _ridge_eigs(problem):
    n = problem.X.shape[0]
    return torch.linalg.eigvalsh(problem.X.T @ problem.X / n + torch.diag(problem.lam()))


def test_set_constants_from_L_mu_gives_theory_alpha_and_exact_hypergradient():
    """L_λ, μ_λ set by hand after λ moved: α = 2/(L+μ), q = (L−μ)/(L+μ), and full-batch solves
    with those constants reproduce the closed-form ridge hypergradient at the new λ."""
    problem = make_ridge(n=200, d=5, log_lam0=-3.0)
    hopt = full_batch_sid(problem, steps=600)
    hopt.hypergradient([problem.train()], problem.val())
    with torch.no_grad():
        problem.log_lam.fill_(1.0)
    eig = _ridge_eigs(problem)
    L, mu = float(eig[-1]), float(eig[0])
    hopt.set_constants(L=L, mu=mu)
    assert math.isclose(hopt.alpha, 2 / (L + mu)) and hopt.phi.alpha == hopt.alpha
    assert math.isclose(hopt.q, (L - mu) / (L + mu))
    g = hopt.hypergradient([problem.train()], problem.val())
    assert relative_error(g[0], problem.exact_hypergradient()) < 1e-8


def test_set_constants_without_values_reestimates_at_current_lambda():
    problem = make_ridge(n=200, d=5, log_lam0=-3.0)
    hopt = ridge_sid(
        problem,
        full_train_batch=problem.train(),
        curvature=EstimatedCurvature(iters=200),
        preconditioner=NoPreconditioner(),
    )
    hopt.hypergradient([problem.train()], problem.val())
    with torch.no_grad():
        problem.log_lam.fill_(2.0)
    hopt.set_constants()
    hopt.hypergradient([problem.train()], problem.val())
    eig = _ridge_eigs(problem)
    assert math.isclose(hopt.L, float(eig[-1]), rel_tol=1e-3)
    assert math.isclose(hopt.alpha, 2 / float(eig[0] + eig[-1]), rel_tol=1e-2)


def test_set_constants_alpha_and_q_used_as_given():
    problem = make_ridge(n=200, d=5)
    hopt = ridge_sid(
        problem,
        curvature=KnownCurvature(10.0, 0.1),
    )
    hopt.set_constants(alpha=0.05, q=0.9)
    hopt.hypergradient([problem.train()], problem.val())
    assert (hopt.alpha, hopt.q, hopt.phi.alpha) == (0.05, 0.9, 0.05)
    assert hopt.last["alpha"] == 0.05


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(L=1.0, mu=2.0), "must not exceed L"),
        (dict(L=1.0, mu=0.1, alpha=5.0), "not a contraction"),
        (dict(L=1.0, mu=0.1, q=0.5), "contradicts"),
        (dict(alpha=-1.0), "alpha must be a finite positive"),
        (dict(alpha=0.1, q=1.0), r"q must be a contraction constant in \[0, 1\)"),
        (dict(L=float("nan")), "L must be a finite positive"),
    ],
)
def test_set_constants_rejects_bad_values_and_keeps_old_ones(kwargs, match):
    from hypertorch_sid import ConfigurationError

    problem = make_ridge(n=200, d=5)
    hopt = ridge_sid(
        problem,
        curvature=KnownCurvature(10.0, 0.1),
    )
    hopt.hypergradient([problem.train()], problem.val())
    before = (hopt.alpha, hopt.L, hopt.mu, hopt.q, hopt.phi.alpha)
    with pytest.raises(ConfigurationError, match=match):
        hopt.set_constants(**kwargs)
    assert (hopt.alpha, hopt.L, hopt.mu, hopt.q, hopt.phi.alpha) == before


def test_norm_is_accurate_in_every_precision():
    """The residual norm used for divergence checks: float64 exact, float32 to rounding, half
    types without overflow (their squares exceed float16's range here)."""
    from hypertorch_sid.core.solvers import norm

    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(1000, 30, generator=gen, dtype=torch.float64) * 1e3, torch.ones(7)]
    xs[1] = xs[1].double()
    ref = math.sqrt(sum(float((x * x).sum()) for x in xs))
    assert norm(xs) == pytest.approx(ref, rel=1e-12)
    assert norm([x.float() for x in xs]) == pytest.approx(ref, rel=1e-5)
    for half in (torch.float16, torch.bfloat16):
        assert norm([x.to(half) for x in xs]) == pytest.approx(ref, rel=1e-2)
    assert norm([]) == 0.0


def test_set_constants_needs_a_gradient_map():
    from hypertorch_sid import ConfigurationError

    problem = make_ridge(n=50, d=5)
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        outer_loss=problem.outer_loss,
        fixed_point_map=lambda b: [problem.w - 0.1 * problem.w],
        config=SIDConfig(step_size="constant"),
    )
    with pytest.raises(ConfigurationError, match="general fixed_point_map"):
        hopt.set_constants(L=1.0, mu=0.1)


def test_head_takes_the_first_samples_of_any_batch_structure():
    from collections import namedtuple

    from hypertorch_sid.core.batches import head

    X, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    assert torch.equal(head(X, 3), X[:3])
    hx, hy = head((X, y), 3)
    assert torch.equal(hx, X[:3]) and torch.equal(hy, y[:3])
    d = head({"x": X, "y": [y, y]}, 2)
    assert torch.equal(d["x"], X[:2]) and torch.equal(d["y"][1], y[:2])
    Pair = namedtuple("Pair", "x y")
    p = head(Pair(X, y), 4)
    assert isinstance(p, Pair) and torch.equal(p.y, y[:4])
    assert torch.equal(head(X, 50), X)  # fewer samples than asked: all of them
    sparse = X.to_sparse()
    assert head(sparse, 3) is sparse  # samples not separable: the batch itself


def test_join_concatenates_batches_of_any_structure_and_keeps_the_rest_apart():
    from collections import namedtuple

    from hypertorch_sid.core.batches import join

    X, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    parts = [(X[i : i + 2], y[i : i + 2]) for i in range(0, 10, 2)]  # 5 batches of 2
    joined = join(parts, 2)
    assert [len(b[1]) for b in joined] == [4, 4, 2]
    assert torch.equal(torch.cat([b[0] for b in joined]), X)
    Pair = namedtuple("Pair", "x y")
    (whole,) = join([Pair(X[:3], {"y": y[:3]}), Pair(X[3:], {"y": y[3:]})], 8)
    assert isinstance(whole, Pair) and torch.equal(whole.x, X) and torch.equal(whole.y["y"], y)
    sparse = [X[:5].to_sparse(), X[5:].to_sparse()]
    assert join(sparse, 2) == sparse  # samples not joinable: kept as they were
    ragged = [(X[:2], torch.zeros(3)), (X[2:4], torch.zeros(3))]  # no shared sample dimension
    assert join(ragged, 2) == ragged


def test_next_pass_reads_one_whole_epoch_and_the_stream_goes_on():
    from torch.utils.data import DataLoader, TensorDataset

    from hypertorch_sid.core.batches import BatchStream

    X = torch.arange(30.0).reshape(30, 1)
    gen = torch.Generator().manual_seed(0)
    stream = BatchStream(DataLoader(TensorDataset(X), batch_size=4, shuffle=True, generator=gen))
    assert stream.batches_per_pass == 8
    next(stream)  # mid-pass: the epoch still starts from a fresh pass
    epoch = stream.next_pass()
    assert sorted(torch.cat([b[0] for b in epoch]).flatten().tolist()) == X.flatten().tolist()
    assert stream.batches_drawn == 9 and stream.samples_drawn == 34
    assert len(next(stream)[0]) == 4  # and the stream goes on
    assert BatchStream(iter([X])).batches_per_pass is None  # one-shot: no passes

    class Endless:  # says 3 minibatches per pass, never ends one
        def __len__(self) -> int:
            return 3

        def __iter__(self):
            while True:
                yield X[:4]

    assert len(BatchStream(Endless()).next_pass()) == 3
    assert BatchStream(b for b in [X]).batches_per_pass is None
