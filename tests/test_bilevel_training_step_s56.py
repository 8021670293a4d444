"""A ``training_step`` that minimises something else than ``inner_loss`` (session 56).

The hyper steps differentiate ``inner_loss`` (ℓ̂(w, λ; ζ)) as the objective Lightning's training
minimises. A ``training_step`` returning ``inner_loss(batch) + extra`` (an auxiliary loss, a
penalty, a scaled loss, augmented inputs) used to pass silently, since it reads λ: λ was tuned
for a training that is not the one run. At the first training step the module now compares the
loss the step returns with ``inner_loss`` on the same batch (same w, λ and random draws) and
warns where they differ. See docs/bilevel-module.md, "Session 56: a training_step that
minimises something else than inner_loss".
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from lightning_problems import Ridge, loaders, ridge_data, trainer

from hypertorch_sid import BilevelModule
from hypertorch_sid.lightning import HyperOptimizationCallback

ANOTHER = "minimises another objective than the inner_loss"
f64 = torch.float64


def _fit(model: Any, max_epochs: int = 1) -> list[warnings.WarningMessage]:
    """Fit ``model`` on the ridge data with a hyper-optimization callback; the warnings."""
    train, val = loaders(ridge_data(), 20)
    callback = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([callback], max_epochs=max_epochs, limit_val_batches=0).fit(model, train, val)
    return list(caught)


def _another(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if ANOTHER in str(w.message)]


class Counting(Ridge):
    """The ridge problem (w starting at 0.5, so that ‖w‖² ≠ 0 at the first step) counting the
    ``inner_loss`` evaluations."""

    def __init__(self) -> None:
        super().__init__(w0=0.5)
        self.calls = 0

    def inner_loss(self, batch: Any) -> torch.Tensor:
        self.calls += 1
        return super().inner_loss(batch)


class Penalised(Counting):
    """Before: passed silently — it reads λ (through inner_loss) but minimises ℓ̂ + ½‖w‖²."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.inner_loss(batch) + 0.5 * (self.lin.weight**2).sum()


class Scaled(Counting):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return 2 * self.inner_loss(batch)


class DictPenalised(Counting):
    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"loss": self.inner_loss(batch) + 0.5 * (self.lin.weight**2).sum()}


@pytest.mark.parametrize("module", [Penalised, Scaled, DictPenalised])
def test_a_training_step_returning_another_loss_is_warned_with_both_values(module):
    model = module()
    messages = _another(_fit(model))
    assert len(messages) == 1  # once, at the first step
    # both values are named, and the fix
    first = next(iter(loaders(ridge_data(), 20)[0]))
    fresh = module()
    with torch.no_grad():
        reference = float(fresh.inner_loss(first))
        returned = fresh.training_step(first, 0)
        returned = float(returned["loss"] if isinstance(returned, dict) else returned)
    assert f"{returned:.6g}" in messages[0] and f"{reference:.6g}" in messages[0]
    assert "let training_step return self.inner_loss(batch)" in messages[0]


class Same(Counting):
    """A training_step of its own that returns inner_loss (and logs): the control."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.inner_loss(batch)
        self.log("my/loss", loss)
        return loss


class DictSame(Counting):
    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"loss": self.inner_loss(batch), "extra": torch.tensor(3.0)}


@pytest.mark.parametrize("module", [Same, DictSame])
def test_control_a_training_step_returning_inner_loss_costs_one_extra_forward(module):
    model, default = module(), Counting()
    assert not _another(_fit(model)) and not _another(_fit(default))
    assert model.calls == default.calls + 1  # one reference forward, at the first step


def test_control_the_default_training_step_is_not_checked(monkeypatch):
    model = Counting()
    assert not _another(_fit(model))
    monkeypatch.setattr(BilevelModule, "_reference_inner_loss", lambda *args: None)
    unchecked = Counting()
    _fit(unchecked)
    assert model.calls == unchecked.calls  # no extra forward


class Skipping(Counting):
    """Returns None on the first batch (Lightning skips it), inner_loss (+ ``extra``·‖w‖²) after."""

    def __init__(self, extra: float = 0.0) -> None:
        super().__init__()
        self.extra = extra

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        if batch_idx == 0:
            return None
        return self.inner_loss(batch) + self.extra * (self.lin.weight**2).sum()


def test_a_skipped_first_step_leaves_the_checks_to_the_next_batch():
    """Before: a step skipped at the first batch (it reads no λ) was refused as a training that
    ignores λ. Now both checks wait for the next batch that returns a loss."""
    assert not _another(_fit(Skipping()))
    assert len(_another(_fit(Skipping(extra=0.5)))) == 1


class Manual(Counting):
    """Manual optimisation: the step returns nothing Lightning minimises; no check, no forward."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.inner_loss(batch)
        self.manual_backward(loss)
        opt.step()
        return 3 * loss  # not what is minimised: manual optimisation minimises `loss`


