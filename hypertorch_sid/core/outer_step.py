"""Outer steps on λ whose size follows the evidence in the hypergradients.

Adam on ρ = log λ is scale-free: a hypergradient of 1e-8 whose sign holds for a few hyper steps
moves ρ as far as one of 1e-2, and a hypergradient that is mostly validation-batch noise moves
ρ on a random walk of about ``lr`` per hyper step. :class:`SignalGatedAdam` keeps Adam's step
and multiplies it, per entry of λ, by a gate that opens with the t-statistic of the entry's
recent hypergradients: noise leaves λ where it is, a consistent signal moves it at Adam's rate.

:class:`TrustRprop` keeps no average at all: each entry's step grows while the hypergradient
keeps its sign and shrinks at a flip (Rprop), so a late flip is answered at the next hyper step
instead of after Adam's momentum has decayed; and a rise of λ is held to a small share of what
it would shrink the weights by over the remaining training (eq. decaytrust), which is what
keeps a fast step from wrecking a training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigurationError
from .validation import add_checked_group


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
        self._check_settings(lr=lr, betas=betas, eps=eps, kappa=kappa)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "kappa": kappa})
        self.last_gate = math.nan
        self.held_back = False

    @staticmethod
    def _check_settings(lr: float, betas: Any, eps: float, kappa: float) -> None:
        """Adam's settings and κ (of the defaults, and of each parameter group)."""
        _check("lr", lr, low=0.0, strict=True)
        _check("eps", eps, low=0.0)
        _check("kappa", kappa, low=0.0)
        # betas=(0.9,) crashed at the first step, 0.9 at construction, three were taken (s60)
        _check_pair("betas", betas, "(β₁, β₂), e.g. (0.9, 0.999)", "SignalGatedAdam")
        for i, b in enumerate(betas):
            _check(f"betas[{i}]", b, low=0.0, high=1.0)
        if kappa > 0 and betas[0] == 0:
            raise ConfigurationError(
                "SignalGatedAdam: betas[0] = 0 averages one hypergradient, which has no variance "
                "to judge it by, so the gate would never open: use betas[0] > 0 (e.g. 0.9) or "
                "kappa=0 (Adam)."
            )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the group's own settings checked as the defaults are."""
        add_checked_group(self, param_group, ("lr", "betas", "eps", "kappa"))

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


