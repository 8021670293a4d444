"""One configuration, validated once: SIDConfig shared by the core and the callback, one name for
each setting (the flat 0.1 names refused with what replaces them), and the core WeightDecay
container."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from problems import full_batch_sid, make_ridge, relative_error

from hypertorch_sid import (
    Automatic,
    AveragedMomentum,
    BackOff,
    Batches,
    ConfigurationError,
    ConjugateGradient,
    CurvatureDamping,
    EstimatedCurvature,
    FeasibleSet,
    FisherDiagonal,
    FixedDamping,
    FixedPointIteration,
    HyperOptimizationCallback,
    KnownCurvature,
    LearnedWeightDecay,
    LogDecay,
    ProjectedDecay,
    Recover,
    SIDConfig,
    SIDHyperOptimizer,
    VarianceReduced,
    WeightDecay,
)
from hypertorch_sid.lightning import CALLBACK_CONFIG


# ------------------------------------------------------------------------------ SIDConfig
@pytest.mark.parametrize(
    "name, replacement",
    [
        ("L", "KnownCurvature"),
        ("mu", "KnownCurvature"),
        ("estimate_batches", r"EstimatedCurvature\(batches="),
        ("estimate_iters", r"EstimatedCurvature\(iters="),
        ("reestimate_every", r"EstimatedCurvature\(every="),
        ("backoff", r"on_divergence=BackOff"),
        ("projection", r"FeasibleSet\(project="),
        ("feasible", r"FeasibleSet\(contains="),
        ("inner_batches", r"Batches\(inner="),
        ("adjoint_batches", r"Batches\(adjoint="),
        ("d2_batches", r"Batches\(d2="),
    ],
)
def test_the_flat_names_of_0_1_are_refused_with_their_replacement(name, replacement):
    with pytest.raises(ConfigurationError, match=rf"\['{name}'\] were removed.*{replacement}"):
        SIDConfig.from_settings(**{name: 1})
    with pytest.raises(ConfigurationError, match=replacement):
        HyperOptimizationCallback(**{name: 1})
    with pytest.raises(TypeError):  # the optimizer takes its settings as config= only
        SIDHyperOptimizer([], [], outer_loss=print, **{name: 1})


def test_strategies_are_refined_by_replacing_their_fields():
    c = CALLBACK_CONFIG.replace(curvature=dataclasses.replace(CALLBACK_CONFIG.curvature, iters=30))
    assert c.curvature == EstimatedCurvature(batches=2, iters=30, every=10)
    assert c.on_divergence == Recover(retries=2)  # untouched
    c = SIDConfig(curvature=KnownCurvature(4.0, 0.5), on_divergence=BackOff(2))
    assert c.replace(batches=Batches(d2="full")).curvature == KnownCurvature(4.0, 0.5)


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(warm_start=True), r"unknown setting\(s\) \['warm_start'\]"),
        (dict(damping="curvature"), r"damping must be a Damping object"),
        (dict(adjoint_solver=ConjugateGradient), r"adjoint_solver must be a AdjointSolver"),
        (dict(divergence_factor=0.5), r"divergence_factor must be a number > 1"),
        (dict(sigma2=-1.0), r"sigma2 must be a number ≥ 0"),
        (dict(q=1.0), r"q must be a contraction constant in \[0, 1\)"),
        (dict(hvp="backward"), r"hvp must be 'reverse' or 'forward'"),
        (lambda: dict(batches=Batches(d2=0)), r"d2_batches \(J\) must be an integer ≥ 1"),
    ],
)
def test_bad_settings_are_refused_in_one_place(settings, match):
    with pytest.raises(ConfigurationError, match=match):
        SIDConfig.from_settings(**(settings() if callable(settings) else settings))


def test_the_config_is_frozen_and_replace_validates_again():
    c = SIDConfig(adjoint_steps=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.adjoint_steps = 6  # type: ignore[misc]
    assert c.replace(adjoint_steps=6).adjoint_steps == 6 and c.adjoint_steps == 5
    with pytest.raises(ConfigurationError, match=r"adjoint_steps \(k\) must be an integer ≥ 1"):
        c.replace(adjoint_steps=0)


def test_numpy_integers_pass_the_core_and_the_callback_alike():
    c = SIDConfig.from_settings(inner_steps=np.int64(5), adjoint_steps=np.int32(3))
    assert (c.inner_steps, c.adjoint_steps) == (5, 3) and type(c.inner_steps) is int
    cb = HyperOptimizationCallback(every_n_steps=np.int64(4), adjoint_steps=np.int64(3))
    assert (cb.every_n_steps, cb.adjoint_steps) == (4, 3)
    curvature = EstimatedCurvature(batches=np.int64(3))
    assert HyperOptimizationCallback(curvature=curvature).config.curvature.batches == 3


def test_the_callback_refuses_bad_settings_at_construction_not_at_train_start():
    with pytest.raises(ConfigurationError, match="divergence_factor must be a number > 1"):
        HyperOptimizationCallback(divergence_factor=0.5)
    with pytest.raises(ConfigurationError, match=r"did you mean adjoint_steps="):
        LearnedWeightDecay(1e-3, adjoint_step=4)


def test_a_mistyped_drop_in_argument_names_the_drop_in_and_its_own_arguments():
    from hypertorch_sid import LearnedDataWeights

    with pytest.raises(ConfigurationError) as info:
        LearnedDataWeights(num_class=3)
    message = str(info.value)
    assert message.startswith("LearnedDataWeights: unknown argument(s) ['num_class']")
    assert "did you mean num_classes=" in message and "'per'" in message
    with pytest.raises(ConfigurationError, match=r"LearnedWeightDecay: .*did you mean outer_lr="):
        LearnedWeightDecay(1e-3, outer_lrr=0.1)


def test_the_callback_and_the_core_share_one_config():
    cb = HyperOptimizationCallback(
        config=SIDConfig(damping=FixedDamping(0.1)), step_size="constant"
    )
    assert cb.config.damping == FixedDamping(0.1) and cb.config.step_size == "constant"
    assert HyperOptimizationCallback().config == CALLBACK_CONFIG
    config = CALLBACK_CONFIG.replace(on_divergence=BackOff(1))
    assert HyperOptimizationCallback(config=config).config.on_divergence == BackOff(1)


def test_config_and_flat_keywords_give_the_same_hypergradient():
    """The short path (flat keywords) and an explicit SIDConfig are the same algorithm."""
    flat_problem, config_problem = make_ridge(), make_ridge()
    g_flat = full_batch_sid(flat_problem, steps=200).hypergradient(
        flat_problem.loader(50), flat_problem.val()
    )
    config = SIDConfig(
        inner_steps=200,
        adjoint_steps=200,
        step_size="constant",
        eta=1.0,
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )
    hopt = SIDHyperOptimizer(
        [config_problem.log_lam],
        [config_problem.w],
        config_problem.inner_loss,
        config_problem.outer_loss,
        config=config,
        full_train_batch=config_problem.train(),
    )
    assert hopt.config is config
    g = hopt.hypergradient(config_problem.loader(50), config_problem.val())
    torch.testing.assert_close(g[0], g_flat[0], rtol=1e-12, atol=0)
    assert relative_error(g[0], config_problem.exact_hypergradient()) < 1e-6


def test_settings_override_the_given_config():
    problem = make_ridge()
    hopt = SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        problem.outer_loss,
        config=SIDConfig(inner_steps=7).replace(adjoint_steps=3),
    )
    assert (hopt.inner_steps, hopt.adjoint_steps) == (7, 3)


# ------------------------------------------------------------------------------ WeightDecay
def test_weight_decay_container_gives_the_exact_ridge_hypergradient():
    """A per-element LogDecay over w is the ridge's per-feature log λ: same oracle."""
    problem = make_ridge()
    decay = WeightDecay([("w", problem.w)], 1.0, granularity="per_element", elements="untied")
    with torch.no_grad():
        decay.hyperparameters[0].copy_(problem.log_lam)

    def inner_loss(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w - y) ** 2).mean() + decay.penalty()

    config = full_batch_sid(problem, steps=400).config
    hopt = SIDHyperOptimizer(
        decay.hyperparameters,
        [problem.w],
        inner_loss,
        problem.outer_loss,
        config=config,
        full_train_batch=problem.train(),
    )
    g = hopt.hypergradient(problem.loader(50), problem.val())
    assert relative_error(g[0], problem.exact_hypergradient()) < 1e-6


