"""Outer steps on λ whose size follows the evidence in the hypergradients.

Adam on ρ = log λ is scale-free: a hypergradient of 1e-8 whose sign holds for a few hyper steps
moves ρ as far as one of 1e-2, and a hypergradient that is mostly validation-batch noise moves
ρ on a random walk of about ``lr`` per hyper step. :class:`SignalGatedAdam` keeps Adam's step
and multiplies it, per entry of λ, by a gate that opens with the t-statistic of the entry's
recent hypergradients: noise leaves λ where it is, a consistent signal moves it at Adam's rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from .errors import ConfigurationError


def effective_weight(beta: float, steps: int) -> float:
    """W_t = Σ_s w_s², the squared weights of a bias-corrected exponential average of t values
    (w_s = (1 − β) β^(t−s) / (1 − βᵗ), Σ w_s = 1); 1 / W_t is its effective number of values:

        W_t = (1 − β)(1 + βᵗ) / ((1 + β)(1 − βᵗ))                              (eq. effw)

    (1 at t = 1; (1 − β) / (1 + β) as t → ∞)."""
    bt = beta**steps
    return (1 - beta) * (1 + bt) / ((1 + beta) * (1 - bt))


class SignalGatedAdam(torch.optim.Optimizer):
    """Adam whose step on each entry of λ is gated by the t-statistic of its hypergradients.

    For one entry with hypergradients g_1 … g_t (one per hyper step), Adam's moments
    m̂ (β₁) and v̂ (β₂), and a β₁-average of the squares â (all bias-corrected),

        s² = (â − m̂²) / (1 − W_t)                                              (eq. noise)
        z² = m̂² / (s² W_t),   ν = 1/W_t − 1                                     (eq. tstat)
        c  = max(0, 1 − κ² ν / ((ν − 2) z²))   (c = 0 for ν ≤ 2)                (eq. gate)
        ρ ← ρ − lr · c · m̂ / (√v̂ + ε)                                          (eq. gatedstep)

    s² is the unbiased weighted variance of the recent hypergradients and s² W_t that of their
    average m̂ (W_t from eq. effw, 1/W_t the average's effective number of hyper steps, up to
    (1 + β₁)/(1 − β₁) = 19 at β₁ = 0.9), so z is m̂ in standard errors, with about ν degrees of
    freedom. Where the hypergradients are noise about 0, z is Student-t-like and
    E[z²] = ν/(ν − 2): the gate compares z² with κ² times what noise alone gives, so c is 0 or
    small and λ stays (pure noise moves ρ far less than Adam's random walk). A signal that
    holds has z² ≫ κ² and c → 1: Adam's step. Until the average holds more than three
    effective hyper steps (ν > 2: the fourth hyper step at β₁ = 0.9) there is too little
    variance to judge by and c = 0 — which also lets the training's first transient pass
    without moving λ. κ = 0 is Adam exactly (c = 1).

    The gate is on the size of the evidence, not of the hypergradient: it does not stop a
    consistent tiny hypergradient (Adam's scale freedom is kept where the sign is steady).
    Measured as the weight-decay drop-in's outer step (κ = 2, 5 settings × 9 seeds,
    ``docs/weight_decay_budget.md``): no gain on the CNNs, and it held back λ growth that paid
    on the MLPs (Fashion MLP +0.017 ± 0.009 test loss): an option, not the drop-in's default.

    The last step's mean gate over all entries is ``last_gate``; ``held_back`` is True when every
    gate was 0 (λ deliberately unchanged). The averages live in ``state`` (checkpointed).

    Parameters
    ----------
    params:
        The learned tensors (ρ = log λ for :class:`~hypertorch_sid.core.decay.LogDecay`).
    lr, betas, eps:
        Adam's.
    kappa:
        κ: the gate opens where z² exceeds κ² times its mean under pure noise (c = 0.75 at
        twice that z).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        kappa: float = 2.0,
    ) -> None:
        _check("lr", lr, low=0.0, strict=True)
        _check("eps", eps, low=0.0)
        _check("kappa", kappa, low=0.0)
        for i, b in enumerate(betas):
            _check(f"betas[{i}]", b, low=0.0, high=1.0)
        if kappa > 0 and betas[0] == 0:
            raise ConfigurationError(
                "SignalGatedAdam: betas[0] = 0 averages one hypergradient, which has no variance "
                "to judge it by, so the gate would never open: use betas[0] > 0 (e.g. 0.9) or "
                "kappa=0 (Adam)."
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "kappa": kappa})
        self.last_gate = math.nan
        self.held_back = False

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        gates: list[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigurationError(
                        "SignalGatedAdam does not take sparse gradients: use LazyAdam for "
                        "sparse hypergradients."
                    )
                gates.append(self._gated(p, p.grad, group).flatten())
        if gates:
            every = torch.cat(gates)
            self.last_gate = float(every.mean())
            self.held_back = bool((every == 0).all())
        return loss

    def _gated(self, p: Tensor, g: Tensor, group: dict) -> Tensor:
        st = self.state[p]
        if not st:
            st.update(
                step=0,
                exp_avg=torch.zeros_like(p),
                exp_avg_sq=torch.zeros_like(p),
                recent_sq=torch.zeros_like(p),
            )
        (b1, b2), st["step"] = group["betas"], st["step"] + 1
        t = st["step"]
        st["exp_avg"].lerp_(g, 1 - b1)  # Adam's operations, in torch.optim.Adam's order
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        st["recent_sq"].lerp_(g * g, 1 - b1)
        bias1 = 1 - b1**t
        gate = self.gate(st["exp_avg"] / bias1, st["recent_sq"] / bias1, b1, t, group["kappa"])
        denom = (st["exp_avg_sq"].sqrt() / (1 - b2**t) ** 0.5).add_(group["eps"])
        p.addcdiv_(st["exp_avg"] * gate, denom, value=-group["lr"] / bias1)
        return gate

    @staticmethod
    def gate(mean: Tensor, mean_sq: Tensor, beta: float, steps: int, kappa: float) -> Tensor:
        """c of eq. gate from the bias-corrected averages m̂ and â after ``steps`` values."""
        if kappa == 0:
            return torch.ones_like(mean)
        w = effective_weight(beta, steps)
        nu = 1 / w - 1
        if nu <= 2:  # too few effective values: no variance to judge them by
            return torch.zeros_like(mean)
        var_mean = (mean_sq - mean * mean).clamp_(min=0) * (w / (1 - w))  # s² W_t
        m2 = mean * mean
        noise = kappa**2 * nu / (nu - 2) * var_mean  # κ² E[z²] · s² W_t under pure noise
        c = 1 - noise / m2.clamp(min=torch.finfo(m2.dtype).tiny)
        return torch.where(m2 > 0, c, torch.zeros_like(c)).clamp_(0.0, 1.0)

    def __repr__(self) -> str:
        g = self.defaults
        return f"SignalGatedAdam(lr={g['lr']}, betas={g['betas']}, kappa={g['kappa']})"


def _check(
    name: str, value: float, low: float, high: float = math.inf, strict: bool = False
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low) and value < high
    if not ok:
        bound = f"{'>' if strict else '≥'} {low}" + (f" and < {high}" if high < math.inf else "")
        raise ConfigurationError(
            f"SignalGatedAdam: {name} must be a number {bound}, got {value!r}."
        )
