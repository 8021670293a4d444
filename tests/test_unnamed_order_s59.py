"""Hyperparameters named on neither side (session 59): a state saved with unnamed λ of distinct
shapes and loaded into an optimizer given them in another order is refused by their shapes,
nothing changed; where the shapes are equal no check can tell them apart (docs/core.md)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor

from hypertorch_sid import ConfigurationError, SIDConfig, SIDHyperOptimizer

F64 = torch.float64


def ridge(order: tuple[str, str]) -> SIDHyperOptimizer:
    """λ_a (shape (1,)) decays w[:2], λ_b (shape (2,)) w[2:], given unnamed in ``order``."""
    lam = {
        "a": torch.zeros(1, dtype=F64, requires_grad=True),
        "b": torch.full((2,), -0.5, dtype=F64, requires_grad=True),
    }
    w = torch.zeros(4, dtype=F64, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g, dtype=F64), torch.randn(100, generator=g, dtype=F64)

    def fit(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    def inner(b: Any) -> Tensor:
        return fit(b) + 0.5 * (torch.cat([lam["a"].exp().expand(2), lam["b"].exp()]) * w**2).sum()

    tensors = [lam[n] for n in order]
    hopt = SIDHyperOptimizer(
        tensors, [w], inner, fit, torch.optim.Adam(tensors, lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )  # fmt: skip
    hopt.batches = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 80, 20)]  # type: ignore[attr-defined]
    hopt.val = (x[80:], y[80:])  # type: ignore[attr-defined]
    return hopt


def test_unnamed_lambdas_of_distinct_shapes_in_another_order_are_refused():
    saved = ridge(("a", "b"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            saved.step(saved.batches, saved.val)  # type: ignore[attr-defined]
    state = saved.state_dict()
    assert state["hyperparameter_names"] == [None, None]
    other = ridge(("b", "a"))
    before = [h.detach().clone() for h in other.hyperparameters]
    adam_before = str(other.outer_optimizer.state_dict())
    with pytest.raises(
        ConfigurationError, match=r"shapes \[\(1,\), \(2,\)\], these have \[\(2,\), \(1,\)\]"
    ):
        other.load_state_dict(state)
    assert all(torch.equal(h, b) for h, b in zip(other.hyperparameters, before))
    assert str(other.outer_optimizer.state_dict()) == adam_before
    same = ridge(("a", "b"))  # control: the same order loads
    same.load_state_dict(state)
    assert all(torch.equal(h, s) for h, s in zip(same.hyperparameters, state["hyperparameters"]))
