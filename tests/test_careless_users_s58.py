"""Careless users, session 58: the outer steps given as outer_optimizer, odd EarlyStopping
set-ups under the hold, a tensor trained by two optimizers, labels of small integer dtypes,
losses that are no scalar.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Session 58: careless inputs".
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    QUICK,
    TOY_X,
    TOY_Y,
    Ridge,
    ToyClassifier,
    loaders,
    ridge_data,
    toy_val,
    trainer,
)
from pytorch_lightning.callbacks import EarlyStopping
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.core.outer_step import ReachRprop, ShrinkFallRprop, TrustRprop

X, Y = TOY_X, TOY_Y


def _indexed(y: Tensor | None = None) -> DataLoader:
    labels = Y[60:] if y is None else y
    return DataLoader(IndexedDataset(TensorDataset(X[60:], labels)), batch_size=16)


def _fit(callbacks: list[Any], model: pl.LightningModule, train: Any, **kw: Any) -> pl.Trainer:
    kw.setdefault("max_epochs", 2)
    val = kw.pop("val", None) or toy_val()
    fitter = trainer(callbacks, **kw)
    fitter.fit(model, train, val)
    return fitter


# ------------------------------------------------------------- the outer steps' own settings
@pytest.mark.parametrize("cls", [ReachRprop, ShrinkFallRprop, TrustRprop])
def test_an_rprop_outer_step_names_itself_and_a_reversed_or_unpaired_setting(cls: type) -> None:
    """ReachRprop(lr=-1) said "TrustRprop: lr must be …" (a class the user never named);
    step_sizes=(2.0, 0.01) said "step_sizes[1] must be a number > 2.0"; a scalar or three
    step sizes crashed at the first step ("'float' object is not subscriptable")."""
    p = [torch.zeros(2, requires_grad=True)]
    name = cls.__name__
    with pytest.raises(ConfigurationError, match=rf"^{name}: lr must be"):
        cls(p, lr=-1.0)
    with pytest.raises(ConfigurationError, match=r"step_sizes=\(0\.01, 2\.0\) if it was reversed"):
        cls(p, step_sizes=(2.0, 0.01))
    for bad in (0.5, (0.01, 1.0, 2.0)):
        with pytest.raises(ConfigurationError, match=rf"^{name}: step_sizes must be two numbers"):
            cls(p, step_sizes=bad)
    with pytest.raises(ConfigurationError, match=rf"^{name}: etas must be two numbers"):
        cls(p, etas=1.2)
    cls(p, step_sizes=[1e-3, 1.0])  # a list of two: taken


@pytest.mark.parametrize("outer", ["adam", "reach"])
def test_data_weights_under_a_user_outer_optimizer_take_dense_gradients(outer: str) -> None:
    """LearnedDataWeights(outer_optimizer=Adam / ReachRprop) with the training cross term (the
    default without a budget): sparse_grad is off for a user's optimizer, but the cross term
    handed it a sparse COO gradient: "Adam does not support sparse gradients" at the first
    training batch after a hyper step."""
    make = (
        functools.partial(torch.optim.Adam, lr=0.1)
        if outer == "adam"
        else functools.partial(ReachRprop)
    )
    cb = LearnedDataWeights(outer_optimizer=make, cross_term="training", **QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit([cb], ToyClassifier("none"), _indexed())
    w = cb.data_weights()
    assert torch.isfinite(w).all() and float((w - 0.5).abs().max()) > 1e-3


# ------------------------------------------------------------------- EarlyStopping and the hold
class _Logged(ToyClassifier):
    def __init__(self, nan_after: int | None = None) -> None:
        super().__init__("none")
        self.nan_after = nan_after

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss = F.cross_entropy(self(batch[0]), batch[1])
        if self.nan_after is not None and self.global_step > self.nan_after:
            loss = torch.tensor(float("nan"))
        self.log("val_loss", loss)


def _held_fit(stopper: EarlyStopping, model: pl.LightningModule) -> tuple[pl.Trainer, list[str]]:
    cb = LearnedDataWeights(every_n_steps=4, start_step=20, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitter = _fit([cb, stopper], model, _indexed(), max_epochs=20)
    return fitter, [str(w.message) for w in caught if "asked to stop" in str(w.message)]


@pytest.mark.parametrize(
    "stop",
    [
        dict(stopping_threshold=5.0),  # reached at the first validation: the user's goal
        dict(divergence_threshold=0.1),  # "crossed" at once: the user's abort of a divergence
        "nan",  # a NaN metric (check_finite=True): a diverged model
    ],
    ids=["stopping_threshold", "divergence_threshold", "non_finite"],
)
def test_a_stop_that_is_no_patience_run_out_is_not_held(stop: Any) -> None:
    """The hold (min_steps raised to s_hold = 44 here) kept every stop: a fit whose metric was
    NaN, past the user's divergence_threshold or at their stopping_threshold trained on to step
    44 (said as "EarlyStopping(patience=3) asked to stop", a patience that had not run out).
    Only a patience run out is held now: these stop at the first validation (step 12, one step
    later as Lightning checks min_steps before the hold is released)."""
    if stop == "nan":
        stopper, model = EarlyStopping("val_loss", patience=5), _Logged(nan_after=10)
    else:
        stopper, model = EarlyStopping("val_loss", **stop), _Logged()
    fitter, said = _held_fit(stopper, model)
    assert fitter.global_step <= 13 and not said


def test_a_patience_stop_is_held_and_names_a_mode_other_than_min() -> None:
    """mode='max' on a loss stops at the second validation (patience 0): held to step 44, as
    before; the line now names the mode (the user's slip is visible)."""
    fitter, said = _held_fit(EarlyStopping("val_loss", patience=0, mode="max"), _Logged())
    assert fitter.global_step == 44
    assert len(said) == 1 and "mode='max'" in said[0]


# ------------------------------------------------------------------ decay and the optimizers
class _Shared(ToyClassifier):
    """Manual optimisation over two SGDs that both train the first layer."""

    def __init__(self, wd: float = 0.0) -> None:
        super().__init__()
        self.automatic_optimization, self.wd = False, wd

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=self.wd),
            torch.optim.SGD(self.net[0].parameters(), lr=0.05, weight_decay=self.wd),
        ]

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        first, second = self.optimizers()
        loss = F.cross_entropy(self(batch[0]), batch[1])
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        return loss


