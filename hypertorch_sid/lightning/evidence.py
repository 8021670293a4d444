"""What the record of the training rows says about the learned data weights.

:class:`~hypertorch_sid.lightning.row_record.RowRecord` (which
:class:`~hypertorch_sid.lightning.DataWeightsProblem` is) keeps a record as the fit
runs: each row's label at its first visit (``_labels``), its training loss at its last visit
(``_last_loss``), how often the training loader drew it (``_visits``), the validation
batches' class counts (``_val_counts``, ``_val_rows``) and the latest validation losses
(``_val_losses``). :class:`RowEvidence` reads that record:
which classes the validation data lacks (:meth:`RowEvidence.validation_shortfall`), how the
weights moved the class shares (eq. classshift, :meth:`RowEvidence.class_shift`), and whether
the rows the weights push down are ones the network contradicts (:meth:`RowEvidence.flag_evidence`,
:meth:`RowEvidence.flag_contrast`, :meth:`RowEvidence.misfits`), which
:meth:`~hypertorch_sid.lightning.LearnedDataWeights.flagged` and the fit's end say.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.sample_weights import SampleWeights

__all__ = ["CLASS_SHIFT_FACTOR", "CONTRAST_QUANTILE", "MIN_VAL_PER_CLASS", "RowEvidence"]

#: the fewest clean validation examples of each class for per-sample weights to say which labels
#: are wrong (issue 27; docs/data_weights.md, "Too few validation examples"): a training example
#: of a class the validation data holds (almost) none of gets its hypergradient from the other
#: classes' examples alone, so its weight follows them, not its label. Measured with a class
#: missing from the validation set, precision of the flags: 2-D blobs 0.57-0.69, digits
#: 0.46-0.62; the same seeds with 256 validation examples 0.97-0.98 and 0.67-0.75
MIN_VAL_PER_CLASS = 2


#: κ of eq. classshift (:meth:`DataWeightsProblem.class_shift`): a class whose weighted share of
#: the training draws fell below κ · min(π_c, s⁰_c) is said at the fit's end. Measured (session
#: 50): healthy fits down to 0.47 of that base (the imbalanced recipe, a sampler balancing the
#: classes; Fashion pair-flip 0.49), so ½ and ⅔ warned on healthy fits; ⅓ warned on none.
CLASS_SHIFT_FACTOR = 1 / 3

#: the quantile of the clean validation losses above which a row without class labels counts
#: as contradicted by the network (:meth:`RowEvidence._no_scale_contrast`; session 62,
#: docs/data_weights.md, "Flags on a regression")
CONTRAST_QUANTILE = 0.9
#: the excess J of the flagged rows' share contradicted over the kept rows' above which
#: flags mostly fitted are said to be a memorised group, not "no group" (session 64)
MEMORISED_CONTRAST = 0.2

#: what the contrast check was measured to tell (session 62: 39 fits of targets without class
#: labels, docs/data_weights.md "Flags on a regression")
_MEASURED = (
    "on 39 fits of targets without class labels the flags' precision was 0-0.51 where this "
    "check warns (session 61's rotated-digit angles 0.32-0.51), 0.50-1.0 where it does not"
)

#: what the estimated precision of a regression's default flags was measured to tell (session
#: 62: 39 fits, docs/data_weights.md "Regression flags filtered by the validation scale")
_MEASURED_MISFITS = (
    "on 39 fits of targets without class labels this estimate was within 0.2 of the flags' "
    "precision: below 0.5 on a clean regression (precision 0) and on two of three with 8 % of "
    "the targets moved (0.52, 0.58), 0.51-1.0 on every other"
)

#: a row not yet visited (labels may be any integer, e.g. an ignore index of -100)
_UNSEEN = torch.iinfo(torch.long).min


class RowEvidence:
    """The record's readings, mixed into
    :class:`~hypertorch_sid.lightning.row_record.RowRecord` (which keeps the record; see the
    module docstring)."""

    per: str
    weights: SampleWeights | None
    _labels: Tensor | None
    _last_loss: Tensor | None
    _visits: Tensor | None
    _val_counts: Tensor | None
    _trained_classes: Tensor | None
    _val_rows: int
    _val_losses: Tensor | None

    def validation_shortfall(self) -> str | None:
        """Why per-sample weights cannot tell wrong labels from right ones on this validation
        data: a class of the training labels with fewer than :data:`MIN_VAL_PER_CLASS`
        validation examples (each class's count: its share of the validation rows the hyper
        steps read times the validation set's size, exact where every hyper step reads the
        whole set). None where every class has enough, or where no class is known (labels that
        are not integers, per-class weights, no hyper step yet)."""
        labels, counts = self._labels, self._val_counts
        if self.per == "class":
            return self._classes_unvalidated()
        if self.per != "sample" or labels is None or counts is None or not self._val_rows:
            return None
        classes = labels[(labels != _UNSEEN) & (labels >= 0)].unique().cpu()
        if classes.numel() < 2:
            return None
        counts = torch.cat(
            [counts, counts.new_zeros(max(0, int(classes.max()) + 1 - counts.numel()))]
        )
        size = self.validation_examples or self._val_rows / self._val_batches
        have = (counts[classes] * size / self._val_rows).round()
        short = classes[have < MIN_VAL_PER_CLASS]
        if short.numel() == 0:
            return None
        few = have[have < MIN_VAL_PER_CLASS]
        named = ", ".join(f"{int(c)}: {int(h)}" for c, h in zip(short[:8], few[:8]))
        more = ", ..." if short.numel() > 8 else ""
        return (
            f"the validation data holds fewer than {MIN_VAL_PER_CLASS} examples of "
            f"{short.numel()} of the {classes.numel()} classes of the training labels (class: "
            f"examples {named}{more}; {size:.0f} validation examples for "
            f"{self.weights.n} per-sample weights): a training example of such a class gets its "
            "hypergradient from the other classes' validation examples alone, so its weight "
            "follows them, not its label (measured: flags no better than chance, "
            "docs/data_weights.md). Give at least "
            f"{MIN_VAL_PER_CLASS} clean validation examples of every class (more is better), or "
            f"learn per-class weights (per='class', num_classes={int(classes.max()) + 1})."
        )

    def _classes_unvalidated(self) -> str | None:
        """Per class: the classes the training batches held and the validation batches the
        hyper steps read held none of. Their weights serve the other classes' validation loss
        alone, so they fall (class 2 left out of the validation set: 0.38 after 2 epochs on
        the careless-user toy, silently before session 58)."""
        trained, counts = self._trained_classes, self._val_counts
        if trained is None or counts is None or not self._val_rows:
            return None
        trained = trained.cpu()
        held = torch.zeros(trained.numel(), dtype=torch.bool)
        k = min(counts.numel(), trained.numel())
        held[:k] = counts[:k] > 0
        missing = (trained & ~held).nonzero().flatten().tolist()
        if not missing:
            return None
        named = ", ".join(str(c) for c in missing[:8]) + (", ..." if len(missing) > 8 else "")
        return (
            f"the validation data the hyper steps read holds no example of class(es) {named}, "
            "which the training batches hold: per-class weights follow the validation's class "
            "shares, so those classes' weights are learned for the other classes alone and "
            "fall (the model learns to predict them less). Give the validation data examples "
            "of every class you want predicted."
        )

    def validation_classes_untrained(self) -> str | None:
        """The classes the validation batches the hyper steps read hold and no training label
        does (per class: none of 0..num_classes − 1; per sample, once every training row has
        been visited: no row's label). Almost surely two label encodings (a validation set
        numbered by another ``class_to_idx`` or ``LabelEncoder``): E then asks the model for a
        class it never trains on, and the weights are learned for that. Taken silently before
        session 61 (``per="class", num_classes=3`` beside a validation label 5). None where
        none, or where the labels are unknown."""
        counts = self._val_counts
        if counts is None or not self._val_rows:
            return None
        labels, trained = self._labels, None
        if self.per == "class" and self._trained_classes is not None:  # past num_classes only
            trained = torch.ones_like(self._trained_classes)  # (a class unsampled yet may come)
        elif self.per == "sample" and labels is not None and not bool((labels == _UNSEEN).any()):
            known = labels[labels >= 0].cpu()  # every row visited: the training set's classes
            trained = torch.bincount(known, minlength=1) > 0 if known.numel() else None
        if trained is None:
            return None
        trained = trained.cpu()
        held = torch.zeros(max(counts.numel(), trained.numel()), dtype=torch.bool)
        held[: trained.numel()] = trained
        extra = ((counts.cpu() > 0) & ~held[: counts.numel()]).nonzero().flatten().tolist()
        if not extra:
            return None
        named = ", ".join(str(c) for c in extra[:8]) + (", ..." if len(extra) > 8 else "")
        within = (
            f" (num_classes={trained.numel()}: 0..{trained.numel() - 1})"
            if self.per == "class"
            else ""
        )
        return (
            f"the validation data holds class(es) {named}, which no training label holds"
            f"{within}: the validation loss E then asks the model for classes it never trains "
            "on, and the weights are learned to serve that. Two label encodings? Check that "
            "the training and validation sets number their classes alike (one class_to_idx or "
            "LabelEncoder for both splits)."
        )

    def class_shares(self) -> dict[str, Tensor] | None:
        """Per class c (per sample, integer labels, the rows visited and the validation
        batches the hyper steps read): the weighted training share s_c = Σ_{i∈c} vᵢωᵢ / Σᵢ vᵢωᵢ
        over the training loader's draws (vᵢ: the times row i was in a training batch, so a
        sampler that balances the classes counts as it draws), the unweighted one
        s⁰_c = Σ_{i∈c} vᵢ / Σᵢ vᵢ and the validation's π_c (float64 vectors over the classes
        0..the largest label: ``"weighted"``, ``"unweighted"``, ``"validation"``), or None
        where they are unknown (no labels read, per-class weights, no hyper step yet). One
        pass over the n weights."""
        labels, counts, weights = self._labels, self._val_counts, self.weights
        if self.per != "sample" or labels is None or counts is None or weights is None:
            return None
        known = (labels != _UNSEEN) & (labels >= 0)
        if not self._val_rows or not bool(known.any()) or not float(counts.sum()):
            return None
        visits = self._visits
        if visits is None or visits.shape != labels.shape or not float(visits[known].sum()):
            visits = torch.ones(labels.shape, device=labels.device)  # resumed: none counted
        y, v = labels[known].cpu(), visits[known.to(visits.device)].double().cpu()
        w = weights.values()[known.to(weights.logits.device)].double().cpu() * v
        k = max(int(y.max()) + 1, counts.numel())
        val = torch.zeros(k, dtype=torch.float64)
        val[: counts.numel()] = counts.double()
        return {
            "weighted": torch.bincount(y, weights=w, minlength=k) / w.sum().clamp_min(1e-300),
            "unweighted": torch.bincount(y, weights=v, minlength=k) / v.sum(),
            "validation": val / val.sum(),
        }

    def class_shift(self) -> str | None:
        """Why the learned weights may have learned a class prior rather than which labels to
        trust: a class c that the weights pushed away from the validation's share,

            s_c / π_c < κ · min(1, s⁰_c / π_c),  κ = CLASS_SHIFT_FACTOR = ⅓     (eq. classshift)

        (:meth:`class_shares`; classes the validation data holds and the training rows carry):
        its weighted share fell below a third of what the validation asks for, or of the
        unweighted training's where that was short already. Weights that move a class's share
        TOWARD the validation's (imbalanced classes) are not caught. None where no class is, or
        the shares are unknown. A safety net for a collapsed class, not a test of every harmful
        fit: healthy fits reached 0.47 (κ = ½ and ⅔ warned on healthy fits), and session 50's
        20 Newsgroups failures sat at 0.53, 0.94 and 0.92 (docs/data_weights.md, session 50)."""
        shares = self.class_shares()
        if shares is None:
            return None
        s, s0, pi = shares["weighted"], shares["unweighted"], shares["validation"]
        seen = (pi > 0) & (s0 > 0)
        ratio = torch.where(seen, s / pi.clamp_min(1e-300), torch.ones_like(s))
        floor = CLASS_SHIFT_FACTOR * torch.clamp(s0 / pi.clamp_min(1e-300), max=1.0)
        pushed = (seen & (ratio < floor)).nonzero().flatten().tolist()
        if not pushed:
            return None
        names = ", ".join(
            f"class {c}: {float(s[c]):.1%} of the weight, {float(s0[c]):.1%} of the rows, "
            f"{float(pi[c]):.1%} of the validation"
            for c in pushed[:8]
        )
        more = f" and {len(pushed) - 8} more" if len(pushed) > 8 else ""
        return (
            f"the learned weights pushed {len(pushed)} whole class(es) down, away from the "
            f"clean validation set's class shares ({names}{more}): they learned a class prior "
            "(which classes the validation objective rewards the network for predicting "
            "less), not only which labels to trust, and such a fit can be less accurate than "
            "plain training (session 50: 20 Newsgroups, 0.64 against 0.79). Hold each class's "
            "mean weight with gauge='class', or use objective='mean_loss', or fit plainly as "
            "well and keep the fit with the lower clean validation loss."
        )

    def flag_evidence(self, flags: Tensor) -> str | None:
        """None where the validation data holds every class (:meth:`validation_shortfall`),
        the flagged rows' training losses at their last visit are higher than the kept rows'
        (mislabelled examples are the ones the network does not fit) and, with class labels,
        most flagged rows are predicted as another class (:meth:`_contradicted`); else why
        the flags are no evidence of corrupted labels."""
        if self._last_loss is None or flags.numel() == 0:
            return None
        said = self.validation_shortfall()
        if said is not None:
            return said
        low, kept = self._losses_of(flags)
        if low.numel() == 0 or kept.numel() == 0:
            return None
        a, b = float(low.median()), float(kept.median())
        if a > b:
            return self._contradicted(low, kept)
        rows = "examples" if self.per == "sample" else "classes"
        return (
            f"the {flags.numel()} {rows} with low weights are fitted no worse than the rest "
            f"(median training loss at their last visit {a:.3g}, the others' {b:.3g}): their "
            "weights went down because the validation data values them least (under the "
            "self-normalised loss only ratios of weights count, and examples the network "
            "already fits drift down too), not because their labels disagree with the rest. "
            "No group of corrupted labels stands out (e.g. a clean data set)."
        )

    def flag_contrast(self, flags: Tensor, misfits: bool = False) -> str | None:
        """Per sample with integer class labels: None where the network predicted another
        class than the label (last-visit loss above log 2) for a share of the rows ``flags``
        at least ½ above its share of the other rows seen (:meth:`_no_contrast`; ``misfits``
        changes nothing). Without class labels (a regression, multi-label or sequence targets)
        the rows returned are judged: ``flags`` themselves by the same contrast with a loss
        above the clean validation losses' :data:`CONTRAST_QUANTILE` τ for "contradicted"
        (:meth:`_no_scale_contrast`), or with ``misfits`` their rows above τ
        (:meth:`misfits`, the default's) by the share of corrupted targets the excess of
        training rows above τ leaves them (:meth:`_no_scale_precision`); else why the flags
        may be mostly clean rows. :meth:`LearnedDataWeights.flagged` warns with it and
        returns its rows anyway (refusing them cost two of the tests' noisy fits their flags
        at precision 0.45-0.53; docs/data_weights.md, "Flags the network does not tell
        apart")."""
        if self._last_loss is None or flags.numel() == 0 or self.per != "sample":
            return None
        low, kept = self._losses_of(flags)
        if low.numel() == 0 or kept.numel() == 0:
            return None
        if self._reads_labels():
            return self._no_contrast(low, kept)
        if misfits:
            return self._no_scale_precision(low, kept)
        return self._no_scale_contrast(low, kept)

    def _losses_of(self, flags: Tensor) -> tuple[Tensor, Tensor]:
        """The last-visit training losses of the rows ``flags`` and of the other rows seen."""
        loss = self._last_loss
        assert loss is not None
        mask = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)
        mask[flags.to(loss.device)] = True
        seen = torch.isfinite(loss)
        return loss[mask & seen], loss[~mask & seen]

    def misfits(self, flags: Tensor) -> Tensor:
        """Of the rows ``flags``, those the network contradicts at their last visit: a training
        loss above ϑ,

            ϑ = log 2 (integer class labels),  ϑ = τ (no class labels)          (eq. scalemisfit)

        where log 2 is the label's probability below ½ (another class predicted) and τ the
        :data:`CONTRAST_QUANTILE` (90 %) of the clean validation losses the latest hyper steps
        read (:attr:`_val_losses`): a row fitted worse than nine in ten clean validation rows.
        ``flags`` as they are where neither is known (per class, no last-visit losses, or no
        per-sample validation loss read: E from ``validation_loss=``).

        With class labels an option, ``flagged("split_misfit")``: on small networks the split's
        low bump holds clean rows too (hard examples whose weights the validation data also
        lowers): on the tests' noisy digits (30 % wrong labels, an MLP and a CNN with
        BatchNorm, seeds 0-1) the split flagged 45-57 % of the rows at precision 0.45-0.55,
        recall 0.74-0.93; its misfit rows are 23-36 % at precision 0.75-0.95, recall 0.64-0.92.
        On the noisy-label CNN benchmark (40 % noise, seeds 1-3) F1 within +0.006 / -0.012 of
        the split's, recall down 0.005-0.076 (docs/data_weights.md, "Flags the network
        contradicts"). Without class labels the default (:meth:`misfits_by_default`): on 39
        fits of regressions, multi-label and sequence targets the split flagged 40-46 % of a
        synthetic regression's rows at precision 0.15-0.57 (session 61's rotated-digit angles
        652-1663 of 2000 at 0.32-0.51); its rows above τ are precise (0.51-1.0 where any target
        is corrupted, the angles 0.78-0.86) at F1 up 0.03-0.46 (0 at precision 1 already),
        recall down 0.07-0.27 on the angles and 0.13-0.19 with mild noise (30 % of the
        targets plus N(0, 1 s.d.): the rows moved little are not contradicted), at most 0.014
        elsewhere (docs/data_weights.md, "Regression flags filtered by the validation scale
        (session 62)")."""
        loss = self._last_loss
        if self.per != "sample" or loss is None or flags.numel() == 0:
            return flags
        scale = math.log(2) if self._reads_labels() else self._validation_scale()
        if scale is None:
            return flags
        return flags[loss.cpu()[flags] > scale]

    def misfits_by_default(self) -> bool:
        """Whether ``flagged()``'s default returns :meth:`misfits` of the split's rows rather
        than the split's rows: per sample where the rows carry no class labels (a regression,
        multi-label or sequence targets). With class labels the split's rows stay the default
        (their misfits an option, ``flagged("split_misfit")``)."""
        return self.per == "sample" and self._labels is None

    def _reads_labels(self) -> bool:
        """Whether a row's training loss reads as −log p of its class label, so that above
        log 2 means another class predicted (eq. scalemisfit's ϑ = log 2): integer class
        labels and, where clean validation losses were read (:attr:`_val_losses`), at least
        one of them below log 2. A loss with other terms than the label's cross entropy (a
        supervised contrastive term per row, an autoencoder's ELBO on batches that carry labels
        it never reads) keeps every row above log 2, fitted or not, and "above log 2" then
        called 100 % of the flagged and of the kept rows contradicted (session 63: flags of
        precision 0.71 said to be no evidence); such losses are read on the validation scale
        τ, as targets without class labels are."""
        if self._labels is None:
            return False
        losses = self._val_losses
        return losses is None or losses.numel() == 0 or bool((losses < math.log(2)).any())

    def _scale_reason(self) -> str:
        """Why a flag is checked on the validation scale τ rather than by log 2."""
        if self._labels is None:
            return "the examples carry no class labels (a regression?)"
        return (
            "the training losses do not read as −log p of the class labels (every clean "
            "validation loss read was above log 2: a loss with other terms than the label's "
            "cross entropy?)"
        )

    def _validation_scale(self) -> float | None:
        """τ: the :data:`CONTRAST_QUANTILE` of the clean validation losses the latest hyper
        steps read (:attr:`_val_losses`), or None where none was read."""
        losses = self._val_losses
        if losses is None or losses.numel() == 0:
            return None
        return float(losses.float().quantile(CONTRAST_QUANTILE))

    def _contradicted(self, low: Tensor, kept: Tensor) -> str | None:
        """Per sample with integer class labels (ℓ = −log p of the label): None where more
        than half of the flagged rows' last-visit losses ``low`` exceed log 2 (the network
        predicted another class than the label); else why the flags are no group of wrong
        labels. The median comparison of :meth:`flag_evidence` is partly circular: a
        down-weighted example is fitted less, so its loss rises whatever its label. A clean
        one the network still predicts from its neighbours; a wrong label, it does not.

        Where the flagged rows are contradicted at least :data:`MEMORISED_CONTRAST` more often
        than the kept rows ``kept`` (J = s_flagged − s_kept bounds the flags' precision from
        below, :meth:`_no_contrast`), the other flags read as fitted although many are wrong
        labels, and that is said instead of "no group stands out" (session 64: a bag-of-words
        MLP, 15 epochs on 1200 documents, 64-71 % of the wrong labels fitted by heart: 32 % of
        the flags contradicted against 0.3 % of the kept rows, flags of precision 0.44-0.59
        where 30 % of the labels were wrong, their contradicted rows 0.88-0.91; a hinge loss,
        whose rows predicted as another class may be below log 2: 36 % above it, 55-63 %
        predicted as another class, flags of precision 0.48-0.52, the contradicted 0.95)."""
        if self.per != "sample" or not self._reads_labels():
            return None
        share = float((low > math.log(2)).double().mean())
        if share > 0.5:
            return None
        kept_share = float((kept > math.log(2)).double().mean()) if kept.numel() else 0.0
        if share - kept_share >= MEMORISED_CONTRAST:
            return (
                f"only {share:.0%} of the {low.numel()} examples with low weights were "
                "predicted as another class than their label at their last visit (training "
                f"loss above log 2), but that is {share - kept_share:.2f} more than of the "
                f"{kept.numel()} it keeps ({kept_share:.1%}): at least that share of the flags "
                "are wrong labels, and the rest read as fitted, either because the network "
                "fitted their wrong labels by heart (memorised: many epochs on few examples) or "
                "because the loss is no −log p of the label, so that a loss below log 2 may "
                "still be another class predicted (a hinge loss: F.multi_margin_loss). "
                f"flagged('split_misfit') returns the {int((low > math.log(2)).sum())} it "
                "contradicts (mostly wrong labels); flagged('split') all of them. A network that "
                "memorises less (fewer epochs, dropout, weight decay) keeps wrong labels "
                "unfitted, and the flags then pass."
            )
        return (
            f"only {share:.0%} of the {low.numel()} examples with low weights were predicted "
            "as another class than their label at their last visit (training loss above "
            "log 2: the label's probability below ½); the others are fitted, so their weights "
            "went down because the validation data values them least, not because their labels "
            "are wrong. No group of corrupted labels stands out (e.g. a clean data set, or too "
            "few validation examples to tell: give more clean validation examples of every "
            "class)."
        )

    def _no_scale_contrast(self, low: Tensor, kept: Tensor) -> str | None:
        """Per sample without class labels: None where the flagged rows' last-visit
        training losses ``low`` stand out from the kept rows' ``kept``,

            J = (s_low − s_kept) / (1 − s_kept) ≥ ½,                            (eq. scalecontrast)

        s the share of a group's losses above τ, the :data:`CONTRAST_QUANTILE` of the clean
        validation losses the latest hyper steps read (:attr:`_val_losses`); else why the flags
        may be mostly clean rows. :meth:`_no_contrast`'s reading of "contradicted", with τ for
        log 2: a clean row is above τ at a rate e, a grossly wrong target at c ≤ 1, and with
        precision p and κ wrong targets among the kept rows J = (p − κ)(c − e) /
        (1 − κc − (1 − κ)e) ≤ (p − κ) / (1 − κ) ≤ p, so J < ½ cannot show that most flags are
        corrupted targets. Divided by 1 − s_kept: where the clean training rows sit just above
        the validation rows' losses (all tiny, the network still improving), e is large and
        s_low − s_kept alone fell below ½ on flags of precision 1 (a token tagger, session 62).
        The bound takes a flagged clean row to be above τ as often as a kept one; fitted less
        (its weight is low), it is more often, so J can exceed p (measured: 0.62-0.65 on
        multi-label flags of precision 0.50-0.53). Measured over 33 fits (docs/data_weights.md,
        "Flags on a regression (session 62)"): J 0.60-1.0 on flags of precision 0.50-1.0,
        0.13-0.49 on flags of precision 0-0.47; the quantile 0.9 (0.99 left diabetes' flags of
        precision 0.57 at J 0.50). Held out, seeds 3-5: the rotated-digit angles J 0.34-0.46
        (precision 0.45-0.51, warned), diabetes 0.58-0.69 (0.51-0.58, not).

        Where no validation losses were read (E from ``validation_loss=``, or an objective that
        reads no losses), why the flags have no check at all: never silent."""
        tau = self._validation_scale()
        if tau is None:
            return self._unchecked(low)
        s_low = float((low > tau).double().mean())
        s_kept = float((kept > tau).double().mean())
        contrast = (s_low - s_kept) / (1 - s_kept) if s_kept < 1 else 0.0
        if contrast >= 0.5:
            return None
        return (
            f"{self._scale_reason()}, so a flag is checked by its training loss: "
            f"{s_low:.0%} of the {low.numel()} examples with low weights "
            f"and {s_kept:.0%} of the {kept.numel()} kept ones had a loss at their last visit "
            f"above {tau:.3g}, the {CONTRAST_QUANTILE:.0%} quantile of the clean validation "
            f"examples' losses: a contrast (s_low − s_kept) / (1 − s_kept) of {contrast:.2f} "
            "< 0.5, so the losses do not single out corrupted targets, and the flags may be "
            "mostly clean examples whose weights the validation data lowers as well "
            f"({_MEASURED}). Read data_weights() as soft weights (a ranking to inspect, or "
            "sample weights to train with) rather than flagged() as a list of wrong targets; "
            "a network that fits the clean data better, or more clean validation examples, "
            "can sharpen them."
        )

    def _unchecked(self, low: Tensor) -> str:
        """Why rows without class labels have no check: no per-sample validation loss read."""
        return (
            f"the {low.numel()} examples with low weights carry no class labels (a "
            "regression?) and no per-sample validation loss was read through "
            "training_step (a validation_loss= of yours, or an objective that reads no "
            "losses), so nothing checks that they are corrupted targets rather than hard "
            f"clean ones ({_MEASURED}). Read data_weights() as soft weights (a ranking to "
            "inspect, or sample weights to train with) rather than flagged() as a list of "
            "wrong targets."
        )

    def _no_scale_precision(self, low: Tensor, kept: Tensor) -> str | None:
        """Per sample without class labels, for the rows :meth:`misfits` returns (the flagged
        rows' last-visit losses ``low`` above τ, m of them): None where the share of them that
        the excess of training rows above τ can account for is at least ½,

            p̂ = min(1, (m_τ − (1 − q) n) / m) ≥ ½                             (eq. scaleprecision)

        q = :data:`CONTRAST_QUANTILE`, n the rows seen, m_τ those of them above τ (flagged or
        kept, ``low`` and ``kept``); also None where no flagged row is above τ (nothing is
        returned). A clean training row, fitted, sits above τ no more often than a clean
        validation row does (1 − q), so m_τ − (1 − q) n estimates the corrupted rows above τ,
        and p̂ the flags' precision where the split holds them. Eq. scalecontrast judges the
        split's rows and doubted the filtered rows at precision 0.78-0.95 (the rotated-digit
        angles, the tests' L1 and Huber fits); p̂ tracked the precision within 0.2 on the 39
        fits of session 62 (docs/data_weights.md, "Regression flags filtered by the validation
        scale (session 62)"): below ½ on the clean set-up (precision 0) and two of three with 8 %
        of the targets moved (0.52, 0.58), at least 0.51 on every other. Training losses read
        with dropout or augmentation on can sit above the validation's (the assumption fails,
        and p̂ is too high)."""
        tau = self._validation_scale()
        if tau is None:
            return self._unchecked(low)
        m = int((low > tau).sum())
        if m == 0:
            return None
        n, above = low.numel() + kept.numel(), m + int((kept > tau).sum())
        clean = (1 - CONTRAST_QUANTILE) * n  # a clean set's rows above τ
        excess = above - clean
        p_hat = min(1.0, excess / m)
        if p_hat >= 0.5:
            return None
        return (
            f"{self._scale_reason()}, so the flags are the {m} of the {low.numel()} "
            "examples with low weights whose training loss at their "
            f"last visit was above {tau:.3g}, the {CONTRAST_QUANTILE:.0%} quantile of the "
            f"clean validation examples' losses. {above} of the {n} training examples are "
            f"above it, against the {1 - CONTRAST_QUANTILE:.0%} ({clean:.0f}) "
            f"a clean set would hold, so at most about {max(excess, 0):.0f} corrupted targets "
            f"stand out: an estimated precision (m_τ − (1 − q) n) / m of {p_hat:.2f} < 0.5, and "
            f"the flags may be mostly clean examples ({_MEASURED_MISFITS}). Read data_weights() "
            "as soft weights (a ranking to inspect, or sample weights to train with) rather "
            "than flagged() as a list of wrong targets; a network that fits the clean data "
            "better, or more clean validation examples, can sharpen them."
        )

    def _no_contrast(self, low: Tensor, kept: Tensor) -> str | None:
        """Per sample with integer class labels: None where the share of the flagged rows the
        network predicted as another class (last-visit loss ``low`` above log 2) exceeds the
        share of the kept rows it did (``kept``) by at least ½; else why the flags may be
        mostly clean rows.

        If a clean row is predicted as another class at the same rate e whether flagged or
        kept, and a wrong label at rate c ≤ 1, the contrast J = s_flagged − s_kept =
        (precision − κ)(c − e), κ the share of wrong labels among the kept rows: J is at
        most the flags' precision. Below ½ it cannot show that most flags are wrong labels:
        the network contradicts the labels it is trained on (the kept rows) too, so its
        contradiction does not single out a wrong label (a network that fits the data poorly,
        or too few validation examples to tell). ``_contradicted`` is the case s_kept = 0."""
        if self.per != "sample" or not self._reads_labels():
            return None
        s_low = float((low > math.log(2)).double().mean())
        s_kept = float((kept > math.log(2)).double().mean())
        if s_low - s_kept >= 0.5:
            return None
        return (
            f"the network predicted another class than the label for {s_low:.0%} of the "
            f"{low.numel()} examples with low weights but also for {s_kept:.0%} of the "
            f"{kept.numel()} it keeps (training loss above log 2 at their last visit): a "
            f"contrast of {s_low - s_kept:.2f} < 0.5, so its disagreement does not single out "
            "wrong labels, and the flags may be mostly hard clean examples whose weights the "
            "validation data lowers as well. The network fits the data too poorly (or the "
            "validation set is too small) for its weights to tell a wrong label from a hard "
            "example: train a network that fits the clean data better (capacity, epochs, "
            "learning rate), or give more clean validation examples of every class."
        )
