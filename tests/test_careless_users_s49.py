"""A careless user's inputs that gave silent wrong answers, ignored settings or failures inside
the user's own code (session 49; the table of every recipe tried and its outcome is in
docs/failures.md, "Careless users (session 49)"). Each test fails without its fix.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    TOY_C,
    TOY_D,
    TOY_N,
    TOY_X,
    TOY_Y,
    ToyClassifier,
    quick_decay,
    quick_weights,
    toy_val,
    trainer,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
)
from hypertorch_sid.core.objectives import ExpectedError

N, D, C = TOY_N, TOY_D, TOY_C
X, Y = TOY_X, TOY_Y


Net = ToyClassifier


def _indexed(batch_size: int = 16, labels: Tensor = Y) -> DataLoader:
    return DataLoader(IndexedDataset(TensorDataset(X, labels)), batch_size=batch_size, shuffle=True)


def _plain(batch_size: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True)


def _fit(cb: Any, train: DataLoader, val: DataLoader | None, model: Any, **kw: Any) -> list[str]:
    """Fit (one epoch unless said); the warnings' messages."""
    kw.setdefault("max_epochs", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], **kw).fit(model, train, val)
    return [str(w.message) for w in caught]


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return _indexed(self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return toy_val()


@pytest.mark.parametrize("tune", ["lr_find", "scale_batch_size"])
def test_the_tuner_runs_with_the_data_weights(tune):
    """``Tuner(trainer).lr_find`` / ``scale_batch_size`` run their trials from ``on_fit_start``
    with every other callback switched off: the user's training_step got the Indexed batch and
    failed inside the user's code ("mat1 and mat2 must have the same dtype": the index read as
    the input). Now ``training_step`` takes Indexed batches from the fit's setup on, returning
    the loss at the weights' start; the fit after the tuner learns as before, and the module
    gets its own ``training_step`` back."""
    from pytorch_lightning.tuner import Tuner

    cb, model, data = quick_weights(), Net("none"), Data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = trainer([cb], max_epochs=1)
        if tune == "lr_find":
            found = Tuner(fit).lr_find(model, datamodule=data, num_training=15)
            assert found is not None and len(found.results["loss"]) > 5
        else:
            # 2 then 4 (init_val=2), as without the callback
            assert Tuner(fit).scale_batch_size(model, datamodule=data, max_trials=2) == 4
        assert "training_step" not in model.__dict__  # given back after the trials
        fit.fit(model, datamodule=data)
    assert cb.sid is not None and cb.sid.hyper_step > 0
    assert "training_step" not in model.__dict__


def test_weight_decay_reads_as_the_initial_lambda_and_says_so_after_a_fit(tmp_path):
    """``cb.weight_decay`` after a fit was the constructor's λ₀ (1e-3), read by users as the
    learned decay, silently. It stays λ₀ (LightningCLI and configs read it back before the fit,
    unwarned); after a fit it warns once, naming ``learned_weight_decay`` (λ by slot) and
    ``decay_values()``; ``initial_weight_decay`` names λ₀ without a warning."""
    cb = quick_decay()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cb.weight_decay == cb.initial_weight_decay == 1e-3  # before a fit: no warning
    assert cb.learned_weight_decay == {}
    said = _fit(
        cb, _plain(), toy_val(), Net(), enable_checkpointing=True, default_root_dir=tmp_path
    )
    assert not [m for m in said if "is the initial λ" in m]  # nothing in the fit reads it
    learned = cb.learned_weight_decay
    assert list(learned) == cb.slot_names == ["net.0", "net.2"]
    values = cb.decay_values()
    for slot, lam in learned.items():
        assert torch.equal(lam, values[f"{slot}.weight"].reshape(1))
        assert float(lam) != 1e-3  # learned
    with pytest.warns(UserWarning, match=r"weight_decay is the initial λ .*\(0.001\).*learned_"):
        assert cb.weight_decay == 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cb.weight_decay == cb.initial_weight_decay == 1e-3  # said once
    one = quick_decay(granularity="global")
    _fit(one, _plain(), toy_val(), Net())
    assert list(one.learned_weight_decay) == ["all"]


class Compiled(Net):
    """The network compiled inside the module (``self.net = torch.compile(net)``)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.net = torch.compile(self.net, backend="eager")


@pytest.mark.parametrize("granularity", ["per_layer", "per_tensor"])
def test_names_under_torch_compile_are_the_users(granularity):
    """``self.net = torch.compile(net)``: every name the decay showed carried the wrapper's
    ``_orig_mod.`` (``net._orig_mod.0.weight`` in ``decay_values()``, the slots, the logs and
    warnings). They are the user's names now, and λ is what the uncompiled module learns."""
    compiled, plain = quick_decay(granularity=granularity), quick_decay(granularity=granularity)
    _fit(compiled, _plain(), toy_val(), Compiled())
    _fit(plain, _plain(), toy_val(), Net())
    assert compiled.slot_names == plain.slot_names
    assert not [k for k in compiled.history[-1] if "_orig_mod" in k]
    got, want = compiled.decay_values(), plain.decay_values()
    assert list(got) == list(want) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    for name in want:
        torch.testing.assert_close(got[name], want[name])


def _masked_said(messages: list[str]) -> list[str]:
    return [m for m in messages if "exactly 0" in m]


def test_masked_examples_first_read_late_in_the_fit_are_said():
    """Rows labelled ``-100`` (ignore_index) that the training first reads after its first 20
    batches (an unshuffled loader, the unlabelled rows at the end): their weights were learned
    and flagged without a word, as the per-batch check reads only the fit's first 20 batches.
    The rows' negative labels and exact-0 losses are read from the per-row records at the
    epoch's end now (one read per epoch). Clean labels: nothing said."""
    labels = Y.clone()
    labels[200:] = -100  # batches 25-29 of 30
    train = DataLoader(IndexedDataset(TensorDataset(X, labels)), batch_size=8)
    said = _masked_said(_fit(quick_weights(), train, toy_val(), Net("none")))
    assert len(said) == 1 and "40 training examples have a negative label (-100" in said[0]

    early = Y.clone()
    early[::6] = -100  # in the first batch: said there, once
    said = _masked_said(
        _fit(quick_weights(), _indexed(8, early), toy_val(), Net("none"), max_epochs=2)
    )
    assert len(said) == 1 and "near the fit's start" in said[0]
    assert not _masked_said(
        _fit(quick_weights(), _indexed(8), toy_val(), Net("none"), max_epochs=2)
    )


@pytest.mark.parametrize(
    "bad, match",
    [(-100, r"from -100 to 2.*ignore_index, unlabelled rows\?"), (5, r"pass num_classes=6")],
)
def test_class_weights_name_labels_outside_the_classes(bad, match):
    """``per="class"`` on labels with ``-100`` (ignore_index) or a label past ``num_classes``:
    refused as "sample-weight index out of range … The weights were sized for another data
    set", which names neither the label nor the fix."""
    labels = Y.clone()
    labels[::6] = bad
    train = DataLoader(TensorDataset(X, labels), batch_size=16)
    with pytest.raises(ConfigurationError, match=match):
        _fit(quick_weights(per="class", num_classes=3), train, toy_val(), Net("none"))


def test_a_directional_the_hyper_step_cross_term_does_not_read_is_refused():
    """``directional=`` says how the training batches' cross term is computed; with
    ``cross_term="hyper_step"`` (given, or the default under a compute budget) there is none,
    and the setting was accepted and ignored."""
    with pytest.raises(ConfigurationError, match=r"directional='forward_mode' .*ignored"):
        LearnedDataWeights(directional="forward_mode", cross_term="hyper_step")
    with pytest.raises(ConfigurationError, match=r"max_overhead=0.5"):
        LearnedDataWeights(directional="forward_mode", max_overhead=0.5)
    LearnedDataWeights(directional="forward_mode")  # the training cross term reads it
    LearnedDataWeights(cross_term="hyper_step")


def test_sparse_gradients_per_class_are_refused():
    """``sparse_grad=True`` with ``per="class"``: only per-sample weights take row-sparse
    gradients (the build set them per sample only); accepted and ignored before."""
    with pytest.raises(ConfigurationError, match=r"sparse_grad=True .*per='class'"):
        LearnedDataWeights(per="class", num_classes=3, sparse_grad=True)
    LearnedDataWeights(per="class", num_classes=3, sparse_grad=False)
    LearnedDataWeights(sparse_grad=True)


def test_an_objective_beside_a_scalar_validation_loss_is_refused():
    """``validation_loss=`` returning a mean is E itself: an ``objective=`` given beside it had
    no per-sample losses to apply to and was ignored, silently."""

    def mean_loss(module: Any, batch: Any) -> Tensor:
        return F.cross_entropy(module(batch[0]), batch[1])

    cb = quick_weights(start_step=0, validation_loss=mean_loss, objective=ExpectedError(q=1.0))
    with pytest.raises(ConfigurationError, match=r"objective=ExpectedError.*would be ignored"):
        _fit(cb, _indexed(), toy_val(), Net("none"))
    for objective in ({}, {"objective": "mean_loss"}):  # E itself; the mean of one number
        cb = quick_weights(start_step=0, validation_loss=mean_loss, **objective)
        _fit(cb, _indexed(), toy_val(), Net("none"))
        assert cb.sid is not None and cb.sid.hyper_step > 0


class Normed(Net):
    """Linear → LayerNorm: the first layer is scale-invariant (its λ is held by default)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, C))


def test_a_callback_given_another_module_probes_its_layers_again():
    """One ``LearnedWeightDecay`` reused for a second model (a loop over architectures): the
    invariance probe's answer for the first model's layers was kept, so the LayerNorm model's
    invariant layer was not held: its λ rose from 1e-3 to 0.91 in 3 epochs, silently. Now the
    groups are probed again on each new set of decayed tensors, as a fresh callback does."""
    reused = quick_decay()
    _fit(reused, _plain(), toy_val(), Net())
    assert reused.invariant_groups == {"net.0": False, "net.2": False}
    _fit(reused, _plain(), toy_val(), Normed(), max_epochs=3)
    fresh = quick_decay()
    _fit(fresh, _plain(), toy_val(), Normed(), max_epochs=3)
    assert reused.invariant_groups == fresh.invariant_groups
    assert reused.invariant_groups == {"net.0": True, "net.1": False, "net.3": False}
    assert float(reused.learned_weight_decay["net.0"]) == pytest.approx(1e-3)


class Regression(Net):
    def __init__(self) -> None:
        super().__init__("none")
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch[0]).squeeze(1), batch[1], reduction="none")


def test_weights_learned_on_another_fold_are_not_carried_to_its_rows():
    """One ``LearnedDataWeights`` over a k-fold loop (folds of one data set, the same size): the
    second fold's rows took the first fold's weights (row i another example), silently for a
    regression (no labels to see the change by). Now a training set that reads other positions
    of the same data set starts every weight afresh, said; the same fold again keeps them."""
    from torch.utils.data import Subset

    target = X @ torch.randn(D, generator=torch.Generator().manual_seed(2))
    base = TensorDataset(X, target)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(3)).tolist()
    folds = [Subset(base, perm[:120]), Subset(base, perm[120:])]
    held = torch.randn(40, D, generator=torch.Generator().manual_seed(4))
    val = DataLoader(TensorDataset(held, held @ torch.ones(D)), batch_size=20)

    def loader(fold: Any) -> DataLoader:
        return DataLoader(IndexedDataset(fold), batch_size=16)

    def said(messages: list[str]) -> list[str]:
        return [m for m in messages if "other examples than the ones" in m]

    reused = quick_weights(objective="mean_loss")
    assert not said(_fit(reused, loader(folds[0]), val, Regression()))
    first = reused.data_weights()
    assert not said(_fit(reused, loader(folds[0]), val, Regression()))  # the same fold: kept
    assert len(said(_fit(reused, loader(folds[1]), val, Regression()))) == 1
    fresh = quick_weights(objective="mean_loss")
    _fit(fresh, loader(folds[1]), val, Regression())
    torch.testing.assert_close(reused.data_weights(), fresh.data_weights())
    assert not torch.allclose(first, fresh.data_weights())

    class Rotating(pl.LightningDataModule):  # another fold at every reload, within one fit
        def train_dataloader(self) -> DataLoader:
            return loader(folds[self.trainer.current_epoch % 2])

        def val_dataloader(self) -> DataLoader:
            return val

    with pytest.raises(ConfigurationError, match=r"reloaded .*over other examples"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer([quick_weights(objective="mean_loss")], max_epochs=2,
                    reload_dataloaders_every_n_epochs=1).fit(Regression(), datamodule=Rotating())  # fmt: skip


@pytest.mark.parametrize("which", ["training_loss", "validation_loss"])
def test_a_per_sample_loss_given_to_the_decay_is_named_by_its_shape(which):
    """``LearnedWeightDecay(validation_loss=...)`` returning ``reduction="none"`` losses: refused
    as "returned Tensor, not a scalar tensor", which reads as a contradiction."""

    def per_sample(module: Any, batch: Any) -> Tensor:
        return F.cross_entropy(module(batch[0]), batch[1], reduction="none")

    with pytest.raises(ConfigurationError, match=r"returned a tensor of shape \(\d+,\) .*mean"):
        _fit(quick_decay(**{which: per_sample}), _plain(), toy_val(), Net())


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"outer_betas": (0.9,)}, r"betas must be two numbers in \[0, 1\)"),
        ({"outer_betas": (1.0, 0.999)}, r"betas must be two numbers"),
        ({"outer_lr": 0}, r"outer_lr=0.*lr must be > 0"),
        ({"row_scale": "yes"}, r"row_scale must be True, False or 'batch'"),
        ({"initial": 2.0}, r"initial weight in \(0, 1\)"),
    ],
)
def test_the_data_weights_outer_settings_are_refused_at_construction(settings, match):
    """Refused only at the fit's first hyper step or build before (``outer_betas=(0.9,)`` as a
    raw "not enough values to unpack" from inside the fit; β₁ = 1 not at all: LazyAdam's bias
    correction divides by 1 − β₁ᵗ = 0)."""
    with pytest.raises(ConfigurationError, match=match):
        LearnedDataWeights(**settings)


class Listed(Net):
    """A training_step for a list of training loaders (Lightning hands it one batch of each)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        losses = [F.cross_entropy(self(x), y) for x, y in batch]
        return sum(losses) / len(losses)  # type: ignore[return-value]