def test_a_tensor_trained_by_two_optimizers_is_refused() -> None:
    """Held at λ₀ = 0.05, the shared layer ended 0.022 away from both SGDs'
    weight_decay=0.05 (the decay added at each one's step to the gradient they share), and
    learned_weight_decay said 0.05, silently. With one optimizer the weights match bit for
    bit (session 57)."""
    cb = LearnedWeightDecay(
        0.05,
        every_n_steps=4,
        start_step=10_000,
        max_overhead=None,
        training_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
    )
    with pytest.raises(ConfigurationError, match=r"net\.0\.weight is trained by two optimizers"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit([cb], _Shared(), DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16))


class _FrozenDummy(ToyClassifier):
    """Every layer frozen; one zero tensor the loss reads times 0 (the only trainable one)."""

    def __init__(self) -> None:
        super().__init__()
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.extra = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1]) + 0 * self.extra.sum()


def test_a_decay_that_never_fell_is_not_said_to_have_been_driven_down() -> None:
    """A λ whose ½λ‖w‖² is tiny because w is 0 (here it never moved from λ₀ = 1e-3) was said
    "the hyper steps drove 1 of the 1 learned λ down to 0.001 … because the validation loss
    was lowest with less decay": a false account."""
    cb = LearnedWeightDecay(1e-3, **QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit([cb], _FrozenDummy(), DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16))
    assert cb.learned_weight_decay["extra"].item() == pytest.approx(1e-3)
    assert cb.problem.decay_off(1.0) is None  # the line logged at the fit's end


