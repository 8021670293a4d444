"""Careless users, session 60: outer optimizers with odd parameter groups, a fixed-point map
object built over other tensors or with its own α.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Careless inputs (session 60)".
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import QUICK, TOY_X, TOY_Y, ToyClassifier, trainer
from problems import make_ridge
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    BackOff,
    ConfigurationError,
    ConjugateGradient,
    ConstantStep,
    ContractionMap,
    CurvatureDamping,
    EstimatedCurvature,
    ExpectedError,
    GaussNewton,
    GradientDescentMap,
    HoldInvariant,
    HorizonDamping,
    IndexedDataset,
    LazyAdam,
    LearnedDataWeights,
    LearnedWeightDecay,
    SampleWeights,
    SIDConfig,
    SIDHyperOptimizer,
    SoftmaxWeights,
    TrainedWeights,
    class_weights,
)
from hypertorch_sid.core.outer_step import ReachRprop, SignalGatedAdam, TrustRprop

X, Y = TOY_X, TOY_Y
SHORT = SIDConfig(inner_steps=5, adjoint_steps=5)


def _ridge(seed: int = 0) -> tuple[Any, list[Any], Any]:
    p = make_ridge(seed=seed)
    train = [(p.X[i : i + 20], p.y[i : i + 20]) for i in range(0, 200, 20)]
    return p, train, (p.X_val, p.y_val)


def _sid(p: Any, outer: torch.optim.Optimizer, **kw: Any) -> SIDHyperOptimizer:
    config = kw.pop("config", SHORT)
    return SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss, outer, config=config, **kw
    )


# ------------------------------------------------------- the outer optimizer's parameter groups
def test_an_outer_group_of_negative_lr_is_refused() -> None:
    """torch checks only an optimizer's default lr: SGD([{"params": [log_lam], "lr": -0.5}],
    lr=0.1) was taken and climbed E (0.340 → 0.351 → 0.377 over three hyper steps of the
    ridge), as maximize=True did before session 51."""
    p, _, _ = _ridge()
    outer = torch.optim.SGD([{"params": [p.log_lam], "lr": -0.5}], lr=0.1)
    with pytest.raises(ConfigurationError, match=r"lr=-0\.5 in parameter group 0.*up the hyper"):
        _sid(p, outer)


def test_an_outer_group_of_lr_0_is_said_not_blamed_on_float_resolution() -> None:
    """Adam([log_lam], lr=0) ran, and every hyper step said "the step is below the
    floating-point resolution of λ ... raise the outer learning rate" (hypergradient 0.14).
    A warning, not an error: lr=0 holds λ for a diagnostic run of the solves (as
    tests/test_strategies.py does)."""
    p, _, _ = _ridge()
    with pytest.warns(UserWarning, match=r"lr=0 in parameter group 0.*never move"):
        _sid(p, torch.optim.Adam([p.log_lam], lr=0.0))


def test_a_drop_in_given_an_outer_optimizer_at_lr_0_is_said_at_the_fit() -> None:
    """LearnedWeightDecay(outer_optimizer=functools.partial(torch.optim.Adam, lr=0.0)): λ
    stayed at λ₀ through the fit, said only as a floating-point-resolution problem."""
    zero = functools.partial(torch.optim.Adam, lr=0.0)
    cb = LearnedWeightDecay(1e-4, outer_optimizer=zero, **QUICK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(
            ToyClassifier(),
            DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16),
            DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20),
        )
    said = [str(w.message) for w in caught if "lr=0 in parameter group 0" in str(w.message)]
    assert len(said) == 1


@pytest.mark.parametrize(
    "make, group, said",
    [
        (SignalGatedAdam, {"lr": -1.0}, r"SignalGatedAdam: lr must be"),
        (SignalGatedAdam, {"betas": (1.0, 0.999)}, r"SignalGatedAdam: betas\[0\] must be"),
        (TrustRprop, {"lr": -1.0}, r"TrustRprop: lr must be"),
        (ReachRprop, {"step_sizes": (2.0, 0.01)}, r"ReachRprop: step_sizes is"),
        (LazyAdam, {"lr": -1.0}, r"LazyAdam: lr must be"),
        (LazyAdam, {"betas": (0.9,)}, r"LazyAdam: betas must be"),
    ],
    ids=["gated-lr", "gated-betas", "trust-lr", "reach-steps", "lazy-lr", "lazy-betas"],
)
def test_the_package_outer_steps_check_each_groups_own_settings(
    make: type, group: dict[str, Any], said: str
) -> None:
    """Settings given in a parameter group skipped the constructor's checks: SignalGatedAdam,
    TrustRprop and LazyAdam at a group lr=-1 moved λ up the hypergradient; SignalGatedAdam at
    group betas=(1.0, 0.999) raised ZeroDivisionError at the first step."""
    x = torch.zeros(3, requires_grad=True)
    with pytest.raises(ConfigurationError, match=said + r".*parameter group 0"):
        make([{"params": [x], **group}])
    opt = make([x])  # a group added later is checked too, and not kept when refused
    with pytest.raises(ConfigurationError, match=said + r".*parameter group 1"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], **group})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("betas", [(0.9,), 0.9, (0.9, 0.999, 0.9)], ids=["one", "scalar", "three"])
def test_signal_gated_adam_betas_must_be_two_numbers(betas: Any) -> None:
    """betas=(0.9,) crashed at the first step ("not enough values to unpack"), betas=0.9 at
    construction ("'float' object is not iterable"), three numbers were taken (one ignored)."""
    with pytest.raises(ConfigurationError, match=r"betas must be two numbers"):
        SignalGatedAdam([torch.zeros(2, requires_grad=True)], betas=betas)


def test_control_valid_groups_are_taken() -> None:
    x, y = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    for make in (SignalGatedAdam, TrustRprop, ReachRprop, LazyAdam):
        opt = make([{"params": [x]}, {"params": [y], "lr": 0.05}])
        assert [g["lr"] for g in opt.param_groups][1] == 0.05
    lazy = LazyAdam([{"params": [x], "betas": [0.8, 0.99]}])
    assert tuple(lazy.param_groups[0]["betas"]) == (0.8, 0.99)


# ------------------------------------------------------------- a fixed-point map given as object
def test_a_map_built_over_other_tensors_is_refused() -> None:
    """fixed_point_map=GradientDescentMap(q.inner_loss, [q.w], [q.log_lam], ...) of another
    ridge (a map built before the model was rebuilt): the hyper step ran and moved p's λ by the
    hypergradient of q's problem, without a word."""
    p, _, _ = _ridge()
    q, _, _ = _ridge(seed=1)
    for phi in (
        GradientDescentMap(q.inner_loss, [q.w], [q.log_lam], alpha=0.1),
        ContractionMap(lambda b: [q.w], [q.w], [q.log_lam]),
        GradientDescentMap(p.inner_loss, [p.w], [q.log_lam], alpha=0.1),
    ):
        outer = torch.optim.Adam([p.log_lam], lr=0.1)
        with pytest.raises(ConfigurationError, match=r"built over other (inner_p|hyperp)"):
            _sid(p, outer, fixed_point_map=phi)


