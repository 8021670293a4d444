"""A careless user's inputs that gave silent wrong answers or unclear failures (session 52; the
table of every recipe tried and its outcome is in docs/failures.md, "Careless users (session
52)"). Each test fails without its fix.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_X,
    TOY_Y,
    Ridge,
    ToyClassifier,
    loaders,
    quick_weights,
    ridge_data,
    toy_val,
    trainer,
)
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hypertorch_sid import (
    BilevelModule,
    ConfigurationError,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)

X, Y = TOY_X, TOY_Y


def _fit(cb: Any, train: Any, val: Any, model: Any, **kw: Any) -> None:
    kw.setdefault("max_epochs", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(cb if isinstance(cb, list) else [cb], **kw).fit(model, train, val)


# ---------------------------------------------------------------- hyperparameter inputs
def test_numpy_numbers_are_taken_as_the_numbers_they_are():
    """``LearnedWeightDecay(np.float32(1e-3))`` (a value read from an array or a sweep's
    ``np.logspace``) was refused as "weight_decay must be a finite number > 0, got
    np.float32(0.001)", which it is; ``np.int64(1)``, ``min_weight_decay`` likewise;
    ``LearnedDataWeights(per="class", num_classes=np.int64(3))`` as "needs num_classes ≥ 2, got
    np.int64(3)"; ``register_hyperparameter("lam", np.float32(0.1))`` as "must be a tensor or a
    number, got float32"."""
    cb = LearnedWeightDecay(np.float32(1e-3), min_weight_decay=np.float32(1e-6))
    assert cb.initial_weight_decay == float(np.float32(1e-3))
    assert isinstance(cb.initial_weight_decay, float)
    assert LearnedWeightDecay(np.int64(1)).initial_weight_decay == 1.0
    with pytest.raises(ConfigurationError, match="finite number > 0"):
        LearnedWeightDecay(np.float32(-1e-3))
    weights = LearnedDataWeights(per="class", num_classes=np.int64(3))
    assert weights.problem.num_classes == 3 and len(weights.problem.weights.values()) == 3

    class Lam(BilevelModule):
        def __init__(self) -> None:
            super().__init__()
            self.register_hyperparameter("lam", np.float32(0.1))

    assert float(Lam().lam.detach()) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "initial", [torch.full((240,), 0.5), [0.5, 0.5, 0.5]], ids=["tensor", "list"]
)
def test_an_initial_weight_per_row_is_named(initial):
    """``LearnedDataWeights(initial=<one weight per example>)``: a raw "only one element tensors
    can be converted to Python scalars" (a tensor) or "float() argument must be a string or a
    real number, not 'list'" from inside the weights. Now named: one ω₀ for every row."""
    with pytest.raises(ConfigurationError, match=r"initial is one starting weight ω₀ for every"):
        LearnedDataWeights(initial=initial)
    LearnedDataWeights(initial=np.float32(0.3))  # one number, a NumPy one too
    LearnedDataWeights(initial=torch.tensor(0.3))


# ---------------------------------------------------------------- labels as a column
class _Rows(Dataset):
    """The toy with each label a 0-d tensor (``"vector"``: collated to (B,)) or a one-element
    tensor (``"column"``: ``torch.tensor([y])``, collated to (B, 1))."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return len(X)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return X[i], Y[i].clone() if self.kind == "vector" else Y[i].view(1)


class _FlatLabels(ToyClassifier):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y.view(-1), reduction="none")


@pytest.mark.parametrize("per", ["sample", "class"])
def test_labels_as_a_column_are_read_as_the_labels(per):
    """A data set returning ``torch.tensor([y])`` (labels collated to (B, 1), the training
    step flattening them): the labels were read as none, so the class gauge (the default) and
    every label check were silently off, and the weights learned differed from the same fit's
    on (B,) labels by up to 0.76; ``per="class"`` was refused with the fix
    ``batch[1].argmax(1)``, which maps every row to class 0. Now a column of class ids is read
    as the labels: the weights equal the (B,) fit's bit for bit."""
    extra = {"per": "class", "num_classes": 3} if per == "class" else {}
    learned = {}
    for kind in ("vector", "column"):
        cb = quick_weights(**extra)
        train = DataLoader(IndexedDataset(_Rows(kind)), batch_size=16)
        _fit(cb, train, toy_val(), _FlatLabels("none"))
        learned[kind] = cb.data_weights()
    assert len(learned["vector"]) == (240 if per == "sample" else 3)
    assert torch.equal(learned["column"], learned["vector"])