class TrustRprop(torch.optim.Optimizer):
    """Rprop on ρ = log λ whose rises of λ are held to what the remaining training can take.

    Per entry of ρ, with hypergradients g_1 … g_t and step sizes Δ (Δ_0 = ``lr``); η the
    training's effective step size and R the training steps left (from :meth:`observe`):

        Δ_t = clip(Δ_{t−1} · η₊ if g_t g_{t−1} > 0, · η₋ if < 0, · 1 else; Δ_min, Δ_max)
                                                                               (eq. signsize)
              (η₊ ← η₊↓ where g_t > 0, a fall of λ, if ``fall_eta`` = η₊↓ is given)
        ρ' = ρ − Δ_t · sign(g_t),  no move and g_t ← 0 where g_t g_{t−1} < 0   (eq. signstep)
        ρ ← min(ρ', log(e^ρ + δ / (η R)));   where it binds, Δ_t ← clip(ρ − ρ_old; Δ_min, Δ_max)
                                                                               (eq. decaytrust)

    Eqs. signsize and signstep are ``torch.optim.Rprop`` (iRprop⁻, bit for bit where eq.
    decaytrust does not bind): no average carries an old hypergradient forward, so a flip of the
    sign stops λ at the next hyper step and halves its step there, and a sign that holds grows
    the step by η₊ per hyper step. Only the sign and its persistence count, not the
    hypergradient's size (as with Adam on log λ); noise flips about every other step and shrinks
    Δ towards Δ_min.

    Eq. decaytrust is the guard, on the assumption the hypergradient needs. Coupled decay
    shrinks the weights by η λ per training step (η·∇(λ‖w‖²/2) = ηλw; η the step per unit
    gradient: lr/(1 − μ) with momentum μ, lr/√v̂ for Adam), so raising λ by Δλ shrinks them by
    a further e^(−η Δλ R) over the rest of the training where nothing pushes back. The
    hypergradient is a first-order reading a few training steps ahead
    (``docs/weight_decay_budget.md``), blind to that cumulative effect: a rise of λ is held to
    δ of it. λ can then reach λ₀ + (δ/η) Σ_j 1/R_j by the j-th hyper step — little early,
    where a decay acts longest, more as the training ends and the hypergradient's short horizon
    becomes the horizon left. Without it, a step that grows by η₊ per hyper step outruns the
    feedback (the weights answer a decay only after ~1/(ηλ) steps): on the digits MLP
    (``examples/lightning_digits.py``) Rprop with η₊ = 1.5 drove λ to 0.04–0.08 and the test
    loss from 0.23 to 0.8–1.05, Adam with β₁ = 0 to 0.035 and 0.49. A fall of λ is not held:
    less decay is the training without it. η and R come from the callback before each hyper step
    (as for the damping and the look-ahead); unobserved (a fit of unknown length, no callback)
    the step is Rprop's.

    The state (Δ and the last sign-kept hypergradient per entry) is checkpointed with the
    optimizer's ``state_dict``; the bound is recomputed at each :meth:`observe`.

    Parameters
    ----------
    params:
        ρ = log λ (:class:`~hypertorch_sid.core.decay.LogDecay`, the drop-in's default).
    lr:
        Δ_0, the first step on log λ.
    etas:
        (η₋, η₊): step-size factors at a flip and at an agreeing sign.
    step_sizes:
        (Δ_min, Δ_max).
    trust:
        δ of eq. decaytrust: how much one rise of λ may add to the exponent of the shrink
        over the remaining training. ``math.inf``: Rprop.
    fall_eta:
        η₊↓, the growth factor of a step that keeps *lowering* λ (g_t g_{t−1} > 0, g_t > 0);
        rises keep η₊. ``None``: η₊ both ways (Rprop). Falls are not held by eq. decaytrust,
        so this sets how soon λ leaves a λ₀ where decay does not pay. Measured as the
        drop-in's outer step (``fall_eta=2.0``, 9 seeds × 7 settings,
        ``docs/weight_decay_budget.md``, "Session 45"): 20 Newsgroups −0.0043 ± 0.0006 test
        loss, but the Fashion MLP and the main job's recipe worse by more than their s.e.:
        an option for recipes where no decay is expected to pay.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.3,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-2, 2.0),
        trust: float = 0.1,
        fall_eta: float | None = None,
    ) -> None:
        self._check_settings(lr, etas, step_sizes, trust, fall_eta)
        super().__init__(
            params,
            {"lr": lr, "etas": tuple(etas), "step_sizes": tuple(step_sizes),
             "trust": float(trust), "fall_eta": fall_eta},
        )  # fmt: skip
        self.max_rise = math.inf  # δ/(ηR) of eq. decaytrust for the coming step
        self.bound = False  # whether eq. decaytrust held back the last step
        self.held_back = False  # every entry flipped: λ unchanged on purpose (eq. signstep)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the group's own settings checked as the defaults are."""
        add_checked_group(self, param_group, ("lr", "etas", "step_sizes", "trust", "fall_eta"))

    def _check_settings(
        self,
        lr: float,
        etas: tuple[float, float],
        step_sizes: tuple[float, float],
        trust: float,
        fall_eta: float | None,
    ) -> None:
        """The settings of the defaults, and of each parameter group."""
        who = type(self).__name__  # a ReachRprop's error names the class the user gave
        _check("lr", lr, low=0.0, strict=True, who=who)
        _check_pair("etas", etas, "(η₋, η₊), e.g. (0.5, 1.2)", who)
        _check("etas[0]", etas[0], low=0.0, high=1.0, strict=True, who=who)
        _check("etas[1]", etas[1], low=1.0, who=who)
        _check_pair("step_sizes", step_sizes, "(Δ_min, Δ_max), e.g. (1e-2, 2.0)", who)
        _check("step_sizes[0]", step_sizes[0], low=0.0, who=who)
        if _is_number(step_sizes[1]) and step_sizes[1] <= step_sizes[0]:
            raise ConfigurationError(
                f"{who}: step_sizes is (Δ_min, Δ_max), so step_sizes[1] must be above "
                f"step_sizes[0], got "
                f"{tuple(step_sizes)!r}: pass step_sizes={tuple(sorted(step_sizes))!r} if it "
                "was reversed (the two must differ)."
            )
        _check("step_sizes[1]", step_sizes[1], low=step_sizes[0], strict=True, who=who)
        ok = isinstance(trust, (int, float)) and not isinstance(trust, bool) and trust > 0
        if not ok:
            raise ConfigurationError(
                f"{who}: trust must be a number > 0 (math.inf: no bound), got {trust!r}."
            )
        if fall_eta is not None:
            _check("fall_eta", fall_eta, low=1.0, who=who)

    def observe(self, remaining_steps: int | None, eta: float | None) -> None:
        """R (the training steps left) and η before a hyper step, as the callback tells its
        damping and look-ahead: sets δ/(ηR) of eq. decaytrust (none where either is unknown,
        or at R = 0, where no training is left for λ to act on)."""
        known = remaining_steps is not None and eta is not None
        if known and remaining_steps > 0 and eta > 0:  # type: ignore[operator]
            self.max_rise = self.defaults["trust"] / (eta * remaining_steps)  # type: ignore[operator]
        else:
            self.max_rise = math.inf

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        self.bound, moved = False, []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigurationError(
                        f"{type(self).__name__} does not take sparse gradients: give the "
                        "weights dense ones (SampleWeights(sparse_grad=False), "
                        "LearnedDataWeights(sparse_grad=False)), or use LazyAdam."
                    )
                st = self._state_of(p, group["lr"])
                old = p.clone()
                kept = self._signed_step(p, p.grad, group, st)
                moved.append(bool(kept.any()))
                self._trusted(p, old, st, group)
                self._after_step(p, old, kept, st)
        self.held_back = bool(moved) and not any(moved)
        self.max_rise = math.inf  # one observation, one step
        return loss

    def _state_of(self, p: Tensor, lr: float) -> dict:
        st = self.state[p]
        if not st:
            st.update(step=0, prev=torch.zeros_like(p), step_size=torch.full_like(p, lr))
        return st

    @staticmethod
    def _signed_step(p: Tensor, g: Tensor, group: dict, st: dict) -> Tensor:
        """Eqs. signsize and signstep, in ``torch.optim.Rprop``'s order of operations; returns
        the sign-kept hypergradient (0 where the sign flipped)."""
        (minus, plus), (low, high) = group["etas"], group["step_sizes"]
        st["step"] += 1
        agree = g.mul(st["prev"]).sign()
        factor = torch.ones_like(agree)
        factor[agree > 0], factor[agree < 0] = plus, minus
        if group.get("fall_eta") is not None:  # (a state saved before it existed: None)
            factor[(agree > 0) & (g > 0)] = group["fall_eta"]
        st["step_size"].mul_(factor).clamp_(low, high)
        kept = torch.where(agree < 0, torch.zeros_like(g), g)  # a flip: no move, forget g_t
        p.addcmul_(kept.sign(), st["step_size"], value=-1)
        st["prev"].copy_(kept)
        return kept

    def _after_step(self, p: Tensor, old: Tensor, kept: Tensor, st: dict) -> None:
        """A subclass's change of ρ after eqs. signstep and decaytrust (here: none); ``kept``
        is the sign-kept hypergradient (0 at a flip)."""

    def _trusted(self, p: Tensor, old: Tensor, st: dict, group: dict) -> None:
        """Eq. decaytrust: ρ ≤ log(e^ρ_old + δ/(ηR)); Δ becomes the move made where it binds."""
        if not math.isfinite(self.max_rise):
            return
        top = torch.log(old.exp() + self.max_rise)
        held = p > top
        if bool(held.any()):
            self.bound = True
            p.copy_(torch.where(held, top, p))
            low, high = group["step_sizes"]
            moved = (p - old).clamp(low, high)
            st["step_size"].copy_(torch.where(held, moved, st["step_size"]))

    def __repr__(self) -> str:
        g = self.defaults
        return (
            f"TrustRprop(lr={g['lr']}, etas={g['etas']}, step_sizes={g['step_sizes']}, "
            f"trust={g['trust']}"
            + (f", fall_eta={g['fall_eta']})" if g.get("fall_eta") is not None else ")")
        )


