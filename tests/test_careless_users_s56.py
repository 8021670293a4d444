"""Careless users of the non-drop-in API (``SIDHyperOptimizer``, ``SIDConfig`` and its
strategies, ``BilevelModule`` + ``HyperOptimizationCallback``, ``SampleWeights``,
``IndexedDataset``), session 56.

Each case failed before its fix (silently ignored or wrong, a raw crash, or a message naming
the wrong cause); the controls passed before and after. See docs/failures.md, "Careless users,
the core and BilevelModule (session 56)".
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning_problems import Ridge, loaders, ridge_data, trainer
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import SIDConfig, SIDHyperOptimizer
from hypertorch_sid.core import (
    Batches,
    ConjugateGradient,
    FeasibleSet,
    IndexedDataset,
    LazyAdam,
    SampleWeights,
    class_weights,
)
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning import HyperOptimizationCallback

D = 5
f64 = torch.float64


def _data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(200, D, generator=g, dtype=f64), torch.randn(200, generator=g, dtype=f64)
    return [(X[i : i + 20], y[i : i + 20]) for i in range(0, 160, 20)], (X[160:], y[160:])


def _fit(w: torch.Tensor, batch: Any) -> torch.Tensor:
    X, y = batch
    return 0.5 * ((X @ w - y) ** 2).mean()


def _ridge(outer=None, optimizer=None, config=None, **kw):
    """The README's ridge in float64: ℓ̂ = fit + ½ Σ exp(log λ) w², E = fit on validation data."""
    w = torch.zeros(D, dtype=f64, requires_grad=True)
    log_lam = torch.zeros(D, dtype=f64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [log_lam],
        [w],
        lambda b: _fit(w, b) + 0.5 * (log_lam.exp() * w**2).sum(),
        outer(w, log_lam) if outer else lambda b: _fit(w, b),
        optimizer(log_lam) if optimizer else torch.optim.Adam([log_lam], lr=0.1),
        config=config or SIDConfig(inner_steps=3, adjoint_steps=3),
        **kw,
    )
    return hopt, w, log_lam


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has not converged")
        warnings.filterwarnings("ignore", message=".*sign of lambda_min is uncertain")
        yield


# ---------------------------------------------------------------- the core: SIDHyperOptimizer
def test_control_an_outer_loss_reading_lambda_directly_matches_finite_differences():
    """E = fit + 0.3 Σ λ² + Σ log λ · w reads λ directly: the hypergradient must hold ∇₂E too.
    Oracle: central differences of the closed-form f(λ) = E(w*(λ), λ) on the full batch."""
    batches, val = _data()
    X, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])

    def direct(w, log_lam):
        return lambda b: _fit(w, b) + 0.3 * (log_lam.exp() ** 2).sum() + (log_lam * w).sum()

    def f(log_lam: torch.Tensor) -> torch.Tensor:
        A = X.T @ X / len(X) + torch.diag(log_lam.exp())
        w = torch.linalg.solve(A, X.T @ y / len(X))
        return _fit(w, val) + 0.3 * (log_lam.exp() ** 2).sum() + (log_lam * w).sum()

    full = Batches(inner="full", adjoint="full", d2="full")
    config = SIDConfig(inner_steps=300, adjoint_steps=300, batches=full, step_size="constant")
    hopt, _, log_lam = _ridge(outer=direct, config=config, full_train_batch=(X, y))
    with torch.no_grad():
        log_lam.copy_(torch.linspace(-1.0, 0.5, D, dtype=f64))
    g = hopt.hypergradient(batches, val)[0]
    at, eps = log_lam.detach().clone(), 1e-6
    fd = torch.stack(
        [(f(at + eps * e) - f(at - eps * e)) / (2 * eps) for e in torch.eye(D, dtype=f64)]
    )
    assert torch.allclose(g, fd, atol=1e-8), (g, fd)


