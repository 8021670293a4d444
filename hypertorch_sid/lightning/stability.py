"""The stability bounds on λ of :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`.

Every λ is kept in [``min_weight_decay``, its stable bound]: the largest decay the training
optimizer can train the decayed tensor with, halved (:meth:`StableBounds.bound`), read from the
optimizer's parameter group as it is now (a scheduler moves it with the learning rate). λ₀ above
the bound is refused at fit start, above half of it warned (:meth:`StableBounds.check_initial`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pytorch_lightning.utilities import rank_zero_warn

from ..core.errors import ConfigurationError

if TYPE_CHECKING:
    from .weight_decay_problem import WeightDecayProblem

__all__ = ["HIGH_INITIAL", "StableBounds"]

#: λ₀ above this share of the largest decay the optimizer can train with is warned: the decayed
#: layers are nearly wiped at every step and λ's hypergradient vanishes with them (session 50)
HIGH_INITIAL = 0.5


class StableBounds:
    """λ's box [``min_weight_decay``, :meth:`bound`] for each tensor ``problem`` decays (its
    ``decay.entries``, trained in the parameter groups its ``placement`` names).

    ``decoupled``, ``weight_decay`` (λ₀, named where it is refused) and ``min_weight_decay``:
    see :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`.
    """

    def __init__(
        self,
        problem: WeightDecayProblem,
        decoupled: bool,
        weight_decay: float,
        min_weight_decay: float,
    ) -> None:
        self._problem = problem
        self.decoupled = decoupled
        self.weight_decay = weight_decay
        self.min_weight_decay = min_weight_decay
        #: ``() -> L̂`` of the data term, once the hyper steps have estimated it (else None):
        #: the stability cap λ ≤ :meth:`bound` subtracts it (set by LearnedWeightDecay)
        self.data_curvature: Callable[[], float | None] = lambda: None
        self._warned_at_limit = False

    def bound(self, group: Mapping[str, Any]) -> float:
        """The largest λ the training optimizer can train a tensor of ``group`` with, halved.

        Coupled decay adds λw to the gradient: SGD with learning rate η and momentum m is stable
        on ℓ + ½λw² only while L + λ < 2(1 + m)/η, L the data term's curvature. With L̂ estimated
        (:attr:`data_curvature`, from the hyper steps' curvature estimate) the bound is half the
        room left, λ ≤ (2(1 + m)/η − L̂)/2 (with a data curvature of 15 and SGD at lr 0.1 λ rose
        to 10 under the old (1 + m)/η, past the limit 5, and the weights grew from 6 to 2.6e6).
        Only on a convex data term (λ̂_min > 0): a network trains at the edge of stability
        (its sharpness rises to about 2/η and SGD stays stable), where the subtraction would pin
        λ at 0. Before an estimate, or on networks, (1 + m)/η; where L̂ alone reaches the limit
        (minibatch estimates overshoot) λ is held under 1 % of it, with a warning. Other
        optimizers (Adam: the decay is preconditioned, the step bounded by η) λ ≤ 1/η. Decoupled
        decay multiplies w by 1 − ηλ each step, so λ ≤ 0.5/η keeps that factor in [0.5, 1].
        """
        lr = float(group.get("lr", 0.0) or 0.0)
        if lr <= 0:
            return math.inf
        if self.decoupled:
            return 0.5 / lr
        momentum = float(group.get("momentum", 0.0) or 0.0)
        if "momentum" in group and not group.get("nesterov", False):
            limit = 2 * (1 + momentum) / lr
            L = self.data_curvature()
            if L is None or not math.isfinite(L) or L <= 0:
                return limit / 2
            if L >= limit:
                return self._at_the_limit(L, limit)
            return (limit - L) / 2
        return 1.0 / lr

    def bounds(self) -> list[float]:
        """:meth:`bound` of every decayed tensor."""
        decay = self._problem.decay
        assert decay is not None
        return [self.bound(self._problem._group(i)) for i in range(len(decay.entries))]

    def project(self) -> None:
        """Keep every λ in [min_weight_decay, stable bound]: never past what the user's optimizer
        can train (the upper bound wins where the two cross)."""
        decay = self._problem.decay
        assert decay is not None
        decay.floor(self.min_weight_decay)
        decay.project(self.bounds())

    def check_initial(self) -> None:
        """λ₀ above :meth:`bound` (a learning rate so large that lr·λ₀ flips or blows up
        the decayed weights) is refused naming the learning rate; it was reported as "the
        initial hyperparameters are outside the feasible set", naming log λ's values.

        The λ checked is the one this fit starts from: λ₀ in a first fit, the learned λ where
        the callback fitted before (a second ``fit``, a loop over learning rates). Session 51:
        λ₀ was checked there, so a second fit at a larger learning rate was refused for a λ₀
        it does not start from, and a learned λ above the new bound was not checked at all."""
        bounds = self.bounds()
        decay = self._problem.decay
        assert decay is not None
        starts = [
            float(lam) if isinstance(lam, (int, float)) else float(lam.max())
            for lam in decay.applied_lambdas()
        ]
        worst = max(
            range(len(bounds)), key=lambda i: starts[i] / bounds[i] if bounds[i] else 0.0,
            default=None,
        )  # fmt: skip
        if worst is None or starts[worst] <= HIGH_INITIAL * bounds[worst]:
            return
        start = starts[worst]
        lr = float(self._problem._group(worst).get("lr", 0.0) or 0.0)
        what = (
            f"the initial weight_decay={start:g}"
            if math.isclose(start, self.weight_decay, rel_tol=1e-6)
            else f"the weight decay this fit starts from, λ = {start:.3g} (learned in an earlier "
            f"fit of this callback; weight_decay={self.weight_decay:g} was given)"
        )
        if start <= bounds[worst]:
            rank_zero_warn(
                f"LearnedWeightDecay: {what} is above "
                f"half the largest decay the training optimizer can train with at lr={lr:g} "
                f"({bounds[worst]:.3g}, for {decay.entries[worst].name}): each step "
                "removes most of the decayed weights, a layer so decayed holds little more than "
                "the last step's gradient, and λ's hypergradient vanishes with its weights, so "
                "λ may never come back down (the careless-user toy, SGD lr 0.1: λ₀ = 6–10 left "
                "the last layer's λ at 1.9–7.2 after 75 hyper steps and the network at chance; "
                "λ₀ ≤ 5 fell to 0). Start from a smaller weight_decay (e.g. 1e-4)."
            )
            return
        raise ConfigurationError(
            f"LearnedWeightDecay: {what} is above the "
            f"largest decay the training optimizer can train with at lr={lr:g} "
            f"({bounds[worst]:.3g}, for {decay.entries[worst].name}: "
            f"{'0.5/lr, decoupled' if self.decoupled else 'SGD (1 + momentum)/lr, else 1/lr'}): "
            "each step would shrink those weights past 0. Start from a smaller weight_decay, or "
            "lower the learning rate."
        )

    def _at_the_limit(self, L: float, limit: float) -> float:
        """L̂ alone reaches SGD's limit 2(1 + m)/η: any λ adds to a curvature the training can
        barely take (a minibatch estimate may overshoot the true L, but no room is measured),
        so λ is held below 1 % of the plain cap, and the user is told once."""
        if not self._warned_at_limit:
            self._warned_at_limit = True
            rank_zero_warn(
                f"LearnedWeightDecay: the data term's estimated curvature L̂ = {L:.3g} reaches "
                f"the training optimizer's stability limit 2(1 + momentum)/lr = {limit:.3g}; "
                f"λ is capped at {0.005 * limit:.3g} so that the decay cannot make the training "
                "diverge. Lower the learning rate of the training optimizer to give λ room."
            )
        return 0.005 * limit
