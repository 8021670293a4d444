"""Careless users, session 59: a torch.optim class given as outer_optimizer without a learning
rate.

Each case failed before its fix (silently wrong, or a raw or misleading error); the controls
passed before and after. See docs/failures.md, "Careless inputs (session 59)".
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import QUICK, TOY_X, TOY_Y, ToyClassifier, trainer
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.core.outer_step import ReachRprop

X, Y = TOY_X, TOY_Y


def _said(make: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [str(w.message) for w in caught if "without a learning rate" in str(w.message)]


@pytest.mark.parametrize("drop_in", [LearnedWeightDecay, LearnedDataWeights])
@pytest.mark.parametrize(
    "factory, lr",
    [(torch.optim.Adam, "0.001"), (functools.partial(torch.optim.SGD, momentum=0.9), "0.001")],
    ids=["Adam", "partial-SGD-no-lr"],
)
def test_a_torch_optimizer_given_without_a_learning_rate_is_said(
    drop_in: type, factory: Any, lr: str
) -> None:
    """outer_optimizer=torch.optim.Adam ran at torch's lr=0.001 instead of the drop-in's own
    outer step (0.3 on log λ for LearnedWeightDecay): λ barely moved (1e-4 → 9.94e-5 on the toy
    fit below, against 5e-6 under the default), with nothing said. Now a warning names torch's
    lr and the fix."""
    said = _said(lambda: drop_in(outer_optimizer=factory))
    assert len(said) == 1 and f"default lr={lr}" in said[0] and "functools.partial" in said[0]


@pytest.mark.parametrize(
    "factory",
    [functools.partial(torch.optim.Adam, lr=0.1), ReachRprop, lambda p: torch.optim.Adam(p)],
    ids=["partial-with-lr", "own-outer-step", "lambda"],
)
def test_control_an_outer_optimizer_with_its_own_step_is_not_warned(factory: Any) -> None:
    assert not _said(lambda: LearnedWeightDecay(outer_optimizer=factory))


def test_the_bare_class_moves_lambda_far_less_than_the_default() -> None:
    """The defect the warning names, measured: the same toy fit, λ₀ = 1e-4."""
    moved = []
    for outer in (None, torch.optim.Adam):
        cb = LearnedWeightDecay(1e-4, outer_optimizer=outer, **QUICK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer([cb], max_epochs=2).fit(
                ToyClassifier(),
                DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16),
                DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20),
            )
        lam = torch.cat(list(cb.learned_weight_decay.values()))
        moved.append(float((lam.log() - torch.log(torch.tensor(1e-4))).abs().max()))
    assert moved[1] < 0.1 * moved[0]
