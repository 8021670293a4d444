"""Network structures under the drop-ins (session 56, ``benchmarks/bench_zoo_s56.py``).

``spectral_norm``'s parametrization runs one power iteration on its ``_u``, ``_v`` buffers each
time its weight is read in training mode. The drop-in read it once more at fit start (the
second-derivative check), so its fit at a fixed λ left the user's own (weights 0.6 apart after 8
epochs), and the invariance probe ran its forwards one iteration apart, so the normalised
weight (W / σ(W): the loss does not see its scale) was called not invariant and its λ learned.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_split
from torch import nn
from torch.nn.utils import parametrizations
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.second_order import check_second_derivatives
from hypertorch_sid.lightning.invariance import scale_invariant_slots
from hypertorch_sid.lightning.weight_decay import WeightDecayProblem

pytest.importorskip("sklearn.datasets")

LAMBDA = 1e-3


class SpectralMLP(pl.LightningModule):
    def __init__(self, weight_decay: float) -> None:
        super().__init__()
        self.weight_decay = weight_decay
        self.net = nn.Sequential(
            parametrizations.spectral_norm(nn.Linear(64, 32)), nn.ReLU(),
            parametrizations.spectral_norm(nn.Linear(32, 32)), nn.ReLU(), nn.Linear(32, 10),
        )  # fmt: skip

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9,
                               weight_decay=self.weight_decay)  # fmt: skip


def _fit(callbacks, weight_decay: float, steps: int) -> SpectralMLP:
    xt, yt, xv, yv = digits_split(320, 64, seed=0)
    pl.seed_everything(0, verbose=False)
    module = SpectralMLP(weight_decay)
    train = DataLoader(TensorDataset(xt, yt), 32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))  # fmt: skip
    pl.Trainer(
        max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=1,
    ).fit(module, train, DataLoader(TensorDataset(xv, yv), 64))  # fmt: skip
    return module


def test_the_second_derivative_check_runs_no_parametrization():
    """Reading a spectral-norm layer's ``weight`` moves its power iteration: the check reads
    only the layers it refuses (embeddings), their tensors as registered."""
    layer = parametrizations.spectral_norm(nn.Linear(8, 8))
    u = layer.parametrizations.weight[0]._u.clone()
    check_second_derivatives(layer, list(layer.parameters()))
    assert torch.equal(layer.parametrizations.weight[0]._u, u)
    bag = nn.EmbeddingBag(5, 3)  # still refused
    with pytest.raises(Exception, match="EmbeddingBag"):
        check_second_derivatives(nn.Sequential(bag), list(bag.parameters()))


def test_a_spectral_norm_fit_at_fixed_decay_is_the_optimizers_own():
    """With the hyper steps off, the drop-in trains as ``SGD(weight_decay=λ)``: the same
    tensors decayed once, and the spectral norm's ``_u``, ``_v`` where the user's fit has them."""
    applied = float(torch.tensor(math.log(LAMBDA)).exp())  # λ as the drop-in holds it
    own = _fit([], applied, 30)
    cb = LearnedWeightDecay(LAMBDA, start_step=10**9, max_overhead=None)
    dropin = _fit([cb], 0.0, 30)
    theirs = dropin.state_dict()
    gap = max(float((v - theirs[k]).abs().max()) for k, v in own.state_dict().items())
    assert gap < 1e-6, gap


def test_the_probe_calls_a_spectral_norm_weight_scale_invariant():
    """W / σ(W) does not change with W's scale: the probe says so, its forwards each from the
    same ``_u``, ``_v`` (here far from converged: the weights drawn anew after the layers
    were made), and leaves them as they were; the output layer is not invariant."""
    module = SpectralMLP(0.0)
    layers = [module.net[0], module.net[2]]
    with torch.no_grad():
        for layer in layers:
            layer.parametrizations.weight.original.normal_()
    u = [layer.parametrizations.weight[0]._u.clone() for layer in layers]
    problem = WeightDecayProblem(LAMBDA)
    problem._collect(SimpleNamespace(optimizers=[module.configure_optimizers()]), module)
    xt, yt, _, _ = digits_split(64, 0, seed=0)
    groups = scale_invariant_slots(problem, module, (xt, yt))
    assert groups == {"net.0": False, "net.0.parametrizations.weight": True, "net.2": False,
                      "net.2.parametrizations.weight": True, "net.4": False}  # fmt: skip
    for layer, before in zip(layers, u):
        assert torch.equal(layer.parametrizations.weight[0]._u, before)