def test_an_outer_optimizer_holding_other_tensors_beside_lambda_is_refused():
    """Before: taken; each outer step moved the extra tensor by whatever .grad it held, then
    cleared that .grad."""
    extra = torch.zeros(3, dtype=f64, requires_grad=True)
    with pytest.raises(ConfigurationError, match="also holds 1 tensor.*not hyperparameters"):
        _ridge(optimizer=lambda log_lam: torch.optim.Adam([log_lam, extra], lr=0.1))


def test_hyperparameters_and_inner_parameters_given_the_other_way_round_are_named():
    """``SIDHyperOptimizer([w], [log_lam], ..., Adam([log_lam]))``. Before: "outer_optimizer
    holds inner parameters", which does not say that the two lists were swapped."""
    w = torch.zeros(D, dtype=f64, requires_grad=True)
    log_lam = torch.zeros(D, dtype=f64, requires_grad=True)
    with pytest.raises(ConfigurationError, match="were the two lists swapped"):
        SIDHyperOptimizer(
            [w],
            [log_lam],
            lambda b: _fit(w, b) + 0.5 * (log_lam.exp() * w**2).sum(),
            lambda b: _fit(w, b),
            torch.optim.Adam([log_lam], lr=0.1),
        )


def test_apply_names_a_hypergradient_of_another_dtype():
    """Before: torch's "attempting to assign a gradient with dtype 'float' ... grad_dtype"."""
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match=r"dtype torch.float32.*g.to\(torch.float64\)"):
        hopt.apply([torch.zeros(D)])


def test_a_generator_read_already_by_the_outer_optimizer_is_named():
    """``hs = model.hyperparameters(); Adam(hs); SIDHyperOptimizer(hs, ...)``: the generator is
    empty the second time. Before: "hyperparameters is empty: pass at least one tensor"."""
    w = torch.zeros(D, dtype=f64, requires_grad=True)
    log_lam = torch.zeros(D, dtype=f64, requires_grad=True)
    hs = (p for p in [log_lam])
    opt = torch.optim.Adam(hs, lr=0.1)
    with pytest.raises(ConfigurationError, match=r"empty iterator.*list\(model.parameters\(\)\)"):
        SIDHyperOptimizer(hs, [w], lambda b: _fit(w, b), lambda b: _fit(w, b), opt)


def test_an_inner_loss_reading_a_copy_of_the_model_is_named():
    """``inner_loss`` calls ``copy.deepcopy(model)``, ``inner_parameters=model.parameters()``.
    Before: "leave them out of inner_parameters" for every position, a fix that leaves none."""
    import copy

    batches, val = _data()
    model = torch.nn.Linear(D, 1).double()
    twin = copy.deepcopy(model)
    log_lam = torch.zeros((), dtype=f64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [log_lam],
        model.parameters(),
        lambda b: _fit(twin.weight[0], b) + 0.5 * log_lam.exp() * (twin.weight**2).sum(),
        lambda b: _fit(model.weight[0], b),
        torch.optim.Adam([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )
    with pytest.raises(ConfigurationError, match="none of the inner parameters.*deepcopy"):
        hopt.hypergradient(batches, val)


def test_set_constants_alpha_without_q_is_refused_under_decreasing_steps():
    """Before: ``set_constants(alpha=1e-3)`` under the default two-phase steps was silently
    replaced by the curvature estimate's α (0.596 here) at the next hypergradient."""
    batches, val = _data()
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match="without q.*two_phase"):
        hopt.set_constants(alpha=1e-3)
    hopt.set_constants(alpha=1e-3, q=0.999)  # with q: used as given
    hopt.hypergradient(batches, val)
    assert hopt.alpha == 1e-3
    hopt, _, _ = _ridge(config=SIDConfig(inner_steps=3, adjoint_steps=3, step_size="constant"))
    hopt.set_constants(alpha=1e-3)  # constant steps need no q
    hopt.hypergradient(batches, val)
    assert hopt.alpha == 1e-3


@pytest.mark.parametrize("tol", [float("nan"), -1.0, 1.0, 10.0])
def test_conjugate_gradient_tol_is_checked(tol):
    """Before: NaN or a negative tol never stopped early; tol ≥ 1 stopped before any step (v
    left at its start, 0 at the first hyper step), all without a word."""
    with pytest.raises(ConfigurationError, match=r"ConjugateGradient tol must be .*\[0, 1\)"):
        ConjugateGradient(tol=tol)


def test_batch_sources_holding_loaders_or_keys_are_refused():
    """A dict of loaders as ``train_batches`` (its keys were iterated as batches) and a list of
    DataLoaders as ``val_batch``: before, raw errors inside the user's losses."""
    batches, val = _data()
    val_loader = DataLoader(TensorDataset(*val), batch_size=10)
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match="dict of keys 'a': its keys"):
        hopt.hypergradient({"a": batches}, val)
    with pytest.raises(ConfigurationError, match="val_batch is a list holding a DataLoader"):
        hopt.hypergradient(batches, [val_loader, val_loader])
    with pytest.raises(ConfigurationError, match="holding a DataLoader or dataset"):
        hopt.hypergradient([DataLoader(TensorDataset(*val), batch_size=10)], val)


