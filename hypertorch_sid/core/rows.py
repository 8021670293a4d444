"""Row-sparse hypergradients: what the optimizer's checks read of a gradient, and of λ.

A row-indexed hyperparameter family (:class:`~.sample_weights.SampleWeights` with
``sparse_grad=True``) gathers its rows so that autograd gives ∂₂Φ̂ᵀv as a sparse COO tensor
holding only the rows of the minibatch (eq. gradestim's cross term is zero elsewhere). The
optimizer then treats every gradient alike through these functions: the finite check and the
norm read the stored values, and the snapshot taken before the outer step (to restore λ where
the step fails) holds the rows the gradient touches. For a dense gradient each is the usual pass
over the whole tensor; for a sparse one it costs O(rows read), not O(n).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Tensors = list[Tensor]

#: attribute a family sets on its leaf tensor: ∇E w.r.t. it, where E does not read it, is a
#: sparse zero (no n-vector), so the hypergradient stays sparse
ROW_SPARSE = "_hypertorch_sid_row_sparse"


def mark_row_sparse(x: Tensor) -> Tensor:
    """Declare that the gradients of ``x`` are row-sparse (set by the family that owns it)."""
    setattr(x, ROW_SPARSE, True)
    return x


def zero_gradient(x: Tensor) -> Tensor:
    """A zero gradient for ``x``: sparse (no storage) for a row-sparse tensor, else dense."""
    if getattr(x, ROW_SPARSE, False):
        return torch.sparse_coo_tensor(
            torch.zeros((1, 0), dtype=torch.long, device=x.device),
            torch.zeros((0,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device),
            x.shape,
            check_invariants=False,
        )
    return torch.zeros_like(x)


def stored(g: Tensor) -> Tensor:
    """The values ``g`` stores: all of a dense tensor, the (coalesced) rows of a sparse one."""
    return g.coalesce().values() if g.is_sparse else g


def all_finite(gs: Sequence[Tensor]) -> bool:
    """No NaN/Inf in any stored value of ``gs`` (read in one wait for the device where they
    share one)."""
    flags = [torch.isfinite(stored(g)).all() for g in gs]
    if len({f.device for f in flags}) > 1:
        return all(bool(f) for f in flags)
    return not flags or bool(torch.stack(flags).all())


class RowSnapshot:
    """The rows of λ an outer step on the gradient ``g`` changes, kept to check and restore.

    All of λ for a dense gradient; only the gradient's rows for a sparse one (the outer
    optimizer is then taken to move only the rows it is given: ``SGD`` without momentum,
    :class:`~.sample_weights.LazyAdam`).
    """

    def __init__(self, h: Tensor, g: Tensor) -> None:
        self.rows = g.coalesce().indices()[0] if g.is_sparse else None
        data = h.detach()
        self.values = (data if self.rows is None else data.index_select(0, self.rows)).clone()

    def changed(self, h: Tensor) -> Tensor:
        """The rows of ``h`` the step may have changed."""
        return h if self.rows is None else h.detach().index_select(0, self.rows)

    def restore(self, h: Tensor) -> None:
        """Put the saved rows back into ``h`` (in place)."""
        with torch.no_grad():
            if self.rows is None:
                h.copy_(self.values)
            else:
                h.index_copy_(0, self.rows, self.values)


def add(a: Tensor, b: Tensor, scale: float = 1.0) -> Tensor:
    """a + scale·b in whichever order torch allows (dense + sparse is dense, sparse + sparse
    stays sparse); a new tensor."""
    return scale * b + a if a.is_sparse else a + scale * b
