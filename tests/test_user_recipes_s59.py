"""Session 59's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 59)"; the recipes: benchmarks/bench_user_recipes_s59.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import three_class_sets
from torch import Tensor, nn
from torch.utils.data import DataLoader

from hypertorch_sid import ConfigurationError, LearnedWeightDecay


class Toggled(pl.LightningModule):
    """Manual optimisation with two optimizers, each toggled and stepped in turn on the loss
    (Lightning's documented pattern for several optimizers): encoder by SGD, head by Adam."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.encoder = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        for opt in self.optimizers():
            self.toggle_optimizer(opt)
            loss = F.cross_entropy(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.untoggle_optimizer(opt)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        enc = torch.optim.SGD(self.encoder.parameters(), lr=0.1, momentum=0.9)
        return enc, torch.optim.Adam(self.head.parameters(), lr=1e-2)


def _fit_toggled(**kw: Any) -> tuple[LearnedWeightDecay, pl.Trainer, list[str]]:
    train, val = three_class_sets()
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    cb = LearnedWeightDecay(1e-3, training_loss=loss, max_overhead=None, **kw)
    trainer = pl.Trainer(
        max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            Toggled(),
            DataLoader(train, batch_size=16, shuffle=True),
            DataLoader(val, batch_size=32),
        )
    return cb, trainer, [str(w.message) for w in caught]


def test_toggle_optimizer_is_not_taken_for_a_tensor_frozen_during_the_fit() -> None:
    """``toggle_optimizer`` switches the other optimizer's tensors off for one step and
    ``untoggle_optimizer`` back on: they are still trained. Before: refused at the head's
    first step ("head.weight, head.bias stopped requiring gradients during the fit")."""
    cb, trainer, _ = _fit_toggled(every_n_steps=4)
    assert trainer.global_step == 3 * 8 * 2  # 8 batches an epoch, each steps both optimizers
    assert len(cb.history) >= 5
    lam = cb.learned_weight_decay
    assert set(lam) == {"encoder.0", "head"}
    assert all(torch.isfinite(v).all() and (v > 0).all() for v in lam.values())
    assert any(float(v.mean()) != 1e-3 for v in lam.values())  # λ learned, not held


def test_a_tensor_frozen_for_good_during_the_fit_is_still_refused() -> None:
    """The toggle's exception does not hide a tensor frozen for good during the fit."""

    class FreezesHead(Toggled):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            if self.trainer.global_step >= 4:
                self.head.bias.requires_grad_(False)

    train, val = three_class_sets()
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    cb = LearnedWeightDecay(1e-3, training_loss=loss, max_overhead=None, every_n_steps=4)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="head.bias stopped requiring"):
        trainer.fit(FreezesHead(), DataLoader(train, batch_size=16), DataLoader(val))


def test_the_fit_start_counts_each_optimizer_of_a_manual_fit() -> None:
    """Two optimizers stepped once a batch run 2 × the batches: the warning at the fit's start
    counted the batches (48 steps said for 24 ... before: "this fit runs 24 optimizer steps"
    and advice sized for them)."""
    _, trainer, said = _fit_toggled(every_n_steps=20)
    assert trainer.global_step == 48
    few = [s for s in said if "optimizer steps, so only" in s]
    assert few and "runs 48 optimizer steps" in few[0], few


class WeightNormed(pl.LightningModule):
    """An MLP whose layers are ``parametrizations.weight_norm``'d (w = g · v / ‖v‖)."""

    def __init__(self, norm: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(norm(nn.Linear(6, 16)), nn.Tanh(), norm(nn.Linear(16, 3)))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "norm",
    [nn.utils.parametrizations.weight_norm, nn.utils.parametrizations.spectral_norm],
    ids=["weight_norm", "spectral_norm"],
)
def test_a_parametrized_weight_keeps_its_own_slot(norm: Any) -> None:
    """Per layer, the tensors of a parametrization (``<layer>.parametrizations.weight
    .original[k]``) get a λ of their own beside the layer's bias: a spectral-norm weight's scale
    does not reach the loss, and only on its own slot can the scale-invariance probe hold its λ
    (tests/test_zoo_s56.py). Session 59's round of recipes merged the two (one λ per layer, as
    the docs' general rule says); that lost the hold, so the slots stay apart and the docs say
    so. The learned λ reads out under both names."""
    train, val = three_class_sets()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(WeightNormed(norm), DataLoader(train, batch_size=16), DataLoader(val))
    assert set(cb.learned_weight_decay) == {
        "net.0", "net.0.parametrizations.weight", "net.2", "net.2.parametrizations.weight"
    }  # fmt: skip
    decayed = cb.decay_values()
    assert (
        len(
            {
                float(decayed[n].mean())
                for n in decayed
                if ".original" in n and n.startswith("net.0.")
            }
        )
        == 1
    )
