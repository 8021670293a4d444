"""The lazy outer step: Adam that moves only the rows whose hypergradient is non-zero, so a
hyper step costs the same for any number of rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from .errors import ConfigurationError
from .validation import add_checked_group, is_real

Tensors = list[Tensor]


# ---------------------------------------------------------------------- the lazy outer step
def _per_row(x: Tensor, p: Tensor) -> Tensor:
    """A per-row factor ``x`` (shape ``(rows,)``) in ``p``'s dtype, shaped to scale rows of
    ``p`` (no view for a vector: each is one more operation at every step). ``p``: the moments
    (float32 at least) or anything of their dtype and dimensions."""
    x = x.to(p.dtype)
    return x if p.dim() == 1 else x.view((-1,) + (1,) * (p.dim() - 1))


def _two_betas(betas: Any) -> tuple[float, float]:
    """(β₁, β₂) as two floats in [0, 1): any sequence of two real numbers (a tuple, a list, a
    NumPy array, NumPy scalars), or a clear error."""
    try:
        values = [betas[0], betas[1]] if len(betas) == 2 else None
    except TypeError:
        values = None
    if values is None or not all(is_real(b) and 0 <= b < 1 for b in values):
        raise ConfigurationError(
            f"LazyAdam: betas must be two numbers in [0, 1) (β₁, β₂), got {betas!r}."
        )
    return float(values[0]), float(values[1])


class LazyAdam(torch.optim.Optimizer):
    """Adam that moves only the rows whose gradient is non-zero (TensorFlow's LazyAdam).

    Dense Adam keeps moving every row by its momentum after the row's last minibatch, which for
    per-sample weights means all n rows change at every hyper step; here a row moves only when a
    minibatch reads it, with Adam's bias correction counted per row (its own number of visits).
    The cost is a scan for the non-zero rows plus O(rows read) arithmetic; the state (m, v, the
    visit counts) is O(n) storage. ``row_scale=False`` divides by one running RMS of the
    gradients of all rows read instead of each row's own (a row visited once then moves by
    lr·gᵢ/RMS, keeping how large its gradient was, not by ±lr whatever its size).
    ``row_scale="batch"`` divides by the RMS of this step's gradients over the rows read:

        xᵢ ← xᵢ − lr · m̂ᵢ / RMS_{j read}(gⱼ),                                  (eq. batchscale)

    so the rows of one minibatch keep the ratios of their evidence (an example the validation
    data barely cares about moves little beside one it clearly contradicts) and every step has
    RMS lr whatever the hypergradient's scale at that point of the training. Works on dense
    gradients (what ``SIDHyperOptimizer`` writes) and on sparse ones.

    ``scale_prior`` = k > 0 (with ``row_scale=True``) shrinks each row's second moment toward
    the running mean square V̄ of all rows read, as k pseudo-visits of a prior:

        sᵢ² = (tᵢ v̂ᵢ + k V̄) / (tᵢ + k),   xᵢ ← xᵢ − lr · m̂ᵢ / sᵢ,               (eq. scaleprior)

    so a row visited a few times whose hypergradients are small beside the population's moves
    little (not ±lr at its first visit whatever its size), while its own scale takes over as
    its visits accumulate (k = 0: each row's own, k → ∞: ``row_scale=False``).
    """

    #: moments and steps in float32 at least, whatever the weights' dtype (eps = 1e-8 is 0 in
    #: float16): :func:`~hypertorch_sid.core.validation.check_outer_optimizer` reads it
    steps_in_float32 = True

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        row_scale: bool | Literal["batch"] = True,
        scale_prior: float = 0.0,
    ) -> None:
        betas = self._check_settings(lr, betas, eps, row_scale, scale_prior)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "row_scale": row_scale,
            "scale_prior": float(scale_prior),
        }
        super().__init__(params, defaults)

    @staticmethod
    def _check_settings(
        lr: float, betas: Any, eps: float, row_scale: Any, scale_prior: float
    ) -> tuple[float, float]:
        """The settings of the defaults and of each parameter group; (β₁, β₂) as floats."""
        if not is_real(scale_prior) or not scale_prior >= 0:
            raise ConfigurationError(f"LazyAdam: scale_prior must be ≥ 0, got {scale_prior!r}.")
        if not is_real(lr) or not 0 < lr < math.inf:  # inf: σ(±inf) written (s53)
            raise ConfigurationError(f"LazyAdam: lr must be > 0 and finite, got {lr!r}.")
        if row_scale not in (True, False, "batch"):
            raise ConfigurationError(
                f"LazyAdam: row_scale must be True, False or 'batch', got {row_scale!r}."
            )
        return _two_betas(betas)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the group's own settings checked as the defaults are (session 60)."""
        names = ("lr", "betas", "eps", "row_scale", "scale_prior")
        add_checked_group(self, param_group, names)
        group = self.param_groups[-1]
        group["betas"] = _two_betas(group["betas"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                # a scalar as one row (HyperOptimizationCallback's default over float16 λ)
                p, g = (
                    (param.view(1), param.grad.view(1)) if param.dim() == 0 else (param, param.grad)
                )
                if g.is_sparse:
                    g = g.coalesce()
                    rows, values = g.indices()[0], g.values()
                else:
                    flat = g.reshape(g.shape[0], -1) if g.dim() > 1 else g.reshape(-1, 1)
                    rows = torch.nonzero(flat.ne(0).any(1)).flatten()
                    values = g.index_select(0, rows)
                # the moments and the step in float32 at least: in float16 a small gradient's
                # square is 0 and eps=1e-8 too, so a row's step was 0/0 or g/0, non-finite
                # (a precision="16-true" fit's first hyper step, blamed on the lr; session 62)
                acc = torch.promote_types(p.dtype, torch.float32)
                values = values.to(acc)
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=acc)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=acc)
                    state["visits"] = torch.zeros(p.shape[0], dtype=torch.float64, device=p.device)
                for key in ("exp_avg", "exp_avg_sq"):  # a loaded state: cast to p's dtype by torch
                    state[key] = state[key].to(acc)
                if rows.numel() == 0:
                    continue
                if b1 == 0:  # m = 0·m + 1·g = g and its bias correction 1 − 0ᵗ = 1, exactly
                    m = values
                else:
                    m = state["exp_avg"].index_select(0, rows).mul_(b1)
                    m.add_(values, alpha=1 - b1)
                v = state["exp_avg_sq"].index_select(0, rows).mul_(b2)
                v.addcmul_(values, values, value=1 - b2)
                t = state["visits"].index_select(0, rows).add_(1)
                state["exp_avg"].index_copy_(0, rows, m)
                state["exp_avg_sq"].index_copy_(0, rows, v)
                state["visits"].index_copy_(0, rows, t)
                shape = (-1,) + (1,) * (p.dim() - 1)
                m_hat = m if b1 == 0 else m / _per_row(1 - b1**t, m)
                row_scale = group.get("row_scale", True)
                if row_scale == "batch":  # eq. batchscale: one scale, this step's rows
                    scale = values.pow(2).mean().sqrt()
                elif row_scale:
                    c2 = _per_row(1 - b2**t, m)
                    scale = (v / c2).sqrt()
                    k = group.get("scale_prior", 0.0)
                    if k > 0:  # eq. scaleprior: k pseudo-visits of the population's scale
                        prior = self._shared_scale(state, values, b2).pow(2)
                        tt = t.to(acc).view(shape)
                        scale = ((tt * scale.pow(2) + k * prior) / (tt + k)).sqrt()
                else:  # one scale for all rows: a row's step keeps its gradient's magnitude
                    scale = self._shared_scale(state, values, b2)
                update = m_hat / (scale + group["eps"])
                p.index_add_(0, rows, update.to(p.dtype), alpha=-group["lr"])
        return loss

    @staticmethod
    def _shared_scale(state: dict[str, Any], values: Tensor, beta2: float) -> Tensor:
        """√ of a bias-corrected running mean of the squared gradients of all rows read."""
        mean_sq = values.double().pow(2).mean()
        if "shared_sq" not in state:
            state["shared_sq"] = torch.zeros((), dtype=torch.float64, device=values.device)
            state["shared_steps"] = torch.zeros((), dtype=torch.float64, device=values.device)
        state["shared_sq"].mul_(beta2).add_(mean_sq, alpha=1 - beta2)
        state["shared_steps"].add_(1)
        corrected = state["shared_sq"] / (1 - beta2 ** state["shared_steps"])
        return corrected.sqrt().to(values.dtype)