@pytest.mark.parametrize(
    "granularity, slots",
    [("global", 1), ("per_group", 2), ("per_layer", 2), ("per_tensor", 3), ("per_element", None)],
)
def test_weight_decay_granularity(granularity, slots):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1, bias=False))
    named = [(n, p, "decay" if p.dim() > 1 else "bias") for n, p in net.named_parameters()]
    decay = WeightDecay(named, 0.01, granularity)
    if slots is None:  # tied to the layer: ρ of the 2 layers, then s_e shaped like each tensor
        assert [h.shape for h in decay.hyperparameters] == [(2,)] + [p.shape for _, p, _ in named]
    else:
        assert decay.hyperparameters[0].shape == (slots,)
    values = decay.values()
    assert set(values) == {n for n, _, _ in named}
    assert all(torch.allclose(v, torch.tensor(0.01, dtype=v.dtype)) for v in values.values())
    expected = 0.5 * 0.01 * sum(p.detach().pow(2).sum() for _, p, _ in named)
    torch.testing.assert_close(decay.penalty().detach(), expected)


def test_weight_decay_projection_and_parameterisations():
    w = torch.ones(3, requires_grad=True)
    log = WeightDecay([("w", w)], 0.5, "per_tensor", LogDecay())
    with torch.no_grad():
        log.hyperparameters[0].fill_(5.0)  # λ = e⁵
    log.project([2.0])
    assert float(log.summary()) == pytest.approx(2.0)
    proj = WeightDecay([("w", w)], 0.5, "per_tensor", ProjectedDecay())
    with torch.no_grad():
        proj.hyperparameters[0].fill_(-1.0)
    proj.project()
    assert float(proj.summary()) == 0.0
    with pytest.raises(ConfigurationError, match="log parameterisation needs λ₀ > 0"):
        WeightDecay([("w", w)], 0.0)
    with pytest.raises(ConfigurationError, match="FeasibleSet.project must be a callable"):
        FeasibleSet(project=3)
    with pytest.raises(ConfigurationError, match="granularity must be one of"):
        WeightDecay([("w", w)], 0.1, "per_neuron")
    with pytest.raises(ConfigurationError, match="parameterization must be 'log', 'projection'"):
        WeightDecay([("w", w)], 0.1, parameterization="exp")