@dataclass(frozen=True)
class ShrinkReading:
    """How fast one decayed tensor shrinks under a unit of coupled decay, as its training
    optimizer sets it: per element η_i of eq. shrinkrate.

    ``weight``: |w| per element (Adam), or ``None`` where η_i = ``gain`` is the same for all
    ``elements`` of the tensor (SGD: lr(1 − d)/(1 − μ); decoupled decay: the group's lr), whose
    share is then in closed form, S = 1 − exp(−R gain λ), and nothing per element is read.
    ``data_sq``: Adam only, σ_i² = max(v̂_i − (λ w_i)², 0), the part of the second moment v̂
    (bias-corrected) that is not the decay λw itself. ``lr`` and ``eps``: Adam's.
    """

    weight: Tensor | None
    data_sq: Tensor | None = None
    gain: float = 0.0
    lr: float = 0.0
    eps: float = 1e-8
    elements: int = 0

    @property
    def numel(self) -> int:
        return self.weight.numel() if self.weight is not None else self.elements

    def rate(self, lam: float) -> Tensor:
        """s_i(λ') = λ' η_i(λ'), the relative shrink per training step at decay λ' (eq.
        shrinkrate): with Adam η_i(λ') = lr / (√(σ_i² + λ'² w_i²) + ε) — a weight its data
        barely move (σ_i ≪ λ'|w_i|) is moved by about lr per step whatever λ' is, until λ'|w_i|
        nears ε; with SGD η_i = gain (one value where no weights were read)."""
        if self.data_sq is None:
            if self.weight is None:
                return torch.tensor(self.gain * lam, dtype=torch.float64)
            return torch.full_like(self.weight, self.gain * lam)
        denom = (self.data_sq + (lam * self.weight) ** 2).sqrt() + self.eps
        return self.lr * lam / denom