def test_class_ids_as_a_float_column_are_named_with_their_fix():
    """``per="class"`` on class ids stored as a float column (B, 1): the fix given was
    ``batch[1].argmax(1)`` (all zeros for one column); now ``batch[1].long()``, which a
    column of ids now is."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y.float()[:, None])), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"class ids stored as floats.*batch\[1\]\.long"):
        _fit(quick_weights(per="class", num_classes=3), train, toy_val(), _FlatLabels("none"))


class _Binary(ToyClassifier):
    """A binary classifier (class 0 of the toy against the others), the per-sample
    ``F.binary_cross_entropy_with_logits``, which needs float targets: the labels are cast in
    the step, so integer and float labels give the same losses."""

    def __init__(self) -> None:
        super().__init__("none")
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(
            self(x).view(-1), y.float().view(-1), reduction="none"
        )


@pytest.mark.parametrize("shape", ["vector", "column"])
def test_binary_targets_stored_as_floats_are_read_as_the_labels(shape):
    """Binary labels as floats (0.0 / 1.0, as ``binary_cross_entropy_with_logits`` wants
    them): read as no labels, so the class gauge and the label checks were silently off, and
    the weights differed from the same fit's on integer labels by up to 0.75 (session 49
    checked float labels gave the same weights; the class gauge of session 51 broke that).
    Now read as the labels 0 / 1: the weights equal the integer fit's bit for bit."""
    binary = (Y == 0).long()
    learned = {}
    for dtype in (torch.long, torch.float32):  # against integer labels as a vector
        y = binary.to(dtype)
        y = y[:, None] if shape == "column" and dtype == torch.float32 else y
        cb = quick_weights()
        train = DataLoader(IndexedDataset(TensorDataset(X, y)), batch_size=16)
        _fit(cb, train, DataLoader(TensorDataset(X[:60], y[:60]), batch_size=20), _Binary())
        learned[dtype] = cb.data_weights()
    assert torch.equal(learned[torch.float32], learned[torch.long])


# ---------------------------------------------------------------- a fit that trains nothing
class _NoOptimizer(Ridge):
    def configure_optimizers(self) -> Any:
        return None


class _ManualDefaultStep(Ridge):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


def test_a_bilevel_module_without_an_optimizer_is_refused():
    """``configure_optimizers`` returning None: Lightning runs the fit without an optimizer
    (warned), and the hyper steps learned λ for a w nothing trained (6 hyper steps, w still
    0). Refused at fit start now, for every callback (``LearnedDataWeights`` said
    "inner_parameters is empty: pass at least one tensor")."""
    train, val = loaders(ridge_data(), 20, 30)
    model = _NoOptimizer()
    with pytest.raises(ConfigurationError, match="no training optimizer"):
        _fit(HyperOptimizationCallback(every_n_steps=2, start_step=2), train, val, model)
    assert torch.equal(model.lin.weight, torch.zeros_like(model.lin.weight))

    class Plain(ToyClassifier):
        def configure_optimizers(self) -> Any:
            return None

    indexed = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    with pytest.raises(ConfigurationError, match="LearnedDataWeights: the fit has no training"):
        _fit(quick_weights(), indexed, toy_val(), Plain("none"))


def test_a_bilevel_module_under_manual_optimisation_needs_its_own_training_step():
    """``automatic_optimization = False`` with ``BilevelModule``'s default ``training_step``
    (which returns ``inner_loss`` for Lightning to step): nothing stepped, the fit trained
    nothing and ran no hyper step, without a word. Refused now, naming both fixes."""
    train, val = loaders(ridge_data(), 20, 30)
    with pytest.raises(ConfigurationError, match="manual_backward"):
        _fit(
            HyperOptimizationCallback(every_n_steps=2, start_step=2),
            train,
            val,
            _ManualDefaultStep(),
        )


# ---------------------------------------------------------------- a training run in eval mode
class _EvalTrained(ToyClassifier):
    """The toy MLP with a dropout layer (``drop``; else an identity), trained in eval mode
    (``self.eval()`` in ``on_train_batch_start``: no dropout, running statistics) where
    ``evaluated``."""

    def __init__(self, drop: bool, reduction: str = "mean") -> None:
        super().__init__(reduction)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16),
            torch.nn.Tanh(),
            torch.nn.Dropout(0.5) if drop else torch.nn.Identity(),
            torch.nn.Linear(16, 3),
        )
        self.drop = drop

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.drop:
            self.eval()


@pytest.mark.parametrize("drop_in", ["weights", "decay"])
def test_a_training_run_in_eval_mode_has_its_hyper_steps_run_so(drop_in):
    """``self.eval()`` in ``on_train_batch_start`` (a fine-tuning recipe: no dropout, frozen
    BatchNorm statistics): the hyper steps switched the module back to training mode, so they
    ran dropout the training never ran (47 of 84 dropout forwards of a decay fit, 50 of 128 of
    a data-weights fit), and the data weights differed from the same network's without the
    dropout layer. Now the hyper steps keep the training's flags (``core.modes.as_trained``):
    no forward runs dropout, and the data weights equal the dropout-free network's bit for
    bit."""
    learned = {}
    for drop in (False, True):
        model = _EvalTrained(drop, "none" if drop_in == "weights" else "mean")
        in_training_mode: list[bool] = []
        model.net[2].register_forward_hook(
            lambda m, i, o, seen=in_training_mode: seen.append(m.training)
        )
        if drop_in == "weights":
            cb: Any = quick_weights()
            train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
            _fit(cb, train, toy_val(), model)
            learned[drop] = cb.data_weights()
        else:
            cb = LearnedWeightDecay(1e-2, every_n_steps=4, max_overhead=None)
            _fit(cb, DataLoader(TensorDataset(X, Y), batch_size=16), toy_val(), model)
            assert len(cb.history) == 7
        if drop:
            assert len(in_training_mode) > 60 and not any(in_training_mode)
    if drop_in == "weights":
        assert torch.equal(learned[True], learned[False])


