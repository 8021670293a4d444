"""Careless users, session 63: session 62's three leftovers (optimizers re-created mid-fit with
a malformed ``configure_optimizers``, a layer replaced by a frozen one, a user's float16 Adam),
then round 18's new inputs.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Careless inputs (session 63)".
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import (
    QUICK,
    TOY_X,
    TOY_Y,
    Ridge,
    ToyClassifier,
    loaders,
    ridge_data,
    toy_indexed_train,
    toy_train,
    toy_val,
    trainer,
)
from problems import make_ridge
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    DivergenceError,
    HyperOptimizationCallback,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core import LazyAdam

X, Y = TOY_X, TOY_Y


def _quiet_fit(tr: pl.Trainer, model: pl.LightningModule, *data: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.fit(model, *data)


# ------------------------------------------------------------------ leftover 1
class _RestartedBadly(ToyClassifier):
    """configure_optimizers well formed at the fit's start, without its optimizer when a
    callback re-creates the optimizers at epoch 1 (a warm restart)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.calls = 0

    def configure_optimizers(self) -> Any:
        self.calls += 1
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.calls == 1:
            return opt
        return {"lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}


class _Restart(pl.Callback):
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            trainer.strategy.setup_optimizers(trainer)


@pytest.mark.parametrize(
    "make, loader, reduction",
    [(LearnedWeightDecay, toy_train, "mean"), (LearnedDataWeights, toy_indexed_train, "none")],
    ids=["decay", "data_weights"],
)
def test_optimizers_re_created_mid_fit_are_checked_too(make, loader, reduction) -> None:
    """The configure_optimizers check saw the fit's first call only (its wrapper removed itself
    there): optimizers re-created at epoch 1 (trainer.strategy.setup_optimizers) from a dict
    without 'optimizer' failed with Lightning's bare KeyError: 'optimizer' (session 62's
    leftover). The check now stays until the fit's teardown, and is then removed."""
    model = _RestartedBadly(reduction)
    with pytest.raises(ConfigurationError, match=rf"^{make.__name__}: configure_optimizers"):
        _quiet_fit(trainer([make(**QUICK), _Restart()], max_epochs=2), model, loader(), toy_val())
    assert model.calls == 2
    assert "configure_optimizers" not in model.__dict__


def test_control_a_well_formed_restart_runs_and_leaves_no_wrapper() -> None:
    class Restarted(ToyClassifier):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model, cb = Restarted(), LearnedWeightDecay(**QUICK)
    _quiet_fit(trainer([cb, _Restart()], max_epochs=2), model, toy_train(), toy_val())
    assert "configure_optimizers" not in model.__dict__
    assert len(cb.learned_weight_decay) == 2


# ------------------------------------------------------------------ leftover 2
class _SwappedForFrozen(ToyClassifier):
    """Its last layer replaced at epoch 1 by a frozen one (a pretrained head, say)."""

    def __init__(self, reduction: str = "mean", frozen: bool = True) -> None:
        super().__init__(reduction)
        self.frozen = frozen

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            head = torch.nn.Linear(16, 3)
            head.requires_grad_(not self.frozen)
            self.net[2] = head


@pytest.mark.parametrize(
    "make, loader, reduction",
    [(LearnedWeightDecay, toy_train, "mean"), (LearnedDataWeights, toy_indexed_train, "none")],
    ids=["decay", "data_weights"],
)
def test_a_layer_replaced_by_a_frozen_one_is_named(make, loader, reduction) -> None:
    """self.net[2] = a frozen nn.Linear at epoch 1: the replaced-layer check (session 62) needed
    a trainable tensor no optimizer held, so under the decay the fit went on and drove net.2's
    λ (a layer no longer used) to 2e-8, blamed on the validation loss; under the data weights
    the cross term failed with a bare KeyError of a tensor's id. Now named, by the names the
    tensors had when the fit started."""
    with pytest.raises(ConfigurationError, match=r"net\.2\.weight, net\.2\.bias, .*frozen"):
        _quiet_fit(
            trainer([make(**QUICK)], max_epochs=3),
            _SwappedForFrozen(reduction),
            loader(),
            toy_val(),
        )


def test_a_layer_replaced_by_a_trainable_one_under_the_data_weights_is_named() -> None:
    """The same with a trainable head, under the data weights: the bare KeyError too."""
    with pytest.raises(ConfigurationError, match=r"replaced during the fit"):
        _quiet_fit(
            trainer([LearnedDataWeights(**QUICK)], max_epochs=3),
            _SwappedForFrozen("none", frozen=False),
            toy_indexed_train(),
            toy_val(),
        )


def test_control_a_trained_tensor_outside_the_module_is_not_named() -> None:
    """A plain tensor (no Parameter) trained beside the module's is no layer replaced."""

    class Temperature(ToyClassifier):
        def __init__(self) -> None:
            super().__init__()
            self.t = torch.ones(1, requires_grad=True)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(batch[0]) * self.t, batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD([*self.parameters(), self.t], lr=0.1)

    cb = LearnedWeightDecay(**QUICK)
    _quiet_fit(trainer([cb], max_epochs=2), Temperature(), toy_train(), toy_val())
    assert len(cb.learned_weight_decay) == 3


# ------------------------------------------------------------------ leftover 3
def test_a_users_float16_adam_is_refused_whatever_its_eps() -> None:
    """outer_optimizer=partial(Adam, lr=0.1, eps=1e-4) over float16 data weights
    (precision="16-true"): torch's Adam squares the hypergradients in float16, where below
    2.4e-4 they are 0, so its steps were lr·g/eps: the weights came out 0.44 off float32's
    (correlation 0.85), silently (session 62's leftover; eps=1e-8 was refused)."""
    opt = functools.partial(torch.optim.Adam, lr=0.1, eps=1e-4)
    cb = LearnedDataWeights(outer_optimizer=opt, **QUICK)
    with pytest.raises(ConfigurationError, match=r"Adam \(eps=0.0001.*float16.*LazyAdam"):
        _quiet_fit(
            trainer([cb], max_epochs=1, precision="16-true"),
            ToyClassifier("none"),
            toy_indexed_train(),
            toy_val(),
        )


def test_control_a_users_lazy_adam_over_float16_is_taken() -> None:
    from hypertorch_sid.core.validation import check_outer_optimizer

    half = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    check_outer_optimizer(LazyAdam([half], lr=0.1), [], [half])
    bf16 = torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)
    check_outer_optimizer(torch.optim.Adam([bf16], lr=0.1), [], [bf16])  # float32's range


