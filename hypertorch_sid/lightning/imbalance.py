"""A run-time hint where training classes are far rarer than in the validation data (session 55).

Sessions 53 and 54 measured, on imbalanced classes with clean labels, no rebalancing sampler
and balanced validation data (docs/data_weights.md, "Session 53: imbalanced data without a
sampler" and "Session 54: a label-shift class prior"): the learned per-example weights gain
over plain training (+1.3 points of balanced accuracy) but stay about a point below class
weights in the loss (torch's ``weight=``, inverse frequency: −0.98 ± 0.32 over 10 seeds with 5
classes at a tenth), because they move too slowly to re-balance 10–20×; with noisy labels as
well the learned weights are 3.5 points above inverse-frequency weights, and class weights
read from the noisy labels hurt. :func:`class_rarity` reads from the record of the training
rows how much rarer each class is in the training draws than in the validation data the hyper
steps read,

    r_c = π_c / s⁰_c                                                      (eq. rarity)

(π_c: the validation's share of class c, s⁰_c: its share of the training loader's draws, so a
sampler that balances the classes counts as it draws; r is the label-shift weight of session
54's eq. labelshift, and inverse frequency where the validation data is balanced), and
:func:`imbalance_advice` says the classes whose r_c is at least :data:`RARE_CLASS_FACTOR` also
at the lower end of π_c's sampling interval. The hint changes nothing in the learning.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .evidence import RowEvidence

__all__ = ["RARE_CLASS_FACTOR", "ClassRarity", "class_rarity", "imbalance_advice"]

#: the factor of eq. rarity from which a class is said (at the lower end of π_c's interval).
#: On the recipes' data, seeds 0–4 (session 55, docs/data_weights.md, "Session 55: a run-time
#: hint for imbalanced classes"), the largest r_c and its lower end: ``five10`` (5 classes at a
#: tenth) 6.0–7.9 / 4.3–5.6, ``two20`` (2 at a twentieth) 14–19 / 10–13; the balanced recipes,
#: clean or with 35–40 % symmetric or pair-flip noise, at most 1.64 / 1.25; a class-balancing
#: ``WeightedRandomSampler``'s draws at most 1.37 / 1.00; ``two20`` / ``five10`` with 35 %
#: noise (which floods the rare classes) 2.0–2.7 / 1.4–1.9.
RARE_CLASS_FACTOR = 3.0

#: the normal quantile of π_c's Wilson interval whose lower end must reach the factor too: a
#: share read from a few validation examples is not taken at its face value (of 20 validation
#: examples of 10 balanced classes, one class holds 6, 3× its share, with probability ~1 %, and
#: some class of the 10 with ~10 %; the lower end of 6 of 20 is 1.45×)
RARITY_Z = 1.96

#: the docs section that holds the measurements the hint cites
ANCHOR = "docs/data_weights.md#session-55-a-run-time-hint-for-imbalanced-classes"


@dataclass(frozen=True)
class ClassRarity:
    """The classes' shares behind eq. rarity (float64 vectors over the classes 0..the largest
    label).

    Attributes
    ----------
    training:
        s⁰_c, each class's share of the training loader's draws (unweighted).
    validation:
        π_c, its share of the validation rows the hyper steps read.
    examples:
        n, the validation examples π was read from (rows read twice counted once).
    """

    training: Tensor
    validation: Tensor
    examples: float

    @property
    def factor(self) -> Tensor:
        """r_c = π_c / s⁰_c (eq. rarity); 1 where a class is missing from either side."""
        seen = (self.training > 0) & (self.validation > 0)
        ratio = self.validation / self.training.clamp_min(1e-300)
        return torch.where(seen, ratio, torch.ones_like(ratio))

    @property
    def lower_factor(self) -> Tensor:
        """The lower end of π_c's Wilson interval (z = :data:`RARITY_Z`, n = ``examples``) over
        s⁰_c; 1 where a class is missing from either side."""
        p, n, z = self.validation, max(self.examples, 1.0), RARITY_Z
        centre = p + z * z / (2 * n)
        spread = z * torch.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        low = (centre - spread) / (1 + z * z / n)
        seen = (self.training > 0) & (self.validation > 0)
        ratio = low.clamp_min(0.0) / self.training.clamp_min(1e-300)
        return torch.where(seen, ratio, torch.ones_like(ratio))

    def rare(self) -> list[int]:
        """The classes at least :data:`RARE_CLASS_FACTOR` times rarer in the training draws than
        in the validation data, also at the lower end of π_c's interval."""
        return (self.lower_factor >= RARE_CLASS_FACTOR).nonzero().flatten().tolist()


def class_rarity(record: RowEvidence) -> ClassRarity | None:
    """Eq. rarity's shares from the record of the training rows
    (:meth:`~hypertorch_sid.lightning.evidence.RowEvidence.class_shares`), or None where they
    are unknown (no integer labels read, per-class weights, no hyper step yet)."""
    shares = record.class_shares()
    if shares is None:
        return None
    rows = record._val_rows
    size = getattr(record, "validation_examples", None) or rows / max(record._val_batches, 1)
    return ClassRarity(shares["unweighted"], shares["validation"], float(min(rows, size)))


def imbalance_advice(rarity: ClassRarity | None) -> str | None:
    """What to say where some class is far rarer in the training draws than in the validation
    data (:meth:`ClassRarity.rare`); None where none is, or the shares are unknown."""
    rare = [] if rarity is None else rarity.rare()
    if not rare:
        return None
    assert rarity is not None
    r, s0, pi = rarity.factor, rarity.training, rarity.validation
    named = "; ".join(
        f"class {c}: {float(s0[c]):.1%} of the training draws, {float(pi[c]):.1%} of the "
        f"validation, {float(r[c]):.1f}× rarer"
        for c in rare[:8]
    )
    more = f" and {len(rare) - 8} more" if len(rare) > 8 else ""
    return (
        f"{len(rare)} class(es) are far rarer in the training draws than in the validation "
        f"data ({named}{more}). The learned per-example weights re-balance that only slowly: "
        "on MNIST with 5 classes at a tenth and clean labels they gained 1.3 points of "
        "balanced accuracy over plain training but stayed about 1 point below class weights "
        "in the loss (inverse frequency, torch's weight=; 10 seeds). If the labels are clean "
        "and your loss does not weigh the classes yet, weigh class c by π_c / s_c (the "
        "validation's share over the training's; inverse frequency for balanced validation "
        "data): F.cross_entropy(out, y, weight=w, reduction='none'). If the labels are noisy, "
        "keep the learned weights alone (3.5 points above inverse-frequency weights there: "
        "class weights read from noisy labels hurt). If your loss or sampler already "
        "re-balances the classes, or the validation's shares are not the ones you want, ignore "
        f"this. Read the shares with class_imbalance(); measurements: {ANCHOR}."
    )
