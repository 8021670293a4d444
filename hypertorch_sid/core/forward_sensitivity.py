"""Forward sensitivity: ∂w_t/∂λ carried along the steps the optimizer actually took.

The implicit hypergradient (eq. hypergrad) is the derivative at the fixed point w(λ); the damped
one looks a few steps ahead of the current w_t. Neither sees what λ *has done* to the weights
along the training so far. Differentiating one training step with a weight decay λ per group,

    SGD with L2 in the loss:   w_{t+1} = w_t − η (∇ℓ(w_t) + λ w_t)
    decoupled (AdamW-like):    w_{t+1} = (1 − η_d λ) w_t − η u_t

by λ gives the forward (tangent) recursion of z_t = ∂w_t/∂λ,

    z_{t+1} = (1 − η λ) z_t − η w_t − η H z_t,                            (eq. forwardsens)

with η the step size the optimizer applied (a scalar, or a tensor per element: Adam's
lr/(√v̂ + ε)) and H = ∇²ℓ(w_t). Dropping the H term (``hvp=None``) keeps the decay path only:
what λ did to the weights through the shrink alone, which costs one fused multiply-add per
decayed weight and step. The hypergradient of the validation loss at the weights reached is then

    dE(w_t)/dλ = ∇₂E + ⟨∇₁E(w_t), z_t⟩                                  (eq. forwardhyper)

exact for the training that ran (with H), not for a fixed point that it never reaches.
``forgetting`` < 1 multiplies z by a factor each step: a sensitivity over a window of about
1/(1 − forgetting) recent steps instead of the whole past (λ changes while it is learned).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .errors import ConfigurationError

Tensors = list[Tensor]


@dataclass
class ForwardSensitivity:
    """z = ∂w/∂λ of one decayed group, accumulated over the training steps (eq. forwardsens).

    Parameters
    ----------
    forgetting: the factor z is multiplied by before each step, in (0, 1] (1: the exact
        sensitivity of the whole training so far).
    """

    forgetting: float = 1.0
    z: Tensors | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.forgetting <= 1.0:
            raise ConfigurationError(
                f"forgetting must be in (0, 1], got {self.forgetting!r}: 1 keeps the whole "
                "training's sensitivity, 0.99 about the last 100 steps'."
            )

    def step(
        self,
        weights: Sequence[Tensor],
        step_size: float | Sequence[Tensor],
        decay: float,
        hvp: Callable[[Tensors], Tensors] | None = None,
    ) -> None:
        """Advance z by one training step taken from ``weights`` (w_t, before the step).

        Parameters
        ----------
        weights: the group's weights w_t before the step.
        step_size: η: one float, or one tensor per weight (the optimizer's per-element step).
        decay: λ of the group at this step.
        hvp: v ↦ H v at w_t (``None``: the decay path only, H z dropped).
        """
        weights = [w.detach() for w in weights]
        steps = _per_weight(step_size, weights)
        if self.z is None:
            self.z = [torch.zeros_like(w) for w in weights]
        if len(self.z) != len(weights):
            raise ConfigurationError(
                f"step got {len(weights)} weights, the sensitivity tracks {len(self.z)}: pass the "
                "same decayed group at every step (or a new ForwardSensitivity for a new group)."
            )
        curvature = hvp(self.z) if hvp is not None else [torch.zeros_like(z) for z in self.z]
        self.z = [
            self.forgetting * ((1.0 - eta * decay) * z - eta * hz) - eta * w
            for z, w, eta, hz in zip(self.z, weights, steps, curvature, strict=True)
        ]

    def hypergradient(self, validation_grads: Sequence[Tensor]) -> Tensor:
        """⟨∇₁E(w_t), z_t⟩ of eq. forwardhyper (0 before any step)."""
        if self.z is None:
            return torch.zeros(())
        return sum((g.detach() * z).sum() for g, z in zip(validation_grads, self.z, strict=True))


def _per_weight(step_size: float | Sequence[Tensor], weights: Tensors) -> list:
    if isinstance(step_size, int | float):
        return [float(step_size)] * len(weights)
    steps = list(step_size)
    if len(steps) != len(weights):
        raise ConfigurationError(
            f"step_size has {len(steps)} tensors for {len(weights)} weights: pass one float, or "
            "one step-size tensor per weight."
        )
    return steps
