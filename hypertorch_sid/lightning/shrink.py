"""How fast :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`'s decay shrinks
the weights per training step, as the training optimizers set it (eq. shrinkrate): what the
outer step :class:`~hypertorch_sid.core.outer_step.ShrinkFallRprop` reads per λ slot
(:meth:`ShrinkRates.readings`), and the η that :class:`~hypertorch_sid.core.outer_step.TrustRprop`'s
bound (eq. decaytrust) reads (:meth:`ShrinkRates.step_size`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.decay import WeightDecay
from ..core.errors import ConfigurationError
from ..core.outer_step import ShrinkReading
from ..core.validation import is_real
from .optimizer_decay import stepping

if TYPE_CHECKING:
    from .weight_decay_problem import WeightDecayProblem

__all__ = ["AppliedShrink", "ShrinkRates", "ShrinkReadings"]

#: an optimizer's share of the steps R counts (eq. stepshare,
#: :class:`~hypertorch_sid.lightning.training_length.StepShares`)
Share = Callable[[torch.optim.Optimizer], float]


class ShrinkReadings(Sequence):
    """Per λ slot, the :class:`~hypertorch_sid.core.outer_step.ShrinkReading` of its decayed
    tensors (:meth:`ShrinkRates.readings`), read when a slot is first looked up,
    at the λ of when the sequence was made: the outer step looks up only the slots eq.
    shrinkfall may move (still descending, hypergradient "less decay"), so the others cost
    nothing, and SGD's or decoupled decay's cost no per-element work at all."""

    def __init__(self, rates: ShrinkRates, lambdas: list, share: Share | None = None) -> None:
        self._rates, self._lambdas, self._share = rates, lambdas, share
        self._slots: dict[int, list[ShrinkReading]] = {}

    def __len__(self) -> int:
        return len(self._rates.decay.slot_names)

    def __getitem__(self, k: int) -> list[ShrinkReading]:  # type: ignore[override]
        if not 0 <= k < len(self):
            raise IndexError(k)
        if k not in self._slots:
            entries = self._rates.decay.entries
            read = (self._rates._reading(i, float(self._lambdas[i]), self._share)
                    for i, e in enumerate(entries) if e.slot == k)  # fmt: skip
            self._slots[k] = [r for r in read if r is not None]
        return self._slots[k]


class ShrinkRates:
    """The shrink a unit of λ causes on each tensor ``problem`` decays (its ``decay.entries``,
    trained by the optimizers and groups its ``placement`` names), coupled or ``decoupled``."""

    def __init__(self, problem: WeightDecayProblem, decoupled: bool) -> None:
        self._problem = problem
        self.decoupled = decoupled
        #: per-element readings of the optimizers' state taken for eq. shrinkfall (Adam's)
        self.reads = 0

    @property
    def decay(self) -> WeightDecay | None:
        """λ of ``problem`` (None before a fit found its tensors)."""
        return self._problem.decay

    def step_size(self, eta: float | None, share: Share | None = None) -> float | None:
        """η of the shrink a unit of λ causes per training step: coupled decay adds λw to the
        gradient, so the training's own η (momentum's and Adam's gain included); decoupled decay
        multiplies w by 1 − lr·λ, so the lr of the decayed tensors' groups (their mean, by
        elements), whatever the optimizer's gain. What :class:`TrustRprop`'s bound (eq.
        decaytrust) reads. ``share``: each optimizer's share of the steps R counts (eq.
        stepshare; None: 1), by which a decoupled lr is one per step of R (``eta`` carries it)."""
        if not self.decoupled or self.decay is None:
            return eta
        sizes = [(self._lr(i) * self._share(i, share), e.param.numel())
                 for i, e in enumerate(self.decay.entries)]  # fmt: skip
        total = sum(n for _, n in sizes)
        lr = sum(lr * n for lr, n in sizes) / total if total else 0.0
        return lr if lr > 0 else eta

    def readings(self, share: Share | None = None) -> ShrinkReadings | None:
        """Per λ slot, how fast its decayed tensors shrink under a unit of decay as their
        optimizers set it (:class:`~hypertorch_sid.core.outer_step.ShrinkReading`, eq.
        shrinkrate), at the λ and optimizer state of now: a lazy sequence (:class:`ShrinkReadings`)
        that reads a slot's tensors only when the outer step looks the slot up. SGD's
        lr(1 − d)/(1 − μ) and decoupled decay's group lr are one number per tensor (closed form,
        nothing read per element); Adam's (any optimizer with ``exp_avg_sq``) lr and ε with
        σ² = max(v̂ − (λw)², 0) per element. A tensor whose optimizer gives no reading (not
        stepped yet, another optimizer) is left out. None per element. ``share``: each
        optimizer's share of the steps R counts (eq. stepshare; None: 1): the rates are per step
        of R, so a tensor whose optimizer makes half of them shrinks half as fast per step of R."""
        decay = self.decay
        if decay is None or decay.per_element:
            return None
        return ShrinkReadings(self, decay.applied_lambdas(), share)

    def _lr(self, i: int) -> float:
        return float(self._problem._group(i).get("lr", 0.0) or 0.0)

    def _share(self, i: int, share: Share | None) -> float:
        """Decayed tensor i's optimizer's share of the steps R counts (eq. stepshare)."""
        return 1.0 if share is None else share(self._problem.placement[i][0])

    @torch.no_grad()
    def _reading(self, i: int, lam: float, share: Share | None = None) -> ShrinkReading | None:
        """Decayed tensor i's :class:`ShrinkReading` at decay ``lam`` per step of R (see
        :meth:`readings`); counts the per-element readings in :attr:`reads`."""
        e = self.decay.entries[i]
        opt = stepping(self._problem.placement[i][0])  # a wrapper's (SAM's) base optimizer
        group = self._problem._group(i)
        lr = self._lr(i) * self._share(i, share)
        if self.decoupled:
            return ShrinkReading(None, gain=lr, elements=e.param.numel())
        if isinstance(opt, torch.optim.SGD):
            mu = float(group.get("momentum", 0.0) or 0.0)
            damp = float(group.get("dampening", 0.0) or 0.0) if mu > 0 else 0.0
            gain = lr * (1.0 - damp) / (1.0 - mu)
            return ShrinkReading(None, gain=gain, elements=e.param.numel())
        state = opt.state.get(e.param, {})
        if "exp_avg_sq" in state and "step" in state and "betas" in group:
            self.reads += 1
            w = e.param.detach().abs()
            v = state["exp_avg_sq"].detach() / (1.0 - group["betas"][1] ** float(state["step"]))
            data_sq = (v - (lam * w) ** 2).clamp(min=0.0)
            eps = float(group.get("eps", 1e-8))
            return ShrinkReading(w, data_sq=data_sq, lr=lr, eps=eps)
        return None


class AppliedShrink:
    """The decay a fit has applied, per λ group (the slots; per element, the layers): the
    effective λ, the constant that shrinks the group's weights as much over the fit under the
    training's own learning rates (eq. effectivedecay)

        λ̄ = Σ_t lr_t λ_t / Σ_t lr_t,

    summed over the optimizer steps that applied the decay (a tensor's steps, weighted by its
    elements; per element, λ_t is the tensor's mean λ). It is what to put in a plain training's
    ``weight_decay`` after a learned fit: the last λ describes the fit's last steps only, and
    where the learning rate ends near 0 (a cosine tail) λ's last rises change nothing, so it can
    end far above any decay the fit applied (session 60: 54 on an AdamW fit whose λ̄ was 1e-2).
    Exact for SGD (momentum's gain is a constant factor) and decoupled decay (AdamW's
    ``w ← w(1 − lr λ)``); for coupled Adam the preconditioner also scales the shrink.
    Checkpointed with λ, so a resumed fit sums on (:meth:`state`, :meth:`load`)."""

    def __init__(self) -> None:
        #: group name → [Σ lr λ n, Σ lr n] (a 0-dim tensor where λ is one: no device sync)
        self.sums: dict[str, list[Any]] = {}
        #: the sums a checkpoint held, taken over by the next :meth:`start`
        self.checkpointed: dict[str, list[float]] | None = None
        #: group name → [Σ lr n, Σ n, the last lr] of this process's steps (not checkpointed):
        #: whether the learning rate had fallen by the fit's end (:meth:`lr_fell`)
        self.rates: dict[str, list[float]] = {}

    def start(self) -> None:
        """A fit starts: sum from 0, or on from the checkpoint it resumes."""
        saved, self.checkpointed = self.checkpointed, None
        self.sums = {k: list(v) for k, v in saved.items()} if saved is not None else {}
        self.rates = {}

    def add(self, group: str, lr: float, lam: float | Tensor, elements: int) -> None:
        """One optimizer step applied ``lam`` at learning rate ``lr`` to a tensor of ``group``."""
        if isinstance(lam, Tensor):
            lam = lam.detach().float().mean()
        weight = lr * elements
        sums = self.sums.setdefault(group, [0.0, 0.0])
        sums[0] = sums[0] + weight * lam
        sums[1] += weight
        rates = self.rates.setdefault(group, [0.0, 0.0, 0.0])
        rates[0], rates[1], rates[2] = rates[0] + weight, rates[1] + elements, lr

    def lr_fell(self, group: str) -> bool | None:
        """Whether the group's last learning rate is below half its mean over this fit's steps
        (a cosine or step tail); None where this process stepped none of it."""
        rates = self.rates.get(group)
        if rates is None or rates[1] == 0:
            return None
        return rates[2] < 0.5 * rates[0] / rates[1]

    def effective(self) -> dict[str, float]:
        """λ̄ per group (eq. effectivedecay); a group never stepped at lr > 0 is left out."""
        return {k: float(num) / den for k, (num, den) in self.sums.items() if den > 0}

    def state(self) -> dict[str, list[float]]:
        """The sums as numbers, for a checkpoint."""
        return {k: [float(num), float(den)] for k, (num, den) in self.sums.items()}

    def rename(self, names: Mapping[str, str]) -> None:
        """Rename groups (old name → new), in the sums and in a checkpoint's not yet started."""
        self.sums = {names.get(k, k): v for k, v in self.sums.items()}
        if self.checkpointed is not None:
            self.checkpointed = {names.get(k, k): v for k, v in self.checkpointed.items()}

    def load(self, state: Any, key: str) -> None:
        """Keep a checkpoint's sums (its entry ``key``) for the resumed fit's :meth:`start`."""
        if not isinstance(state, Mapping) or not all(
            isinstance(k, str)
            and isinstance(v, (list, tuple))
            and len(v) == 2
            and all(is_real(x) and math.isfinite(x) and x >= 0 for x in v)
            for k, v in state.items()
        ):
            raise ConfigurationError(
                f"LearnedWeightDecay: the checkpoint's {key} must map λ group names to two "
                "finite numbers ≥ 0, [Σ lr·λ, Σ lr] (truncated or foreign checkpoint?)."
            )
        self.checkpointed = {k: [float(v[0]), float(v[1])] for k, v in state.items()}
