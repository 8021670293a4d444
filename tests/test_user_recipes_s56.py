"""Session 56's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 56)"; the recipes: benchmarks/bench_user_recipes_s56.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import three_class_sets
from pytorch_lightning.callbacks import BatchSizeFinder, LearningRateFinder, ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)


def _trainer(callbacks: list, **kw: Any) -> pl.Trainer:
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        callbacks=callbacks, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


class Net(pl.LightningModule):
    """An MLP whose learning rate (``self.lr``, LearningRateFinder's) and loaders' batch size
    (``self.batch_size``, BatchSizeFinder's) are its attributes."""

    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.per_sample, self.lr, self.batch_size = per_sample, 0.1, 16
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.train_set, self.val_set = three_class_sets()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self.net(x), y))

    def train_dataloader(self) -> DataLoader:
        data = IndexedDataset(self.train_set) if self.per_sample else self.train_set
        return DataLoader(data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=32)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=32)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _drop_in(which: str) -> LearnedWeightDecay | LearnedDataWeights:
    if which == "decay":
        return LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    return LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)


def _fit(trainer: pl.Trainer, model: Net, **kw: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, **kw)
    return [str(w.message) for w in caught]


# ------------------------------------------- a tuner callback inside the fit


@pytest.mark.parametrize("which", ["decay", "weights"])
@pytest.mark.parametrize("finder", ["lr", "batch_size"])
def test_a_tuner_callback_inside_the_fit_is_no_resume_from_a_checkpoint(
    which: str, finder: str, tmp_path
) -> None:
    """Lightning's ``LearningRateFinder`` / ``BatchSizeFinder`` callbacks run their trials from
    ``on_fit_start``, then restore a temporary checkpoint of the fit's start and remove it;
    ``trainer.ckpt_path`` keeps naming that file. Both drop-ins then warned "the checkpoint
    .../.lr_find_<uuid>.ckpt holds no state of this callback: λ continues from its current
    value with a fresh outer optimizer …", of a fit the user resumed from nothing."""
    cb = _drop_in(which)
    tuner = (
        LearningRateFinder(min_lr=1e-3, max_lr=0.5, num_training_steps=8)
        if finder == "lr"
        else BatchSizeFinder(init_val=8, max_trials=2, steps_per_trial=2)
    )
    model = Net(per_sample=which == "weights")
    said = _fit(_trainer([cb, tuner], max_epochs=3, default_root_dir=tmp_path), model)
    assert not [m for m in said if "holds no state of this callback" in m], said
    assert cb.sid is not None and cb.sid.hyper_step > 0  # the drop-in learned after the trials
    if finder == "batch_size":
        assert model.batch_size == 16  # 8 → 16 (max_trials=2): the finder ran


def test_control_a_resume_from_a_checkpoint_without_the_callbacks_state_is_still_said(
    tmp_path,
) -> None:
    """A fit resumed from a checkpoint written without the drop-in is told so, as before."""
    model = Net()
    last = ModelCheckpoint(tmp_path, save_last=True)
    _fit(_trainer([last], max_epochs=1, enable_checkpointing=True), model)
    cb = _drop_in("decay")
    said = _fit(_trainer([cb], max_epochs=2), model, ckpt_path=last.last_model_path)
    assert [m for m in said if "holds no state of this callback" in m]


# ------------------------------------------- a checkpoint loaded by trainer.test


@pytest.mark.parametrize("how", ["test", "validate"])
@pytest.mark.parametrize("which", ["decay", "weights"])
def test_read_outs_of_a_checkpoint_loaded_by_test_name_test_not_a_fit(
    which: str, how: str, tmp_path
) -> None:
    """``trainer.test(model, ckpt_path=...)`` with a new drop-in (a new script that tests the
    best checkpoint, then asks for the learned λ or the flags): Lightning gives every callback
    its state from the checkpoint there, and only a fit applies it, so the read-outs refuse.
    They said "the fit that loaded it (trainer.fit(..., ckpt_path=...)) ran no step, its
    max_epochs / max_steps being reached", a fit the user never ran; now they name the call."""
    per_sample = which == "weights"
    last = ModelCheckpoint(tmp_path, save_last=True)
    _fit(_trainer([_drop_in(which), last], max_epochs=2, enable_checkpointing=True),
         Net(per_sample))  # fmt: skip
    cb, model = _drop_in(which), Net(per_sample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        getattr(_trainer([cb]), how)(model, ckpt_path=last.last_model_path, verbose=False)
    read = (lambda: cb.learned_weight_decay) if which == "decay" else cb.data_weights
    with pytest.raises(ConfigurationError, match=rf"trainer\.{how}\(\.\.\., ckpt_path=\.\.\.\)"):
        read()
    with pytest.raises(ConfigurationError) as err:
        read()
    assert "the fit that loaded it" not in str(err.value)


def test_flags_read_after_test_loaded_a_checkpoint_from_before_the_hyper_steps_say_so(
    tmp_path,
) -> None:
    """``trainer.test(model, ckpt_path="best")`` after the fit, the best epoch before the data
    weights' first hyper step: Lightning gives the callback that checkpoint's state (every
    weight at its start, no hyper step), as it gives the module its weights. ``flagged()`` then
    returned no row without a word, though the fit had learned the weights (``flagged()``
    before the test flags rows); now it says why there is nothing to flag."""
    every = ModelCheckpoint(tmp_path, save_top_k=-1)  # one file per epoch (8 steps each)
    cb = LearnedDataWeights(start_step=12, every_n_steps=4, max_overhead=None)
    model = Net(per_sample=True)
    _fit(_trainer([cb, every], max_epochs=4, enable_checkpointing=True), model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = cb.flagged(0.5)  # the fit's weights: a rule's rows
    assert len(before) > 0 and not [w for w in caught if "no hyper step" in str(w.message)]
    first = next(tmp_path.glob("epoch=0-*.ckpt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([cb]).test(model, ckpt_path=first, verbose=False)
    assert bool((cb.data_weights() == cb.data_weights()[0]).all())  # the checkpoint's: all at start
    with pytest.warns(UserWarning, match=r"has run no hyper step.*trainer\.test"):
        assert len(cb.flagged(0.5)) == 0


def test_control_flags_after_a_second_fit_with_no_hyper_step_are_the_first_fits() -> None:
    """The same callback object fitted again (a fine-tuning stage) keeps the weights it learned;
    a second fit that ends before its own first hyper step leaves them learned: no such word."""
    cb = LearnedDataWeights(start_step=12, every_n_steps=4, max_overhead=None)
    model = Net(per_sample=True)
    _fit(_trainer([cb], max_epochs=3), model)
    learned = cb.data_weights()
    _fit(_trainer([cb], max_epochs=1), model)  # 8 steps: no hyper step of its own
    assert torch.equal(cb.data_weights(), learned)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(cb.flagged(0.5)) > 0
    assert not [w for w in caught if "no hyper step" in str(w.message)]