def test_the_drop_in_defaults_are_the_benchmarked_ones():
    cb = LearnedWeightDecay(1e-4, granularity="per_layer")
    assert (cb.every_n_steps, cb.adjoint_steps, cb.outer_lr) == (20, 3, 0.3)
    assert cb.config.curvature.every == 10
    per_element = LearnedWeightDecay(1e-4, granularity="per_element")  # as per layer
    assert per_element.outer_lr == 0.3 and per_element.config.curvature.every == 10
    untied = LearnedWeightDecay(1e-4, granularity="per_element", elements="untied")
    assert untied.outer_lr == 1.0 and untied.config.curvature.every is None
    mine = LearnedWeightDecay(
        1e-4,
        granularity="per_element",
        every_n_steps=5,
        curvature=EstimatedCurvature(batches=2, iters=10, every=4),
    )
    assert mine.every_n_steps == 5 and mine.config.curvature.every == 4


# ------------------------------------------------------------------------------ one rule
_NUMBERS = [  # (strategy, its field, a NumPy value it accepts, a bool of the right size)
    (lambda v: SIDConfig(alpha=v), "alpha", np.float32(0.5), True),
    (lambda v: SIDConfig(sigma2=v), "sigma2", np.float64(0.5), True),
    (lambda v: SIDConfig(inner_steps=v), "inner_steps", np.int64(3), True),
    (lambda v: SIDConfig(q=v), "q", np.float32(0.5), False),
    (lambda v: Batches(d2=v), "d2", np.int32(2), True),
    (lambda v: KnownCurvature(v), "L", np.float32(2.0), True),
    (lambda v: EstimatedCurvature(iters=v), "iters", np.int64(5), True),
    (lambda v: EstimatedCurvature(mu=v), "mu", np.float32(0.5), True),
    (lambda v: FixedDamping(v), "value", np.float32(0.5), True),
    (lambda v: CurvatureDamping(margin=v), "margin", np.float64(0.5), True),
    (lambda v: BackOff(v), "retries", np.int64(2), True),
    (lambda v: AveragedMomentum(momentum=v), "momentum", np.float32(0.25), False),
    (lambda v: FixedPointIteration(momentum=v), "momentum", np.float32(0.25), False),
    (lambda v: VarianceReduced(eta_scale=v), "eta_scale", np.float32(0.5), True),
    (lambda v: Automatic(chunk=v), "chunk", np.int64(4), True),
    (lambda v: FisherDiagonal(samples=v), "samples", np.int64(8), True),
]


@pytest.mark.parametrize("build, field, numpy_value, boolean", _NUMBERS)
def test_a_bool_is_not_a_number_and_numpy_scalars_are(build, field, numpy_value, boolean):
    """One rule in every module: NumPy scalars are accepted (stored as Python numbers), a bool
    is refused naming the setting."""
    value = getattr(build(numpy_value), field)
    assert value == numpy_value and type(value) in (int, float)
    with pytest.raises(ConfigurationError, match=rf"{field}.* must be .*got {boolean}"):
        build(boolean)


def test_the_callback_follows_the_same_rule():
    cb = HyperOptimizationCallback(every_n_steps=np.int64(4), outer_lr=np.float32(0.5))
    assert type(cb.every_n_steps) is int and type(cb.outer_lr) is float
    for bad in (dict(every_n_steps=True), dict(outer_lr=True), dict(val=True)):
        with pytest.raises(ConfigurationError, match="HyperOptimizationCallback: .* must be"):
            HyperOptimizationCallback(**bad)
