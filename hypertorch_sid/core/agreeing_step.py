"""The agreeing outer step: :class:`LazyAdam` whose step on a row is gated by whether the row's
evidence at this visit agrees in sign with its evidence at the last one (session 54)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .lazy_adam import LazyAdam

__all__ = ["AgreeingLazyAdam"]


def _rows_read(g: Tensor) -> tuple[Tensor, Tensor]:
    """The rows a gradient reads and their values (sparse: its indices; dense: its non-zero
    rows), as :class:`LazyAdam` finds them."""
    if g.is_sparse:
        g = g.coalesce()
        return g.indices()[0], g.values()
    flat = g.reshape(g.shape[0], -1) if g.dim() > 1 else g.reshape(-1, 1)
    rows = torch.nonzero(flat.ne(0).any(1)).flatten()
    return rows, g.index_select(0, rows)


class AgreeingLazyAdam(LazyAdam):
    """:class:`LazyAdam` that moves a row its full step only where this visit's hypergradient
    agrees in sign with the row's previous visit's, and not at all where they disagree:

        aᵢ = (1 + sign gᵢᵗ · sign gᵢᵗ⁻¹) / 2,   xᵢ ← xᵢ − lr · aᵢ · m̂ᵢ / sᵢ,        (eq. agreestep)

    with sign gᵢ⁰ = 0, so a row's first visit moves half a step. Successive visits of a row read
    independent validation minibatches, so this is a split-half check of the row's evidence over
    time. Why it separates noise from evidence where a shrunk step did not (docs/failures.md,
    session 53): if a row's hypergradient is negative with probability p at each visit (q = 1 − p),
    the plain step's drift per visit is q − p and its variance 1 − (q − p)²; the agreeing step's
    drift is q² − p² = q − p, the same, while it moves at all with probability p² + q² only — a
    row whose evidence is a coin (p = ½) moves half as often, a row with consistent evidence as
    fast as before. Everything else (β's, ``row_scale``, ``scale_prior``, the lazy rows) is
    :class:`LazyAdam`'s.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        read = []  # (p, rows, sign of this visit's evidence, the rows before the step)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                rows, values = _rows_read(p.grad)
                if rows.numel():
                    read.append((p, rows, values.sign(), p.index_select(0, rows).clone()))
        super().step()
        for p, rows, sign, before in read:
            state = self.state[p]
            if "last_sign" not in state:
                state["last_sign"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            agree = (1 + sign * state["last_sign"].index_select(0, rows)) / 2  # eq. agreestep
            moved = p.index_select(0, rows) - before
            p.index_copy_(0, rows, before + agree.to(p.dtype) * moved)
            state["last_sign"].index_copy_(0, rows, sign.to(p.dtype))
        return loss
