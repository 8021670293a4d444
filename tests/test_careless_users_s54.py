"""Careless users of the core (``SIDHyperOptimizer``) and of ``BilevelModule``, session 54.

Each case failed before its fix (a resumed run that was not the straight run, a silent wrong
answer, a raw crash or a message naming the wrong cause); the controls passed before and after.
See docs/failures.md, "Careless users, the core and BilevelModule (session 54)".
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from hypertorch_sid import SIDConfig, SIDHyperOptimizer
from hypertorch_sid.core.errors import ConfigurationError

D = 5
f64 = torch.float64


def _data(dtype: torch.dtype = f64):
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(200, D, generator=g, dtype=dtype), torch.randn(200, generator=g, dtype=dtype)
    return [(X[i : i + 20], y[i : i + 20]) for i in range(0, 160, 20)], (X[160:], y[160:])


def _fit(w, batch):
    X, y = batch
    return 0.5 * ((X @ w - y) ** 2).mean()


def _ridge(inner=None, outer=None, config=None, dtype=f64, **kw):
    """The README's ridge in float64: ℓ̂ = fit + ½ Σ exp(log λ) w², E = fit on validation data."""
    w = torch.zeros(D, dtype=dtype, requires_grad=True)
    log_lam = torch.zeros(D, dtype=dtype, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [log_lam],
        [w],
        inner(w, log_lam) if inner else lambda b: _fit(w, b) + 0.5 * (log_lam.exp() * w**2).sum(),
        outer(w, log_lam) if outer else lambda b: _fit(w, b),
        torch.optim.Adam([log_lam], lr=0.1),
        config=config or SIDConfig(inner_steps=3, adjoint_steps=3),
        **kw,
    )
    return hopt, w, log_lam


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has not converged")
        yield


# ---------------------------------------------------------------- 1. a killed run resumes
def test_a_resumed_loop_over_a_batch_list_equals_the_straight_run():
    """Before: the resumed loop restarted its list at the first batch (the position in it was
    not in the state): λ after 2 + 2 steps differed from 4 straight steps by 0.04 here (0.12 on
    session 53's ridge). Now bit for bit, with w saved with the model and loaded beside it."""
    batches, val = _data()
    hopt, w, log_lam = _ridge()
    for _ in range(4):
        hopt.step(batches, val)
    straight = log_lam.detach().clone()

    hopt, w, log_lam = _ridge()
    for _ in range(2):
        hopt.step(batches, val)
    saved = copy.deepcopy({"w": w.detach(), "hopt": hopt.state_dict()})  # a checkpoint
    hopt, w, log_lam = _ridge()  # a fresh process: new tensors, optimizer and list object
    with torch.no_grad():
        w.copy_(saved["w"])
    hopt.load_state_dict(saved["hopt"])
    for _ in range(2):
        hopt.step(list(batches), val)
    assert torch.equal(log_lam.detach(), straight)


def test_a_state_saved_under_another_config_warns_on_load():
    """Before: loaded without a word; the resumed steps then ran under the new settings."""
    batches, val = _data()
    hopt, _, _ = _ridge()
    hopt.step(batches, val)
    other, _, _ = _ridge(config=SIDConfig(inner_steps=6, adjoint_steps=3))
    with pytest.warns(UserWarning, match=r"other settings.*inner_steps 3 → 6"):
        other.load_state_dict(hopt.state_dict())


def test_control_a_state_of_another_number_of_hyperparameters_is_refused():
    """Control (before and after): another number of hyperparameters is refused by shape."""
    batches, val = _data()
    hopt, _, _ = _ridge()
    hopt.step(batches, val)
    w = torch.zeros(D, dtype=f64, requires_grad=True)
    a, b = (torch.zeros(n, dtype=f64, requires_grad=True) for n in (D, 1))
    two = SIDHyperOptimizer(
        [a, b], [w], lambda z: _fit(w, z) + 0.5 * ((a.exp() + b.exp()) * w**2).sum(),
        lambda z: _fit(w, z), torch.optim.Adam([a, b], lr=0.1),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="belongs to another model"):
        two.load_state_dict(hopt.state_dict())


