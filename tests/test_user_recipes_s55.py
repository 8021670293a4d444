"""Session 55's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 55)"; the recipes: benchmarks/bench_user_recipes_s55.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import (
    Callback,
    GradientAccumulationScheduler,
    StochasticWeightAveraging,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.lightning.training_length import horizon


def _trainer(callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


class Net(pl.LightningModule):
    def __init__(self, per_sample: bool = False, norm: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.per_sample = per_sample
        bn = nn.BatchNorm1d(16) if norm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(6, 16), bn, nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(indexed: bool = False) -> tuple[DataLoader, DataLoader]:
    """128 training rows in 8 batches of 16, 64 validation rows."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    train = TensorDataset(x[:128], y[:128])
    return (
        DataLoader(IndexedDataset(train) if indexed else train, batch_size=16, shuffle=True),
        DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32),
    )


class Horizons(Callback):
    """The steps left that the hyper steps count on (R of eq. decaytrust), at every batch."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(horizon(trainer)[0])


# ------------------------------------------- a gradient-accumulation schedule


def test_a_gradient_accumulation_schedule_counts_the_steps_the_fit_runs() -> None:
    """``GradientAccumulationScheduler({0: 1, 1: 4})`` over 3 epochs of 8 batches runs 8 + 2 + 2
    = 12 optimizer steps; Lightning's ``estimated_stepping_batches`` read 24 at the fit's start
    (the drop-in warned "this fit runs 24 optimizer steps") and 6 from epoch 1 on, so the steps
    left that the hypergradient's horizon counts on went negative."""
    train, val = _data()
    horizons = Horizons()
    decay = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    sched = GradientAccumulationScheduler(scheduling={0: 1, 1: 4})
    trainer = _trainer([decay, sched, horizons], max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), train, val)
    said = [str(w.message) for w in caught if "hyper step" in str(w.message)]
    assert trainer.global_step == 12
    assert any("this fit runs 12 optimizer steps" in s for s in said), said
    assert min(horizons.seen) >= 0, horizons.seen


def test_data_weights_whose_first_hyper_step_comes_late_under_an_accumulation_schedule_say_so() -> (
    None
):
    """{0: 1, 2: 4} over 5 epochs of 8 batches: 22 optimizer steps, read as 40. The first hyper
    step at step 16 is in the second half of 22 with 6 steps after it (the s55 recipe: at step 80
    of 88, the weights did nothing, silently); of 40 it looked early."""
    train, val = _data(indexed=True)
    weights = LearnedDataWeights(start_step=16, every_n_steps=8)
    sched = GradientAccumulationScheduler(scheduling={0: 1, 2: 4})
    trainer = _trainer([weights, sched], max_epochs=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(per_sample=True), train, val)
    said = [str(w.message) for w in caught if "LearnedDataWeights" in str(w.message)]
    assert trainer.global_step == 22
    assert any("at optimizer step 16" in s and "runs 22 optimizer steps" in s for s in said), said


def test_stochastic_weight_averagings_batchnorm_epoch_is_counted_as_one_step() -> None:
    """Lightning's SWA on a model with BatchNorm adds an epoch that accumulates all 8 batches
    into one step: 4 epochs run 4·8 + 1 = 33 steps, read as 40 at the fit's start (the s55
    recipe: "this fit runs 192 optimizer steps" of 161) and as 5 in that epoch (steps left < 0)."""
    train, val = _data()
    horizons = Horizons()
    decay = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=0.5)
    trainer = _trainer([decay, swa, horizons], max_epochs=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(norm=True), train, val)
    said = [str(w.message) for w in caught if "hyper step" in str(w.message)]
    assert trainer.global_step == 33
    assert any("this fit runs 33 optimizer steps" in s for s in said), said
    assert min(horizons.seen) >= 0, horizons.seen


class ManualEverySecond(Net):
    """Manual optimisation that steps the optimizer every second batch (accumulation)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        self.manual_backward(super().training_step(batch, batch_idx) / 2)
        if batch_idx % 2 == 1:
            opt.step()
            opt.zero_grad()


def test_manual_optimisation_stepping_every_second_batch_counts_its_steps() -> None:
    """3 epochs of 8 batches, a step every second batch: 12 steps, which Lightning counts as 24
    (training batches); the steps left were twice the true ones to the end (12 at the last
    step), and the fit's start said "runs 24 optimizer steps" as a fact."""
    train, val = _data()
    horizons = Horizons()
    loss = lambda module, batch: F.cross_entropy(module.net(batch[0]), batch[1])  # noqa: E731
    decay = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None, training_loss=loss)
    trainer = _trainer([decay, horizons], max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(ManualEverySecond(), train, val)
    said = [str(w.message) for w in caught if "hyper step" in str(w.message)]
    assert trainer.global_step == 12
    assert horizons.seen[-1] == 0, horizons.seen
    assert any("Under manual optimisation Lightning counts" in s for s in said), said


class StopAt(Callback):
    """Ends the fit at an optimizer step, as ``max_time`` does by the clock."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = trainer.should_stop or trainer.global_step >= self.step


def test_data_weights_in_a_fit_of_unknown_length_stopped_soon_after_the_first_hyper_step() -> None:
    """``Trainer(max_time=..., max_epochs=-1)``: the fit's planned length is infinite. Stopped at
    step 24 with the first hyper step at 16, the end-of-fit warning formatted the planned length
    as ``int(inf)``: OverflowError after the fit, the model trained but the user's script
    stopped."""
    train, val = _data(indexed=True)
    weights = LearnedDataWeights(start_step=16, every_n_steps=8)
    trainer = _trainer([weights, StopAt(24)], max_epochs=-1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(per_sample=True), train, val)
    said = [str(w.message) for w in caught if "stopped at optimizer step 24" in str(w.message)]
    assert trainer.global_step == 24
    assert len(said) == 1 and "planned" not in said[0], said
