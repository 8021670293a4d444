"""The outer objective E(w, λ) and its partial gradients ∇₁E, ∇₂E (eq. gradfv2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from .errors import ConfigurationError, DivergenceError
from .solvers import norm

Tensors = list[Tensor]


def _validation_batches(val_batch: Any) -> tuple[list[Any], bool]:
    """A DataLoader means 'the whole validation set in pieces'; anything else is one batch."""
    if isinstance(val_batch, DataLoader):
        batches = list(val_batch)
        if not batches:
            raise ConfigurationError("the validation DataLoader is empty: it yielded no batch.")
        return batches, True
    return [val_batch], False


def outer_gradients(
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    inner_parameters: Sequence[Tensor],
    hyperparameters: Sequence[Tensor],
) -> tuple[Tensors, Tensors, float]:
    """(∇₁E(w, λ), ∇₂E(w, λ), E(w, λ)) on ``val_batch`` (a batch, or a DataLoader averaged over).

    Raises :class:`ConfigurationError` when E depends on neither w nor λ, and
    :class:`DivergenceError` when E or its gradients are not finite.
    """
    batches, _ = _validation_batches(val_batch)
    params = list(inner_parameters) + list(hyperparameters)
    total = [torch.zeros_like(p) for p in params]
    value = 0.0
    used = [False] * len(params)
    for batch in batches:
        loss = outer_loss(batch)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ConfigurationError(
                "outer_loss(batch) must return a scalar tensor (the validation objective E)."
            )
        if not loss.requires_grad:
            raise ConfigurationError(
                "outer_loss depends on neither the inner parameters nor the hyperparameters (its "
                "result does not require grad): E must be computed from w and/or λ."
            )
        grads = torch.autograd.grad(loss.reshape(()), params, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                used[i] = True
                total[i].add_(g, alpha=1.0 / len(batches))
        value += float(loss.detach()) / len(batches)
    if not any(used):
        raise ConfigurationError(
            "outer_loss depends on neither the inner parameters nor the hyperparameters: E must "
            "be computed from w and/or λ."
        )
    n = len(inner_parameters)
    g1, g2 = total[:n], total[n:]
    if not torch.isfinite(torch.tensor(value)) or not all(torch.isfinite(g).all() for g in total):
        raise DivergenceError(
            "outer gradient ∇E",
            None,
            norm(total),
            "The validation loss or its gradient is not finite: check the validation data for "
            "NaN/Inf and that w has not diverged.",
        )
    return g1, g2, value
