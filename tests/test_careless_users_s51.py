"""A careless user's inputs that gave silent wrong answers or unclear failures (session 51; the
table of every recipe tried and its outcome is in docs/failures.md, "Careless users (session
51)"). Each test fails without its fix.
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
    TOY_C,
    TOY_D,
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
    LearnedWeightDecay,
)
from hypertorch_sid.core.outer_step import ShrinkFallRprop

X, Y, D, C = TOY_X, TOY_Y, TOY_D, TOY_C


def _fit(cb: Any, train: Any, val: Any, model: Any, **kw: Any) -> list[str]:
    """Fit (one epoch unless said); the warnings' messages."""
    kw.setdefault("max_epochs", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(cb if isinstance(cb, list) else [cb], **kw).fit(model, train, val)
    return [str(w.message) for w in caught]


# ---------------------------------------------------------------- session 50's leftovers
@pytest.mark.parametrize("drop_in", [LearnedWeightDecay, LearnedDataWeights])
def test_the_class_given_for_a_callback_is_named_with_the_fix(drop_in):
    """``callbacks=[LearnedWeightDecay]`` (the class): Lightning calls the class's hooks
    unbound, and the fit failed with "on_exception() missing 1 required positional argument:
    'exception'". Refused at the first hook now, naming the class and ``LearnedWeightDecay()``."""
    reduction = "none" if drop_in is LearnedDataWeights else "mean"
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    name = drop_in.__name__
    with pytest.raises(
        ConfigurationError, match=rf"callbacks=\[{name}\].*callbacks=\[{name}\(\)\]"
    ):
        _fit(drop_in, train, toy_val(), ToyClassifier(reduction))


class MaskedNet(ToyClassifier):
    """Per-sample losses times the sample's mask (``(x, y, mask)`` samples); sharp logits (×100)
    from optimizer step 25 on, which fit most rows to a loss exactly 0."""

    def __init__(self) -> None:
        super().__init__("none")

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y, *mask = batch
        scale = 100.0 if self.global_step >= 25 else 1.0
        losses = F.cross_entropy(scale * self(x), y, reduction="none")
        return losses * mask[0] if mask else losses


def test_masked_rows_are_not_hidden_behind_rows_fitted_to_0():
    """Rows 200–239 masked (loss × 0); the loader reads rows 0–199 twice first, the second time
    with sharp logits that fit them to a loss exactly 0. At the epoch's end the first 16 rows
    of loss 0 were re-read (0–15: fitted, not 0 with the weights shrunk) and the masked rows
    left unsaid until a later epoch's end. Rows whose loss was ever other than 0 are no
    candidates now: the masked ones are re-read and said at once."""
    mask = torch.ones(len(Y))
    mask[200:] = 0
    order = list(range(200)) * 2 + list(range(200, 240))
    train = DataLoader(IndexedDataset(TensorDataset(X, Y, mask)), batch_size=8, sampler=order)
    cb = quick_weights()
    said = [m for m in _fit(cb, train, toy_val(), MaskedNet()) if "exactly 0" in m]
    assert int((cb.problem._last_loss[:200] == 0).sum()) > 16  # fitted rows of loss 0 first
    assert len(said) == 1 and "40 training examples had a loss exactly 0 at every visit" in said[0]
    assert "rows [200, 201, 202, 203, 204]" in said[0]


class DeepNet(ToyClassifier):
    """A 4-layer ReLU MLP on the toy, SGD lr 0.05 with momentum 0.5."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        layers: list[nn.Module] = [nn.Linear(D, 32), nn.ReLU()]
        for _ in range(2):
            layers += [nn.Linear(32, 32), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(32, C))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.5)


def test_a_fit_whose_layers_the_decay_wiped_says_so():
    """``LearnedWeightDecay(1.0)`` on a 4-layer ReLU MLP at SGD lr 0.05, momentum 0.5 (1/30 of
    the stable bound 30, not warned at fit start): the decay drove every weight matrix to 0
    (its last layer by the second epoch), λ's hypergradient vanished with them, and the fit ended at
    chance (validation loss 1.093 = log 3 after 10 epochs) without a word. Said at the fit's
    end now; λ₀ = 1e-3 is not."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)
    torch.manual_seed(0)
    # the outer step of the time (ReachRprop, the default since session 60, takes λ = 1 down in
    # larger steps, before the decay wipes the layers: this fit needs the slower fall)
    slow = functools.partial(ShrinkFallRprop, lr=0.3, step_sizes=(0.01, 2.0))
    said = [
        m
        for m in _fit(
            quick_decay(1.0, outer_optimizer=slow), train, toy_val(), DeepNet(), max_epochs=2
        )
        if "wiped" in m
    ]
    assert len(said) == 1 and "weight_decay=1 at the start" in said[0]
    assert "wiped net.4.weight" in said[0]
    torch.manual_seed(0)
    assert not [
        m
        for m in _fit(quick_decay(1e-3), train, toy_val(), DeepNet(), max_epochs=2)
        if "wiped" in m
    ]


# ---------------------------------------------------------------- the data weights' data
class SkipsBatches(ToyClassifier):
    """``training_step`` returns None on every third batch of the loop (Lightning's skip)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        if self.trainer.training and batch_idx % 3 == 2:
            return None
        return super().training_step(batch, batch_idx)


def test_a_training_step_skipping_batches_by_none_runs_with_the_data_weights():
    """Lightning skips a batch whose ``training_step`` returns None; under ``LearnedDataWeights``
    the fit stopped at the first one ("per-sample weights need a tensor of per-sample losses,
    got NoneType"). The skipped batch is skipped: its rows are not recorded (the hyper steps
    draw their own batches)."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    cb = quick_weights()
    _fit(cb, train, toy_val(), SkipsBatches("none"))
    assert len(cb.history) > 0
    visits = cb.problem._visits
    assert visits is not None and int(visits[32:48].sum()) == 0  # batch 2, skipped
    assert int(visits[:32].min()) == 1


def _regression(model_seed: int = 0) -> ToyClassifier:
    class Regressor(ToyClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return F.mse_loss(self(batch[0]).squeeze(-1), batch[1], reduction="none")

    net = Regressor("none")
    torch.manual_seed(model_seed)
    net.net = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 1))
    return net


