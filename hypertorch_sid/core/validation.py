"""Input checks with errors that say what is wrong and how to fix it."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigurationError


def as_tensor_list(xs: Iterable[Tensor] | Tensor, name: str) -> list[Tensor]:
    """A list of tensors from a tensor, a list, or ``module.parameters()``."""
    if isinstance(xs, Tensor):
        xs = [xs]
    xs = list(xs)
    if not xs:
        raise ConfigurationError(f"{name} is empty: pass at least one tensor.")
    for i, x in enumerate(xs):
        if not isinstance(x, Tensor):
            raise ConfigurationError(f"{name}[{i}] is a {type(x).__name__}, not a torch.Tensor.")
    return xs


def check_parameters(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """w and λ: leaf tensors that require grad, disjoint, on one device, floating point."""
    for name, xs in (("hyperparameters", hyper), ("inner_parameters", inner)):
        for i, x in enumerate(xs):
            if not x.is_floating_point():
                raise ConfigurationError(f"{name}[{i}] has dtype {x.dtype}; use a float dtype.")
            if not x.requires_grad:
                raise ConfigurationError(
                    f"{name}[{i}] does not require grad: create it with requires_grad=True "
                    "(or call .requires_grad_())."
                )
            if not x.is_leaf:
                raise ConfigurationError(
                    f"{name}[{i}] is not a leaf tensor (it was computed from other tensors). Pass "
                    "the leaf you optimise, e.g. log_lam, and compute λ = log_lam.exp() inside "
                    "the losses."
                )
    inner_ids = {id(x) for x in inner}
    shared = [i for i, x in enumerate(hyper) if id(x) in inner_ids]
    if shared:
        raise ConfigurationError(
            f"hyperparameters at positions {shared} are also inner parameters: λ and w must be "
            "different tensors."
        )
    devices = {x.device for x in list(inner) + list(hyper)}
    if len(devices) > 1:
        raise ConfigurationError(
            "inner parameters and hyperparameters are on different devices "
            f"{sorted(map(str, devices))}; move them to one device."
        )
    dtypes = {x.dtype for x in list(inner) + list(hyper)}
    if len(dtypes) > 1:
        raise ConfigurationError(
            "inner parameters and hyperparameters have different dtypes "
            f"{sorted(map(str, dtypes))}; use one dtype (e.g. all float32 or all float64)."
        )


def check_outer_optimizer(
    optimizer: torch.optim.Optimizer, inner: Sequence[Tensor], hyper: Sequence[Tensor]
) -> None:
    """The outer optimizer must hold every λ and no w."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigurationError(
            f"outer_optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}."
        )
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    inner_ids = {id(x) for x in inner}
    if held & inner_ids:
        raise ConfigurationError(
            "outer_optimizer holds inner parameters: it must optimise only the hyperparameters "
            "(the inner parameters are updated by the inner solve)."
        )
    missing = [i for i, x in enumerate(hyper) if id(x) not in held]
    if missing:
        raise ConfigurationError(
            f"hyperparameters at positions {missing} are not in outer_optimizer: build it as "
            "torch.optim.Adam(hyperparameters, ...)."
        )


def check_inner_optimizers(
    optimizers: Iterable[torch.optim.Optimizer], hyper: Sequence[Tensor]
) -> None:
    """No inner (training) optimizer may hold a hyperparameter."""
    hyper_ids = {id(x): i for i, x in enumerate(hyper)}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) in hyper_ids:
                    raise ConfigurationError(
                        f"hyperparameter {hyper_ids[id(p)]} is also in the training optimizer "
                        f"{type(opt).__name__}: the training optimizer must see only the inner "
                        "parameters (use BilevelModule.inner_parameters())."
                    )


def check_steps(name: str, value: int, minimum: int) -> int:
    """A step count that is an integer ≥ ``minimum`` (a Python or NumPy int, not a bool)."""
    if not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= minimum:
        return int(value)
    raise ConfigurationError(f"{name} must be an integer ≥ {minimum}, got {value!r}.")


def check_dependencies(
    inner_loss: Callable[[Any], Tensor],
    batch: Any,
    inner: Sequence[Tensor],
    hyper: Sequence[Tensor],
) -> None:
    """ℓ̂ must depend on every inner parameter and on at least one hyperparameter."""
    loss = inner_loss(batch)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise ConfigurationError("inner_loss(batch) must return a scalar tensor.")
    if not loss.requires_grad:
        raise ConfigurationError(
            "inner_loss does not depend on the inner parameters (its result does not require grad)."
        )
    grads = torch.autograd.grad(loss.reshape(()), list(inner) + list(hyper), allow_unused=True)
    unused_w = [i for i, g in enumerate(grads[: len(inner)]) if g is None]
    if unused_w:
        raise ConfigurationError(
            f"inner_loss does not depend on inner parameters at positions {unused_w}: leave them "
            "out of inner_parameters (they have no fixed point to solve for)."
        )
    if all(g is None for g in grads[len(inner) :]):
        raise ConfigurationError(
            "inner_loss depends on none of the hyperparameters: the implicit part of the "
            "hypergradient would be zero. Use λ inside the training objective (e.g. a penalty "
            "0.5 * (log_lam.exp() * w**2).sum())."
        )
