"""One ``autograd.grad`` for the core's products: zeros for the inputs the outputs do not reach."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor] | None = None,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> list[Tensor]:
    """∂⟨outputs, grad_outputs⟩/∂inputs, a zero tensor for each input the outputs do not depend
    on (``torch.autograd.grad`` with ``allow_unused=True``). Outputs off autograd's graph (a
    first derivative this function gave as zeros: a block a random draw skipped) add nothing
    and are left out (:func:`on_graph`)."""
    outputs, grad_outputs = on_graph(outputs, grad_outputs)
    if isinstance(outputs, list) and not outputs:
        return [torch.zeros_like(x) for x in inputs]
    grads = torch.autograd.grad(
        outputs,
        inputs,
        grad_outputs=grad_outputs,
        create_graph=create_graph,
        retain_graph=retain_graph,
        allow_unused=True,
    )
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def on_graph(
    outputs: Tensor | Sequence[Tensor], grad_outputs: Sequence[Tensor] | None
) -> tuple[Tensor | list[Tensor], Sequence[Tensor] | None]:
    """``outputs`` (a sequence) without those that do not require grad, with their
    ``grad_outputs``: a gradient that is a constant (the zeros :func:`grad` gives a tensor the
    loss did not read in this draw, e.g. a residual block stochastic depth skipped) has no
    derivative, and torch refuses it as an output ("element 4 of tensors does not require
    grad"; session 63). A single tensor is returned as it is."""
    if isinstance(outputs, Tensor):
        return outputs, grad_outputs  # type: ignore[return-value]
    keep = [i for i, o in enumerate(outputs) if o.requires_grad]
    kept_grads = None if grad_outputs is None else [grad_outputs[i] for i in keep]
    return [outputs[i] for i in keep], kept_grads