def _ridge_lambda(**settings: Any) -> torch.Tensor:
    cb = HyperOptimizationCallback(
        every_n_steps=2, adjoint_steps=5, max_overhead=None, start_step=0
    )
    model = Ridge()
    _quiet_fit(trainer([cb], max_epochs=30, **settings), model, *loaders(ridge_data(), 20))
    return model.log_lam.detach().float().exp()


def test_the_callbacks_default_over_float16_lambda_learns_float32s() -> None:
    """HyperOptimizationCallback's own outer Adam over a float16 λ (the ridge BilevelModule
    under precision="16-true"): one λ of five came out 0.028 where float32 learns 0.057 (its
    hypergradient squared to 0 in float16). The default is now LazyAdam there (Adam, in
    float32 whatever λ's dtype): within 3 % of float32's."""
    full, half = _ridge_lambda(), _ridge_lambda(precision="16-true")
    assert torch.allclose(half, full, rtol=0.03)


def test_lazy_adam_takes_a_scalar_and_steps_as_adam() -> None:
    """The default above meets scalar λ: LazyAdam failed on a 0-dim tensor (IndexError)."""
    p = torch.zeros((), dtype=torch.float16, requires_grad=True)
    q = torch.zeros((), requires_grad=True)
    lazy, adam = LazyAdam([p], lr=0.01), torch.optim.Adam([q], lr=0.01)
    for t in range(30):
        g = 1e-3 if t < 5 else 1e-4
        p.grad, q.grad = torch.tensor(g, dtype=torch.float16), torch.tensor(g)
        lazy.step()
        adam.step()
    assert p.shape == () and math.isclose(p.item(), q.item(), rel_tol=5e-3)


def test_bfloat16_lambda_coarser_than_the_outer_step_is_said() -> None:
    """precision="bf16-true" casts the ridge's log λ (−2.3) to bfloat16, whose spacing there
    (0.0156) is above the outer lr 0.01: every step was rounded, and λ ended near 0.08 where
    float32 learns 0.06, silently. Said when the outer optimizer is taken."""
    from hypertorch_sid.core.validation import check_outer_optimizer

    lam = torch.full((5,), -2.3, dtype=torch.bfloat16, requires_grad=True)
    with pytest.warns(UserWarning, match=r"bfloat16.*spacing of 0\.0156.*lr=0\.01.*bf16-mixed"):
        check_outer_optimizer(torch.optim.Adam([lam], lr=0.01), [], [lam])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_outer_optimizer(torch.optim.Adam([lam], lr=0.1), [], [lam])  # control