@pytest.mark.parametrize("kind", ["loader", "list"])
def test_a_full_train_batch_that_is_not_one_batch_is_refused(kind):
    """Before: "too many values to unpack" from the user's loss."""
    batches, _ = _data()
    X, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    full = DataLoader(TensorDataset(X, y), batch_size=20) if kind == "loader" else batches
    config = SIDConfig(inner_steps=3, adjoint_steps=3, batches=Batches(d2="full"))
    with pytest.raises(ConfigurationError, match="full_train_batch must be one batch"):
        _ridge(config=config, full_train_batch=full)


def test_mean_across_processes_must_be_a_function():
    """Before: ``mean_across_processes=True`` was taken (and called on a tensor later)."""
    with pytest.raises(ConfigurationError, match="mean_across_processes must be a function"):
        _ridge(mean_across_processes=True)


# ---------------------------------------------------------------- SampleWeights, IndexedDataset
def test_sample_weight_switches_given_as_strings_are_refused():
    """Before: ``sparse_grad="no"`` was True (sparse gradients), ``normalize="no"`` the
    self-normalised loss (2.0 here, where the plain mean is 1.0)."""
    with pytest.raises(ConfigurationError, match="sparse_grad must be True or False"):
        SampleWeights(10, sparse_grad="no")
    weights = SampleWeights(10)
    with pytest.raises(ConfigurationError, match="normalize must be True or False"):
        weights.weighted_mean(torch.tensor([1.0, 2.0, 3.0]), torch.arange(3), normalize="no")


def test_sample_weight_sizes_and_dtypes_are_read_or_named():
    """Before: ``n=np.int64(10)`` / ``torch.tensor(10)`` (``int(y.max()) + 1`` without int)
    were refused as "needs n ≥ 1, got 10"; ``dtype=torch.long`` was torch's "Only Tensors of
    floating point ... can require gradients"; ``initial="0.5"`` was taken as 0.5."""
    assert SampleWeights(np.int64(10)).n == 10
    assert class_weights(torch.tensor(3)).n == 3
    with pytest.raises(ConfigurationError, match="dtype must be a floating-point"):
        SampleWeights(10, dtype=torch.long)
    with pytest.raises(ConfigurationError, match="initial must be a number"):
        SampleWeights(10, initial="0.5")


