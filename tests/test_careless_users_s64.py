"""Careless users, session 64: session 63's three leftovers (a gradient clip that binds late in a
learned decay's fit, a Normalize left out of one set, weights edited after a manual step), then
round 19's new inputs.

Each case failed before its fix (silently wrong, or a misleading or unhelpful message); the
controls passed before and after. See docs/failures.md, "Careless inputs (session 64)".
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import (
    QUICK,
    TOY_X,
    TOY_Y,
    ToyClassifier,
    toy_indexed_train,
    toy_train,
    toy_val,
    trainer,
)
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
)

X, Y = TOY_X, TOY_Y


def _said(fit: Any, text: str) -> list[str]:
    """The warnings of ``fit()`` that hold ``text``."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit()
    return [str(w.message) for w in said if text in str(w.message)]


# ------------------------------------------------------------------ leftover (a): a binding clip
def test_a_gradient_clip_that_binds_late_under_the_decay_is_said() -> None:
    """Trainer(gradient_clip_val=0.01) against gradients of norm about 0.7: the decay is added
    after the clip, so the training settles where c·∇ℓ + λw = 0 while the hyper steps model
    ∇ℓ + λw = 0. Silent before (a ridge fit of 1,600 steps under a clip of 0.1: λ driven to its
    floor, the validation loss 13 % above the best fixed decay under the same clip)."""
    decay = LearnedWeightDecay(every_n_steps=2, start_step=0, max_overhead=None)
    with pytest.warns(UserWarning, match=r"gradient_clip_val=0\.01\) clipped the gradient at each"):
        trainer([decay], max_epochs=2, gradient_clip_val=0.01).fit(
            ToyClassifier(), toy_train(), toy_val()
        )


@pytest.mark.parametrize("make, loader, reduction, clip", [
    (LearnedWeightDecay, toy_train, "mean", 5.0),
    (LearnedDataWeights, toy_indexed_train, "none", 0.01),
], ids=["decay_loose_clip", "data_weights_tight_clip"])  # fmt: skip
def test_control_a_clip_that_does_not_move_the_fixed_point_is_not_said(
    make, loader, reduction, clip
) -> None:
    """A clip above the gradients' norm, and the data weights under any clip (the clip scales
    the whole weighted gradient: its fixed point stays), are not said."""
    cb = make(every_n_steps=2, start_step=0, max_overhead=None)
    fit = lambda: trainer([cb], max_epochs=2, gradient_clip_val=clip).fit(  # noqa: E731
        ToyClassifier(reduction), loader(), toy_val()
    )
    assert not _said(fit, "clipped the gradient")


class _AdamW(ToyClassifier):
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0)


class _Adam(ToyClassifier):
    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


@pytest.mark.parametrize("model, decoupled, said", [
    (_AdamW, True, False), (_Adam, False, True),
], ids=["adamw_decoupled", "adam_coupled"])  # fmt: skip
def test_a_binding_clip_under_adam_is_said_where_it_moves_the_fixed_point(
    model, decoupled, said
) -> None:
    """AdamW's decoupled decay: its fixed point P⁻¹∇ℓ + λw = 0 has P = √v̂ + ε, which scales with
    the clip's factor c, so c cancels and the clip is not said; Adam's coupled decay enters
    Adam's input after the clip (c·∇ℓ + λw = 0): said."""
    decay = LearnedWeightDecay(
        decoupled=decoupled, every_n_steps=2, start_step=0, max_overhead=None
    )
    fit = lambda: trainer([decay], max_epochs=2, gradient_clip_val=0.01).fit(  # noqa: E731
        model(), toy_train(), toy_val()
    )
    assert bool(_said(fit, "clipped the gradient")) is said


# ------------------------------------------------------------------ leftover (c): manual steps
class _Manual(ToyClassifier):
    """Manual optimisation, one optimizer or one per layer; the first layer clamped after its
    step (a WGAN critic's weight clipping) where ``clamp``."""

    def __init__(self, clamp: bool, two: bool) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.clamp, self.two = clamp, two

    def configure_optimizers(self) -> Any:
        if self.two:
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[2].parameters(), lr=0.1),
            ]
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        for opt in opts:
            opt.zero_grad()
            loss = F.cross_entropy(self(batch[0]), batch[1])
            self.manual_backward(loss)
            opt.step()
            if self.clamp and opt is opts[0]:
                with torch.no_grad():
                    self.net[0].weight.clamp_(-0.2, 0.2)
        return loss


def _manual_decay() -> LearnedWeightDecay:
    return LearnedWeightDecay(**QUICK, training_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]))