# ---------------------------------------------------------------- the row record on resume
def test_a_resumed_fit_keeps_each_rows_last_loss_and_visits(tmp_path):
    """The per-row record ``flagged()`` reads (each row's training loss at its last visit, its
    visits) was not checkpointed: a fit resumed for 3 more batches had no last loss for the
    192 rows it had not read again, so ``flagged("split_misfit")`` (losses above log 2) and the
    flags' contrast checks saw 48 rows, and the visits counted 48 draws, not 768. Now both are
    checkpointed beside the labels and taken over at the resumed fit's build."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16, shuffle=True)
    torch.manual_seed(0)
    first = quick_weights()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = trainer([first], max_epochs=3)
        fitted.fit(ToyClassifier("none"), train, toy_val())
        fitted.save_checkpoint(tmp_path / "epoch3.ckpt")
        resumed = quick_weights()
        trainer([resumed], max_epochs=4, limit_train_batches=3).fit(
            ToyClassifier("none"), train, toy_val(), ckpt_path=tmp_path / "epoch3.ckpt"
        )
    before, after = first.problem._last_loss, resumed.problem._last_loss
    assert after is not None and bool(torch.isfinite(after).all())
    unread = after == before  # the rows the 3 batches did not read keep their last loss
    assert int(unread.sum()) == 240 - 48
    assert float(resumed.problem._visits.sum()) == float(first.problem._visits.sum()) + 48


@pytest.mark.parametrize("drop_in", ["weights", "decay"])
def test_a_finished_fit_resumed_without_a_step_says_its_state_is_not_applied(tmp_path, drop_in):
    """``trainer.fit(model, ckpt_path=...)`` with the checkpoint's own ``max_epochs`` (to get a
    finished fit's hyperparameters back in a new process): Lightning runs no training step, so
    the checkpoint's state, applied at the first one, never was: ``data_weights()`` was empty
    and ``flagged()`` flagged nothing (89 rows before the checkpoint), ``learned_weight_decay``
    and ``decay_values()`` gave λ₀ (1e-3, where 6.5e-8 was learned), without a word. They
    refuse now, naming the fix."""
    if drop_in == "weights":
        make: Any = quick_weights
        train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
        reduction = "none"
    else:

        def make() -> LearnedWeightDecay:
            return LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)

        train = DataLoader(TensorDataset(X, Y), batch_size=16)
        reduction = "mean"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = trainer([make()], max_epochs=2)
        fitted.fit(ToyClassifier(reduction), train, toy_val())
        fitted.save_checkpoint(tmp_path / "done.ckpt")
        resumed = make()
        trainer([resumed], max_epochs=2).fit(
            ToyClassifier(reduction), train, toy_val(), ckpt_path=tmp_path / "done.ckpt"
        )
    if drop_in == "weights":
        readers = [resumed.data_weights, resumed.flagged]
    else:
        readers = [lambda: resumed.learned_weight_decay, resumed.decay_values]
    for read in readers:
        with pytest.raises(ConfigurationError, match="no training step has applied"):
            read()


def test_a_label_stored_as_a_one_element_tensor_is_read_under_a_users_collate_fn():
    """``torch.tensor([y])`` per sample: read before collation as it is read after it (the (B, 1)
    column above), also where a collate_fn of the user's hides the labels from the drop-in."""
    from hypertorch_sid.core.indexing import sample_label

    assert sample_label((torch.zeros(3), torch.tensor([2]))) == 2
    assert sample_label({"x": torch.zeros(3), "label": torch.tensor([1])}) == 1
    assert sample_label((torch.zeros(3), torch.tensor([0.0]))) is None  # a float: no class id


def test_lazy_adams_betas_as_numpy_numbers():
    """``outer_betas=np.array([0.9, 0.999])`` or NumPy scalars are two numbers, as a tuple is."""
    from hypertorch_sid.core.errors import ConfigurationError
    from hypertorch_sid.core.lazy_adam import LazyAdam

    x = torch.zeros(4, requires_grad=True)
    for betas in (np.array([0.9, 0.999]), (np.float32(0.9), np.float64(0.999)), [0.0, 0.5]):
        opt = LazyAdam([x], lr=0.1, betas=betas)
        assert opt.param_groups[0]["betas"] == (float(betas[0]), float(betas[1]))
    for bad in ((0.9,), (0.9, 1.0), "ab", 0.9, (True, 0.9)):
        with pytest.raises(ConfigurationError, match="betas must be two numbers"):
            LazyAdam([x], lr=0.1, betas=bad)