@pytest.mark.parametrize("loaders", [1, 2])
def test_training_loaders_given_as_a_list_are_refused(loaders):
    """``trainer.fit(model, [train_loader, ...], val)``: Lightning hands ``training_step`` a list
    of batches, the hyper steps handed it one loader's batch: "too many values to unpack" from
    inside the user's code (or, with one loader's step written for it, λ tuned on that loader
    alone). Refused at fit start now, naming the fix."""
    with pytest.raises(ConfigurationError, match=rf"a list of {loaders}, .*Pass one DataLoader"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer([quick_decay()], max_epochs=1).fit(Listed(), [_plain()] * loaders, toy_val())


class NoBatchIdx(Net):
    """``training_step(self, batch)``: Lightning lets ``batch_idx`` be left out."""

    def training_step(self, batch: Any) -> Tensor:  # type: ignore[override]
        return F.cross_entropy(self(batch[0]), batch[1], reduction=self.reduction)


def test_a_training_step_without_batch_idx_works_with_both_drop_ins():
    """Lightning passes the batch alone to a ``training_step(self, batch)``; the drop-ins' own
    calls (the weighted wrapper, the decay's ℓ̂ and E) passed ``batch_idx`` too: "takes 2
    positional arguments but 3 were given" from inside the user's code, in both drop-ins."""
    weights, reference = quick_weights(), quick_weights()
    _fit(weights, _indexed(), toy_val(), NoBatchIdx("none"))
    _fit(reference, _indexed(), toy_val(), Net("none"))
    torch.testing.assert_close(weights.data_weights(), reference.data_weights())
    decay, plain = quick_decay(), quick_decay()
    _fit(decay, _plain(), toy_val(), NoBatchIdx())
    _fit(plain, _plain(), toy_val(), Net())
    assert decay.decay_values().keys() == plain.decay_values().keys()
    for name, lam in plain.decay_values().items():
        torch.testing.assert_close(decay.decay_values()[name], lam)