def shrink_share(readings: Sequence[ShrinkReading], lam: float, steps: int) -> float:
    """S(λ') = mean over the slot's elements of 1 − exp(−R s_i(λ')): the share of its weights
    that decay alone would remove over the R training steps left (eq. shrinkshare). Increasing
    in λ'. A uniform rate (SGD, decoupled decay) counts in closed form."""
    total = count = 0.0
    for r in readings:
        if r.data_sq is None:
            total += r.numel * -math.expm1(-steps * r.gain * lam)
        else:
            total += float(-torch.expm1(-steps * r.rate(lam).double()).sum())
        count += r.numel
    return total / count if count else 0.0


def shrink_floor(
    readings: Sequence[ShrinkReading], lam: float, steps: int, trust: float, max_fall: float
) -> float:
    """ρ_f of eq. shrinkfall: the log of the largest λ' ≤ λ with S(λ') ≤ δ (``trust``), at most
    ``max_fall`` below log λ; −∞ where S(λ) ≤ δ already (no floor). By bisection on log λ'
    (S is increasing), to 1e-3 in log λ'."""
    if not readings or steps <= 0 or lam <= 0 or shrink_share(readings, lam, steps) <= trust:
        return -math.inf
    high, low = math.log(lam), math.log(lam) - max_fall
    if shrink_share(readings, math.exp(low), steps) > trust:
        return low
    while high - low > 1e-3:  # S(e^low) ≤ δ < S(e^high)
        mid = 0.5 * (low + high)
        if shrink_share(readings, math.exp(mid), steps) <= trust:
            low = mid
        else:
            high = mid
    return low