def test_given_logits_set_the_initial_weight():
    """``SampleWeights(n, logits=x)`` with x = 2 everywhere (ω₀ = 0.88). Before: ω₀ stayed ½, so
    the mean-logit gauge's projection would pull x̄ to 0 (refused as "the initial
    hyperparameters are outside the feasible set ... e.g. a weight decay ≥ 0", after moving the
    logits), and ``flagged("below_half")`` compared with ¼. Now ω₀ = σ(x̄): a hyper step keeps
    x̄ = 2; an ``initial`` the logits contradict is refused."""
    torch.manual_seed(0)
    n = 40
    X, y = torch.randn(n, 3), torch.randint(0, 2, (n,))
    model = torch.nn.Linear(3, 2)
    weights = SampleWeights(n, logits=torch.full((n,), 2.0, requires_grad=True), gauge="mean_logit")
    assert weights.initial_weight == pytest.approx(1 / (1 + math.exp(-2.0)))
    batches = [(torch.arange(i, i + 10), (X[i : i + 10], y[i : i + 10])) for i in range(0, n, 10)]

    def inner(b):
        index, (xb, yb) = b
        losses = F.cross_entropy(model(xb), yb, reduction="none")
        return weights.weighted_mean(losses, index, normalize=True)

    hopt = SIDHyperOptimizer(
        weights.hyperparameters,
        model.parameters(),
        inner,
        lambda b: F.cross_entropy(model(b[0]), b[1]),
        LazyAdam(weights.hyperparameters, lr=1e-3),
        config=SIDConfig(
            inner_steps=2, adjoint_steps=2, feasible_set=FeasibleSet(project=weights.projection)
        ),
    )
    hopt.step(batches, (X, y))
    assert weights.logits.mean().item() == pytest.approx(2.0, abs=1e-5)
    with pytest.raises(ConfigurationError, match="initial=0.9 and logits= disagree"):
        SampleWeights(10, initial=0.9, logits=torch.zeros(10, requires_grad=True))