@pytest.mark.parametrize("two", [False, True], ids=["one_optimizer", "two_optimizers"])
def test_weights_edited_after_a_manual_step_are_said(two) -> None:
    """clamp_ after the optimizer's step in a manual training_step: the session-63 watch covered
    automatic optimisation with one optimizer only, so this was silent."""
    with pytest.warns(UserWarning, match=r"net\.0\.weight changed between optimizer steps 0 and"):
        trainer([_manual_decay()], max_epochs=2).fit(_Manual(True, two), toy_train(), toy_val())


def test_control_manual_steps_that_edit_nothing_are_not_said() -> None:
    """Two optimizers stepping in turn (each one's tensors still between its own steps, while
    the other steps) are not said."""
    fit = lambda: trainer([_manual_decay()], max_epochs=2).fit(  # noqa: E731
        _Manual(False, True), toy_train(), toy_val()
    )
    assert not _said(fit, "outside the optimizer")


# ------------------------------------------------------------------ leftover (b): Normalize
_G = torch.Generator().manual_seed(0)
PIXELS = torch.rand(240, 6, generator=_G) ** 3  # intensities in [0, 1], most near 0
MU, SD = PIXELS[60:].mean(), PIXELS[60:].std()


def _pixels(normalised: bool, rows: slice, indexed: bool = False) -> TensorDataset:
    x = (PIXELS[rows] - MU) / SD if normalised else PIXELS[rows]
    data = TensorDataset(x, Y[rows])
    return IndexedDataset(data) if indexed else data  # type: ignore[return-value]


@pytest.mark.parametrize("make, reduction, indexed", [
    (LearnedWeightDecay, "mean", False), (LearnedDataWeights, "none", True),
], ids=["decay", "data_weights"])  # fmt: skip
def test_validation_inputs_left_unnormalised_are_said(make, reduction, indexed) -> None:
    """Training inputs standardised (a Normalize transform), validation inputs left raw: 3×
    apart, within the session-63 check's 10×, so silent; on MNIST the data weights came out
    correlated 0.68-0.79 with those of the fit whose validation inputs were normalised too."""
    train = DataLoader(_pixels(True, slice(60, None), indexed), batch_size=16)
    val = DataLoader(_pixels(False, slice(0, 60)), batch_size=20)
    with pytest.warns(UserWarning, match=r"tensor 0 of the validation data has no negative value"):
        trainer([make(**QUICK)], max_epochs=1).fit(ToyClassifier(reduction), train, val)


@pytest.mark.parametrize("normalised", [True, False], ids=["both_normalised", "both_raw"])
def test_control_sets_preprocessed_alike_are_not_said(normalised) -> None:
    train = DataLoader(_pixels(normalised, slice(60, None)), batch_size=16)
    val = DataLoader(_pixels(normalised, slice(0, 60)), batch_size=20)
    fit = lambda: trainer([LearnedWeightDecay(**QUICK)], max_epochs=1).fit(  # noqa: E731
        ToyClassifier(), train, val
    )
    assert not _said(fit, "another scale") and not _said(fit, "no negative value")


# ------------------------------------------------------------------ (B,) against (B, 1)
class _Regressor(pl.LightningModule):
    """Per-sample squared errors; ``broadcast``: the (B,) prediction against (B, 1) targets."""

    def __init__(self, broadcast: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 1)
        self.broadcast = broadcast

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        target = y if self.broadcast else y.squeeze(-1)
        return (self.lin(x).squeeze(-1) - target) ** 2

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _regression_fit(broadcast: bool) -> None:
    y = (X @ torch.ones(6)).unsqueeze(1)
    train = DataLoader(IndexedDataset(TensorDataset(X[60:], y[60:])), batch_size=16)
    val = DataLoader(TensorDataset(X[:60], y[:60]), batch_size=20)
    cb = LearnedDataWeights(**QUICK, objective="mean_loss")
    trainer([cb], max_epochs=1).fit(_Regressor(broadcast), train, val)


def test_losses_broadcast_against_a_target_column_are_said() -> None:
    """(pred.squeeze(-1) - y) ** 2 with y of shape (B, 1): (B, B) "per-sample" losses, read as
    B labels per row, each row's loss mixing every target of its batch; silent before (40
    outlying targets kept weights 0.34 against 0.09 with the shapes matched)."""
    with pytest.warns(UserWarning, match=r"shape \(16, 16\) for a batch of 16 rows: a prediction"):
        _regression_fit(broadcast=True)


def test_control_losses_of_matched_shapes_are_not_said() -> None:
    assert not _said(lambda: _regression_fit(broadcast=False), "broadcast")


