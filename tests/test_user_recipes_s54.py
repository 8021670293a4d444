"""Session 54's unseen recipes and session 53's two leftovers: each test fails without its fix
(docs/failures.md, "Unseen user recipes (session 54)"; the recipes:
benchmarks/bench_user_recipes_s54.py)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.budget import OverheadBudget


def _trainer(callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n: int = 192) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return (
        DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16, shuffle=True),
        DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32),
    )


# ------------------------------------------- a budget that ran a few of the due hyper steps


def _priced_fit(per_product: float, steps: int) -> tuple[LearnedWeightDecay, list[str]]:
    """The drop-in (a hyper step every 4 steps) under ``max_overhead=0.5`` with a counted clock:
    a training step costs 1, a Hessian–vector product ``per_product`` (no timing)."""
    train, val = _data()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4)

    def units() -> float:
        c = cb.sid.cost if cb.sid is not None else None
        return 0.0 if c is None else per_product * (c.jacobian_vector_products
                                                    + c.curvature_products)  # fmt: skip

    cb.budget = OverheadBudget(0.5, clock=lambda: float(trainer.global_step) + units())
    trainer = _trainer([cb], max_steps=steps, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), train, val)
    return cb, [str(w.message) for w in caught]


def test_a_budget_that_ran_a_few_of_the_due_hyper_steps_says_so() -> None:
    # Before session 54 a budget that allowed 1–3 of a fit's many due hyper steps said nothing,
    # and the user read λ as tuned (session 53: 3–4 of 11 on 20 Newsgroups).
    cb, said = _priced_fit(per_product=4.0, steps=200)
    due, ran = cb._due_in_fit, cb._ran_in_fit
    assert due == 50 and 0 < ran < 10, (due, ran)
    cut = [m for m in said if "ran only" in m]
    assert len(cut) == 1, said
    assert f"ran only {ran} of the {due} hyper steps due" in cut[0]
    assert "max_overhead=0.5" in cut[0] and "max_overhead=None" in cut[0]
    assert not any("allowed none" in m for m in said)  # one warning, not the other's too


def test_a_budget_that_cut_a_few_of_many_due_says_nothing() -> None:
    # the budget's ordinary spacing (more than half of the due hyper steps ran) is no warning
    from hypertorch_sid.lightning.metrics import budget_cut

    assert budget_cut(9, 12, 10, 0.5) is None and budget_cut(5, 7, 10, 0.5) is None
    assert budget_cut(12, 40, 10, 0.5) is None  # enough ran
    assert "ran only 3 of the 11" in budget_cut(3, 11, 10, 0.5)


def test_a_budget_that_ran_none_says_so_once_through_the_same_check() -> None:
    cb, said = _priced_fit(per_product=200.0, steps=60)
    assert cb._ran_in_fit == 0 and cb._due_in_fit == 15
    assert sum("allowed none of the 15 hyper steps" in m for m in said) == 1
    assert not any("ran only" in m for m in said)


def test_every_due_hyper_step_run_says_nothing_of_the_budget() -> None:
    train, val = _data()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([cb], max_steps=60, limit_val_batches=0).fit(Net(), train, val)
    assert cb._ran_in_fit == cb._due_in_fit == 15
    assert not any("ran only" in str(w.message) for w in caught)


# ------------------------------------------------------ λ driven far below any effect


def test_lambda_driven_below_any_effect_is_said_to_be_off(caplog) -> None:
    # Before session 54 a λ at 1e-30 ended the fit silently; printed, it read like a fault.
    train, val = _data()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    trainer = _trainer([cb], max_steps=8, limit_val_batches=0)
    module = Net()
    original = cb._hyper_step

    def hyper_step(trainer, module):  # the hyper steps reach λ = 1e-30 on the first tensor
        original(trainer, module)
        with torch.no_grad():
            cb.problem.decay.hyperparameters[0][0].fill_(torch.tensor(1e-30).log())

    cb._hyper_step = hyper_step
    with caplog.at_level(logging.INFO):
        trainer.fit(module, train, val)
    lam = cb.decay_values()
    first = next(iter(lam))
    assert float(lam[first].max()) == pytest.approx(1e-30, rel=1e-3)  # the maths unchanged
    said = [r.getMessage() for r in caplog.records if "effectively off" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert (
        "1 of the 2 learned λ (net.0)" in said[0]
        and "1e-30" in said[0]
        and "min_weight_decay" in said[0]
    )


def test_lambda_with_an_effect_is_not_said_to_be_off(caplog) -> None:
    train, val = _data()
    cb = LearnedWeightDecay(1e-2, every_n_steps=4, max_overhead=None)
    with caplog.at_level(logging.INFO):
        _trainer([cb], max_steps=8, limit_val_batches=0).fit(Net(), train, val)
    assert not any("effectively off" in r.getMessage() for r in caplog.records)


# ------------------------------- gradient checkpointing that cuts the gradient (reentrant)


class Reentrant(Net):
    """A block under ``checkpoint(..., use_reentrant=True)`` on the raw inputs (no grad): the
    block gets no gradient, in plain training too (torch only warns)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        from torch.utils.checkpoint import checkpoint

        x, y = batch
        h = checkpoint(self.net[0], x, use_reentrant=True)
        return F.cross_entropy(self.net[2](self.net[1](h)), y)