def test_weights_learned_on_another_data_set_of_the_same_size_are_not_carried_over():
    """One ``LearnedDataWeights`` fitted on data set A, then on another data set B of the same
    size (a regression, ``objective="mean_loss"``; two TensorDatasets): B's row i took the
    weight learned for A's row i, without a word (a classification was refused at the first
    relabelled row). Data sets of other content start afresh now, said; the same data set
    rebuilt over copies of its tensors keeps its weights."""
    target = X.sum(1)
    a, b = TensorDataset(X[:120], target[:120]), TensorDataset(X[120:], target[120:])
    val = DataLoader(TensorDataset(X[:60], target[:60]), batch_size=20)
    cb = quick_weights(objective="mean_loss")
    _fit(cb, DataLoader(IndexedDataset(a), batch_size=16), val, _regression(), max_epochs=2)
    said = _fit(cb, DataLoader(IndexedDataset(b), batch_size=16), val, _regression())
    assert any("other examples than the ones this callback learned" in m for m in said)
    fresh = quick_weights(objective="mean_loss")
    _fit(fresh, DataLoader(IndexedDataset(b), batch_size=16), val, _regression())
    assert torch.equal(cb.data_weights(), fresh.data_weights())

    copy = TensorDataset(X[120:].clone(), target[120:].clone())
    kept = cb.data_weights()
    said = _fit(
        cb, DataLoader(IndexedDataset(copy), batch_size=16), val, _regression(), max_epochs=0
    )
    assert not any("other examples" in m for m in said)
    assert torch.equal(cb.data_weights(), kept)


def test_validation_batches_the_training_step_cannot_read_are_named():
    """A validation loader of ``(x,)`` batches (no labels): the data weights' E failed inside
    the user's ``training_step`` with a bare "IndexError: list index out of range"
    (``LearnedWeightDecay`` named the cause since session 41). Named, with the fix."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    val = DataLoader(TensorDataset(X[:60]), batch_size=20)
    with pytest.raises(ConfigurationError, match=r"E reads .* training_step failed .*IndexError"):
        _fit(quick_weights(), train, val, ToyClassifier("none"))


def test_class_ids_stored_as_floats_are_named_with_their_fix():
    """``per="class"`` with labels 0.0 / 1.0 / 2.0: the error asked for one-hot labels' fix,
    ``batch[1].argmax(1)``, which fails on a vector. It names ``batch[1].long()`` now."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y.float())), batch_size=16)
    with pytest.raises(
        ConfigurationError, match=r"class ids stored as floats.*batch\[1\]\.long\(\)"
    ):
        _fit(quick_weights(per="class", num_classes=C), train, toy_val(), ToyClassifier("none"))


