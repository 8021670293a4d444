"""The weighted empirical risk of data reweighting (eq. weighted), each row's cross term
centred on its class (eq. classcentre), and the check that a loss is per sample."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .errors import ConfigurationError


class RowMasks:
    """Which rows of a training batch the training's loss masks at this visit (their loss a
    constant 0 that teaches nothing), as :class:`SampleWeights` reads them for the weights'
    hypergradient (:func:`weighted_loss`'s ``masked``, :class:`TrainingCrossTerm`). This one,
    every fit's default: none, every row a visit reads is taught by it."""

    def masked(self, losses: Tensor) -> Tensor | None:
        """The rows of the batch masked at this visit (a bool tensor per row), or None: none."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ZeroLossMasks(RowMasks):
    """A fit whose per-sample loss is known to mask rows (``losses * keep``, keep a 0/1 mask
    chosen anew in each batch: the hardest k rows of online hard example mining, a curriculum,
    loss truncation; ``ignore_index``), known from the structure of the loss, not from a
    value (the Lightning drop-in: exact zeros at the fit's start confirmed by the step re-run
    with the network's weights shrunk 1000-fold, :class:`~hypertorch_sid.lightning.
    batch_masks.MaskDetection`): a row whose loss is exactly 0 at a visit is masked at it.
    Its weight then enters Σ ω by value only and, in the training batches' cross term, is not
    moved by that visit (session 63, docs/data_weights.md "Session 63: per-batch masks")."""

    def masked(self, losses: Tensor) -> Tensor:
        return losses.detach().reshape(losses.shape[0], -1).eq(0).all(1)


def weighted_loss(
    losses: Tensor,
    weights: Tensor,
    normalize: bool = False,
    hold_normaliser: bool = False,
    masked: Tensor | None = None,
) -> Tensor:
    """Σᵢ ωᵢℓᵢ / Σᵢ ωᵢ (``normalize``) or (1/b) Σᵢ ωᵢℓᵢ (eq. weighted) of per-sample losses.

    ``hold_normaliser`` (with ``normalize``): the same value and the same gradient in w, but
    Σᵢ ωᵢ is a constant for the weights' gradient, which is then ω′ᵢℓᵢ / Σ ω instead of
    ω′ᵢ(ℓᵢ − ℓ̂) / Σ ω: the minibatch's centre ℓ̂ is left to a global gauge
    (:attr:`SampleWeights.gauge`).

    ``masked`` (with ``normalize``; a bool per row, :meth:`RowMasks.masked`): those rows'
    weights enter Σᵢ ωᵢ by value only: the same value and gradient in w, the others' weights'
    gradients unchanged, and a masked row's weight gets ω′ᵢℓᵢ / Σ ω (0 for its constant 0
    loss; its cross term ∂ₓ⟨∇₁ℓ̂, v⟩ 0) instead of −ω′ᵢℓ̂ / Σ ω, by which a masked row's
    weight was pushed down at every masked visit (session 62, OHEM: clean rows flagged
    1.3–4.1× as often as with every row kept). None: every row as it is."""
    weights = weights.to(losses.dtype)
    if normalize:
        total = _held_where(masked, weights).sum().clamp_min(1e-12)
        return (weights * losses).sum() / (total.detach() if hold_normaliser else total)
    return (weights * losses).mean()


def _held_where(masked: Tensor | None, weights: Tensor) -> Tensor:
    """``weights`` with those of the rows ``masked`` detached (as they are where none is, or
    where the weights have no gradient)."""
    if masked is None or not weights.requires_grad:
        return weights
    return torch.where(masked.to(weights.device), weights.detach(), weights)


def class_centred(u: Tensor, omega: Tensor, labels: Tensor | None) -> Tensor:
    """uᵢ − ū_c(i) + û: each row's cross term against its own class's weighted mean in the
    batch, ū_c = Σ_{j∈c} ωⱼuⱼ / Σ_{j∈c} ωⱼ, not the batch's û = Σ ωⱼuⱼ / Σ ωⱼ (eq. classcentre).

    Under the self-normalised loss the gradient of row i is ω′ᵢ(uᵢ − û)/Σ ω; with these u it is
    ω′ᵢ(uᵢ − ū_c(i))/Σ ω (the batch's weighted mean of the centred u is û again), so a part of
    u that is common to a class (which class the validation minibatch favours) moves no row:
    the weights can only order the rows within their class. Session 51 (20 Newsgroups, 4
    classes, 300 validation documents): 71–98 % of the variance of uⱼ = ⟨∇ℓⱼ, ∇E⟩ over the
    training rows lay between the labels' means, and two disjoint halves of the validation set
    disagreed on it (correlation −0.72 to +0.92 from one step to the next); on the noisy-label
    CNN 1–21 % and 0.96–1.0 (docs/failures.md). Used by the class gauge
    (:meth:`SampleWeights.use_class_gauge`, the drop-in's ``gauge="class"``). ``labels``: the
    rows' integer labels (negative: unknown, left as they are); None: ``u`` unchanged."""
    if labels is None:
        return u
    labels = labels.to(u.device)
    known = labels >= 0
    if not bool(known.any()):
        return u
    w = omega.to(u.dtype)
    y = labels[known]
    k = int(y.max()) + 1
    mass = torch.zeros(k, dtype=u.dtype, device=u.device).index_add_(0, y, w[known])
    total = torch.zeros(k, dtype=u.dtype, device=u.device).index_add_(0, y, (w * u)[known])
    centre = (w * u).sum() / w.sum().clamp_min(1e-12)
    out = u.clone()
    out[known] = u[known] - total[y] / mass[y].clamp_min(1e-12) + centre
    return out


def check_index_shape(index: Any) -> None:
    """One weight index per row: shape (b,) or a (b, 1) column, or a clear error (session 60:
    ``class_weights(3).weighted_mean(losses, F.one_hot(y, 3))`` was flattened to 3b indices and
    refused as "4 per-sample losses for a batch of 12 indexed samples")."""
    shape = tuple(getattr(index, "shape", ()))
    if len(shape) > 2 or (len(shape) == 2 and shape[1] != 1):
        raise ConfigurationError(
            f"the sample-weight indices have shape {shape}: one index per row is needed, shape "
            f"({shape[0]},) (or a ({shape[0]}, 1) column). One-hot labels given as class ids? "
            "Pass labels.argmax(1)."
        )


def check_per_sample(losses: Any, index: Tensor) -> Tensor:
    """``losses`` as a (b,) tensor matching ``index``, or a clear error (a reduced loss)."""
    check_index_shape(index)
    if not isinstance(losses, Tensor):
        raise ConfigurationError(
            f"per-sample weights need a tensor of per-sample losses, got {type(losses).__name__}."
        )
    if not losses.is_floating_point():  # torch's "mean(): could not infer output dtype" (s56)
        raise ConfigurationError(
            f"per-sample losses of dtype {losses.dtype}: a loss is a floating-point tensor with "
            "a gradient (an integer or bool one is a count, e.g. of errors, which has none)."
        )
    b = int(index.numel()) if isinstance(index, Tensor) else len(index)
    if losses.dim() == 0 or (losses.numel() == 1 and b > 1):
        raise ConfigurationError(
            "the loss is already reduced to a scalar, so it cannot be weighted per sample: "
            "compute it with reduction='none' (e.g. F.cross_entropy(logits, y, reduction='none')) "
            "and return the vector of per-sample losses."
        )
    if losses.dim() > 1 and losses.shape[0] != b and b in losses.shape[1:]:
        at = list(losses.shape).index(b)
        raise ConfigurationError(
            f"the per-sample losses have shape {tuple(losses.shape)} for a batch of {b} samples: "
            f"the batch is their dimension {at}, not the first (a sequence model's (T, B) "
            f"losses?). Put the samples first, e.g. losses.movedim({at}, 0), or reduce the "
            f"other dimensions yourself (losses.mean(0) for (T, B)): each sample's losses "
            "are averaged over every dimension after the first."
        )
    if losses.dim() > 1:
        losses = losses.reshape(losses.shape[0], -1).mean(1)
    if losses.shape[0] != b:
        raise ConfigurationError(
            f"{losses.shape[0]} per-sample losses for a batch of {b} indexed samples: return one "
            f"loss per sample (reduction='none', not 'mean' or 'sum'){_several_views(losses, b)}"
            f"{_rows_dropped(losses, b)}."
        )
    return losses


def _rows_dropped(losses: Tensor, b: int) -> str:
    """The likely cause where there are fewer losses than rows, but more than one: the loss
    left some rows out (``x[keep]``, ``losses[mask]``), so which loss is which row's cannot be
    read (session 60: the advice was only reduction='none', which such a loss already has).
    Rows chosen per batch (session 62: ``losses.topk(k)``, online hard example mining) keep
    their place as a mask (session 63: a row's weight no longer drifts down at its masked
    visits, :class:`ZeroLossMasks`); leaving them out of the training set is for rows never
    trained."""
    if not 1 < losses.shape[0] < b:
        return ""
    return (
        f"; {b - losses.shape[0]} row(s) fewer than the batch: did the loss leave rows out "
        "(x[keep], losses[mask], losses.topk(k))? Then no loss can be told to its row: compute "
        "every row's loss, in the batch's order; rows chosen anew in each batch (the hardest "
        "k: online hard example mining) keep their place with the others' losses times 0 "
        "(losses * keep, keep a 0/1 mask of the batch's rows: the weights then train; "
        "LearnedDataWeights sees such a mask in the fit's first batches and moves each row's "
        "weight only at the visits its loss is not masked, the core's SampleWeights with "
        "use_masks(ZeroLossMasks())); leave examples that must never train out of the "
        "training set (IndexedDataset(Subset(train_set, kept)))"
    )


def _several_views(losses: Tensor, b: int) -> str:
    """The likely cause where the losses are k × the batch: each sample's k views (two
    augmentations, a pair) concatenated along the batch, which the per-sample weights cannot
    read (which loss is which sample's?)."""
    k, left = divmod(int(losses.shape[0]), b)
    if k < 2 or left:
        return ""
    return (
        f"; {k} × the batch: {k} views of each sample concatenated (torch.cat([x1, x2]))? Give "
        f"each sample one loss, e.g. losses.view({k}, {b}).mean(0) where view j holds rows "
        f"j·{b} … (j+1)·{b} − 1"
    )
