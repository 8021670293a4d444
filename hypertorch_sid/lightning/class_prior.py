"""The label-shift class prior of the data-weights drop-in: r of eq. labelshift from the fit's data.

:class:`ClassPrior` is what ``LearnedDataWeights(prior=...)`` holds: at each fit's build it
counts the training set's labels (one pass over its samples, the model not run) and the
validation set's, gives them to the core
:class:`~hypertorch_sid.core.label_shift.LabelShift`, and sets each training row's factor
r_{yᵢ} on the weights (:meth:`~hypertorch_sid.core.sample_weights.SampleWeights.use_prior`):
the loss then weighs row i by r_{yᵢ}ωᵢ, and the learned ωᵢ reorder the examples within their
class on top of the class balance the validation set defines (session 54).

Where the training DataLoader draws with a ``WeightedRandomSampler`` the training distribution
is the sampler's: p_c is its class mass Σ_{i∈c} sᵢ / Σ sᵢ (sᵢ its weights), so a sampler that
already balances the classes toward the validation's gives r ≈ 1 (no double correction). The
prior is recomputed from the data at every fit's build, so it holds no state of its own: a
resumed fit gets the same r.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, WeightedRandomSampler

from ..core.indexing import Indexed, split_indexed
from ..core.label_shift import LabelShift, LabelShiftRatios
from .data_checks import _carried_labels
from .evidence import MIN_VAL_PER_CLASS
from .sampling import draws_by_index, first_loader, validation_loader

__all__ = ["AutoClassPrior", "ClassPrior", "weighted_sampler"]

#: the batch size of the passes that read the labels
READ_BATCH = 512


def weighted_sampler(loader: DataLoader) -> WeightedRandomSampler | None:
    """The ``WeightedRandomSampler`` the training DataLoader draws with (also as Lightning
    wraps it under DDP, :func:`~.data_checks.draws_weighted`), or None."""
    sampler: Any = getattr(loader, "sampler", None)
    for _ in range(4):
        if isinstance(sampler, WeightedRandomSampler):
            return sampler
        sampler = getattr(getattr(sampler, "dataset", None), "_sampler", None)
        if sampler is None:
            return None
    return None


class ClassPrior:
    """The drop-in's label-shift prior (see the module docstring): ``shift`` computes r from
    the class counts, :meth:`apply` reads them from the fit's data and sets the factors.

    Parameters
    ----------
    shift:
        The estimator of r: :class:`~hypertorch_sid.core.label_shift.LabelShift` (its
        James–Stein shrinkage toward r ≡ 1 by default).
    """

    def __init__(self, shift: LabelShift | None = None) -> None:
        self.shift = shift if shift is not None else LabelShift()
        #: what the last fit's build found (None: not applied, e.g. no labels read)
        self.found: LabelShiftRatios | None = None

    def apply(self, problem: Any, trainer: pl.Trainer, loader: DataLoader) -> None:
        """Count the training and validation labels of this fit, compute r, and set each
        training row's factor r_{yᵢ} on ``problem.weights`` (per sample); say what was found.
        Where labels cannot be read the weights get no factor, with a warning."""
        weights = problem.weights
        weights.use_prior(None)
        self.found = None
        with torch.random.fork_rng(devices=[]):  # the training's draws as without the prior
            rows = _training_labels(problem, loader)
            val = _validation_counts(problem, trainer)
        if rows is None or val is None:
            self._unread("training" if rows is None else "validation")
            return
        known = rows >= 0
        sampler = weighted_sampler(loader)
        mass = None if sampler is None else sampler.weights.double()[: rows.numel()]
        train = torch.bincount(
            rows[known], weights=None if mass is None else mass[known], minlength=val.numel()
        ).double()
        found = self.shift.ratios(train, val)
        if not self._applies(train, val):
            return
        self.found = found
        self._say(found, sampler is not None, int(known.sum()), int(val.sum()))
        if found.identity:
            return
        factors = torch.ones(rows.numel(), dtype=torch.float64)
        factors[known] = found.ratios[rows[known]]
        weights.use_prior(factors)

    def _applies(self, train: Tensor, val: Tensor) -> bool:
        """Whether r is applied with these class counts (asked for: always)."""
        return True

    def _unread(self, which: str) -> None:
        """Say that the ``which`` set's labels could not be read (the prior was asked for)."""
        rank_zero_warn(
            f"LearnedDataWeights(prior=...): no integer class labels could be read from the "
            f"{which} set, so no label-shift prior is applied (r ≡ 1). Pass target=lambda "
            "batch: <its integer labels>, or prior=None to silence this."
        )

    def _say(self, found: LabelShiftRatios, sampled: bool, n_train: int, n_val: int) -> None:
        """The prior found (info), and each class missing from one of the sets (a warning)."""
        drawn = " (as the WeightedRandomSampler draws them)" if sampled else ""
        r = ", ".join(f"{v:.3g}" for v in found.ratios.tolist())
        rank_zero_info(
            f"LearnedDataWeights: label-shift prior from {n_train} training labels{drawn} and "
            f"{n_val} validation labels: X² = {found.statistic:.3g}, shrinkage s = "
            f"{found.shrinkage:.3g}, r per class = [{r}] (each row's weight is multiplied by r "
            "of its label; read it with label_shift())."
        )
        absent_val, absent_train = found.missing()
        if absent_val:
            rank_zero_warn(
                f"LearnedDataWeights: class(es) {absent_val} have training rows but no "
                f"validation example, so the label-shift prior weighs them by r = "
                f"{float(found.ratios[absent_val[0]]):.3g} (the validation set defines the "
                "target distribution, which then holds almost none of them). Add validation "
                "examples of every class, or prior=None."
            )
        if absent_train:
            rank_zero_warn(
                f"LearnedDataWeights: class(es) {absent_train} are in the validation set but "
                "have no training row: no weight can raise them, and the label-shift prior "
                "leaves their share out."
            )


