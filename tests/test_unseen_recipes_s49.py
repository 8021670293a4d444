"""Recipes no one here wrote that broke a drop-in (session 49; every recipe tried, with its
numbers, is in docs/failures.md, "Unseen recipes (session 49)").

Each test fails without its fix: a ``spectral_norm`` layer under ``LearnedDataWeights`` crashed
inside torch's forward-mode AD after a false "randomness outside torch's generator" warning; an
EMA copy of the network read by ``forward`` outside training (or held by the optimizer) stopped
the drop-ins with errors that named nothing the user wrote; a solve whose residual stayed where
it started was said to have "grown from 1.64 to 1.64".
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

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.core.directional import ForwardMode


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


class EMAInForward(pl.LightningModule):
    """A 1-D-CNN-recipe habit: an EMA copy of the network (``AveragedModel``) updated in
    ``on_train_batch_end`` and used by ``forward`` outside training, i.e. in validation."""

    def __init__(self, per_sample: bool) -> None:
        super().__init__()
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        self.per_sample = per_sample
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.9))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) if self.training else self.ema(x)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ema.update_parameters(self.net)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        reduction = "none" if self.per_sample else "mean"
        return F.cross_entropy(self(batch[0]), batch[1], reduction=reduction)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)


def _fit_ema(callback: pl.Callback, per_sample: bool) -> None:
    X, y, Xv, yv, _ = _noisy_digits(160)
    train = TensorDataset(X, y)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short fit
        trainer([callback], max_epochs=2).fit(
            EMAInForward(per_sample),
            DataLoader(IndexedDataset(train) if per_sample else train, batch_size=32),
            DataLoader(TensorDataset(Xv, yv), batch_size=50),
        )


@pytest.mark.parametrize("drop_in", ["decay", "data_weights"])
def test_an_ema_copy_read_by_forward_in_eval_mode_is_named_with_the_fix(drop_in):
    """E runs with the module in eval mode, so this forward computed it from the EMA copy,
    which no optimizer trains: the hyper step stopped with "outer_loss depends on neither the
    inner parameters nor the hyperparameters: E must be computed from w and/or λ", which says
    nothing a drop-in user wrote. It now names the copy's tensors, the cause and the fix; the
    fix named (validation_loss= on the trained network) learns."""
    per_sample = drop_in == "data_weights"

    def make(**kw: Any) -> pl.Callback:
        if per_sample:
            return LearnedDataWeights(start_step=2, every_n_steps=2, **kw)
        return LearnedWeightDecay(1e-4, every_n_steps=2, max_overhead=None, **kw)

    with pytest.raises(ConfigurationError, match=r"ema\.module\..*eval mode.*validation_loss="):
        _fit_ema(make(), per_sample)
    reduction = "none" if per_sample else "mean"
    cb = make(validation_loss=lambda m, b: F.cross_entropy(m.net(b[0]), b[1], reduction=reduction))
    _fit_ema(cb, per_sample)
    assert len(cb.history) >= 3


def test_an_adjoint_solve_whose_residual_stayed_is_not_said_to_have_grown_from_x_to_x():
    """A wide ResNet's k = 3 adjoint solve was said to have "grown from 1.64 to 1.64" and to be
    "moving away from its answer": its residual rose by less than 3 significant digits show.
    It is said not to have fallen, with figures that differ; a real growth is still growth."""
    from hypertorch_sid.core.solvers import _ADJOINT_FIX, _ADJOINT_HINT
    from hypertorch_sid.core.watch import ResidualWatch, unconverged_message

    def said(residuals: list[float]) -> str:
        watch = ResidualWatch("adjoint solve v_k", _ADJOINT_HINT)
        direction = [torch.full((4,), 0.5)]
        for step, residual in enumerate(residuals):
            watch.see(step, residual, [residual * d for d in direction])
        return unconverged_message("adjoint solve v_k", watch, _ADJOINT_FIX)

    stayed = said([1.6401, 1.6402, 1.6403])
    assert "did not fall (1.6401 to 1.6403)" in stayed, stayed
    assert "grew" not in stayed and "moving away" not in stayed, stayed
    assert "CurvatureDamping" in stayed and _ADJOINT_FIX not in stayed, stayed
    assert "grew from 48.4 to 2.18e+03" in said([48.4, 900.0, 2180.0])


def test_an_e_that_reads_no_other_tensor_gets_no_guess_about_a_copy():
    """The EMA hint names only tensors E read: an E that reads w detached keeps the plain
    message (no copy, no eval-mode guess)."""
    from hypertorch_sid.core.outer import outer_gradients

    net = nn.Linear(3, 1)
    lam = torch.zeros(1, requires_grad=True)
    x = torch.randn(4, 3)

    def detached(batch: Tensor) -> Tensor:
        return (batch @ net.weight.detach().T).pow(2).mean()

    with pytest.raises(ConfigurationError, match=r"w and/or λ\.$"):
        outer_gradients(detached, x, list(net.parameters()), [lam], module=net)


class EMAInOptimizer(EMAInForward):
    """The same EMA copy, not read by ``forward``, but inside ``self.parameters()``, which the
    optimizer is given (torch's optimizers skip tensors without a gradient: the plain fit runs)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_an_ema_copy_among_the_optimizers_tensors_is_named_under_data_weights():
    """LearnedWeightDecay named the copy's tensors ("got no gradient from the training loss (a
    layer the training never uses)"); LearnedDataWeights stopped with the core's "inner_loss
    does not depend on inner parameters at positions [4, 5, 6, 7]: leave them out of
    inner_parameters", positions of a list the user never wrote."""
    X, y, Xv, yv, _ = _noisy_digits(160)
    pl.seed_everything(0, verbose=False)
    with pytest.raises(
        ConfigurationError, match=r"does not depend on ema\.module\.0\.weight.*out of the optimizer"
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer([LearnedDataWeights(start_step=2, every_n_steps=2)], max_epochs=1).fit(
                EMAInOptimizer(per_sample=True),
                DataLoader(IndexedDataset(TensorDataset(X, y)), batch_size=32),
                DataLoader(TensorDataset(Xv, yv), batch_size=50),
            )
