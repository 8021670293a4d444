"""Which rows the learned weights flag as suspect: below a weight, or the lower of two
components of the weights' distribution."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .errors import ConfigurationError
from .validation import as_strategy, is_real, number_fix

if TYPE_CHECKING:
    from .sample_weights import SampleWeights

Tensors = list[Tensor]


# ---------------------------------------------------------------------- which rows to flag
class FlagRule(ABC):
    """Which rows of a :class:`SampleWeights` count as flagged (distrusted)."""

    @abstractmethod
    def flags(self, weights: SampleWeights) -> Tensor:
        """A boolean mask over the n rows."""


class BelowWeight(FlagRule):
    """ω < ``threshold`` (default: half the initial weight ω₀)."""

    def __init__(self, threshold: float | None = None) -> None:
        if threshold is not None and not (is_real(threshold) and 0 < threshold < math.inf):
            raise ConfigurationError(  # NaN or ≤ 0 flagged no row, whatever the weights (s53)
                f"BelowWeight: threshold must be a finite number > 0 (a weight: rows with ω "
                f"below it are flagged), got {threshold!r}."
            )
        self.threshold = None if threshold is None else float(threshold)

    def flags(self, weights: SampleWeights) -> Tensor:
        threshold = self.threshold
        if threshold is None:
            threshold = 0.5 * weights.initial_weight
        largest = weights.parameterization.largest
        if threshold >= largest:  # flagged(50), a percentage: every row, whatever was learned
            raise ConfigurationError(
                f"flagging ω < {threshold:g} flags every row: the weights of "
                f"{weights.parameterization!r} are below {largest:g}. Pass a weight (e.g. 0.25 "
                "flags ω < 0.25), not a percentage."
            )
        return weights.values() < threshold

    def __repr__(self) -> str:
        return f"BelowWeight({self.threshold!r})"


class TwoComponentSplit(FlagRule):
    """The rows of the lower of two Gaussian components fitted to the learned logits x by EM
    (each component its own mean, spread and share):

        flagged ⇔ P(low | xᵢ) > ½ and xᵢ < μ_high,

    where the two components are separated, Ashman's D = √2 |μ_high − μ_low| / √(σ²_low +
    σ²_high) ≥ ``min_separation`` (a bimodal split; a single bump gives D < 2), and the low
    component's weight ω(μ_low) lies below ω₀ (its rows' weights went down). Otherwise no row
    is flagged.

    The logits are clipped to ±``clip`` first (σ(±10) is within 5·10⁻⁵ of 0 or 1): a solver
    whose logits run off to ±100s, the weights long saturated, would otherwise hand the fit a
    few far tails that dwarf the two bumps. It reads only where the logits sit relative to
    each other, not how far each moved: with
    an outer step of about ±1 per visit and no momentum (``LazyAdam(betas=(0, ·))``), a clean
    example's logit random-walks around its start while a corrupted one's drifts down, and a
    fixed threshold on ω (:class:`BelowWeight`) catches the clean random walk's lower tail
    once it has walked far enough; the split places the boundary between the corrupted
    examples' bump and the clean examples' spread, wherever they are.
    """

    def __init__(
        self, min_separation: float = 2.0, clip: float = 10.0, iterations: int = 200
    ) -> None:
        if not min_separation >= 0:
            raise ConfigurationError(
                f"TwoComponentSplit: min_separation must be ≥ 0, got {min_separation!r}."
            )
        if not clip > 0:
            raise ConfigurationError(f"TwoComponentSplit: clip must be > 0, got {clip!r}.")
        self.min_separation, self.clip, self.iterations = (
            float(min_separation),
            float(clip),
            int(iterations),
        )

    def flags(self, weights: SampleWeights) -> Tensor:
        x = weights.parameterization.effective_logits(weights)
        x = x.to(torch.float64).reshape(-1).clamp(-self.clip, self.clip)
        none = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
        if x.numel() < 4 or not bool(x.std() > 0):
            return none
        low, (mu, sd) = self.fit(x)
        lo, hi = int(mu.argmin()), int(mu.argmax())
        separation = math.sqrt(2) * float(mu[hi] - mu[lo]) / float(sd.pow(2).sum().sqrt())
        omega_low = weights.parameterization.rows(mu[lo : lo + 1].to(x.dtype), weights)
        if separation < self.min_separation or not float(omega_low) < weights.initial_weight:
            return none
        return low & (x < mu[hi])

    def fit(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """EM for a two-component 1-D Gaussian mixture from the 10 % / 90 % quantiles: the mask
        P(low | x) > ½ and the components' (means, spreads); a spread never falls below 5 %
        of x's (rows that never moved sit at one value)."""
        floor = 0.05 * float(x.std())
        mu = torch.quantile(x, torch.tensor([0.1, 0.9], dtype=x.dtype, device=x.device))
        sd = x.std().repeat(2)
        share = torch.full((2,), 0.5, dtype=x.dtype, device=x.device)
        for _ in range(self.iterations):
            z = (x[:, None] - mu) / sd
            resp = torch.softmax(-0.5 * z * z - sd.log() + share.log(), dim=1)
            total = resp.sum(0).clamp_min(1e-12)
            new_mu = (resp * x[:, None]).sum(0) / total
            sd = ((resp * (x[:, None] - new_mu) ** 2).sum(0) / total).sqrt().clamp_min(floor)
            share = total / x.numel()
            done = bool((new_mu - mu).abs().max() < 1e-9 * (1 + float(mu.abs().max())))
            mu = new_mu
            if done:
                break
        return resp[:, int(mu.argmin())] > 0.5, (mu, sd)

    def __repr__(self) -> str:
        return f"TwoComponentSplit(min_separation={self.min_separation:g})"


FLAG_RULES: dict[str, Callable[[], FlagRule]] = {
    "split": TwoComponentSplit,
    "below_half": BelowWeight,
}


def as_flag_rule(rule: FlagRule | str | float | None) -> FlagRule:
    """A :class:`FlagRule`: ``None`` → :class:`TwoComponentSplit`, a number t → ω < t
    (:class:`BelowWeight`), a name (``"split"``, ``"below_half"``) or the rule itself."""
    if rule is None:
        return TwoComponentSplit()
    if is_real(rule):  # a NumPy number too (np.float32 from a quantile: refused before)
        return BelowWeight(float(rule))
    if isinstance(rule, Tensor):  # flagged(weights.quantile(0.1)): named as no rule (s62)
        raise ConfigurationError(
            "flagged: the rule must be a number t (flags the weights below t), 'split', "
            f"'below_half' or a FlagRule, got {rule!r}{number_fix('rule', rule, float)}."
        )
    return as_strategy("the flag rule", rule, FlagRule, FLAG_RULES, "0.25 or TwoComponentSplit()")
