"""The outer objective E(w, λ) and its partial gradients ∇₁E, ∇₂E (eq. gradfv2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from . import rows
from .errors import ConfigurationError, DivergenceError
from .solvers import norm

Tensors = list[Tensor]


def _validation_batches(val_batch: Any) -> tuple[list[Any], bool]:
    """The validation batches E is averaged over, and whether there are several.

    - a ``DataLoader``: the whole validation set in pieces (every batch it yields);
    - a list or tuple of batches, e.g. ``[(X1, y1), (X2, y2)]`` or ``list(val_loader)``: several
      batches, averaged like a DataLoader. It is recognised when every item is itself a batch
      container (a tuple, list or dict holding tensors) and the items agree: same structure,
      and tensors in the same place have the same dtype and the same shape apart from the
      batch dimension;
    - anything else is one batch: a tensor, a dict, ``(X, y)``, ``[X, y]``, and also a nested
      batch such as ``((X_img, X_txt), (y1, y2))`` whose parts differ in shape.

    A nested batch whose parts *do* agree in shape and dtype (``((X1, X2), (Y1, Y2))`` with X1
    shaped like X2) reads as two batches: wrap it as ``[batch]`` to pass it as one.
    """
    if isinstance(val_batch, DataLoader):
        batches = list(val_batch)
        if not batches:
            raise ConfigurationError("the validation DataLoader is empty: it yielded no batch.")
        return batches, True
    if isinstance(val_batch, (list, tuple)) and not _is_namedtuple(val_batch):
        if not val_batch:
            raise ConfigurationError(
                "val_batch is an empty list: pass a batch such as (X_val, y_val), a list of "
                "batches, or a DataLoader over the validation set."
            )
        if _several_batches(val_batch):
            return list(val_batch), True
    return [val_batch], False


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _signature(x: Any) -> Any:
    """The structure of a batch with its tensors' dtype and trailing shape; None if no tensor."""
    if isinstance(x, Tensor):
        return ("tensor", x.dtype, tuple(x.shape[1:]) if x.dim() > 0 else None)
    if isinstance(x, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__ if _is_namedtuple(x) else "seq", tuple(map(_signature, x)))
    return ("other", type(x).__name__)


def _holds_tensor(x: Any) -> bool:
    if isinstance(x, Tensor):
        return True
    if isinstance(x, dict):
        return any(_holds_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds_tensor(v) for v in x)
    return False


def _several_batches(items: list[Any] | tuple[Any, ...]) -> bool:
    """Every item is a batch container holding tensors, and all items share one signature."""
    if not all(isinstance(b, (list, tuple, dict)) and _holds_tensor(b) for b in items):
        return False
    first = _signature(items[0])
    return all(_signature(b) == first for b in items[1:])


def outer_gradients(
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    inner_parameters: Sequence[Tensor],
    hyperparameters: Sequence[Tensor],
) -> tuple[Tensors, Tensors, float]:
    """(∇₁E(w, λ), ∇₂E(w, λ), E(w, λ)) on ``val_batch``.

    ``val_batch`` is one batch, a list of batches or a DataLoader; E and its gradients are
    averaged over several batches (see :func:`_validation_batches` for how a list is read).

    Raises :class:`ConfigurationError` when E depends on neither w nor λ, and
    :class:`DivergenceError` when E or its gradients are not finite. When E depends on λ but not
    on w (e.g. it reads w only through ``w.detach()``), ∇₁E = 0 makes the implicit part of the
    hypergradient zero: a ``UserWarning`` says so (once per call site, by Python's default
    warning filter).
    """
    batches, _ = _validation_batches(val_batch)
    params = list(inner_parameters) + list(hyperparameters)
    total: list[Tensor | None] = [None] * len(params)
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
                acc = total[i]
                scale = 1.0 / len(batches)
                total[i] = g * scale if acc is None else rows.add(acc, g, scale)
        value += float(loss.detach()) / len(batches)
    if not any(used):
        raise ConfigurationError(
            "outer_loss depends on neither the inner parameters nor the hyperparameters: E must "
            "be computed from w and/or λ."
        )
    n = len(inner_parameters)
    if not any(used[:n]):
        warnings.warn(
            "outer_loss does not depend on the inner parameters w (every ∇₁E is unused, e.g. E "
            "reads w only through w.detach() or under torch.no_grad()), only on the "
            "hyperparameters: the implicit part of the hypergradient is zero and only ∇₂E is "
            "used. If E should measure the trained model, compute it from w without .detach().",
            UserWarning,
            stacklevel=2,
        )
    total = [rows.zero_gradient(p) if g is None else g for p, g in zip(params, total)]
    g1, g2 = total[:n], total[n:]
    if not torch.isfinite(torch.tensor(value)) or not rows.all_finite(total):
        raise DivergenceError(
            "outer gradient ∇E",
            None,
            norm(total),
            "The validation loss or its gradient is not finite: check the validation data for "
            "NaN/Inf and that w has not diverged.",
        )
    return g1, g2, value
