"""Session 58's leftovers of session 57: the step-size probe under manual optimisation with one
optimizer per layer, and a checkpoint's hyperparameters loaded by name.

* **The probe pools every optimizer of the batch.** Where the training optimizers give no
  reading of the step size, the callbacks measure η̂ = ⟨w_before − w_after, g⟩/‖g‖² on the
  update a hyper step follows. Session 57 measured the update of one optimizer, the batch's
  last; now each optimizer that steps in the batch is probed over its own step and the parts
  are pooled, Σ_o ⟨Δw_o, g_o⟩ / Σ_o ‖g_o‖² (SGD per layer, without momentum: Σ_o lr_o ‖g_o‖² /
  Σ_o ‖g_o‖², a closed form).
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

import hypertorch_sid.lightning.callback as callback_module
from hypertorch_sid import LearnedWeightDecay

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval.*"),
]

LRS = (0.1, 0.03, 0.01)  # one optimizer per layer, each its own learning rate


class PerLayer(pl.LightningModule):
    """A float64 tanh MLP of three layers under manual optimisation, one optimizer per layer
    (``kind``: SGD without momentum, or RMSprop) stepped in turn after one backward. Records,
    per batch and optimizer, ⟨w_before − w_after, g⟩ and ‖g‖² of the tensors it steps, g read
    after its step (the gradient the update used, the decay's λw included)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.automatic_optimization = False
        gen = torch.Generator().manual_seed(5)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=torch.float64) for a, b in ((4, 6), (6, 5), (5, 1))
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        self.kind = kind
        self.parts: list[list[tuple[float, float]]] = []  # per batch: (moved, ‖g‖²) per optimizer

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        h = torch.tanh(self.layers[1](torch.tanh(self.layers[0](x))))
        return 0.5 * ((self.layers[2](h).squeeze(-1) - y) ** 2).mean()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(self.loss(batch))
        parts = []
        for opt, layer in zip(opts, self.layers):
            before = [p.detach().clone() for p in layer.parameters()]
            opt.step()
            params = list(layer.parameters())
            moved = sum(float(((b - p.detach()) * p.grad).sum()) for b, p in zip(before, params))
            parts.append((moved, sum(float(p.grad.pow(2).sum()) for p in params)))
        self.parts.append(parts)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        if self.kind == "sgd":
            return [torch.optim.SGD(m.parameters(), lr=lr) for m, lr in zip(self.layers, LRS)]
        return [torch.optim.RMSprop(m.parameters(), lr=lr) for m, lr in zip(self.layers, LRS)]


def per_layer_loss(module: pl.LightningModule, batch: Any) -> Tensor:
    return PerLayer.loss(module, batch)


def loaders() -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(80, 4, generator=gen, dtype=torch.float64)
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(80, generator=gen, dtype=torch.float64)
    train, val = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    return DataLoader(train, batch_size=16), DataLoader(val, batch_size=16)


def probed(cb: LearnedWeightDecay) -> list[float | None]:
    """The step sizes η̂ the probe measured, one per hyper step (read as the hyper step takes
    it)."""
    seen: list[float | None] = []
    observe = cb._observe_horizon

    def recording(trainer: pl.Trainer) -> None:
        seen.append(cb._step_size)
        observe(trainer)

    cb._observe_horizon = recording  # type: ignore[method-assign]
    return seen


def fit_per_layer(kind: str, every_n_steps: int) -> tuple[PerLayer, list[float | None], list[int]]:
    """Two epochs of 4 batches, 3 optimizer steps each; the η̂ of every hyper step and the
    batches (0-based) whose end ran one."""
    model = PerLayer(kind)
    decay = LearnedWeightDecay(
        1e-2, training_loss=per_layer_loss, every_n_steps=every_n_steps, max_overhead=None,
        adjoint_steps=2, seed=3, batch_size=16, val_batch_size=16,
    )  # fmt: skip
    eta = probed(decay)
    ends: list[int] = []
    run = decay._hyper_step

    def counted(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ends.append(trainer.fit_loop.epoch_loop.total_batch_idx)
        run(trainer, pl_module)

    decay._hyper_step = counted  # type: ignore[method-assign]
    trainer = lightning_problems.trainer([decay], max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, *loaders())
    return model, eta, ends


def pooled(parts: list[tuple[float, float]]) -> float:
    return sum(m for m, _ in parts) / sum(g for _, g in parts)


def test_the_probe_pools_every_sgd_of_the_batch_in_closed_form(monkeypatch):
    """SGD per layer without momentum (lr 0.1, 0.03, 0.01), its reading from the optimizers
    withheld so the probe measures it: each hyper step's η̂ is Σ_o lr_o ‖g_o‖² / Σ_o ‖g_o‖² of
    its batch's gradients (rel 1e-9). Before, the probe measured the batch's last optimizer
    alone: η̂ = 0.01, its learning rate, at every hyper step."""
    monkeypatch.setattr(callback_module, "effective_step_size", lambda optimizers: None)
    model, eta, ends = fit_per_layer("sgd", every_n_steps=6)  # due at every second batch's end
    assert ends == [1, 3, 5, 7]
    for got, batch in zip(eta, ends):
        grads = [g for _, g in model.parts[batch]]
        closed = sum(lr * g for lr, g in zip(LRS, grads)) / sum(grads)
        assert got == pytest.approx(closed, rel=1e-9)
        assert got > 1.5 * LRS[-1]  # no longer the last optimizer's lr
    # the module's own measurement of each update agrees with the closed form (SGD: Δw = lr·g)
    for parts in model.parts:
        for (moved, g), lr in zip(parts, LRS):
            assert moved == pytest.approx(lr * g, rel=1e-9)


def test_the_probe_pools_every_rmsprop_of_the_batch():
    """RMSprop per layer (no reading of its step size: probed): each hyper step's η̂ is the
    batch's pooled update Σ_o ⟨Δw_o, g_o⟩ / Σ_o ‖g_o‖², every optimizer measured over its own
    step (rel 1e-9), not one optimizer's response; the layers' responses differ."""
    model, eta, ends = fit_per_layer("rmsprop", every_n_steps=6)
    assert ends == [1, 3, 5, 7]
    assert eta == pytest.approx([pooled(model.parts[b]) for b in ends], rel=1e-9)
    for batch in ends:
        responses = [m / g for m, g in model.parts[batch]]
        assert max(responses) > 1.5 * min(responses)
        assert all(abs(e - responses[-1]) > 1e-3 * e for e in eta)


def test_a_due_step_inside_the_batch_still_probes_the_whole_batch(monkeypatch):
    """``every_n_steps=4`` with 3 optimizer steps per batch: the hyper step runs at the batch
    ending on step 12 (batch 3, 0-based), whose due step is its last; the batches holding
    steps 4 and 8 (the first and second optimizer's) are probed in full too and the hyper
    step reads the latest, batch 3's pooled η̂."""
    monkeypatch.setattr(callback_module, "effective_step_size", lambda optimizers: None)
    model, eta, ends = fit_per_layer("sgd", every_n_steps=4)
    assert ends == [3, 7]
    for got, batch in zip(eta, ends):
        assert got == pytest.approx(pooled(model.parts[batch]), rel=1e-9)
