"""The label-shift class prior: each training row's loss importance-weighted to the validation
set's class distribution.

The validation set defines the distribution the outer objective E measures. Where its class
frequencies π_c differ from the training's p_c (imbalanced training classes, a balanced
validation set), the training loss's expectation is not E's: the importance weight

    r_c = π̂_c / p_c,      E_{i∼p}[r_{yᵢ} ℓᵢ] = Σ_c p_c r_c ℓ̄_c = Σ_c π̂_c ℓ̄_c     (eq. labelshift)

is exactly the label-shift correction (ℓ̄_c: the mean loss of class c). The drop-in multiplies
each row's learned weight by r of its label (:meth:`SampleWeights.use_prior`), so the learned
per-example weights refine *within* a class on top of the class balance E asks for, from the
fit's first step (session 54, docs/data_weights.md).

π̂ is the validation's class frequency shrunk toward the training's (a small validation set,
30 examples a class, gives each π_c to ±17 %): the positive-part James–Stein estimator of the
multinomial proportions,

    π̂ = p + s (π − p),   s = max(0, 1 − (K − 3)⁺ / X²),
    X² = Σ_c (n_c − N p_c)² / (N p_c)                                        (eq. shiftshrink)

with n_c the validation counts, N their sum and K the classes the training holds: X² is
Pearson's statistic of "no shift", χ²_{K−1} under it (mean K − 1), so where the validation
frequencies match the training's within their noise s is 0 or small and r ≈ 1 (exactly 1 for
X² ≤ K − 3), and where they differ by far more than the noise (imbalance) s → 1 and r is the
plain ratio. With K ≤ 3 classes there is no shrinkage (s = 1: James–Stein gains nothing below
three free proportions). A class absent from the validation set gets r_c = 1 − s (the target
holds almost none of it where the shift is evident); a class the validation set holds but the
training does not has no row to weight (its share is left out, and r renormalised so that the
mean factor over the training rows is 1: E_{i∼p}[r_{yᵢ}] = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import ConfigurationError

__all__ = ["LabelShift", "LabelShiftRatios"]


@dataclass(frozen=True)
class LabelShiftRatios:
    """What :meth:`LabelShift.ratios` found (float64 vectors over the classes 0..K−1).

    Attributes
    ----------
    ratios:
        r_c = π̂_c / p_c (eq. labelshift), 1 for a class without training rows.
    training:
        p_c, the training's class frequencies (a sampler's draws where one draws the rows).
    validation:
        π_c, the validation's class frequencies as counted.
    target:
        π̂_c, the shrunk target frequencies over the training's classes (eq. shiftshrink).
    shrinkage:
        s of eq. shiftshrink: 0 keeps the training's frequencies (r ≡ 1), 1 takes the
        validation's as counted.
    statistic:
        Pearson's X² of "no shift" (χ²_{K−1} under it).
    """

    ratios: Tensor
    training: Tensor
    validation: Tensor
    target: Tensor
    shrinkage: float
    statistic: float

    @property
    def identity(self) -> bool:
        """Whether r ≡ 1 (no shift evident: nothing to correct)."""
        return bool((self.ratios == 1).all())

    def missing(self) -> tuple[list[int], list[int]]:
        """(classes the training holds and the validation does not, classes the validation
        holds and the training does not)."""
        p, pi = self.training, self.validation
        absent_val = ((p > 0) & (pi == 0)).nonzero().flatten().tolist()
        absent_train = ((pi > 0) & (p == 0)).nonzero().flatten().tolist()
        return absent_val, absent_train


class LabelShift:
    """The label-shift class prior r_c = π̂_c / p_c (eq. labelshift, see the module docstring),
    π̂ shrunk toward p by the positive-part James–Stein factor (eq. shiftshrink).

    Parameters
    ----------
    shrink:
        ``True`` (default): eq. shiftshrink's s; ``False``: s = 1, the validation's frequencies
        as counted (the closed form r_c = π_c / p_c; a class absent from the validation set
        then gets r_c = 0: its rows leave the training loss).
    """

    def __init__(self, shrink: bool = True) -> None:
        if not isinstance(shrink, bool):
            raise ConfigurationError(f"LabelShift(shrink=) takes True or False, got {shrink!r}.")
        self.shrink = shrink

    def ratios(self, training: Tensor, validation: Tensor) -> LabelShiftRatios:
        """r from the training's class counts (or a sampler's class masses) and the
        validation's class counts (non-negative vectors indexed by class; the shorter is padded
        with zeros), or a clear error where either holds nothing."""
        p_n, n = _counts(training, "training"), _counts(validation, "validation")
        k = max(p_n.numel(), n.numel())
        p_n = torch.nn.functional.pad(p_n, (0, k - p_n.numel()))
        n = torch.nn.functional.pad(n, (0, k - n.numel()))
        p, big_n = p_n / p_n.sum(), float(n.sum())
        pi = n / big_n
        held = p > 0
        expected = big_n * p[held]
        x2 = float(((n[held] - expected) ** 2 / expected).sum())
        s = self.shrinkage(x2, int(held.sum()))
        target = torch.where(held, p + s * (pi - p), torch.zeros_like(p))
        target = target / target.sum()  # the validation's share of classes never trained on
        ratios = torch.where(held, target / p.clamp_min(1e-300), torch.ones_like(p))
        return LabelShiftRatios(ratios, p, pi, target, s, x2)

    def shrinkage(self, statistic: float, classes: int) -> float:
        """s of eq. shiftshrink for Pearson's ``statistic`` X² over ``classes`` classes."""
        if not self.shrink or classes <= 3:
            return 1.0
        if statistic <= 0:
            return 0.0
        return max(0.0, 1.0 - (classes - 3) / statistic)

    def __repr__(self) -> str:
        return "LabelShift()" if self.shrink else "LabelShift(shrink=False)"


def _counts(counts: Tensor, what: str) -> Tensor:
    """``counts`` as a float64 vector of non-negative numbers with a positive sum."""
    c = torch.as_tensor(counts).detach().to("cpu", torch.float64).flatten()
    if c.numel() == 0 or not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ConfigurationError(
            f"LabelShift: the {what} class counts must be finite and non-negative, got {c}."
        )
    if float(c.sum()) <= 0:
        raise ConfigurationError(
            f"LabelShift: the {what} set holds no labelled example, so its class frequencies "
            "are unknown: give it integer class labels, or prior=None."
        )
    return c