# ---------------------------------------------------------------- 2. val_batch=None
def test_val_batch_none_is_refused_at_the_call():
    """Before: the user's own TypeError ("cannot unpack non-iterable NoneType") after the
    inner solve."""
    batches, _ = _data()
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match=r"val_batch is None.*Pass the validation data"):
        hopt.step(batches, None)
    assert hopt.cost.hypergradients == 0


def test_control_an_outer_loss_that_reads_no_batch_may_take_none():
    batches, _ = _data()
    hopt, _, _ = _ridge(outer=lambda w, lam: lambda b: 0.5 * ((w - 1) ** 2).sum())
    assert hopt.hypergradient(batches, None)[0].shape == (D,)


# ---------------------------------------------------------------- 3. module= of no w
@pytest.mark.parametrize(
    "module, why",
    [
        (lambda w: torch.nn.Linear(D, 1), "none of its 2 parameters"),
        (lambda w: torch.nn.Linear(D, 1).requires_grad_(False), "all frozen"),
        (lambda w: torch.nn.ReLU(), "no parameters"),
    ],
    ids=["another-model", "frozen", "no-parameters"],
)
def test_a_module_holding_none_of_the_inner_parameters_is_refused(module, why):
    """Before: taken silently (its modes and buffers switched while other tensors trained)."""
    with pytest.raises(ConfigurationError, match=rf"holds none of the inner parameters.*{why}"):
        _ridge(module=module(None))


def test_a_copy_of_the_model_given_as_module_is_refused():
    model = torch.nn.Linear(D, 1, bias=False, dtype=f64)
    lam = torch.zeros(D, dtype=f64, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"copy\.deepcopy"):
        SIDHyperOptimizer(
            [lam], model.parameters(),
            lambda b: _fit(model.weight[0], b) + (lam.exp() * model.weight**2).sum(),
            lambda b: _fit(model.weight[0], b), module=copy.deepcopy(model),
        )  # fmt: skip


# ---------------------------------------------------------------- new inputs
def test_an_empty_validation_batch_is_named():
    """Before: "the outer gradient ∇E diverged (residual norm 0) … not finite", a wrong cause
    (a mean over no samples); e.g. X[n:] past the end of X."""
    batches, (Xv, yv) = _data()
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match=r"no samples \(shape \(0, 5\)\)"):
        hopt.hypergradient(batches, (Xv[:0], yv[:0]))


def test_validation_data_of_another_dtype_is_named():
    """Before: torch's raw "addmv input tensors must have the same dtype" from the user's loss
    (training data of another dtype was named; validation data was not)."""
    batches, (Xv, yv) = _data(torch.float32)
    hopt, w, log_lam = _ridge(dtype=torch.float32)
    with pytest.raises(ConfigurationError, match=r"val_batch\[0\] has dtype torch.float64"):
        hopt.hypergradient(batches, (Xv.double(), yv.double()))
    assert not w.any()  # w as it was


@pytest.mark.parametrize("where", ["inner", "outer"])
def test_a_loss_that_writes_lambda_in_place_is_refused(where):
    """Before: silent. ``log_lam.data.clamp_(min=0.5)`` (a constraint put in the loss) moved λ
    at every call: λ came back from a hypergradient as 0.5 everywhere, not where it was."""

    def writes(w, log_lam):
        def loss(b):
            log_lam.data.clamp_(min=0.5)
            return _fit(w, b) + (0.5 * (log_lam.exp() * w**2).sum() if where == "inner" else 0)

        return loss

    batches, val = _data()
    hopt, w, log_lam = _ridge(**{where: writes})
    with pytest.raises(ConfigurationError, match=r"changed during the hypergradient.*in place"):
        hopt.hypergradient(batches, val)
    assert not log_lam.any() and not w.any()  # both put back