def test_a_gradient_map_alpha_the_config_would_replace_is_refused() -> None:
    """GradientDescentMap(..., alpha=0.01) given as fixed_point_map ran at the estimated
    α = 10.2 (1000× the given one): the optimizer sets α from its config."""
    p, train, val = _ridge()
    phi = GradientDescentMap(p.inner_loss, [p.w], [p.log_lam], alpha=0.01)
    outer = torch.optim.Adam([p.log_lam], lr=0.1)
    with pytest.raises(ConfigurationError, match=r"SIDConfig\(alpha=0\.01"):
        _sid(p, outer, fixed_point_map=phi)
    with pytest.raises(ConfigurationError, match=r"replaced by config alpha=0\.5"):
        _sid(p, outer, fixed_point_map=phi, config=SHORT.replace(alpha=0.5))
    hopt = _sid(p, outer, fixed_point_map=phi, config=SHORT.replace(alpha=0.01))  # control
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # five steps do not converge: said, not asserted here
        hopt.step(train, val)
    assert hopt.alpha == phi.alpha == 0.01


# ------------------------------------------------------------ tensors replaced between steps
def test_a_hyperparameter_replaced_between_hyper_steps_is_named() -> None:
    """`p.log_lam = torch.full_like(p.log_lam, -2.0).requires_grad_()` between two hyper steps
    of a loop (a "reset" of λ): inner_loss read the new tensor, the optimizer kept moving the
    old one, whose implicit hypergradient was exactly 0; the new λ stayed at −2, unsaid."""
    p, train, val = _ridge()
    hopt = _sid(p, torch.optim.Adam([p.log_lam], lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hopt.step(train, val)
        p.log_lam = torch.full_like(p.log_lam, -2.0).requires_grad_()
        with pytest.raises(ConfigurationError, match=r"no longer reads the hyperparameters.*in"):
            hopt.step(train, val)


def test_inner_parameters_replaced_between_hyper_steps_are_named() -> None:
    """`p.w = torch.zeros_like(p.w).requires_grad_()` between two hyper steps: refused with
    "E must be computed from w and/or λ", which the user's E is (it reads the new w)."""
    p, train, val = _ridge()
    hopt = _sid(p, torch.optim.Adam([p.log_lam], lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hopt.step(train, val)
        p.w = torch.zeros_like(p.w).requires_grad_()
        with pytest.raises(ConfigurationError, match=r"replaced since.*in place"):
            hopt.step(train, val)


def test_control_a_hyperparameter_changed_in_place_between_steps_is_tuned() -> None:
    p, train, val = _ridge()
    hopt = _sid(p, torch.optim.Adam([p.log_lam], lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hopt.step(train, val)
        with torch.no_grad():
            p.log_lam.fill_(-2.0)
        hopt.step(train, val)
    assert not torch.equal(p.log_lam.detach(), torch.full_like(p.log_lam, -2.0))


# -------------------------------------------------- per-class weights on batches of one class
def _class_sorted_fit(shuffle: bool) -> list[str]:
    order = torch.argsort(Y[60:], stable=True)  # a set sorted by class (ImageFolder's order)
    data = IndexedDataset(TensorDataset(X[60:][order], Y[60:][order]))
    cb = LearnedDataWeights(per="class", num_classes=3, **QUICK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(
            ToyClassifier("none"),
            DataLoader(data, batch_size=16, shuffle=shuffle),
            DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20),
        )
    return [str(w.message) for w in caught if "hold examples of one class" in str(w.message)]


def test_per_class_weights_on_batches_of_one_class_are_said() -> None:
    """LearnedDataWeights(per="class") over a class-sorted set and a DataLoader without
    shuffle=True: 6 of the first 8 batches held one class, whose self-normalised loss
    Σ ω_c ℓᵢ / Σ ω_c is the plain mean whatever ω_c: the weights changed none of those steps
    (after 4 epochs 0.43 / 0.50 / 0.54 against 0.31 / 0.52 / 0.62 shuffled), unsaid."""
    said = _class_sorted_fit(shuffle=False)
    assert len(said) == 1 and "shuffle=True" in said[0] and "6 of the fit's first 8" in said[0]


def test_control_shuffled_class_batches_are_not_said() -> None:
    assert not _class_sorted_fit(shuffle=True)


# --------------------------------------------------- a class given where an object of it belongs
@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: SIDConfig(damping=CurvatureDamping), "CurvatureDamping"),
        (lambda: SIDConfig(curvature=EstimatedCurvature), "EstimatedCurvature"),
        (lambda: SIDConfig(adjoint_solver=ConjugateGradient), "ConjugateGradient"),
        (lambda: SIDConfig(on_divergence=BackOff), "BackOff"),
        (lambda: SIDConfig(look_ahead=TrainedWeights), "TrainedWeights"),
        (lambda: SIDConfig(hvp=GaussNewton), "GaussNewton"),
        (lambda: HorizonDamping(base=CurvatureDamping), "CurvatureDamping"),
        (lambda: LearnedWeightDecay(invariant=HoldInvariant), "HoldInvariant"),
        (lambda: LearnedDataWeights(objective=ExpectedError), "ExpectedError"),
        (lambda: SampleWeights(4, parameterization=SoftmaxWeights), "SoftmaxWeights"),
    ],
    ids=[
        "config-damping",
        "config-curvature",
        "config-solver",
        "config-divergence",
        "config-look-ahead",
        "config-hvp",
        "horizon-base",
        "decay-invariant",
        "weights-objective",
        "sample-weights-parameterization",
    ],
)
def test_a_class_given_where_an_object_belongs_is_named_with_the_call(make: Any, name: str) -> None:
    """SIDConfig(damping=CurvatureDamping) (no parentheses) was refused as "must be a Damping
    object (e.g. CurvatureDamping()), got type" ("got ABCMeta" for a solver), the drop-ins'
    strategies as "got <class '...HoldInvariant'>": nothing said the parentheses were
    missing."""
    with pytest.raises(ConfigurationError, match=rf"the class {name} itself.*{name}\(\)"):
        make()


def test_an_optimizer_class_given_to_the_core_is_named_with_the_call() -> None:
    """SIDHyperOptimizer(..., torch.optim.Adam): "outer_optimizer must be a
    torch.optim.Optimizer, got type"."""
    p, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match=r"the class Adam itself.*Adam\(hyperpa"):
        _sid(p, torch.optim.Adam)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"the class SIDConfig itself"):
        _sid(p, torch.optim.Adam([p.log_lam], lr=0.1), config=SIDConfig)


# ------------------------------------------------------- schedule constants no schedule reads
@pytest.mark.parametrize(
    "settings, ignored",
    [
        (dict(step_size="constant", beta=2.0, gamma=3.0), r"beta=2\.0, gamma=3\.0"),
        (dict(step_size="constant", switch=5), r"switch=5"),
        (dict(step_size="decreasing", eta=0.5), r"eta=0\.5"),
        (dict(step_size=ConstantStep(1.0), eta=0.5), r"eta=0\.5"),
    ],
    ids=["constant-beta-gamma", "constant-switch", "decreasing-eta", "object-eta"],
)
def test_schedule_constants_no_schedule_reads_are_said(
    settings: dict[str, Any], ignored: str
) -> None:
    """SIDConfig(step_size="constant", beta=2.0, gamma=3.0) and the others were taken and
    ran without them (β, γ, t₀ are read by the decreasing phases only, η by the constant ones;
    a StepSchedule object carries its own). A warning: test helpers (and users' loops over
    step sizes) pass eta=1.0 beside any step_size."""
    with pytest.warns(UserWarning, match=ignored + r" is ignored"):
        SIDConfig(**settings)


def test_control_constants_read_by_either_schedule_are_taken() -> None:
    """β read by the adjoint's two-phase schedule while the inner one is constant: taken."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        config = SIDConfig(step_size="constant", adjoint_step_size="two_phase", beta=2.0, eta=0.5)
        assert config.beta == 2.0 and config.eta == 0.5
        assert SIDConfig(step_size="two_phase", eta=0.5, beta=2.0, gamma=3.0, switch=4).switch == 4


# ------------------------------------------------------------ a loss that leaves rows out
def test_per_sample_losses_of_rows_left_out_are_named() -> None:
    """A training_step that trains on some rows only, F.cross_entropy(self(x[keep]),
    y[keep], reduction="none") (9 losses for 16 rows), was told "return one loss per sample
    (reduction='none', not 'mean' or 'sum')", which it already does."""
    with pytest.raises(ConfigurationError, match=r"1 row\(s\) fewer.*x\[keep\].*Subset"):
        SampleWeights(10).weighted_mean(torch.rand(3), torch.arange(4))

    class Kept(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            keep = y != 2
            logits = self(x[keep])
            return torch.nn.functional.cross_entropy(logits, y[keep], reduction="none")

    train = DataLoader(IndexedDataset(TensorDataset(X[60:], Y[60:])), batch_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError, match=r"row\(s\) fewer than the batch"):
            trainer([LearnedDataWeights(**QUICK)], max_epochs=1).fit(
                Kept(), train, DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20)
            )


def test_one_hot_labels_given_as_class_indices_are_named() -> None:
    """class_weights(3).weighted_mean(losses, F.one_hot(y, 3)) (integer one-hot labels): the
    (4, 3) index was flattened and refused as "4 per-sample losses for a batch of 12 indexed
    samples: return one loss per sample (reduction='none' ...)", about the losses."""
    y = torch.tensor([0, 1, 2, 1])
    weights = class_weights(3)
    with pytest.raises(ConfigurationError, match=r"shape \(4, 3\).*labels\.argmax\(1\)"):
        weights.weighted_mean(torch.rand(4), torch.nn.functional.one_hot(y, 3))
    with pytest.raises(ConfigurationError, match=r"shape \(4, 3\)"):
        weights.weights(torch.nn.functional.one_hot(y, 3))
    weights.weighted_mean(torch.rand(4), y[:, None])  # control: a (b, 1) column is read
