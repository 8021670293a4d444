"""Four leftovers of session 62's careless-input and recipe rounds (docs/failures.md, "Session
62: the leftovers"): each test failed before its fix."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import torch
from pytorch_lightning.utilities import CombinedLoader

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.core.budget import OverheadBudget, PacedBudget, PlannedBudget
from hypertorch_sid.core.errors import ConfigurationError
from tests.test_user_recipes_s54 import Net, _data, _trainer


# ------------------------------------------------------------------ 1. a user's budget
@pytest.mark.parametrize("kind", [PlannedBudget, PacedBudget, OverheadBudget])
@pytest.mark.parametrize("value", [-1, 0, float("nan"), "fast"])
def test_a_users_refused_budget_names_its_class(kind, value) -> None:
    """Before: "max_overhead must be a number > 0 …", no class named."""
    with pytest.raises(ConfigurationError, match=rf"^{kind.__name__}: max_overhead must be"):
        kind(value)


# ------------------------------------------------------------------ 2. percent-like warning
@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: LearnedDataWeights(max_overhead=50), "LearnedDataWeights"),
        (lambda: LearnedWeightDecay(max_overhead=50), "LearnedWeightDecay"),
        (lambda: PlannedBudget(50), "PlannedBudget"),
    ],
)
def test_a_percent_like_max_overhead_is_warned_in_its_owners_name(make, name) -> None:
    """Before: the warning began "hypertorch_sid: max_overhead=50 …"."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        make()
    told = [str(w.message) for w in said if "max_overhead=50" in str(w.message)]
    assert len(told) == 1 and told[0].startswith(f"{name}: max_overhead=50 allows"), told


# ------------------------------------------------------------------ 3. a negative loss
def test_decay_off_reads_a_negative_training_loss_by_its_size() -> None:
    """Before: "below 1e-06 of the training loss (-0.108)", a share of a negative number."""
    train, val = _data()
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    original = cb._hyper_step

    def hyper_step(trainer, module):  # λ = 1e-30 on the first tensor
        original(trainer, module)
        with torch.no_grad():
            cb.problem.decay.hyperparameters[0][0].fill_(torch.tensor(1e-30).log())

    cb._hyper_step = hyper_step
    _trainer([cb], max_steps=8, limit_val_batches=0).fit(Net(), train, val)
    said = cb.problem.decay_off(-0.108)
    assert said is not None and "effectively off" in said
    assert "training loss's size (0.108; the loss is -0.108)" in said, said
    assert "loss (-0.108)" not in said
    assert "training loss (2.5)" in cb.problem.decay_off(2.5)  # a positive loss as before


# ------------------------------------------------------------------ 4. CombinedLoader of val
class SeveralVal(Net):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("form", ["list", "combined", "combined_dict"])
def test_several_validation_loaders_are_read_alike_in_every_form(form, validate, caplog) -> None:
    """Before: a CombinedLoader of validation loaders was refused ("combine the data in one
    DataLoader") while a list of two was read by its first."""
    train, val = _data()
    second = torch.utils.data.DataLoader(val.dataset, batch_size=8)
    given = {
        "list": [val, second],
        "combined": CombinedLoader([val, second], "sequential"),
        "combined_dict": CombinedLoader({"held_out": val, "probe": second}, "sequential"),
    }[form]
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    limit = {} if validate else {"limit_val_batches": 0}
    with caplog.at_level(logging.INFO):
        _trainer([cb], max_steps=8, **limit).fit(SeveralVal(), train, given)
    assert cb._ran_in_fit == 2
    assert cb.data.val_dataset is val.dataset  # the first loader's, not the second's
    said = [r.getMessage() for r in caplog.records if "using the first of 2" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