# ------------------------------------------------------------------ one-hot training targets
def _one_hot_fit(**kwargs: Any) -> LearnedDataWeights:
    oh = F.one_hot(Y, 3).float()
    cb = LearnedDataWeights(**QUICK, **kwargs)
    train = DataLoader(IndexedDataset(TensorDataset(X[60:], oh[60:])), batch_size=16)
    trainer([cb], max_epochs=1).fit(ToyClassifier("none"), train, toy_val())
    return cb


def test_one_hot_training_targets_are_said_with_the_target_to_pass() -> None:
    """Per sample, one-hot targets (a loss that takes them) were read as no labels without a
    word: the class gauge off (the weights correlated 0.75 with the integer labels' fit), and
    flagged() said "the examples carry no class labels (a regression?)"."""
    with pytest.warns(
        UserWarning, match=r"as one-hot rows \(shape \(16, 3\)\).*batch\[1\]\.argmax"
    ):
        _one_hot_fit()


def test_control_one_hot_targets_with_the_fix_learn_the_integer_labels_weights() -> None:
    """With target=lambda batch: batch[1].argmax(1) nothing is said, and the weights are those
    of the same fit over integer labels."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fixed = _one_hot_fit(target=lambda batch: batch[1].argmax(1))
    assert not any("one-hot rows" in str(w.message) for w in said)
    labelled = LearnedDataWeights(**QUICK)
    trainer([labelled], max_epochs=1).fit(ToyClassifier("none"), toy_indexed_train(), toy_val())
    assert torch.allclose(fixed.data_weights(), labelled.data_weights(), atol=1e-6)


# ------------------------------------------------------------------ a score as validation_loss
@pytest.mark.parametrize("score", [
    lambda m, b: -F.cross_entropy(m(b[0]), b[1]),
    lambda m, b: m(b[0]).softmax(1).gather(1, b[1][:, None]).mean(),
], ids=["negated_loss", "soft_accuracy"])  # fmt: skip
def test_a_validation_loss_that_is_a_score_is_said(score) -> None:
    """validation_loss returning a score to maximise: the hyper steps minimised it, and λ rose
    from 1e-4 to 0.11 in 6 hyper steps on the toy, silently."""
    decay = LearnedWeightDecay(**QUICK, validation_loss=score)
    with pytest.warns(UserWarning, match=r"validation_loss rises where the training loss falls"):
        trainer([decay], max_epochs=1).fit(ToyClassifier(), toy_train(), toy_val())


@pytest.mark.parametrize("loss", [
    lambda m, b: ((m(b[0]).softmax(1) - F.one_hot(b[1], 3)) ** 2).sum(1).mean(),
    lambda m, b: F.cross_entropy(m(b[0]), b[1], label_smoothing=0.2),
], ids=["brier", "label_smoothing"])  # fmt: skip
def test_control_other_validation_losses_are_not_said(loss) -> None:
    decay = LearnedWeightDecay(**QUICK, validation_loss=loss)
    fit = lambda: trainer([decay], max_epochs=1).fit(ToyClassifier(), toy_train(), toy_val())  # noqa: E731
    assert not _said(fit, "validation_loss rises")


# ------------------------------------------------------------------ NumPy arrays as numbers
@pytest.mark.parametrize("setting, value, fix", [
    ("adjoint_steps", np.array(5), r"pass adjoint_steps=a\.item\(\) = 5"),
    ("eta", np.array([0.5]), r"pass eta=a\.item\(\) = 0\.5"),
], ids=["0d_integer", "1_element_float"])  # fmt: skip
def test_a_numpy_array_where_a_number_is_meant_is_named_with_item(setting, value, fix) -> None:
    """A 0-d array (np.load of a saved setting, an .npz entry) was refused with no fix: "must be
    an integer ≥ 1, got array(5).", as if 5 were refused."""
    with pytest.raises(ConfigurationError, match=rf"a NumPy array, where a number is meant: {fix}"):
        SIDConfig(**{setting: value})


def test_control_validation_batches_the_training_step_cannot_read_are_not_compared() -> None:
    """Validation batches of another structure (dicts: the reason for validation_loss=): the
    comparison with the training loss is skipped, and the fit runs."""

    class Dicts(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 60

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": X[i], "y": Y[i]}

    decay = LearnedWeightDecay(
        **QUICK, validation_loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"])
    )
    fit = lambda: trainer([decay], max_epochs=1).fit(  # noqa: E731
        ToyClassifier(), toy_train(), DataLoader(Dicts(), batch_size=20)
    )
    assert not _said(fit, "validation_loss rises")
    assert len(decay.learned_weight_decay) == 2