class ShrinkFallRprop(TrustRprop):
    """:class:`TrustRprop` whose falls from the user's λ₀ go at once as far as the decay's own
    shrink of the weights says.

    The hypergradient reads only the sign of "less decay"; how far to fall it cannot tell. What
    the training optimizer does with the decay it can: per decayed element, coupled decay λw
    shrinks w by s_i = λ η_i per step (eq. shrinkrate, :class:`ShrinkReading`; Adam's gain
    η_i = lr/√v̂_i is large where the data barely move a weight, so decay moves it by about lr
    per step whatever λ — most of a bag-of-words layer), and over the R steps left the share

        S(λ) = mean_i (1 − exp(−R s_i(λ)))                                     (eq. shrinkshare)

    of the slot's weights would be removed by decay alone. While an entry of λ is still
    descending from its start (it has not risen yet), a hyper step whose hypergradient says
    "less decay" (g_t > 0, its sign kept) lowers ρ at least to

        ρ ← min(ρ', max(ρ_f, ρ_old − ``max_fall``)),
        ρ_f = log max{λ' ≤ λ : S(λ') ≤ δ}                                      (eq. shrinkfall)

    with δ = ``trust``, the same share eq. decaytrust holds each rise to: a fall the
    hypergradient asks for ends where decay can remove at most δ of the weights over the rest of
    the fit. Where S(λ) ≤ δ already (SGD at the usual λ₀ = 1e-4: ηλR = 0.5·1e-4·790 = 0.04
    on the benchmark's MNIST MLP) it is :class:`TrustRprop` step for step. Rprop's step sizes
    Δ are not changed by it; once an entry has risen it is :class:`TrustRprop` for good.

    The readings come from the callback before each hyper step (:meth:`observe_shrink`,
    :class:`~hypertorch_sid.LearnedWeightDecay` per layer/tensor/group/global; per element it
    gives none); unobserved, it is :class:`TrustRprop`.

    The other parameters are :class:`TrustRprop`'s.

    Parameters
    ----------
    max_fall:
        The most one hyper step lowers log λ by eq. shrinkfall (5: λ₀ = 1e-4 → 6.7e-7 at most;
        20 Newsgroups trained at λ₀ = 1e-6 was within 0.003 of no decay,
        ``docs/weight_decay_budget.md``).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.3,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-2, 2.0),
        trust: float = 0.1,
        fall_eta: float | None = None,
        max_fall: float = 5.0,
    ) -> None:
        _check("max_fall", max_fall, low=0.0, strict=True, who="ShrinkFallRprop")
        super().__init__(params, lr, etas, step_sizes, trust, fall_eta)
        self.max_fall = float(max_fall)
        self._readings: dict[int, Sequence[list[ShrinkReading]]] = {}
        self._steps: int | None = None
        #: per hyper step, the entries eq. shrinkfall lowered (for logs and tests)
        self.fell: list[int] = []

    def observe_shrink(
        self, remaining_steps: int | None, readings: dict[int, Sequence[list[ShrinkReading]]]
    ) -> None:
        """R and, per parameter (its index in the optimizer's parameters, a vector of slots),
        per slot the :class:`ShrinkReading` of its decayed tensors; for the next step only. A
        slot is looked up (``readings[k]``) only where eq. shrinkfall may act (it still descends
        and g_t > 0), so a lazy sequence (the callback's) reads the optimizers' state of those
        slots only."""
        self._steps, self._readings = remaining_steps, readings

    def wants_shrink(self) -> bool:
        """Whether any entry still descends from its start (eq. shrinkfall can act): the
        callback reads the optimizers' state for :meth:`observe_shrink` only then."""
        for p in self._params():
            rose = self.state.get(p, {}).get("rose")
            if rose is None or not bool(rose.all()):
                return True
        return False

    def _descending(self, st: dict, p: Tensor) -> Tensor:
        if "rose" not in st:
            st["rose"] = torch.zeros_like(p, dtype=torch.bool)
        elif st["rose"].dtype != torch.bool:  # load_state_dict casts state to the entry's dtype
            st["rose"] = st["rose"] != 0
        return ~st["rose"]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        self.fell = []
        self._index = {id(p): i for i, p in enumerate(self._params())}
        try:
            return super().step(closure)
        finally:
            self._readings, self._steps = {}, None

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _after_step(self, p: Tensor, old: Tensor, kept: Tensor, st: dict) -> None:
        """Eq. shrinkfall where the entry still descends and g_t > 0 (kept)."""
        descending = self._descending(st, p)
        readings = self._readings.get(self._index.get(id(p), -1))
        if readings and self._steps and p.dim() == 1 and len(readings) == p.numel():
            for k in range(p.numel()):
                if not (bool(descending[k]) and float(kept[k]) > 0):
                    continue
                floor = shrink_floor(readings[k], math.exp(float(old[k])), self._steps,
                                     self.defaults["trust"], self.max_fall)  # fmt: skip
                if floor == -math.inf:  # S(λ) ≤ δ: decay removes little, the fall is Rprop's
                    continue
                target = max(floor, float(old[k]) - self.max_fall)
                if target < float(p[k]):
                    p[k] = target
                    self.fell.append(k)
        st["rose"] |= kept < 0

    def __repr__(self) -> str:
        return super().__repr__()[:-1].replace("TrustRprop", "ShrinkFallRprop", 1) + (
            f", max_fall={self.max_fall})"
        )


def reach_step(span: float, eta_plus: float, steps: float) -> float:
    """Δ_reach of eq. reachstep: the first step of a run of ``steps`` agreeing Rprop steps, each
    η₊ times the last, that together move log λ by ``span``.

        Δ_reach(n) = span (η₊ − 1) / (η₊ⁿ − 1),   span / n at η₊ = 1           (eq. reachstep)
    """
    if steps <= 0:
        return math.inf
    if eta_plus == 1.0:
        return span / steps
    return span * (eta_plus - 1.0) / math.expm1(steps * math.log(eta_plus))


class ReachRprop(ShrinkFallRprop):
    """:class:`ShrinkFallRprop` whose step never falls below the size that can still cross
    ``span`` in log λ with the hyper steps the fit has left.

    Rprop's step Δ halves at every flip of the hypergradient's sign and regrows by η₊ per
    agreeing hyper step. Early in a fit the sign flips often (the network still fits), so Δ is
    small when the sign settles; a budget that runs 14 hyper steps in a fit leaves too few for
    Δ to regrow: on the main job's recipe λ rose ×1.1–1.2 per hyper step in the second half and
    reached the searches' level (×30–50 above its early fall) at the end of the fit or never
    (``docs/weight_decay_budget.md``, "Session 57"). Here, with R the training steps left (from
    :meth:`observe`) and p the pace of the hyper steps so far (training steps per hyper step,
    measured: the budget's skips included), the hyper steps left are

        n_t = 1 + R_t / p_t,   p_t = (R_1 − R_t) / (t − 1)                     (eq. reachpace)

    and from the second hyper step on eq. signsize's step is held at or above eq. reachstep's
    Δ_reach(n_t) (:func:`reach_step`), within (Δ_min, Δ_max): a sign that holds from here on
    moves log λ by at least ``span`` before the fit ends. While many hyper steps remain (n
    large) the floor is below Δ_min and this is :class:`ShrinkFallRprop` step for step. The pace
    counts from the first hyper step, so a budget's long wait after it (its curvature estimate's
    debt) shortens n: on the main job's recipe the floor is 0.5–0.9 from the second hyper step.
    Eq. decaytrust still holds each rise, and a flip still stops λ. Without the
    fit's length (R unknown) it is :class:`ShrinkFallRprop`; where R grows (a fit resumed to a
    longer one) the pace starts again. The pace's start is checkpointed with the state.

    The other parameters are :class:`ShrinkFallRprop`'s.

    Parameters
    ----------
    span:
        The distance in log λ a run of agreeing signs must be able to cover with the hyper
        steps left (ln 100: two decades, the main job's recipe's λ from its early fall to the
        searches' pick is ln 50).
    settle:
        The share of the fit, counted from the pace's start, left to λ to settle in: the floor
        aims to arrive with R_t = settle·R₁ steps still to go (n_t counts the hyper steps until
        then, eq. reachsettle: n_t = 1 + (R_t − settle·R₁) / p_t) and is off after it, where
        the step is :class:`ShrinkFallRprop`'s own. 0 (the default): the floor holds to the end.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.3,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-2, 2.0),
        trust: float = 0.1,
        fall_eta: float | None = None,
        max_fall: float = 5.0,
        span: float = math.log(100.0),
        settle: float = 0.0,
    ) -> None:
        _check("span", span, low=0.0, strict=True, who="ReachRprop")
        _check("settle", settle, low=0.0, high=1.0, who="ReachRprop")
        if settle >= 1.0:
            raise ConfigurationError(
                f"ReachRprop: settle is the share of the fit left to λ to settle in, below 1 "
                f"(e.g. 0.25), got {settle!r}."
            )
        super().__init__(params, lr, etas, step_sizes, trust, fall_eta, max_fall)
        self.span = float(span)
        self.settle = float(settle)
        self._left: int | None = None
        #: Δ_reach(n_t) of the last step (0 where it had none: the first step, R unknown)
        self.reach = 0.0

    def observe(self, remaining_steps: int | None, eta: float | None) -> None:
        super().observe(remaining_steps, eta)
        self._left = remaining_steps

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        try:
            return super().step(closure)
        finally:
            self._left = None

    def _signed_step(self, p: Tensor, g: Tensor, group: dict, st: dict) -> Tensor:  # type: ignore[override]
        """Eqs. signsize and signstep with Δ_min raised to Δ_reach(n_t) (eq. reachpace)."""
        self.reach = self._reach(st)
        low, high = group["step_sizes"]
        floor = min(max(low, self.reach), high)
        return TrustRprop._signed_step(p, g, {**group, "step_sizes": (floor, high)}, st)

    def _reach(self, st: dict) -> float:
        left = self._left
        if left is None:
            return 0.0
        if "first_left" not in st or left > st["last_left"]:  # a fit (or one resumed longer)
            st["first_left"], st["first_step"] = float(left), st.get("step", 0)
        st["last_left"] = float(left)
        done = st.get("step", 0) - st.get("first_step", 0)  # hyper steps since the pace's start
        if done < 1 or st["first_left"] <= left:
            return 0.0
        pace = (st["first_left"] - left) / done
        to_settle = left - self.settle * st["first_left"]  # steps until λ should have arrived
        if to_settle <= 0:  # eq. reachsettle: the floor is off, λ settles
            return 0.0
        return reach_step(self.span, self.defaults["etas"][1], 1.0 + to_settle / pace)

    def __repr__(self) -> str:
        return super().__repr__()[:-1].replace("ShrinkFallRprop", "ReachRprop", 1) + (
            f", span={self.span:g}, settle={self.settle:g})"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_pair(name: str, value: object, meaning: str, who: str) -> None:
    """Refuse anything but two numbers (a scalar, or three step sizes, crashed at the first
    step: "'float' object is not subscriptable", "too many values to unpack")."""
    pair = isinstance(value, (tuple, list)) and len(value) == 2
    if not pair:
        raise ConfigurationError(f"{who}: {name} must be two numbers {meaning}, got {value!r}.")


def _check(
    name: str,
    value: float,
    low: float,
    high: float = math.inf,
    strict: bool = False,
    who: str = "SignalGatedAdam",
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low) and value < high
    if not ok:
        bound = f"{'>' if strict else '≥'} {low}" + (f" and < {high}" if high < math.inf else "")
        raise ConfigurationError(f"{who}: {name} must be a number {bound}, got {value!r}.")