@pytest.mark.parametrize("projected", [True, False])
def test_a_mean_logit_gauge_left_unheld_is_said(projected):
    """``SampleWeights(gauge="mean_logit")`` (dense gradients) under ``SIDHyperOptimizer``
    without ``FeasibleSet(project=weights.projection)``. Before: the mean logit drifted (0.09
    after 8 steps on this toy), the gauge asked for silently not held. With the projection:
    nothing said."""
    torch.manual_seed(0)
    n = 40
    X = torch.randn(n, 3)
    y = (X[:, 0] > 0).long()
    y[:8] = 1 - y[:8]
    model = torch.nn.Linear(3, 2)
    weights = SampleWeights(n, gauge="mean_logit")
    batches = [(torch.arange(i, i + 10), (X[i : i + 10], y[i : i + 10])) for i in range(0, n, 10)]

    def inner(b):
        index, (xb, yb) = b
        return weights.weighted_mean(F.cross_entropy(model(xb), yb, reduction="none"), index)

    feasible = FeasibleSet(project=weights.projection) if projected else FeasibleSet()
    hopt = SIDHyperOptimizer(
        weights.hyperparameters,
        model.parameters(),
        inner,
        lambda b: F.cross_entropy(model(b[0]), b[1]),
        LazyAdam(weights.hyperparameters, lr=0.5),
        config=SIDConfig(inner_steps=3, adjoint_steps=3, feasible_set=feasible),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            hopt.step(batches, (X, y))
    said = [w for w in caught if "gauge is held by weights.projection" in str(w.message)]
    assert len(said) == (0 if projected else 1)


def test_losses_that_are_no_real_numbers_are_named():
    """Integer per-sample losses (a count of errors) were torch's "mean(): could not infer
    output dtype"; a complex ``inner_loss`` was autograd's "grad can be implicitly created only
    for real scalar outputs"; a checkpoint of NaN logits was loaded (NaN weights)."""
    with pytest.raises(ConfigurationError, match="per-sample losses of dtype torch.int64"):
        SampleWeights(10).weighted_mean(torch.ones(3, dtype=torch.long), torch.arange(3))
    batches, val = _data()
    w = torch.zeros(D, dtype=f64, requires_grad=True)
    log_lam = torch.zeros(D, dtype=f64, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [log_lam],
        [w],
        lambda b: (_fit(w, b) + 0.5 * (log_lam.exp() * w**2).sum()).to(torch.complex128),
        lambda b: _fit(w, b),
        torch.optim.Adam([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )
    with pytest.raises(ConfigurationError, match="scalar tensor .* of real numbers"):
        hopt.hypergradient(batches, val)
    with pytest.raises(ConfigurationError, match="10 non-finite logits"):
        SampleWeights(10).load_state_dict({"logits": torch.full((10,), float("nan"))})


def test_a_negative_sample_weight_index_names_ignore_index():
    """Class weights indexed by labels holding -100 (F.cross_entropy's ignore_index). Before:
    "The weights were sized for another data set", a wrong cause."""
    weights = class_weights(3)
    with pytest.raises(ConfigurationError, match="ignore_index.*keep = y >= 0"):
        weights.weighted_mean(torch.ones(3), torch.tensor([0, 2, -100]))


def test_indexed_dataset_gives_a_negative_position_its_row():
    """``IndexedDataset(ds)[-1]``: the last sample. Before: its index was -1, no row of the
    weights (refused later as out of range)."""
    ds = IndexedDataset(TensorDataset(torch.arange(6.0).reshape(6, 1)))
    item = ds[-1]
    assert item.index == 5 and item.data[0].item() == 5.0
    assert SampleWeights(6).weights(torch.tensor([item.index])).shape == (1,)


# ---------------------------------------------------------------- BilevelModule + the callback
class _ParameterClash(Ridge):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1, dtype=f64))
        self.register_hyperparameter("scale", torch.zeros(1, dtype=f64))


def test_a_hyperparameter_named_like_a_parameter_is_refused():
    """Before: ``register_parameter`` replaced the weight ``self.scale`` by λ, silently: the
    module trained one tensor less."""
    with pytest.raises(ConfigurationError, match="already has a parameter 'scale'"):
        _ParameterClash()


def test_a_non_finite_hyperparameter_is_refused_at_registration():
    class M(Ridge):
        def __init__(self) -> None:
            super().__init__()
            self.register_hyperparameter("log_decay", -math.inf)  # log 0

    with pytest.raises(ConfigurationError, match="'log_decay' has non-finite entries"):
        M()


def test_the_callback_refuses_inner_steps():
    """Before: ``HyperOptimizationCallback(inner_steps=3)`` was taken and ignored (the
    training is the inner solver)."""
    with pytest.raises(ConfigurationError, match="inner_steps=3 would be ignored"):
        HyperOptimizationCallback(inner_steps=3)


class _LateLambda(Ridge):
    """A second λ registered in ``on_train_start``, after the callback built its hyper step."""

    def on_train_start(self) -> None:
        if "late" not in self._hyperparameter_names:
            self.register_hyperparameter("late", torch.zeros(D, dtype=f64))

    def inner_loss(self, batch: Any) -> torch.Tensor:
        loss = super().inner_loss(batch)
        if "late" in self._hyperparameter_names:
            loss = loss + 0.5 * (self.late.exp() * self.lin.weight[0] ** 2).sum()
        return loss


class _ReplacedLambda(Ridge):
    """λ replaced by a new ``nn.Parameter`` at the second epoch's start."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.log_lam = torch.nn.Parameter(torch.full((D,), -1.0, dtype=f64))


@pytest.mark.parametrize(
    "module, match",
    [(_LateLambda, r"\['late'\] were registered after"), (_ReplacedLambda, "replaced by new")],
)
def test_hyperparameters_registered_or_replaced_after_the_fit_started_are_refused(module, match):
    """Before: the late λ was never tuned (it stayed at 0), and the replaced one was read by the
    training while the hyper steps moved the old tensor; both without a word."""
    train, val = loaders(ridge_data(), 20)
    callback = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with pytest.raises(ConfigurationError, match=match):
        trainer([callback], max_epochs=2).fit(module(), train, val)


def test_control_the_outer_loss_runs_in_eval_mode_under_the_callback():
    """A ``BilevelModule`` whose E passes through dropout: the hyper steps evaluate E with the
    module in eval mode, as validation does."""

    class Dropped(Ridge):
        def __init__(self) -> None:
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)
            self.seen: list[bool] = []

        def outer_loss(self, batch: Any) -> torch.Tensor:
            self.seen.append(self.drop.training)
            x, y = batch
            return 0.5 * ((self.lin(self.drop(x)).squeeze(-1) - y) ** 2).mean()

    train, val = loaders(ridge_data(), 20)
    model = Dropped()
    callback = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    trainer([callback], max_epochs=1, limit_val_batches=0).fit(model, train, val)
    assert model.seen and not any(model.seen)