# ---------------------------------------------------------------- the core
def test_one_batch_given_where_an_iterable_of_batches_belongs_is_refused():
    """``hopt.hypergradient((X, y), val_batch)``: iterating the tuple gave X, then y, as
    batches, and a loss indexing ``batch[0]``, ``batch[1]`` read X's rows as inputs and targets
    (here: an IndexError inside the user's loss; silent where the shapes allow). Refused, with
    the fix; a list of batches and a DataLoader are taken as before."""
    from hypertorch_sid import SIDConfig, SIDHyperOptimizer

    g = torch.Generator().manual_seed(0)
    Xr, yr = torch.randn(40, 3, generator=g), torch.randn(40, generator=g)
    w = torch.zeros(3, requires_grad=True)
    log_lam = torch.zeros(3, requires_grad=True)

    def inner(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean() + 0.5 * (log_lam.exp() * w**2).sum()

    def outer(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    hopt = SIDHyperOptimizer(
        [log_lam], [w], inner, outer, config=SIDConfig(inner_steps=2, adjoint_steps=2)
    )
    for one in ((Xr, yr), [Xr, yr], Xr):
        with pytest.raises(
            ConfigurationError, match=r"train_batches must be an iterable .*\[\(X, y\)\]"
        ):
            hopt.hypergradient(one, (Xr, yr))
    assert hopt.hypergradient([(Xr, yr)], (Xr, yr))[0].shape == (3,)


# ---------------------------------------------------------------- the decay
def test_a_second_fit_checks_the_lambda_it_starts_from_against_its_learning_rate():
    """One ``LearnedWeightDecay(2.0)`` and one module, fitted at SGD lr 0.01 (λ fell to 1e-4),
    then again at lr 0.6 (a loop over learning rates): the second fit was refused because
    "the initial weight_decay=2 is above the largest decay the training optimizer can train
    with at lr=0.6", though it starts from the learned 1e-4 (and a learned λ above the new
    bound was not checked). The λ the fit starts from is checked now."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    cb, net = quick_decay(2.0), ToyClassifier(lr=0.01)
    _fit(cb, train, toy_val(), net, max_epochs=3)
    assert max(float(v.max()) for v in cb.learned_weight_decay.values()) < 1e-2
    net.lr = 0.6
    said = _fit(cb, train, toy_val(), net)
    assert not [m for m in said if "weight_decay=2" in m] and len(cb.history) > 0


class _AtEpoch1(pl.Callback):
    """At the start of epoch 1: ``"recreate"`` the optimizers
    (``trainer.strategy.setup_optimizers``: a warm restart), or ``"schedule"`` the optimizer's
    own ``weight_decay`` to 0.05 (a weight-decay schedule)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch != 1:
            return
        if self.what == "recreate":
            trainer.strategy.setup_optimizers(trainer)
        else:
            for group in trainer.optimizers[0].param_groups:
                group["weight_decay"] = 0.05


class _OwnDecay(ToyClassifier):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=0.05)


def test_optimizers_created_anew_during_the_fit_keep_the_decay():
    """A callback re-creating the optimizers at epoch 1 (``trainer.strategy.setup_optimizers``):
    the decay was added only before the old optimizer's steps, so the training went on
    undecayed, without a word (λ = 0.05 held, no hyper step: weights 0.032 off
    ``SGD(weight_decay=0.05)``'s). The decay follows the new optimizers now."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    reference = _OwnDecay()
    _fit([], train, toy_val(), reference, max_epochs=2)
    net = ToyClassifier()
    _fit(
        [quick_decay(0.05, every_n_steps=1000), _AtEpoch1("recreate")],
        train,
        toy_val(),
        net,
        max_epochs=2,
    )
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_an_optimizer_decay_switched_on_during_the_fit_is_refused():
    """A weight-decay schedule setting the optimizer's ``weight_decay`` to 0.05 at epoch 1
    decayed the tensors twice (the optimizer's and the learned λ), without a word; refused at
    fit start only. Refused where it happens now."""
    train = DataLoader(TensorDataset(X, Y), batch_size=16)
    callbacks = [quick_decay(0.05, every_n_steps=1000), _AtEpoch1("schedule")]
    with pytest.raises(ConfigurationError, match=r"group 0\) applies weight_decay=0.05 since"):
        _fit(callbacks, train, toy_val(), ToyClassifier(), max_epochs=2)


def test_a_resume_on_another_data_set_of_the_same_size_is_refused(tmp_path):
    """A regression's data-weights fit resumed (``ckpt_path=``) on another TensorDataset of the
    same size: no label tells the rows apart, so the checkpoint's weights went on with the
    other data set's rows without a word. The checkpoint keeps a digest of its training set's
    content: refused now; the same data (rebuilt over copies) resumes."""
    target = X.sum(1)
    a, b = TensorDataset(X[:120], target[:120]), TensorDataset(X[120:], target[120:])
    val = DataLoader(TensorDataset(X[:60], target[:60]), batch_size=20)
    fitted = trainer([quick_weights(objective="mean_loss")], max_epochs=1)
    fitted.fit(_regression(), DataLoader(IndexedDataset(a), batch_size=16), val)
    fitted.save_checkpoint(tmp_path / "a.ckpt")
    with pytest.raises(ConfigurationError, match="resumes weights learned on other examples"):
        trainer([quick_weights(objective="mean_loss")], max_epochs=2).fit(
            _regression(),
            DataLoader(IndexedDataset(b), batch_size=16),
            val,
            ckpt_path=tmp_path / "a.ckpt",
        )
    again = TensorDataset(X[:120].clone(), target[:120].clone())
    cb = quick_weights(objective="mean_loss")
    trainer([cb], max_epochs=2).fit(
        _regression(),
        DataLoader(IndexedDataset(again), batch_size=16),
        val,
        ckpt_path=tmp_path / "a.ckpt",
    )
    assert cb.data_weights().shape == (120,)


def test_an_outer_optimizer_that_maximizes_is_refused():
    """``HyperOptimizationCallback(outer_optimizer=partial(torch.optim.Adam, maximize=True))``
    (a training optimizer's settings copied): λ climbed the validation objective without a word
    (the ridge's log λ ended at −0.85 where plain Adam took it to −3.5). Refused, in the core
    and through the callback."""
    import functools

    from lightning_problems import Ridge, loaders, ridge_data

    from hypertorch_sid import HyperOptimizationCallback, SIDHyperOptimizer

    w, lam = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    with pytest.raises(ConfigurationError, match="maximize=True"):
        SIDHyperOptimizer(
            [lam], [w], lambda b: (lam.exp() * w**2).sum(), lambda b: w.sum(),
            torch.optim.SGD([lam], lr=0.1, maximize=True),
        )  # fmt: skip
    ascent = functools.partial(torch.optim.Adam, lr=0.1, maximize=True)
    train, val = loaders(ridge_data(), 20)
    with pytest.raises(ConfigurationError, match=r"outer_optimizer Adam has maximize=True"):
        _fit(
            HyperOptimizationCallback(every_n_steps=2, outer_optimizer=ascent), train, val, Ridge()
        )


def test_an_optimizer_decay_switched_on_under_the_data_weights_is_said():
    """``LearnedDataWeights`` models the optimizers' own decay in its hyper steps' ℓ̂ (session
    43), but only the groups with a decay at the fit's start: a weight-decay schedule switching
    it on at epoch 1 left ℓ̂ without it from then on, without a word. Said at the next hyper
    step now; optimizers created anew with their decay are not."""
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    said = _fit(
        [quick_weights(), _AtEpoch1("schedule")],
        train,
        toy_val(),
        ToyClassifier("none"),
        max_epochs=2,
    )
    assert len([m for m in said if "weight_decay=0.05 was switched on during the fit" in m]) == 1
    said = _fit(
        [quick_weights(), _AtEpoch1("recreate")], train, toy_val(), _OwnDecay("none"), max_epochs=2
    )
    assert not [m for m in said if "switched on" in m]


def test_a_skipped_hyper_step_names_the_data_weights_not_lambda():
    """A validation set with a NaN makes every hyper step diverge; under ``LearnedDataWeights``
    the warning said "λ unchanged" (the weight decay's name) for the data weights it left."""
    xv = X[:60].clone()
    xv[3, 0] = float("nan")
    val = DataLoader(TensorDataset(xv, Y[:60]), batch_size=20)
    train = DataLoader(IndexedDataset(TensorDataset(X, Y)), batch_size=16)
    cb = quick_weights(val="full")
    said = _fit(cb, train, val, ToyClassifier("none"), max_epochs=1)
    skipped = [m for m in said if "hyper step skipped" in m]
    assert skipped, said
    assert all("the data weights unchanged" in m and "λ" not in m.split(":")[1] for m in skipped)