# ------------------------------------------------------------------ round 18's new inputs
class _BiasFree(ToyClassifier):
    """The toy without biases (Muon takes matrices only), trained by ``make(params)``."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 3, bias=False)
        )

    def configure_optimizers(self) -> Any:
        return self.make(self.parameters())


def test_an_optimizers_own_default_decay_is_named_by_its_class() -> None:
    """torch.optim.Muon(params, lr=0.02) under LearnedWeightDecay: refused (Muon decays by 0.1
    unless told), but the text said "pass weight_decay=0 — AdamW's default is 0.01", another
    optimizer's default. Now the class's own."""
    model = _BiasFree(lambda ps: torch.optim.Muon(ps, lr=0.02))
    with pytest.raises(ConfigurationError, match=r"Muon .*weight_decay=0 — Muon's default is 0\.1"):
        _quiet_fit(
            trainer([LearnedWeightDecay(**QUICK)], max_epochs=1), model, toy_train(), toy_val()
        )
    model = _BiasFree(lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=1e-3))
    with pytest.raises(ConfigurationError, match=r"pass weight_decay=0\); the callback"):
        _quiet_fit(
            trainer([LearnedWeightDecay(**QUICK)], max_epochs=1), model, toy_train(), toy_val()
        )


def test_a_nan_in_the_validation_batch_is_named_as_the_data() -> None:
    """A NaN feature in one validation row: every hyper step reading it failed with "check the
    validation data for NaN/Inf and that w has not diverged", two causes where the batch
    itself showed which. Now the batch's tensor and its count of rows, w said finite."""
    p = make_ridge()
    X_val = p.X_val.clone()
    X_val[3, 1] = float("nan")
    hopt = SIDHyperOptimizer(
        [p.log_lam], [p.w], p.inner_loss, p.outer_loss, torch.optim.Adam([p.log_lam], lr=0.1),
        config=SIDConfig(inner_steps=5, adjoint_steps=5),
    )  # fmt: skip
    with pytest.raises(
        DivergenceError, match=r"validation batch .*NaN/Inf \(its tensor 0, in 1 of"
    ):
        hopt.hypergradient(p.loader(20), (X_val, p.y_val))


# ------------------------------------------------------------------ per-class targets
_PER_CLASS = dict(per="class", num_classes=3, **QUICK)


def test_a_per_class_target_of_another_length_is_named_as_the_target() -> None:
    """target=lambda batch: batch[1][:4] (a slice left in) under per="class": refused as the
    losses' fault, "16 per-sample losses for a batch of 4 indexed samples … 4 views of each
    sample concatenated (torch.cat([x1, x2]))?", a cause the user's losses did not have."""
    cb = LearnedDataWeights(target=lambda batch: batch[1][:4], **_PER_CLASS)
    with pytest.raises(
        ConfigurationError, match=r"target gave 4 class ids for a training batch of 16 rows"
    ):
        _quiet_fit(
            trainer([cb], max_epochs=1), ToyClassifier("none"), toy_indexed_train(), toy_val()
        )


def test_a_per_class_target_giving_the_inputs_is_not_read_as_soft_labels() -> None:
    """target=lambda batch: batch[0] (the inputs) was said to be "one-hot or soft labels?" with
    the fix batch[1].argmax(1), which on inputs of ≥ num_classes features gives class ids
    that are no labels. Rows that are no distributions are now said to be no labels."""
    cb = LearnedDataWeights(target=lambda batch: batch[0], **_PER_CLASS)
    with pytest.raises(
        ConfigurationError, match=r"\(16, 6\) \(no labels: .*the inputs\?\).*e\.g\. batch\[1\]\.$"
    ):
        _quiet_fit(
            trainer([cb], max_epochs=1), ToyClassifier("none"), toy_indexed_train(), toy_val()
        )
    cb = LearnedDataWeights(target=lambda b: torch.nn.functional.one_hot(b[1], 3), **_PER_CLASS)
    with pytest.raises(
        ConfigurationError, match=r"one-hot or soft labels\?.*argmax\(1\)"
    ):  # control
        _quiet_fit(
            trainer([cb], max_epochs=1), ToyClassifier("none"), toy_indexed_train(), toy_val()
        )


# ------------------------------------------------------------------ a BilevelModule's inner_loss
def test_an_inner_loss_without_lambda_is_named_as_the_inner_loss() -> None:
    """A Ridge BilevelModule whose inner_loss forgot the penalty (the default training_step):
    refused as "training_step does not read any hyperparameter (log_lam), while the
    hypergradient differentiates inner_loss, which reads them … Make training_step return
    self.inner_loss(batch)", which it already did: inner_loss was the one without λ."""

    class Unpenalised(Ridge):
        def inner_loss(self, batch: Any) -> torch.Tensor:
            return self._fit(batch)

    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5, max_overhead=None)
    with pytest.raises(
        ConfigurationError, match=r"Unpenalised\.inner_loss does not read any .*log_lam\.exp\(\)"
    ):
        _quiet_fit(trainer([cb], max_epochs=1), Unpenalised(), *loaders(ridge_data(), 20))