def test_data_weights_of_a_model_with_nothing_to_train_are_refused_in_their_words() -> None:
    """Every tensor frozen: "inner_parameters is empty: pass at least one tensor" (an argument
    of the core the drop-in's user never passed)."""

    class Frozen(ToyClassifier):
        def __init__(self) -> None:
            super().__init__("none")
            for p in self.net.parameters():
                p.requires_grad_(False)

    with pytest.raises(ConfigurationError, match="hold no trainable parameter"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit([LearnedDataWeights(**QUICK)], Frozen(), _indexed())


# ------------------------------------------------------------------------------- labels
class _IntLabels(ToyClassifier):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1].long(), reduction="none")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_class_weights_read_labels_of_any_integer_dtype(dtype: torch.dtype) -> None:
    """per='class' over uint8 labels (MNIST's raw targets) or int8: "index_reduce_(): Expected
    dtype int32/int64 for index but got: Char". The weights are those of int64 labels."""

    def weights(labels_dtype: torch.dtype) -> Tensor:
        cb = LearnedDataWeights(per="class", num_classes=3, **QUICK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit([cb], _IntLabels("none"), _indexed(Y[60:].to(labels_dtype)))
        return cb.data_weights()

    assert torch.equal(weights(dtype), weights(torch.long))


@pytest.mark.parametrize("left_out", [2, None], ids=["class_2_left_out", "control"])
def test_a_class_the_validation_lacks_is_said_under_per_class_weights(left_out: Any) -> None:
    """per='class' with class 2 left out of the validation set: its weight fell to 0.38 (the
    others 0.56, 0.62) without a word (per sample it is said, session 50). Said now, once; the
    weights are unchanged; with every class validated nothing is said."""
    keep = Y[:60] != 2 if left_out is not None else torch.ones(60, dtype=torch.bool)
    val = DataLoader(TensorDataset(X[:60][keep], Y[:60][keep]), batch_size=20)
    cb = LearnedDataWeights(per="class", num_classes=3, **QUICK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit([cb], ToyClassifier("none"), _indexed(), val=val)
    said = [str(w.message) for w in caught if "holds no example of class" in str(w.message)]
    if left_out is None:
        assert not said
    else:
        assert len(said) == 1 and "class(es) 2," in said[0]
        assert float(cb.data_weights()[2]) < 0.45


# ------------------------------------------------------------------------ losses, not scalars
def test_a_loss_that_is_no_scalar_is_named_with_its_shape_and_the_fix() -> None:
    """A BilevelModule whose inner_loss returns per-sample losses failed in Lightning's
    self.log ("the tensor must have a single element"); an outer_loss's said "must return a
    scalar tensor" without what it got or how to fix it."""

    class PerSampleInner(Ridge):
        def inner_loss(self, batch: Any) -> Tensor:
            x, y = batch
            fit = 0.5 * (self.lin(x).squeeze(-1) - y) ** 2
            return fit + 0.5 * (self.log_lam.exp() * self.lin.weight[0] ** 2).sum()

    class PerSampleOuter(Ridge):
        def outer_loss(self, batch: Any) -> Tensor:
            x, y = batch
            return 0.5 * (self.lin(x).squeeze(-1) - y) ** 2

    for model in (PerSampleInner(), PerSampleOuter()):
        train, val = loaders(ridge_data(), 20)
        fitter = trainer([HyperOptimizationCallback(every_n_steps=2)], max_epochs=1)
        with pytest.raises(ConfigurationError, match=r"shape \(20,\): reduce it .*\.mean\(\)"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitter.fit(model, train, val)


def test_a_decay_given_as_a_numpy_array_names_the_float_to_pass() -> None:
    """weight_decay=np.array(1e-3) (a 0-d array, e.g. from np.logspace(...)[k:k+1].squeeze())
    was refused as "must be a finite number > 0, got array(0.001): the initial λ, e.g. the
    optimizer's former weight_decay": a contradiction without the fix."""
    import numpy as np

    with pytest.raises(ConfigurationError, match=r"pass a Python float \(weight_decay=0\.001\)"):
        LearnedWeightDecay(np.array(1e-3))