def test_a_batch_list_rebuilt_at_each_step_goes_on_through_the_data():
    """Before: ``hopt.step([b for b in batches], ...)`` restarted at the first batch at every
    step: with t = k = 3 and J = 1, 7 of the 8 batches were ever read. Now the same as one list."""
    batches, val = _data()
    hopt, _, once = _ridge()
    for _ in range(3):
        hopt.step(batches, val)
    hopt, _, rebuilt = _ridge()
    for _ in range(3):
        hopt.step([b for b in batches], val)
    assert torch.equal(rebuilt.detach(), once.detach())


def test_an_empty_hyperparameter_is_refused_at_construction():
    """Before: built, then refused at the first hypergradient as "read by neither inner_loss
    nor outer_loss", a wrong cause."""
    w = torch.zeros(D, requires_grad=True)
    lam, empty = torch.zeros(D, requires_grad=True), torch.zeros(0, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"hyperparameters\[1\] has no entries"):
        SIDHyperOptimizer(
            [lam, empty], [w], lambda b: _fit(w, b) + (lam.exp() * w**2).sum(),
            lambda b: _fit(w, b),
        )  # fmt: skip


def test_control_an_inner_loss_returning_a_vector_is_refused():
    batches, val = _data()
    hopt, _, _ = _ridge(inner=lambda w, lam: lambda b: (b[0] @ w - b[1]) ** 2 + lam.exp() @ w**2)
    with pytest.raises(ConfigurationError, match="must return a scalar"):
        hopt.hypergradient(batches, val)


# ---------------------------------------------------------------- BilevelModule
def _fit_module(model, data=None):
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import loaders, ridge_data, trainer

    from hypertorch_sid import HyperOptimizationCallback

    train, val = loaders(data or ridge_data(), 20)
    callback = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    trainer([callback], max_epochs=2).fit(model, train, val)


def test_a_bilevel_module_whose_training_step_writes_lambda_is_refused():
    """Before: silent: ``self.log_lam.data.clamp_(max=-3.0)`` in inner_loss moved λ in every
    training step; the fit ended with log λ ≈ −3.05, not where the hyper steps took it."""
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import Ridge

    class Clamps(Ridge):
        def inner_loss(self, batch):
            self.log_lam.data.clamp_(max=-3.0)
            return super().inner_loss(batch)

    with pytest.raises(ConfigurationError, match=r"changed during training_step"):
        _fit_module(Clamps())


def test_a_bilevel_module_hyperparameter_with_no_entries_is_refused_at_registration():
    """Before: registered, then refused at the first hyper step as "read by neither
    inner_loss nor outer_loss"."""
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import Ridge

    class Empty(Ridge):
        def __init__(self):
            super().__init__()
            self.register_hyperparameter("extra", torch.zeros(0, dtype=f64))

    with pytest.raises(ConfigurationError, match=r"'extra' has no entries"):
        Empty()


def test_a_bilevel_module_with_validation_data_of_another_dtype_is_named():
    """Before: torch's raw "expected m1 and m2 to have the same dtype" in the hyper step."""
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import Ridge, ridge_data

    X, y, Xv, yv = ridge_data()
    with pytest.raises(ConfigurationError, match=r"val_batch\[0\] has dtype torch.float32"):
        _fit_module(Ridge(), (X, y, Xv.float(), yv.float()))


def test_a_hyperparameter_summary_of_floats_is_logged():
    """Before: an override returning floats (``{"lam": float(self.log_lam.exp())}``) crashed the
    callback's logging with ``'float' object has no attribute 'detach'``; now a number is read
    as a tensor, and a value that is neither is refused naming its key."""
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import Ridge

    class Floats(Ridge):
        def hyperparameter_summary(self):
            return {"lam": float(self.log_lam.exp().mean())}

    model = Floats()
    _fit_module(model)
    assert torch.isfinite(model.log_lam).all()

    class Strings(Ridge):
        def hyperparameter_summary(self):
            return {"lam": "small"}

    with pytest.raises(ConfigurationError, match=r"hyperparameter_summary\(\)\['lam'\] is str"):
        _fit_module(Strings())
