"""A careless user's Trainer settings against the drop-ins (session 43; the table of every setting
tried and its outcome is in docs/failures.md, "Trainer settings (session 43)").

Session 42's tests (test_gpu_user_recipes.py) cover precision, compilation, accumulation, clipping
by norm, ``max_time``, a float ``val_check_interval`` and the end of a fit under weight averaging;
these cover what they leave: the checkpoints written *during* weight averaging, and the Trainer
and LightningModule settings listed in the table.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BackboneFinetuning, EMAWeightAveraging, ModelCheckpoint
from test_data_weights_recipes import Classifier, X, Y, loader, val_loader
from test_gpu import SmallCNN, image_loaders
from test_gpu_user_recipes import (
    DROP_INS,
    SETTINGS,
    Ridge,
    _run,
    _trainer,
    assert_learned,
    ridge_loaders,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)


class LambdaSeen(pl.Callback):
    """λ of the module after each training step (listed after the hyper-optimization callback:
    after that step's hyper step) and while each validation runs."""

    def __init__(self) -> None:
        self.train: dict[int, torch.Tensor] = {}
        self.val: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        self.train[trainer.global_step] = module.log_lam.detach().clone()

    def on_validation_batch_start(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        self.val[trainer.global_step] = module.log_lam.detach().clone()


@pytest.mark.parametrize("order", ["averaging_first", "hyper_first"])
def test_checkpoints_written_while_averaging_hold_the_learned_lambda(
    order: str, tmp_path: Any
) -> None:
    """EMAWeightAveraging writes its average of every parameter into a checkpoint's
    ``state_dict`` (the learned ones go to ``current_model_state``) and swaps it into the module
    while validation runs. A ``BilevelModule``'s λ was averaged with the weights: the step-35
    checkpoint held log λ -0.243 where the hyper steps had learned -0.350, and
    ``Ridge.load_from_checkpoint`` (or ``trainer.test(ckpt_path=...)``) gave that average;
    validation ran with it too. The averaged model carries the learned λ; its weights stay
    averaged."""
    cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
    ema, seen = EMAWeightAveraging(decay=0.9), LambdaSeen()
    callbacks = [ema, cb] if order == "averaging_first" else [cb, ema]
    callbacks += [seen, ModelCheckpoint(tmp_path, every_n_train_steps=7, save_top_k=-1)]
    pl.seed_everything(0, verbose=False)
    trainer = _trainer(callbacks, max_epochs=3, enable_checkpointing=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Ridge(), *ridge_loaders())
        trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    files = sorted(tmp_path.glob("*.ckpt"))
    assert len(files) == 6
    for file in files:
        saved = torch.load(file, weights_only=False)
        learned = seen.train[saved["global_step"]]
        assert bool((learned != 0).all())  # λ has moved: its average would differ
        torch.testing.assert_close(saved["state_dict"]["log_lam"], learned, rtol=0, atol=0)
        loaded = Ridge.load_from_checkpoint(file)
        torch.testing.assert_close(loaded.log_lam.detach(), learned, rtol=0, atol=0)
        if file.name != "after_fit.ckpt":  # (after the fit the module holds the average)
            averaged, current = saved["state_dict"], saved["current_model_state"]
            assert not torch.equal(averaged["net.0.weight"], current["net.0.weight"])
    assert seen.val
    for step, lam in seen.val.items():  # validation ran with the averaged weights, learned λ
        # (to rounding: between hyper steps EMA's 0.9·λ + 0.1·λ keeps λ to an ulp or two)
        torch.testing.assert_close(lam, seen.train[step])


# ---------------------------------------------------------------------------- unfrozen mid-fit
class RidgeWithBackbone(Ridge):
    """Ridge on the features of a linear backbone that BackboneFinetuning unfreezes."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(8, 8)

    def inner_loss(self, batch: Any) -> Tensor:
        return super().inner_loss((self.backbone(batch[0]), batch[1]))

    def outer_loss(self, batch: Any) -> Tensor:
        return super().outer_loss((self.backbone(batch[0]), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


class ClassifierWithBackbone(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = self.net[0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.2)


@pytest.mark.parametrize("drop_in", ["bilevel", "data_weights"])
def test_tensors_unfrozen_during_the_fit_are_named(drop_in: str) -> None:
    """BackboneFinetuning unfreezes the backbone into a new parameter group mid-fit: the training
    trains it from then on, but the hypergradient's inner parameters were collected when the fit
    started. LearnedWeightDecay said so; a BilevelModule and LearnedDataWeights went on without a
    word (the backbone left out of every later hyper step)."""
    finetune = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.0)
    if drop_in == "bilevel":
        cb: Any = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        model: Any = RidgeWithBackbone()
        loaders, names = ridge_loaders(), "backbone.weight, backbone.bias"
    else:
        cb, model, names = LearnedDataWeights(every_n_steps=2, start_step=0), None, "net.0.weight"
        model, loaders = ClassifierWithBackbone(), (loader(), val_loader())
    pl.seed_everything(0, verbose=False)
    match = rf"{type(cb).__name__}: the optimizers now train 2 tensors the fit did not start "
    with pytest.warns(UserWarning, match=match + rf"with \({names}.*e.g. BackboneFinetuning"):
        _trainer([cb, finetune], max_epochs=3).fit(model, *loaders)
    assert len(cb.sid.inner_parameters) == (1 if drop_in == "bilevel" else 2)  # backbone left out


# ---------------------------------------------------------------------------- reloaded loaders
class GrowingRidge(Ridge):
    """``reload_dataloaders_every_n_epochs=1`` with loaders over data sets that grow after the
    first epoch (a curriculum): 100 then 400 training rows, 100 then 200 validation rows."""

    def _loaders(self) -> tuple[DataLoader, DataLoader]:
        train, val = ridge_loaders()
        if self.trainer.current_epoch > 0:
            return train, val
        small = [Subset(loader.dataset, range(100)) for loader in (train, val)]
        return DataLoader(small[0], batch_size=32, shuffle=True), DataLoader(small[1], 200)

    def train_dataloader(self) -> DataLoader:
        return self._loaders()[0]

    def val_dataloader(self) -> DataLoader:
        return self._loaders()[1]


def test_hyper_steps_draw_from_the_loaders_lightning_reloaded() -> None:
    """With ``reload_dataloaders_every_n_epochs`` the training reads a new data set each epoch,
    but the hyper steps kept drawing from the one of the first epoch (100 of the 400 training
    rows, 100 of the 200 validation rows), with no word: λ tuned for a training that was no
    longer running. They now follow the reloaded loaders."""
    cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([cb], max_epochs=3, reload_dataloaders_every_n_epochs=1).fit(GrowingRidge())
    assert cb.data is not None and (cb.data.n_train, cb.data.n_val) == (400, 200)
    assert len(cb.history) == 6  # 4 + 13 + 13 = 30 steps, a hyper step every 5
    rows = ridge_loaders()[0].dataset.tensors[0]
    batch = next(cb.data.train)[0]
    drawn = (batch[:, None, :] == rows[None, :, :]).all(-1).nonzero()[:, 1]
    assert len(drawn) == len(batch) and int(drawn.max()) >= 100


class GrowingClassifier(Classifier):
    """The first two epochs on half the training set, then all of it (reloaded)."""

    def train_dataloader(self) -> DataLoader:
        n = len(X) // 2 if self.trainer.current_epoch < 2 else len(X)
        return loader(IndexedDataset(TensorDataset(X[:n], Y[:n])))

    def val_dataloader(self) -> DataLoader:
        return val_loader()


def test_data_weights_refuse_a_reloaded_training_set_of_another_size() -> None:
    """The weights were sized for the 120 examples of the first epochs; the reloaded loader
    reads 240. It failed at the next hyper step as 'sample-weight index out of range', naming
    neither the reload nor the fix."""
    cb = LearnedDataWeights(every_n_steps=2, start_step=0)
    match = r"reloaded \(reload_dataloaders_every_n_epochs\).*240 examples.*the 120 examples"
    with pytest.raises(ConfigurationError, match=match):
        _trainer([cb], max_epochs=4, reload_dataloaders_every_n_epochs=1).fit(GrowingClassifier())


# ---------------------------------------------------------------------------- settings that work
#: Trainer settings tried in session 43 that learn on all three drop-ins untouched (the rest of
#: the table in docs/failures.md was checked by hand or costs more than a few seconds)
WORKING = {
    "clip_by_value": dict(gradient_clip_val=0.05, gradient_clip_algorithm="value"),
    "limit_train_batches_half": dict(limit_train_batches=0.5),
    "check_val_every_2_epochs": dict(check_val_every_n_epoch=2),
    "val_check_interval_5_steps": dict(val_check_interval=5),
    "max_epochs_unbounded_max_steps": dict(max_epochs=-1, max_steps=30),
    "sanity_check_2_batches": dict(num_sanity_val_steps=2),
    "inference_mode_off": dict(inference_mode=False),
    "barebones": dict(barebones=True),
}


@pytest.mark.parametrize("drop_in", DROP_INS)
@pytest.mark.parametrize("setting", list(WORKING))
def test_trainer_setting_learns(setting: str, drop_in: str) -> None:
    """λ moves and stays finite (the corrupted examples' weights end below the clean ones')."""
    SETTINGS["s43"] = dict(trainer=WORKING[setting])
    try:
        cb, model = _run(drop_in, "s43")
    finally:
        del SETTINGS["s43"]
    assert_learned(drop_in, cb, model)


def _learned(drop_in: str, cb: Any, model: Any) -> Tensor:
    if drop_in == "weight_decay":
        return torch.cat([v.flatten() for v in cb.decay_values().values()])
    return cb.data_weights() if drop_in == "data_weights" else model.log_lam.detach().clone()


class AtStart(pl.Callback):
    def __init__(self, read: Any) -> None:
        self.read = read

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        self.value = self.read()


@pytest.mark.parametrize("drop_in", DROP_INS)
def test_a_second_fit_continues_from_the_learned_lambda(drop_in: str) -> None:
    """``trainer.fit`` again with the same callback and module (a new Trainer): λ starts where
    the first fit left it (after the callback built itself), and the history goes on."""
    if drop_in == "weight_decay":
        model: Any = SmallCNN()
        cb: Any = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        loaders = image_loaders()
    elif drop_in == "data_weights":
        model, cb = Classifier(), LearnedDataWeights(every_n_steps=2, start_step=0)
        loaders = (loader(), val_loader())
    else:
        model = Ridge()
        cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        loaders = ridge_loaders()
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([cb], max_epochs=2).fit(model, *loaders)
        first, steps = _learned(drop_in, cb, model), len(cb.history)
        seen = AtStart(lambda: _learned(drop_in, cb, model))
        _trainer([cb, seen], max_epochs=2).fit(model, *loaders)
    assert steps > 0 and len(cb.history) == 2 * steps
    torch.testing.assert_close(seen.value, first, rtol=0, atol=0)
    assert not torch.equal(_learned(drop_in, cb, model), first)  # and it moved on


class ReloadedRidge(Ridge):
    """Loaders over new data set objects of the same data every epoch (not shuffled: the
    training's order is the one without reloads)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*ridge_loaders()[0].dataset.tensors), batch_size=32)

    def val_dataloader(self) -> DataLoader:
        return ridge_loaders()[1]


def test_a_reload_over_the_same_data_changes_nothing() -> None:
    """The samplers rebuilt on reloaded data sets of the same size continue where they stopped:
    λ bit for bit that of the fit without reloads."""
    lam = []
    for reload in (0, 1):
        cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        pl.seed_everything(0, verbose=False)
        model = ReloadedRidge()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer([cb], max_epochs=3, reload_dataloaders_every_n_epochs=reload).fit(model)
        lam.append(model.log_lam.detach().clone())
    assert bool((lam[0] != 0).all())
    torch.testing.assert_close(lam[1], lam[0], rtol=0, atol=0)


class UnshuffledGrowingRidge(GrowingRidge):
    def _loaders(self) -> tuple[DataLoader, DataLoader]:
        train, val = super()._loaders()
        return DataLoader(train.dataset, batch_size=32), val  # one training order in every run


def test_a_resume_after_a_reload_resized_the_data_sets_repeats_the_fit(tmp_path: Any) -> None:
    """A checkpoint written after the reload that grew the data sets holds the callback's
    validation sampler over the old 100 rows (it follows the reloaded validation loader at the
    next epoch); the resumed fit's loaders hold 200. It was refused ("Resume with the same
    data"); the uninterrupted fit started a fresh sampler at that reload, and so does the
    resume: λ bit for bit the same."""

    def fit(ckpt_path: Any = None) -> Tensor:
        cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        save = ModelCheckpoint(tmp_path, save_top_k=-1, every_n_epochs=1)
        pl.seed_everything(0, verbose=False)
        model = UnshuffledGrowingRidge()
        trainer = _trainer(
            [cb, save], max_epochs=4, reload_dataloaders_every_n_epochs=1,
            enable_checkpointing=True,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, ckpt_path=ckpt_path)
        return model.log_lam.detach().clone()

    straight = fit()
    resumed = fit(tmp_path / "epoch=1-step=17.ckpt")
    assert bool((straight != 0).all())
    torch.testing.assert_close(resumed, straight, rtol=0, atol=0)
