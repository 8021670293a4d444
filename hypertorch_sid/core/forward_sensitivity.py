"""Forward sensitivity: ∂w_t/∂λ carried along the steps the optimizer actually took.

The implicit hypergradient (eq. hypergrad) is the derivative at the fixed point w(λ); the damped
one looks a few steps ahead of the current w_t. Neither sees what λ *has done* to the weights
along the training so far. Write one training step as the decay, then the optimizer's step Δ
of the gradient g it is given:

    coupled (λw added to the gradient, as SGD's / Adam's ``weight_decay=``):
        g_t = ∇ℓ(w_t) + λ w_t,                    w_{t+1} = w_t − Δ(g_t)
    decoupled (AdamW's shrink with the group's lr η_d, then the optimizer's own step):
        g_t = ∇ℓ(w_t),                            w_{t+1} = (1 − η_d λ) w_t − Δ(g_t).

Differentiating by λ, with z_t = ∂w_t/∂λ, H = ∇²ℓ(w_t) and Δ̇ the optimizer step's derivative
along ġ (its moments' tangents carried as state):

    coupled:    ġ = H z_t + w_t + λ z_t,           z_{t+1} = z_t − Δ̇(ġ)           (eq. fwdcoupled)
    decoupled:  ġ = H z_t,                         z_{t+1} = (1 − η_d λ) z_t − η_d w_t − Δ̇(ġ)
                                                                               (eq. fwddecoupled)

The optimizer steps Δ̇ followed here (:func:`update_rule`):

    SGD (momentum μ, dampening d):  u̇ ← μ u̇ + (1 − d) ġ (u̇ = ġ at the buffer's first step),
        Δ̇ = η u̇, Nesterov Δ̇ = η (ġ + μ u̇)                                        (eq. fwdsgd)
    Adam / AdamW (β₁, β₂, ε, step t):  ṁ ← β₁ ṁ + (1 − β₁) ġ,  v̇ ← β₂ v̇ + 2(1 − β₂) g ⊙ ġ,
        Δ̇ = η [ṁ̂ / (√v̂ + ε) − m̂ ⊙ v̇̂ / (2√v̂ (√v̂ + ε)²)]   (hats: ÷ (1 − βᵗ))     (eq. fwdadam)

Dropping H (``hvp=None``) keeps the decay path only: what λ did to the weights through the decay
alone. Decoupled, ġ = 0 then and the optimizer's step drops out (:class:`StaticStep`): one
multiply-add per decayed weight and step, whatever the optimizer. The hypergradient of the
validation loss at the weights reached is

    dE(w_t)/dλ = ∇₂E + ⟨∇₁E(w_t), z_t⟩                                  (eq. forwardhyper)

exact for the training that ran (with H), not for a fixed point it never reaches. With several
λ (one per tensor or layer) z_i is ∂w_i/∂λ_i; the cross terms ∂w_i/∂λ_j run through H only, so
the decay path is exact for them too, and ``hvp`` assumes one λ shared by all weights.
``forgetting`` < 1 multiplies z (and the moments' tangents) by a factor each step: a
sensitivity over about 1/(1 − forgetting) recent steps instead of the whole past.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from .errors import ConfigurationError

Tensors = list[Tensor]
Tangents = dict[str, Tensor]


class UpdateRule(Protocol):
    """Δ̇(ġ): the derivative of one optimizer step along a gradient tangent ġ."""

    def subtract(self, z: Tensor, dg: Tensor | None, state: Tangents) -> None:
        """z ← z − Δ̇(ġ) in place (``dg`` None: ġ = 0; ``dg`` may be kept as state),
        advancing the moments' tangents in ``state``."""
        ...


@dataclass(frozen=True)
class StaticStep:
    """Δ̇ = 0: a step that does not depend on λ (decoupled decay with H dropped: ġ = 0, and
    the moments' tangents stay 0)."""

    def subtract(self, z: Tensor, dg: Tensor | None, state: Tangents) -> None:
        return None


