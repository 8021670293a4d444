"""Session 51's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen recipes
(session 51)"; the recipes: benchmarks/bench_user_recipes_s51.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.lightning.metrics import late_first_hyper_step


def _data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] + 0.5 * x[:, 1] > 0).long())


class MLP(pl.LightningModule):
    def __init__(self, optimizer: Callable[..., torch.optim.Optimizer]) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.optimizer = optimizer

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer(self.parameters())


def _fit_messages(optimizer: Callable[..., torch.optim.Optimizer], decoupled: bool) -> list[str]:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
        callbacks=[LearnedWeightDecay(1e-3, decoupled=decoupled, every_n_steps=2, start_step=2)],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            MLP(optimizer),
            DataLoader(_data(64, 0), batch_size=16, shuffle=True),
            DataLoader(_data(32, 1), batch_size=16),
        )
    return [str(w.message) for w in caught if "preconditioner P" in str(w.message)]


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
    ],
    ids=["Adafactor", "RMSprop"],
)
def test_decoupled_decay_under_an_optimizer_whose_preconditioner_is_not_read_is_said(make):
    """``torch.optim.Adafactor`` decays decoupled (w ← w(1 − lr·wd), as AdamW), so a user passes
    ``LearnedWeightDecay(..., decoupled=True)``, as README.md says for AdamW. The hypergradient
    models that fixed point as P⁻¹∇ℓ + λw = 0 with P read from Adam's second moment or SGD's
    momentum; for Adafactor (P = √v̂·lr / (RMS(w)·ρ_t)) and any other optimizer it silently took
    P = 1: λ was learned for another problem than the one trained. Now said at fit start, naming
    the optimizer and the exact alternative (decoupled=False)."""
    said = _fit_messages(make, decoupled=True)
    assert len(said) == 1, said
    assert type(make([nn.Parameter(torch.zeros(1))])).__name__ in said[0]
    assert "decoupled=False" in said[0]


@pytest.mark.parametrize(
    ("make", "decoupled"),
    [
        (lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.0), True),
        (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), True),
        (lambda ps: torch.optim.Adafactor(ps, lr=1e-2), False),
    ],
    ids=["AdamW-decoupled", "SGD-decoupled", "Adafactor-coupled"],
)
def test_decay_whose_fixed_point_is_modelled_is_not_warned(make, decoupled):
    """The preconditioner is read (AdamW, SGD momentum), or coupled decay needs none."""
    assert _fit_messages(make, decoupled) == []


class PerSample(MLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="none")


def _data_weight_messages(accumulate: int) -> list[str]:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_epochs=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", accumulate_grad_batches=accumulate,
        callbacks=[LearnedDataWeights(start_step=11, every_n_steps=3)],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            PerSample(lambda ps: torch.optim.SGD(ps, lr=0.1)),
            DataLoader(IndexedDataset(_data(80, 0)), batch_size=8, shuffle=True),
            DataLoader(_data(32, 1), batch_size=16),
        )
    return [str(w.message) for w in caught if "first hyper step on" in str(w.message)]


def test_data_weights_whose_first_hyper_step_comes_late_are_said():
    """``accumulate_grad_batches=4`` on 2000 MNIST images, 6 epochs: 96 optimizer steps, and
    ``LearnedDataWeights()``'s first hyper step (the multiple of every_n_steps=40 from
    start_step=50) at step 80. The weights move per visit only once a hyper step has given v,
    so the model trained with them for the last 16 steps, after the MultiStepLR's drops: test
    loss 0.7141 against plain's 0.7148 although the weights separated the noisy rows (AUC
    0.95), and nothing was said (a fit with one hyper step counted as enough). Here: 80 rows in
    batches of 8, accumulated by 5 (2 optimizer steps an epoch, 12 in all), the first hyper
    step at 12."""
    said = _data_weight_messages(accumulate=5)
    assert len(said) == 1, said
    assert "at optimizer step 12" in said[0] and "less than one epoch" in said[0]
    # the same settings without accumulation: 60 steps, 48 of them after the first hyper step
    assert _data_weight_messages(accumulate=1) == []


def test_late_first_hyper_step_on_the_benchmarks_numbers():
    """The recipe's own numbers: accumulated (96 steps, 15.75 an epoch) and not (378, 63)."""
    said = late_first_hyper_step(96, 40, 50, 0, 63 / 4)
    assert said is not None and "optimizer step 80" in said and "last 16 (1.0 epochs)" in said
    assert late_first_hyper_step(378, 40, 50, 0, 63) is None
    assert late_first_hyper_step(60, 40, 50, 0, 10) is None  # none at all: said elsewhere
    assert late_first_hyper_step(float("inf"), 40, 50, 0, 10) is None
    # a one-epoch fit whose first hyper step comes early is not told to start earlier
    assert late_first_hyper_step(10, 2, 0, 0, 10) is None
    # the first hyper step at 80 of 150, 7 epochs of 10 steps after it: not said
    assert late_first_hyper_step(150, 40, 50, 0, 10) is None