# ------------------------------------------------------------------ losses out of the rows' order
class _GroupedByClass(ToyClassifier):
    """Per-sample losses returned grouped by class: every shape check passes."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        losses = torch.nn.functional.cross_entropy(self(x), y, reduction="none")
        return torch.cat([losses[y == c] for c in range(3)])


class _Mixup(ToyClassifier):
    """Mixup inside training_step (torch's randperm, a fixed mix): rows coupled, in order."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        partner = torch.randperm(len(x))
        logits = self(0.7 * x + 0.3 * x[partner])
        ce = torch.nn.functional.cross_entropy
        return 0.7 * ce(logits, y, reduction="none") + 0.3 * ce(
            logits, y[partner], reduction="none"
        )


def test_losses_grouped_by_class_are_said_not_to_follow_the_rows() -> None:
    """training_step returning torch.cat([l[y == c] for c in range(3)]): one loss per row, in
    another order, so each weight multiplied another example's loss: the weights of 3 epochs
    came out uncorrelated with the right ones (correlation −0.02, largest difference 0.90),
    silently."""
    with pytest.warns(UserWarning, match=r"losses do not follow the batch's rows: with row 0"):
        trainer([LearnedDataWeights(**QUICK)], max_epochs=1).fit(
            _GroupedByClass("none"), toy_indexed_train(), toy_val()
        )


@pytest.mark.parametrize("model", [ToyClassifier, _Mixup], ids=["plain", "mixup"])
def test_control_losses_in_the_rows_order_are_not_said(model) -> None:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer([LearnedDataWeights(**QUICK)], max_epochs=1).fit(
            model("none"), toy_indexed_train(), toy_val()
        )
    assert not any("follow the batch's rows" in str(w.message) for w in said)


# ------------------------------------------------------------------ validation data on another scale
@pytest.mark.parametrize(
    "make, loader, reduction",
    [(LearnedWeightDecay, toy_train, "mean"), (LearnedDataWeights, toy_indexed_train, "none")],
    ids=["decay", "data_weights"],
)
def test_validation_inputs_on_another_scale_are_said(make, loader, reduction) -> None:
    """The training inputs preprocessed, the validation ones left raw (×255): the hyper steps
    tuned for inputs the training never sees (the data weights 0.85 off those of the same fit
    with its validation inputs preprocessed, correlation 0.70), silently."""
    raw = DataLoader(TensorDataset(X[:60] * 255, Y[:60]), batch_size=20)
    with pytest.warns(UserWarning, match=r"tensor 0 of the validation data is on another scale"):
        trainer([make(**QUICK)], max_epochs=1).fit(ToyClassifier(reduction), loader(), raw)


def test_control_validation_data_of_the_training_scale_is_not_said() -> None:
    """Another split of the same distribution, and a validation set standardised apart (a
    shift within 10×), are not said."""
    g = torch.Generator().manual_seed(1)
    other = DataLoader(
        TensorDataset(torch.randn(60, 6, generator=g) * 3 + 2, Y[:60]), batch_size=20
    )
    for val in (toy_val(), other):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer([LearnedWeightDecay(**QUICK)], max_epochs=1).fit(
                ToyClassifier(), toy_train(), val
            )
        assert not any("on another scale" in str(w.message) for w in said)


# ------------------------------------------------------------------ weights edited between steps
class _Clamped(ToyClassifier):
    """WGAN-style weight clipping of the first layer after every batch."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():
            self.net[0].weight.clamp_(-0.2, 0.2)


@pytest.mark.parametrize(
    "make, loader, reduction",
    [(LearnedWeightDecay, toy_train, "mean"), (LearnedDataWeights, toy_indexed_train, "none")],
    ids=["decay", "data_weights"],
)
def test_weights_edited_between_optimizer_steps_are_said(make, loader, reduction) -> None:
    """self.net[0].weight.clamp_(-0.2, 0.2) in on_train_batch_end: the training is a projected
    one, while the hyper steps model the optimizer's steps alone, and nothing was said."""
    with pytest.warns(UserWarning, match=r"net\.0\.weight changed between optimizer steps 0 and 1"):
        trainer([make(**QUICK)], max_epochs=1).fit(_Clamped(reduction), loader(), toy_val())


def test_control_an_ema_swapping_weights_for_validation_is_not_said() -> None:
    """Lightning's EMAWeightAveraging swaps the average in for each validation and puts the
    weights back: their norms are back bit for bit."""
    from pytorch_lightning.callbacks import EMAWeightAveraging

    class Validated(ToyClassifier):
        def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer(
            [LearnedWeightDecay(**QUICK), EMAWeightAveraging()], max_epochs=2, val_check_interval=3
        ).fit(Validated(), toy_train(), toy_val())
    assert not any("outside the optimizer" in str(w.message) for w in said)
