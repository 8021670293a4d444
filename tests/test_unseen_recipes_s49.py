"""Recipes no one here wrote that broke a drop-in (session 49; every recipe tried, with its
numbers, is in docs/failures.md, "Unseen recipes (session 49)").

Each test fails without its fix: a ``spectral_norm`` layer under ``LearnedDataWeights`` crashed
inside torch's forward-mode AD after a false "randomness outside torch's generator" warning.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_split, trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, IndexedDataset, LearnedDataWeights
from hypertorch_sid.core.sample_weights import ForwardMode


def _noisy_digits(n: int = 320, seed: int = 5) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Digits with 30 % of the training labels moved to another class; the corrupted mask."""
    X, y, Xv, yv = digits_split(n, 100)
    g = torch.Generator().manual_seed(seed)
    corrupted = torch.zeros(n, dtype=torch.bool)
    corrupted[torch.randperm(n, generator=g)[: int(0.3 * n)]] = True
    moved = (y + torch.randint(1, 10, (n,), generator=g)) % 10
    return X, torch.where(corrupted, moved, y), Xv, yv, corrupted


class SpectralMLP(pl.LightningModule):
    """An MLP whose first layer is ``nn.utils.parametrizations.spectral_norm``: in training mode
    every forward runs one power iteration that updates the buffers ``_u``, ``_v`` and divides
    the weight by the σ they give."""

    def __init__(self) -> None:
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.net = nn.Sequential(sn(nn.Linear(64, 64)), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self.net(batch[0]), batch[1], reduction="none")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_a_spectral_norm_layer_learns_data_weights_by_forward_difference():
    """The cross term's extra forward started from the power-iteration vectors the training
    step had already advanced, so its losses at w differed from the step's own (0.008 of their
    mean): the forward difference was dropped with "randomness outside torch's generator …
    or a forward that changes state", and the dual numbers that replaced it failed inside
    spectral_norm ("Trying to use forward AD with div_out", a raw NotImplementedError). Each
    extra forward now starts from the buffers as the step began."""
    X, y, Xv, yv, corrupted = _noisy_digits()
    cb = LearnedDataWeights(start_step=5, every_n_steps=5)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=8).fit(
            SpectralMLP(),
            DataLoader(IndexedDataset(TensorDataset(X, y)), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(Xv, yv), batch_size=100),
        )
    said = [str(w.message) for w in caught if "ForwardDifference" in str(w.message)]
    assert not said, said  # the losses at w are reproduced: no fallback
    w = cb.data_weights()
    assert len(cb.history) >= 10 and bool(torch.isfinite(w).all())
    assert float(w[corrupted].mean()) < float(w[~corrupted].mean()) - 0.2


def test_dual_numbers_through_spectral_norm_name_the_fix():
    """Where dual numbers are asked for (or forced: bf16 autocast), torch's bare
    NotImplementedError from inside the power iteration becomes a ConfigurationError naming
    the two ways that work."""
    layer = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3))
    params = [layer.parametrizations.weight.original, layer.bias]
    x = torch.randn(5, 4)

    def losses(weight: Tensor, bias: Tensor) -> Tensor:
        names = {"parametrizations.weight.original": weight, "bias": bias}
        return torch.func.functional_call(layer, names, (x,)).pow(2).sum(1)

    tangents = [torch.ones_like(p) for p in params]
    with pytest.raises(
        ConfigurationError, match=r"no forward-mode.*ForwardDifference.*cross_term='hyper_step'"
    ):
        ForwardMode()(losses, params, tangents)
