"""Scale invariance: parameter groups the loss does not see the size of.

A group S of weights (a convolution followed by BatchNorm, a BatchNorm's (γ, β) followed by
ReLU, pooling, a linear map and another BatchNorm) is *scale-invariant* when

    ℓ(c·w_S, w_rest) = ℓ(w_S, w_rest)   for every c > 0.                       (eq. invariant)

Differentiating in c at c = 1 and in w_S gives (Euler's theorem, ℓ 0-homogeneous in w_S)

    ⟨∇_S ℓ, w_S⟩ = 0,     ∇²_SS ℓ · w_S = −∇_S ℓ,                                (eq. euler)

for the training loss as for the validation loss E (when it is the same function on other
data). Weight decay ½λ‖w_S‖² on such a group changes nothing the loss can see at a fixed point:
ℓ̂ = ℓ + ½λ‖w_S‖² has no stationary point with w_S ≠ 0 (⟨∇_S ℓ̂, w_S⟩ = λ‖w_S‖² > 0), so the
implicit hypergradient ∂E/∂λ_S = −⟨w_S, v_S⟩, (∇²ℓ̂) v = ∇E, describes a fixed point that
does not exist; decay acts on such a group only through the *effective learning rate* η/‖w_S‖²
of its direction w_S/‖w_S‖, i.e. through the training's dynamics (Hoffer et al. 2018; van Laarhoven
2017; Zhang et al. 2019, "Three mechanisms of weight decay regularization").

:func:`scale_invariant` tells whether a group is invariant by probing: the loss at c = ½ and
c = 2 against c = 1 (the same batch, the same randomness).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .errors import ConfigurationError
from .validation import as_strategy

#: the scalings probed (exact in binary floating point: the weights come back bit for bit)
FACTORS = (0.5, 2.0)
#: the random moves (± half a direction of the tensors' own norm) a group that passes the
#: scalings is compared with
MOVES = (0.5, -0.5)
#: the most loss evaluations (forward passes) :func:`scale_invariant` makes given its ``base``:
#: one per scaling, then one per random move where both scalings pass (a budget plans a probe of
#: n groups as ``1 + n · MAX_FORWARDS`` forwards, its base included)
MAX_FORWARDS = len(FACTORS) + len(MOVES)
#: an invariant group's loss changes under the scalings at most this share of its change under a
#: random move of the same size (measured 3·10⁻⁴–3·10⁻³ invariant, ≥ 0.3 plain)
RELATIVE_TO_A_MOVE = 0.03


@torch.no_grad()
def scale_invariant(
    loss: Callable[[], Tensor],
    tensors: Sequence[Tensor],
    rtol: float = 1e-3,
    reference: float = RELATIVE_TO_A_MOVE,
    base: float | None = None,
) -> bool:
    """Whether ``loss()`` is unchanged (to relative ``rtol``) when ``tensors`` are scaled by ½
    and by 2 together (eq. invariant), and changed at most ``reference`` times as much as by a
    random move of the same size; the tensors are restored exactly.

    ``loss`` must be deterministic (the same batch; dropout seeded by the caller) and free of
    side effects the caller cares about (BatchNorm's running statistics: restore them, e.g.
    with :func:`~hypertorch_sid.core.modes.frozen_mode`). The tolerance covers BatchNorm's ε
    (the normalisation divides by √(σ² + ε), not σ) and float32 rounding: a layer the loss
    does see changes it by far more (a linear output layer scaled by 2: tens of percent).

    The second test makes the first scale-free: near initialisation a network's loss is
    ≈ log(classes) whatever a middle layer's size, so scaling a plain layer by 2 moved the
    loss by under 10⁻³ of its value and the layer passed as invariant (digits MLPs, a
    squeeze-excitation's fc1). Moving each tensor by ±½ of a seeded random direction of its
    own norm (the size of the move from c = 1 to ½ or 2) changes the loss of an invariant
    group by orders of magnitude more than the scalings do (ratio 3·10⁻⁴–3·10⁻³ after
    LayerNorm, GroupNorm, BatchNorm), of a plain layer about as much (0.3–30): ``reference``
    = 0.03 lies between. ``base``: ``loss()`` at the tensors as they are, where the caller
    probes several groups on one batch (each comes back bit for bit, so one reading serves).
    With it, at most :data:`MAX_FORWARDS` evaluations of ``loss``; one more without it.
    """
    if not tensors:
        raise ConfigurationError("scale_invariant: give at least one tensor to scale.")
    if not rtol > 0:
        raise ConfigurationError(f"scale_invariant: rtol must be > 0, got {rtol!r}.")
    base = float(loss()) if base is None else base
    if not math.isfinite(base):
        return False
    scaled = 0.0
    for c in FACTORS:
        for t in tensors:
            t.mul_(c)
        try:
            value = float(loss())
        finally:
            for t in tensors:
                t.div_(c)
        if not abs(value - base) <= rtol * max(abs(base), 1e-12):
            return False
        scaled = max(scaled, abs(value - base))
    return scaled <= reference * _random_move(loss, tensors, base)


def _random_move(loss: Callable[[], Tensor], tensors: Sequence[Tensor], base: float) -> float:
    """The largest change of ``loss()`` when every tensor moves by ±½ of a seeded random
    direction of its own norm; the tensors are restored bit for bit."""
    generator = torch.Generator().manual_seed(0)
    saved = [t.clone() for t in tensors]
    moves = []
    for t in tensors:
        u = torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device)
        moves.append((u * (t.double().norm() / u.norm().clamp_min(1e-30))).to(t))
    change = 0.0
    try:
        for sign in MOVES:
            for t, u, keep in zip(tensors, moves, saved):
                t.copy_(keep).add_(u, alpha=sign)
            change = max(change, abs(float(loss()) - base))
    finally:
        for t, keep in zip(tensors, saved):
            t.copy_(keep)
    return change if change == change else math.inf  # a NaN loss: no reference


class InvariantRule(ABC):
    """What the λ of a scale-invariant group learns from (``LearnedWeightDecay(invariant=)``).

    ``probes``: whether the groups must be detected (:func:`scale_invariant`) before the first
    hyper step. :meth:`adjust` gets the hypergradient of every learned tensor and a 0/1 mask
    of the same shapes (1 on the values of invariant groups) and returns the hypergradient the
    outer step uses.
    """

    probes: bool = True

    @abstractmethod
    def adjust(self, hypergrad: Sequence[Tensor], invariant: Sequence[Tensor]) -> list[Tensor]:
        """The hypergradient with the invariant groups' part replaced."""


class LearnInvariant(InvariantRule):
    """Every λ learns from the implicit hypergradient, invariant groups included (no probe)."""

    probes = False

    def adjust(self, hypergrad: Sequence[Tensor], invariant: Sequence[Tensor]) -> list[Tensor]:
        return list(hypergrad)

    def __repr__(self) -> str:
        return "LearnInvariant()"


class HoldInvariant(InvariantRule):
    """The λ of an invariant group stays where it is (its hypergradient is set to 0).

    The implicit hypergradient of such a group describes a fixed point that does not exist
    (module docstring); measured on the benchmark's Fashion-MNIST CNN it is 10⁻⁷–10⁻⁶ in
    ∂E/∂log λ, and the outer Adam turns its sign into full steps: λ fell 30× in 19 hyper
    steps on every layer. HoldInvariant keeps the user's initial value there.
    """

    def adjust(self, hypergrad: Sequence[Tensor], invariant: Sequence[Tensor]) -> list[Tensor]:
        return [g * (1 - m) for g, m in zip(hypergrad, invariant)]

    def __repr__(self) -> str:
        return "HoldInvariant()"


#: names of the rules (``invariant=`` takes a name or an :class:`InvariantRule`)
INVARIANT_RULES: dict[str, Callable[[], InvariantRule]] = {
    "implicit": LearnInvariant,
    "held": HoldInvariant,
}


def as_invariant_rule(value: str | InvariantRule) -> InvariantRule:
    """An :class:`InvariantRule` from its name (``"implicit"``, ``"held"``) or itself."""
    return as_strategy(
        "invariant", value, InvariantRule, INVARIANT_RULES, example="HoldInvariant()"
    )