def test_a_gradient_cut_by_reentrant_checkpointing_is_named() -> None:
    # Before session 54 the refusal called the checkpointed block "a layer the training never
    # uses" — the user calls it in every forward — and named no fix for the cut gradient.
    from hypertorch_sid import ConfigurationError

    train, val = _data()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError, match=r"net\.0\.weight.*use_reentrant=False"):
            _trainer([cb], max_steps=8, limit_val_batches=0).fit(Reentrant(), train, val)


class ReentrantRows(Net):
    """The same cut under per-sample losses (``LearnedDataWeights``)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        from torch.utils.checkpoint import checkpoint

        x, y = batch
        h = checkpoint(self.net[0], x, use_reentrant=True)
        return F.cross_entropy(self.net[2](self.net[1](h)), y, reduction="none")


def test_a_gradient_cut_by_reentrant_checkpointing_is_named_under_data_weights() -> None:
    # Before: the core's refusal named only "a layer the training never uses (e.g. an EMA copy)".
    from hypertorch_sid import ConfigurationError, IndexedDataset, LearnedDataWeights

    train, val = _data()
    rows = DataLoader(IndexedDataset(train.dataset), batch_size=16, shuffle=True)
    cb = LearnedDataWeights(every_n_steps=4, start_step=0, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError, match=r"net\.0\.weight.*use_reentrant=False"):
            _trainer([cb], max_steps=8, limit_val_batches=0).fit(ReentrantRows(), rows, val)


class Rows(Net):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")


class StopAt(pl.Callback):
    """What EarlyStopping does, at a known step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        trainer.should_stop = trainer.global_step >= self.step


@pytest.mark.parametrize("stop, said", [(20, True), (None, False)])
def test_a_fit_stopped_early_after_its_first_hyper_step_says_the_weights_say_little(
    stop: int | None, said: bool
) -> None:
    # Before: a noisy-label recipe under EarlyStopping(patience=3) stopped at step 80 of 256,
    # just after its first hyper step: weights at their start, flagged() empty, no word.
    from hypertorch_sid import IndexedDataset, LearnedDataWeights

    train, val = _data()
    rows = DataLoader(IndexedDataset(train.dataset), batch_size=16, shuffle=True)
    cb = LearnedDataWeights(start_step=16, every_n_steps=16, max_overhead=None)
    stops = [StopAt(stop)] if stop else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([cb, *stops], max_epochs=10, limit_val_batches=0).fit(Rows(), rows, val)
    told = [w for w in caught if "stopped at optimizer step" in str(w.message)]
    assert bool(told) == said
