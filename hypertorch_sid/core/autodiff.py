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
    on (``torch.autograd.grad`` with ``allow_unused=True``)."""
    grads = torch.autograd.grad(
        outputs,
        inputs,
        grad_outputs=grad_outputs,
        create_graph=create_graph,
        retain_graph=retain_graph,
        allow_unused=True,
    )
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