def _labels_of_batch(problem: Any, batch: Any) -> Tensor | None:
    """A collated batch's integer labels as the drop-in reads them (``target=``, the labels
    ``indexed_collate`` carried, or ``batch[1]``), on the CPU, or None."""
    data = batch.data if isinstance(batch, Indexed) else batch
    carried = _carried_labels(batch)
    b = None
    if isinstance(batch, Indexed):
        b = int(split_indexed(batch)[0].numel())
    problem._read_binary_floats(data, carried)
    labels = problem._labels_of(data, b, carried)
    return None if labels is None else labels.detach().cpu().long()


def _training_labels(problem: Any, loader: DataLoader) -> Tensor | None:
    """Each training row's label (−1 where it has none), by one pass over the training set in
    its order (its samples read, the model not run), or None where no batch holds labels."""
    dataset = loader.dataset
    n = len(dataset)
    rows = torch.full((n,), -1, dtype=torch.long)
    reader = DataLoader(dataset, batch_size=READ_BATCH, shuffle=False, collate_fn=loader.collate_fn)
    read = False
    for batch in reader:
        index, _ = split_indexed(batch)
        labels = _labels_of_batch(problem, batch)
        if labels is not None:
            rows[index.cpu()] = labels
            read = True
    return rows if read else None


def _validation_counts(problem: Any, trainer: pl.Trainer) -> Tensor | None:
    """The validation set's examples per class (the whole set, every process's share), or
    None where it has no labels to read."""
    loader = validation_loader(trainer)
    if loader is None:
        return None
    loader = first_loader(loader, "validation dataloader")
    if draws_by_index(loader):  # the whole set, not this process's shard
        loader = DataLoader(
            loader.dataset, batch_size=READ_BATCH, shuffle=False, collate_fn=loader.collate_fn
        )
    counts: Tensor | None = None
    for batch in loader:
        labels = _labels_of_batch(problem, batch)
        if labels is None:
            continue
        add = torch.bincount(labels[labels >= 0])
        if counts is None:
            counts = add
        else:
            k = max(counts.numel(), add.numel())
            counts = torch.nn.functional.pad(counts, (0, k - counts.numel()))
            counts += torch.nn.functional.pad(add, (0, k - add.numel()))
    return None if counts is None or int(counts.sum()) == 0 else counts


class AutoClassPrior(ClassPrior):
    """``prior="auto"``'s :class:`ClassPrior`: the same r, said only where it is not ≡ 1;
    nothing said where no labels are read (a regression, soft labels: no class prior to
    apply); and none where the validation set holds fewer than
    :data:`~.evidence.MIN_VAL_PER_CLASS` examples of a class the training holds (it is too
    small to define the class distribution: r would drop that class's rows from the loss; the
    drop-in's shortfall warning says so, :meth:`~.evidence.RowEvidence.validation_shortfall`).
    """

    def _applies(self, train: Tensor, val: Tensor) -> bool:
        k = max(train.numel(), val.numel())
        val = torch.nn.functional.pad(val, (0, k - val.numel()))
        train = torch.nn.functional.pad(train, (0, k - train.numel()))
        return not bool(((train > 0) & (val < MIN_VAL_PER_CLASS)).any())

    def _unread(self, which: str) -> None:
        return None

    def _say(self, found: LabelShiftRatios, sampled: bool, n_train: int, n_val: int) -> None:
        if not found.identity:
            super()._say(found, sampled, n_train, n_val)
