"""Careless users of the two Lightning drop-ins, ``LearnedWeightDecay`` and
``LearnedDataWeights``: their constructor arguments, their read-outs after a fit, the dataset
wrapper and the per-sample losses (session 55; the table of every input tried and its outcome
is in docs/failures.md, "Careless users, the drop-ins (session 55)"). Each test but the
controls fails without its fix.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_X,
    TOY_Y,
    ToyClassifier,
    quick_decay,
    quick_weights,
    toy_val,
    trainer,
)
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)

X, Y = TOY_X, TOY_Y


def _indexed() -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)


def _fit(cb: Any, train: Any, model: Any, **kw: Any) -> pl.Trainer:
    kw.setdefault("max_epochs", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter = trainer(cb if isinstance(cb, list) else [cb], **kw)
        fitter.fit(model, train, toy_val())
    return fitter


# ---------------------------------------------------------------- target= per sample
@pytest.mark.parametrize(
    "target, said",
    [
        (lambda b: b[1].tolist(), "a list"),
        (lambda b: b[1].float(), r"stored as floats\?.*batch\[1\]\.long\(\)"),
        (lambda b: b[1][: len(b[1]) // 2], "8 labels, not one per row"),
        (lambda b: F.one_hot(b[1], 3), r"one-hot.*argmax\(1\)"),
        (lambda b: b[1].numpy(), "ndarray"),
    ],
    ids=["list", "float", "half", "one_hot", "numpy"],
)
def test_a_target_that_gives_no_class_ids_per_sample_is_refused(target, said):
    """``LearnedDataWeights(target=...)`` (per sample) whose labels the drop-in cannot read
    (a list, float ids, labels of half the batch, one-hot rows, a NumPy array) was read as no
    labels without a word: the class gauge (``gauge="auto"``'s choice for labelled data) and
    every label check went off, and the weights were the unlabelled fit's (0.14 / 0.84 where
    the labels' fit has 0.09 / 0.64). Now refused at the fit's first step, naming the fix."""
    with pytest.raises(ConfigurationError, match=f"target= gave .*{said}"):
        _fit(quick_weights(target=target), _indexed(), ToyClassifier("none"))


def test_a_target_that_fails_per_sample_is_named():
    """A ``target`` raising on the training batches was swallowed (no labels, silently)."""
    with pytest.raises(ConfigurationError, match=r"target= failed on a training batch \(TypeError"):
        _fit(quick_weights(target=lambda b: b["y"]), _indexed(), ToyClassifier("none"))


def test_control_a_target_of_class_ids_gives_the_default_fits_weights():
    """Control (passes before and after): a ``target`` giving the labels, as a vector or a
    column, learns the weights of the default's labels bit for bit."""
    fits = []
    for cb in (
        quick_weights(),
        quick_weights(target=lambda b: b[1]),
        quick_weights(target=lambda b: b[1][:, None]),
    ):
        _fit(cb, _indexed(), ToyClassifier("none"))
        fits.append(cb.data_weights())
    assert torch.equal(fits[0], fits[1]) and torch.equal(fits[0], fits[2])


# ---------------------------------------------------------------- read-outs
class _Interrupted(ToyClassifier):
    """Its training ends by ``error`` at optimizer step 10 (a Ctrl-C: ``KeyboardInterrupt``)."""

    def __init__(self, reduction: str, error: type[BaseException]) -> None:
        super().__init__(reduction)
        self.error = error

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.global_step == 10:
            raise self.error("stopped")
        return super().training_step(batch, batch_idx)


def test_read_outs_after_a_fit_an_exception_ended_say_so():
    """Read after a fit an exception ended (a Ctrl-C in a notebook: Lightning stops the fit and
    raises ``SystemExit``, the kernel goes on), ``data_weights()`` / ``flagged()`` and
    ``learned_weight_decay`` gave the unfinished fit's values without a word. Now they say so,
    once; a finished fit after it does not."""
    cb = quick_weights()
    with pytest.raises(RuntimeError, match="stopped"):
        _fit(cb, _indexed(), _Interrupted("none", RuntimeError))
    with pytest.warns(UserWarning, match=r"ended by RuntimeError at optimizer step 10"):
        assert len(cb.data_weights()) == len(X)
    decay = quick_decay()
    with pytest.raises(SystemExit):
        _fit(
            decay,
            DataLoader(TensorDataset(X, Y), batch_size=16),
            _Interrupted("mean", KeyboardInterrupt),
        )
    with pytest.warns(UserWarning, match=r"ended by KeyboardInterrupt at optimizer step 10"):
        assert set(decay.learned_weight_decay) == {"net.0", "net.2"}
    _fit(decay, DataLoader(TensorDataset(X, Y), batch_size=16), ToyClassifier())  # finished
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(decay.learned_weight_decay) == {"net.0", "net.2"}


def test_flagged_before_any_fit_says_there_is_nothing_to_flag():
    """``flagged()`` on a callback no fit has used (another instance than the Trainer's) gave
    an empty tensor, which reads as "no suspect" on a clean data set, without a word."""
    with pytest.warns(UserWarning, match="no fit has built the data weights"):
        assert len(quick_weights().flagged()) == 0


def test_flag_rules_take_numpy_numbers_and_name_split_misfit():
    """``flagged(np.float32(0.3))`` (a quantile from NumPy) was refused as "must be 'split',
    'below_half' or a FlagRule (e.g. 0.25 …)", a contradiction; a mistyped name was answered
    without ``'split_misfit'``, one of the names ``flagged`` takes."""
    cb = quick_weights()
    _fit(cb, _indexed(), ToyClassifier("none"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(cb.flagged(np.float32(0.3)), cb.flagged(0.3))
    with pytest.raises(ConfigurationError, match="'split_misfit'.*got 'split-misfit'"):
        cb.flagged("split-misfit")


# ---------------------------------------------------------------- per-sample losses
class _TimeFirst(ToyClassifier):
    """Per-sample losses of a sequence model written time first: (T, B)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        losses = F.cross_entropy(self(batch[0]), batch[1], reduction="none")
        return losses[None, :] * torch.linspace(0.5, 1.5, 5)[:, None]


class _TwoViews(ToyClassifier):
    """Two views of each sample concatenated along the batch: (2B,) losses."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        views = torch.cat([x, x + 0.1])
        return F.cross_entropy(self(views), torch.cat([y, y]), reduction="none")


def test_per_sample_losses_with_the_batch_second_or_doubled_are_named():
    """(T, B) losses were answered "5 per-sample losses for a batch of 16: return one loss per
    sample (reduction='none', …)", which the user had done; two views' (2B,) losses likewise.
    Now the shapes are named with their fix."""
    with pytest.raises(ConfigurationError, match=r"shape \(5, 16\).*dimension 1.*movedim\(1, 0\)"):
        _fit(quick_weights(), _indexed(), _TimeFirst("none"))
    with pytest.raises(
        ConfigurationError, match=r"2 views of each sample.*view\(2, 16\)\.mean\(0\)"
    ):
        _fit(quick_weights(), _indexed(), _TwoViews("none"))


# ---------------------------------------------------------------- constructors
@pytest.mark.parametrize("outer_lr", [float("nan"), -1.0, float("inf"), "0.3"])
def test_the_decays_outer_lr_is_checked_at_construction(outer_lr):
    """``LearnedWeightDecay(outer_lr=nan / -1 / inf)`` was accepted and refused at the fit's
    start by "TrustRprop: lr must be …" (a name the user never gave); ``"0.3"`` was a raw
    ``TypeError``."""
    with pytest.raises(ConfigurationError, match="LearnedWeightDecay: outer_lr must be"):
        LearnedWeightDecay(outer_lr=outer_lr)


def test_the_data_weights_outer_settings_of_the_wrong_type_are_named():
    """``outer_lr="1"`` gave "'<' not supported between instances of 'int' and 'str'";
    ``outer_betas=0.9`` (one number) a raw ``TypeError``."""
    with pytest.raises(ConfigurationError, match="lr must be > 0 and finite, got '1'"):
        LearnedDataWeights(outer_lr="1")
    with pytest.raises(ConfigurationError, match=r"betas must be two numbers .* got 0\.9"):
        LearnedDataWeights(outer_betas=0.9)


def test_an_infinite_budget_is_refused_at_construction():
    """``max_overhead=float("inf")`` (meant as "no limit") was taken and failed at the fit with
    a raw "cannot convert float NaN to integer"."""
    for make in (LearnedWeightDecay, LearnedDataWeights):
        with pytest.raises(ConfigurationError, match="max_overhead must be .*finite.*None"):
            make(max_overhead=math.inf)


# ---------------------------------------------------------------- the training set
class _Resizable(Dataset):
    """The toy's first ``n`` rows, a length the user changes in place; records the rows read."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        self.reads.append(int(i))
        return X[i], Y[i]


class _Resize(pl.Callback):
    def __init__(self, dataset: _Resizable, n: int) -> None:
        self.dataset, self.n = dataset, n

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.dataset.n != self.n:  # once: the reads after it are the resized set's
            self.dataset.n, self.dataset.reads = self.n, []


def test_a_training_set_resized_in_place_is_followed_by_the_decays_hyper_steps():
    """A data set that shrinks itself (240 → 120 rows) between epochs, no reload: the decay's
    hyper steps kept drawing from rows 0–239, 120 of which the training no longer reads
    (silently: ℓ̂ was not the training's loss). Now they follow the new length."""
    data = _Resizable(240)
    loader = DataLoader(data, batch_size=16, shuffle=True)
    _fit([quick_decay(), _Resize(data, 120)], loader, ToyClassifier(), max_epochs=3)
    assert data.reads and max(data.reads) < 120


def test_a_data_weights_training_set_resized_in_place_is_not_blamed_on_a_reload():
    """The same under ``LearnedDataWeights`` was refused as "the train dataloader was reloaded
    (reload_dataloaders_every_n_epochs)", which the user never asked for."""
    data = _Resizable(240)
    loader = DataLoader(IndexedDataset(data), batch_size=16, shuffle=True)
    with pytest.raises(ConfigurationError, match="changed in place during the fit"):
        _fit([quick_weights(), _Resize(data, 120)], loader, ToyClassifier("none"), max_epochs=3)


def test_control_a_validation_loader_of_another_structure_is_named():
    """Control (passes before and after): validation batches the training step cannot read
    (dicts where it unpacks pairs) are named with ``validation_loss=`` as the fix."""

    class Dicts(Dataset):
        def __len__(self) -> int:
            return 60

        def __getitem__(self, i: int) -> Any:
            return {"x": X[i], "y": Y[i]}

    cb = quick_decay()
    with warnings.catch_warnings(), pytest.raises(ConfigurationError, match="validation_loss="):
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=2).fit(
            ToyClassifier(),
            DataLoader(TensorDataset(X, Y), batch_size=16),
            DataLoader(Dicts(), batch_size=20),
        )


def test_a_dict_of_columns_is_refused_by_the_dataset_wrapper():
    """``IndexedDataset({"x": X, "y": y})`` (a data set's columns, as a dict) was taken with
    length 2, its keys, and the DataLoader failed with a bare ``KeyError: 0``."""
    with pytest.raises(ConfigurationError, match=r"a dict of 2 keys \('x', 'y'\): columns\?"):
        IndexedDataset({"x": X, "y": Y})


@pytest.mark.parametrize("copies", ["subset", "concat"])
def test_examples_repeated_in_the_training_set_are_said(copies):
    """Oversampling by copies (a ``Subset`` listing 40 indices twice, ``ConcatDataset([ds,
    ds])``) gave each copy its own weight, learned apart without a word: the two copies of an
    example ended up to 0.71-0.83 apart, and ``flagged()`` could name one and keep the other."""
    from torch.utils.data import ConcatDataset, Subset

    base = TensorDataset(X, Y)
    train = (
        Subset(base, [*range(len(X)), *range(40)])
        if copies == "subset"
        else ConcatDataset([base, base])
    )
    loader = DataLoader(IndexedDataset(train), batch_size=16, shuffle=True)
    cb = quick_weights()
    with pytest.warns(UserWarning, match="training positions read an example another"):
        trainer([cb], max_epochs=1).fit(ToyClassifier("none"), loader, toy_val())


def test_control_a_random_split_is_no_repetition():
    """Control (passes before and after): a ``random_split`` part and a ``ConcatDataset`` of two
    different data sets hold each example once: nothing said."""
    from torch.utils.data import ConcatDataset, random_split

    base = TensorDataset(X, Y)
    part = random_split(base, [200, 40], generator=torch.Generator().manual_seed(0))[0]
    halves = ConcatDataset([TensorDataset(X[:120], Y[:120]), TensorDataset(X[120:], Y[120:])])
    for train in (part, halves):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer([quick_weights()], max_epochs=1).fit(
                ToyClassifier("none"), DataLoader(IndexedDataset(train), batch_size=16), toy_val()
            )
        assert not [w for w in said if "read an example another" in str(w.message)]


class _Counts(pl.LightningModule):
    """A regression of whole-number targets (counts 0-9, stored as floats) by squared error."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return (self.net(x).squeeze(-1) - y) ** 2

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_whole_number_float_targets_under_the_default_objective_are_refused():
    """A regression of whole numbers stored as floats (counts 0-9) escaped the default
    objective's refusal of regressions (it looked for fractional targets only): E was
    ExpectedError of squared errors, silently. Float class ids (0.0, 1.0, 2.0, …) look the
    same and were read as no labels; the refusal names both fixes. ``objective="mean_loss"``
    runs."""
    counts = (X[:, 0] * 3 + 5).round().clamp(0, 9)
    train = DataLoader(IndexedDataset(TensorDataset(X, counts)), batch_size=16)
    val = DataLoader(TensorDataset(X[:60], counts[:60]), batch_size=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError, match="whole numbers stored as floats.*mean_loss"):
            trainer([quick_weights()], max_epochs=2).fit(_Counts(), train, val)
        cb = quick_weights(objective="mean_loss")
        trainer([cb], max_epochs=2).fit(_Counts(), train, val)
    assert len(cb.data_weights()) == len(X)
