"""Session 60's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 60)"; the recipes: benchmarks/bench_user_recipes_s60.py)."""

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

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.core.directional import ForwardDifference
from hypertorch_sid.lightning.cross_term import directional_losses


class GradPenalty(pl.LightningModule):
    """Cross entropy + the squared norm of its gradient in the input, per sample (double
    back-propagation inside ``training_step``), with dropout; per-sample losses on request."""

    def __init__(self, per_sample: bool = False, wd: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.per_sample, self.wd = per_sample, wd
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x.clone().requires_grad_(True)
        ce = F.cross_entropy(self(x), y, reduction="none")
        (gx,) = torch.autograd.grad(ce.sum(), x, create_graph=True)
        loss = ce + 0.1 * gx.pow(2).sum(1)
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=self.wd)


def _fit(cb: Any, per_sample: bool) -> tuple[GradPenalty, list[str]]:
    train, val = three_class_sets()
    model = GradPenalty(per_sample, wd=0.0 if isinstance(cb, LearnedWeightDecay) else 1e-3)
    trainer = pl.Trainer(
        max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    data = IndexedDataset(train) if per_sample else train
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            model, DataLoader(data, batch_size=16, shuffle=True), DataLoader(val, batch_size=32)
        )
    return model, [str(w.message) for w in caught]


def test_a_gradient_penalty_step_trains_with_the_learned_decay() -> None:
    """A ``training_step`` that differentiates inside itself (``torch.autograd.grad(...,
    create_graph=True)``: a gradient penalty) runs as Lightning runs it. Before: the
    scale-invariance probe called it under ``torch.no_grad`` and the fit failed with
    "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    model, _ = _fit(cb, per_sample=False)
    assert len(cb.history) == 6  # 24 steps, a hyper step every 4
    lam = [float(v.mean()) for v in cb.learned_weight_decay.values()]
    assert all(v != 1e-3 for v in lam)  # the hyper steps moved λ
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_gradient_penalty_step_trains_with_the_data_weights() -> None:
    """The same step with ``LearnedDataWeights``: its cross term's difference of losses (under
    ``torch.no_grad``) called it too. Before: the same RuntimeError."""
    cb = LearnedDataWeights(every_n_steps=4, start_step=4, max_overhead=None)
    _fit(cb, per_sample=True)
    w = cb.data_weights()
    assert len(cb.history) == 6 and torch.isfinite(w).all()  # steps 4, 8, ..., 24
    assert float(w.std()) > 0  # the rows' weights moved apart


def test_the_difference_of_losses_of_a_gradient_penalty_step_is_its_directional_derivative():
    """The cross term's uᵢ = ⟨∇ℓᵢ(w), v⟩ by a difference of losses through the retried step
    (autograd on, the step's dropout replayed) against the per-sample gradients by autograd."""
    train, _ = three_class_sets()
    model = GradPenalty(per_sample=True).eval()  # no dropout: the oracle's loss is the same
    batch = (train.tensors[0][:8], train.tensors[1][:8])
    params = [p for p in model.parameters()]
    g = torch.Generator().manual_seed(1)
    tangents = [torch.randn(p.shape, generator=g) for p in params]
    with torch.no_grad():
        u = directional_losses(
            model, model.training_step, batch, params, tangents, ForwardDifference()
        )
    exact = []
    for i in range(8):
        row = (batch[0][i : i + 1], batch[1][i : i + 1])
        grads = torch.autograd.grad(model.training_step(row, 0).sum(), params)
        exact.append(sum((gr * t).sum() for gr, t in zip(grads, tangents)))
    assert not u.requires_grad
    torch.testing.assert_close(u, torch.stack(exact).detach(), rtol=2e-2, atol=2e-3)


def test_a_step_failing_for_another_reason_is_called_once_and_its_error_kept() -> None:
    """Control: only torch's "does not require grad" is retried with autograd on; another
    error (a batch the step cannot read) is raised at once, the step called once."""
    from hypertorch_sid.lightning.isolation import as_in_training

    calls = []

    def step() -> Tensor:
        calls.append(torch.is_grad_enabled())
        raise RuntimeError("shape mismatch")

    with torch.no_grad(), pytest.raises(RuntimeError, match="shape mismatch"):
        as_in_training(nn.Linear(2, 2), step)
    assert calls == [False]


def test_the_autocast_fallback_names_the_drop_in_and_the_setting_to_pass() -> None:
    """Under ``precision="bf16-mixed"`` the data weights' default difference of losses falls
    back to dual numbers and says so. Before: "ForwardDifference: ... Pass
    directional=ForwardMode() to silence this." (a class the user never named, a setting of
    no object they know); now the drop-in and its string setting."""
    train, _ = three_class_sets()
    model = nn.Linear(6, 3)
    batch = (train.tensors[0][:8], train.tensors[1][:8])
    params = list(model.parameters())
    tangents = [torch.ones_like(p) for p in params]

    def step(data: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(model(data[0]), data[1], reduction="none")

    with (
        warnings.catch_warnings(record=True) as caught,
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        warnings.simplefilter("always")
        u = directional_losses(model, step, batch, params, tangents, ForwardDifference())
    said = [str(w.message) for w in caught if "ForwardDifference" in str(w.message)]
    assert u.shape == (8,) and len(said) == 1
    assert 'LearnedDataWeights(directional="forward_mode")' in said[0]
    assert LearnedDataWeights(directional="forward_mode").directional.__class__.__name__ == (
        "ForwardMode"
    )