@dataclass(frozen=True)
class SGDStep:
    """torch's SGD step, differentiated (eq. fwdsgd).

    Parameters
    ----------
    lr: η.
    momentum: μ (0: Δ̇ = η ġ).
    dampening: d.
    nesterov: Δ̇ = η (ġ + μ u̇) instead of η u̇.
    first: the momentum buffer's first step (torch sets u = g then, undampened).
    """

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    first: bool = True

    def subtract(self, z: Tensor, dg: Tensor | None, state: Tangents) -> None:
        if self.momentum == 0:
            if dg is not None:
                z.add_(dg, alpha=-self.lr)
            return
        u = state.get("u")
        if self.first or u is None:
            if dg is None:
                state.pop("u", None)
                return
            u = state["u"] = dg.clone() if self.nesterov else dg
        elif dg is not None:
            u.mul_(self.momentum).add_(dg, alpha=1.0 - self.dampening)
        else:
            u.mul_(self.momentum)
        if self.nesterov and dg is not None:
            z.add_(dg, alpha=-self.lr)
        z.add_(u, alpha=-self.lr * (self.momentum if self.nesterov else 1.0))


@dataclass(frozen=True)
class AdamStep:
    """torch's Adam / AdamW step (its own ``weight_decay`` 0), differentiated (eq. fwdadam).

    Parameters
    ----------
    lr: η.
    betas: (β₁, β₂).
    eps: ε.
    step: t, the step count after this step (1 at the first).
    m: m_{t−1}, the first moment before the step (None: 0).
    v: v_{t−1}, the second moment before the step (None: 0).
    g: g_t, the gradient the step is given (the decay included where it is coupled).
    """

    lr: float
    betas: tuple[float, float]
    eps: float
    step: int
    m: Tensor | None
    v: Tensor | None
    g: Tensor

    def subtract(self, z: Tensor, dg: Tensor | None, state: Tangents) -> None:
        b1, b2 = self.betas
        dm, dv = state.get("m"), state.get("v")
        if dg is None and dm is None:
            return
        dg = torch.zeros_like(self.g) if dg is None else dg
        dm = (1 - b1) * dg if dm is None else b1 * dm + (1 - b1) * dg
        dv = 2 * (1 - b2) * self.g * dg if dv is None else b2 * dv + 2 * (1 - b2) * self.g * dg
        state["m"], state["v"] = dm, dv
        m = (1 - b1) * self.g if self.m is None else b1 * self.m + (1 - b1) * self.g
        v = (1 - b2) * self.g**2 if self.v is None else b2 * self.v + (1 - b2) * self.g**2
        c1, c2 = 1 - b1**self.step, 1 - b2**self.step
        root = (v / c2).sqrt()
        denom = root + self.eps
        safe = torch.where(root > 0, root, torch.ones_like(root))
        dv_term = torch.where(root > 0, (m / c1) * (dv / c2) / (2 * safe * denom**2), 0.0)
        z.sub_(self.lr * ((dm / c1) / denom - dv_term))