def test_manual_optimisation_is_not_checked():
    model, default = Manual(), Counting()
    assert not _another(_fit(model))
    _fit(default)
    assert model.calls == default.calls  # no reference forward


class Noisy(BilevelModule):
    """A small network with dropout, BatchNorm and a NumPy-drawn input noise in ``inner_loss``:
    every random stream and buffer the reference forward could disturb."""

    def __init__(self, extra: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(5, 8, dtype=f64),
            torch.nn.BatchNorm1d(8, dtype=f64),
            torch.nn.Tanh(),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(8, 1, dtype=f64),
        )
        self.register_hyperparameter("log_lam", torch.tensor(-2.0, dtype=f64))
        self.extra = extra

    def _fit(self, batch: Any) -> torch.Tensor:
        x, y = batch
        x = x + 0.05 * torch.from_numpy(np.random.randn(*x.shape))
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def inner_loss(self, batch: Any) -> torch.Tensor:
        penalty = sum((p**2).sum() for p in self.inner_parameters())
        return self._fit(batch) + 0.5 * self.log_lam.exp() * penalty

    def outer_loss(self, batch: Any) -> torch.Tensor:
        return self._fit(batch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.inner_loss(batch) + self.extra * (self.net[0].weight ** 2).sum()
        # draws after inner_loss (a random sample to log, say): the fit's streams move on
        if torch.rand(()) + np.random.rand() + random.random() < 0:
            self.print("never")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.05)


def _noisy_fit(monkeypatch: pytest.MonkeyPatch | None) -> tuple[list[str], dict[str, Any]]:
    if monkeypatch is not None:  # the check disabled: no reference forward
        monkeypatch.setattr(BilevelModule, "_reference_inner_loss", lambda *args: None)
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    model = Noisy()
    messages = _another(_fit(model, max_epochs=2))
    return messages, {k: v.clone() for k, v in model.state_dict().items()}


def test_the_check_leaves_a_random_fit_unchanged(monkeypatch):
    """Same seed, dropout + BatchNorm + NumPy noise: the fit with the check (one reference
    forward at the first step) ends on the same weights, running statistics and λ, to the bit,
    as the fit without it; and the randomness is not taken for another objective."""
    messages, checked = _noisy_fit(None)
    assert not messages
    _, unchecked = _noisy_fit(monkeypatch)
    assert checked.keys() == unchecked.keys()
    for k in checked:
        assert torch.equal(checked[k], unchecked[k]), k
    assert not torch.equal(checked["log_lam"], torch.tensor(-2.0, dtype=f64))  # λ was tuned


def test_an_auxiliary_term_is_found_through_dropout():
    """The reference forward draws what the step draws, so a small extra term is told apart
    from the randomness exactly."""
    torch.manual_seed(1)
    np.random.seed(1)
    assert len(_another(_fit(Noisy(extra=0.01)))) == 1


class Augmented(Counting):
    """A loss on augmented inputs: training_step draws noise before inner_loss. Its objective is
    E_noise[ℓ̂(w, λ; ζ + noise)], not inner_loss; the fix puts the augmentation in inner_loss."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.inner_loss((x + 0.3 * torch.randn_like(x), y))


def test_a_loss_on_augmented_inputs_is_warned():
    torch.manual_seed(0)
    assert len(_another(_fit(Augmented()))) == 1