@dataclass
class ForwardSensitivity:
    """z = ∂w/∂λ of the decayed weights, accumulated over the training steps (eq. fwdcoupled,
    eq. fwddecoupled); the hypergradient from it (eq. forwardhyper).

    Passed to :class:`~hypertorch_sid.LearnedWeightDecay` (``hypergradient=``), it replaces the
    damped implicit hypergradient: the callback advances z at every optimizer step along the
    decay path (H dropped) and reads ⟨∇₁E, z⟩ at each hyper step.

    Parameters
    ----------
    forgetting: the factor z is multiplied by before each step, in (0, 1] (1: the exact
        sensitivity of the whole training so far).
    """

    forgetting: float = 1.0
    z: Tensors | None = field(default=None, init=False)
    moments: list[Tangents] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if (
            isinstance(self.forgetting, bool)
            or not isinstance(self.forgetting, (int, float))
            or not 0.0 < self.forgetting <= 1.0
        ):
            raise ConfigurationError(
                f"forgetting must be in (0, 1], got {self.forgetting!r}: 1 keeps the whole "
                "training's sensitivity, 0.99 about the last 100 steps'."
            )

    def reset(self) -> None:
        """Forget z and the moments' tangents (a new set of decayed weights)."""
        self.z, self.moments = None, []

    def step(
        self,
        weights: Sequence[Tensor],
        decay: Sequence[float | Tensor],
        updates: Sequence[UpdateRule | None],
        shrink: Sequence[float] | None = None,
        hvp: Callable[[Tensors], Tensors] | None = None,
    ) -> None:
        """Advance z by one training step taken from ``weights`` (w_t, before the step).

        Parameters
        ----------
        weights: the decayed weights w_t before the step (and before a decoupled shrink).
        decay: λ of each weight at this step (a number, or a tensor shaped like it).
        updates: the optimizer's step rule of each weight (:class:`SGDStep`, :class:`AdamStep`,
            :class:`StaticStep`, :func:`update_rule`); None where the optimizer does not move
            the weight this step (no gradient): its z stays.
        shrink: decoupled decay: η_d of each weight (w ← (1 − η_d λ) w before the optimizer's
            step, eq. fwddecoupled); None: coupled decay, λw added to the gradient (eq.
            fwdcoupled).
        hvp: v ↦ H v at w_t over all ``weights`` (None: the decay path only, H z dropped).
        """
        weights = [w.detach() for w in weights]
        for name, seq in (("decay", decay), ("updates", updates), ("shrink", shrink)):
            if seq is not None and len(seq) != len(weights):
                raise ConfigurationError(
                    f"step got {len(seq)} {name} for {len(weights)} weights: pass one per weight."
                )
        if self.z is None:
            self.z = [torch.zeros_like(w) for w in weights]
            self.moments = [{} for _ in weights]
        if len(self.z) != len(weights):
            raise ConfigurationError(
                f"step got {len(weights)} weights, the sensitivity tracks {len(self.z)}: pass the "
                "same decayed weights at every step (or reset() for new ones)."
            )
        if self.z[0].device != weights[0].device or self.z[0].dtype != weights[0].dtype:
            self._move_to(weights)  # a loaded state
        if self.forgetting < 1.0:
            torch._foreach_mul_(self.z, self.forgetting)
            for m in self.moments:
                for t in m.values():
                    t.mul_(self.forgetting)
        hz = hvp(self.z) if hvp is not None else [None] * len(weights)
        shrinks = shrink if shrink is not None else [None] * len(weights)
        for z, w, lam, rule, eta_d, h, state in zip(
            self.z, weights, decay, updates, shrinks, hz, self.moments
        ):
            if rule is not None:
                _advance(z, w, lam, rule, eta_d, h, state)

    def _move_to(self, weights: Sequence[Tensor]) -> None:
        self.z = [z.to(w) for z, w in zip(self.z, weights)]
        self.moments = [{k: t.to(w) for k, t in m.items()} for m, w in zip(self.moments, weights)]

    def products(self, validation_grads: Sequence[Tensor]) -> Tensors:
        """∇₁E ⊙ z of each weight (its sum is ⟨∇₁E(w_t), z_t⟩ of eq. forwardhyper); zeros
        before any step."""
        if self.z is None:
            return [torch.zeros_like(g) for g in validation_grads]
        if len(validation_grads) != len(self.z):
            raise ConfigurationError(
                f"{len(validation_grads)} validation gradients for {len(self.z)} tracked weights: "
                "pass ∇₁E of the same decayed weights, in the same order."
            )
        return [g.detach() * z.to(g) for g, z in zip(validation_grads, self.z)]

    def hypergradient(self, validation_grads: Sequence[Tensor]) -> Tensor:
        """⟨∇₁E(w_t), z_t⟩ of eq. forwardhyper for one λ shared by all weights (0 before any
        step); add ∇₂E where E reads λ."""
        parts = [p.sum() for p in self.products(validation_grads)]
        return torch.stack(parts).sum() if parts else torch.zeros(())

    def state_dict(self) -> dict[str, Any]:
        """z and the moments' tangents (a checkpoint's: z is state of the training)."""
        return {
            "forgetting": self.forgetting,
            "z": None if self.z is None else [z.detach().clone() for z in self.z],
            "moments": [{k: t.detach().clone() for k, t in m.items()} for m in self.moments],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a state of another shape is refused naming it."""
        if not isinstance(state, dict) or not {"z", "moments"} <= set(state):
            raise ConfigurationError(
                "not a ForwardSensitivity state: expected a dict with 'z' and 'moments' "
                "(truncated or foreign checkpoint?)."
            )
        z, moments = state["z"], state["moments"]
        if (
            z is not None
            and (not isinstance(z, list) or not all(isinstance(t, Tensor) for t in z))
            or not isinstance(moments, list)
            or (z is not None and len(moments) != len(z))
        ):
            raise ConfigurationError(
                "ForwardSensitivity state: 'z' must be None or a list of tensors, 'moments' one "
                "dict of tensors per z (truncated or foreign checkpoint?)."
            )
        self.z = None if z is None else [t.clone() for t in z]
        self.moments = [dict(m) for m in moments]


def _advance(
    z: Tensor,
    w: Tensor,
    lam: float | Tensor,
    rule: UpdateRule,
    eta_d: float | None,
    hz: Tensor | None,
    state: Tangents,
) -> None:
    """z ← z_{t+1} of one weight in place (eq. fwdcoupled; eq. fwddecoupled where ``eta_d``
    is given)."""
    if eta_d is None:
        dg = torch.add(w, z, alpha=lam) if isinstance(lam, float) else w + lam * z
        if hz is not None:
            dg.add_(hz)
        rule.subtract(z, dg, state)
        return
    z.mul_(1.0 - eta_d * lam).add_(w, alpha=-eta_d)
    rule.subtract(z, hz, state)


#: the optimizers whose step :func:`update_rule` differentiates, and how
_FOLLOWED = ("SGD", "Adam", "AdamW")


def update_rule(
    optimizer: torch.optim.Optimizer,
    group: dict[str, Any],
    param: Tensor,
    grad: Tensor | Callable[[], Tensor],
) -> UpdateRule:
    """The step rule of ``param`` in ``optimizer``'s ``group``, read before the step (the
    optimizer's state then holds u_{t−1}, m_{t−1}, v_{t−1}): :class:`SGDStep` for
    ``torch.optim.SGD``, :class:`AdamStep` for ``Adam`` / ``AdamW`` (``grad``: g_t, the decay
    included where coupled, or a function giving it, called only where the rule reads it).
    Any other optimizer, or a setting whose step is not followed (amsgrad, maximize, the
    optimizer's own weight decay), is refused naming what to change."""
    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        raise ConfigurationError(
            f"ForwardSensitivity follows the steps of {', '.join(_FOLLOWED)} only, not "
            f"{name}'s: train with one of those, or drop hypergradient=ForwardSensitivity() "
            "(the default hypergradient works with any optimizer). With decoupled decay "
            "(decoupled=True) the decay path needs no optimizer step and any optimizer works."
        )
    for flag in ("maximize", "amsgrad"):
        if group.get(flag):
            raise ConfigurationError(
                f"ForwardSensitivity: {name} with {flag}=True is not followed: pass {flag}=False "
                "or drop hypergradient=ForwardSensitivity()."
            )
    if group.get("weight_decay", 0):
        raise ConfigurationError(
            f"ForwardSensitivity: {name} applies its own weight_decay={group['weight_decay']}; "
            "the step rules assume the decay is applied outside the optimizer: pass "
            "weight_decay=0."
        )
    lr = float(group["lr"])
    state = optimizer.state.get(param, {})
    if isinstance(optimizer, torch.optim.SGD):
        return SGDStep(
            lr,
            float(group.get("momentum", 0.0) or 0.0),
            float(group.get("dampening", 0.0) or 0.0),
            bool(group.get("nesterov", False)),
            first=state.get("momentum_buffer") is None,
        )
    step = int(float(state["step"])) + 1 if "step" in state else 1
    betas = (float(group["betas"][0]), float(group["betas"][1]))
    if not all(math.isfinite(b) for b in betas):
        raise ConfigurationError(f"ForwardSensitivity: {name}'s betas {betas} are not finite.")
    g = grad() if callable(grad) else grad
    return AdamStep(
        lr, betas, float(group["eps"]), step, state.get("exp_avg"), state.get("exp_avg_sq"), g
    )
