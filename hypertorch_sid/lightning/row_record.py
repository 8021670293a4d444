"""The record of the training rows that the data weights keep as the fit runs.

:class:`RowRecord` (which :class:`~hypertorch_sid.lightning.DataWeightsProblem`
is) records at each training step of the loop, after the batch's checks in one read of the
device (:meth:`RowRecord._read_checks`: the index range, a row whose label changed since its
first visit): each row's label at its first visit, its training loss at its last visit, how
often the training loader drew it (:meth:`RowRecord._seen`; under DDP with the class gauge,
every rank's rows, eq. classgauge); per class, the validation examples the hyper steps read
(:meth:`RowRecord._count_validation`); their latest per-sample losses
(:meth:`RowRecord._keep_validation_losses`); and which rows are masked examples, a loss exactly 0
that does not depend on the weights (:meth:`RowRecord.masked_rows`). What the record says
about the weights (the flags' evidence, eq. classshift, a validation set short of a class) is
read by :class:`~hypertorch_sid.lightning.evidence.RowEvidence`, which it extends.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigurationError
from ..core.modes import frozen_mode
from .data_checks import (
    _MASKED_LATE_WHY,
    MASKED_REREADS,
    _integer_vector,
    _rows,
    batch_labels,
    class_ids,
)
from .evidence import _UNSEEN, RowEvidence
from .isolation import metric_states_kept, muted_logging, private_rng

__all__ = ["RowRecord"]

#: the most validation losses :attr:`RowRecord._val_losses` keeps where the validation set's
#: size is unknown (a stream)
VAL_LOSSES_KEPT = 4096


#: whether :func:`_row_means_into` has met torch's one "index_reduce() is in beta" warning
_SAID_BETA = False


def _row_means_into(target: Tensor, index: Tensor, values: Tensor) -> None:
    """``target[i]`` ← the mean of ``values`` at the positions where ``index`` holds i, for
    every row i in ``index`` (a row held twice gets the mean of its two values); the other rows
    are left as they were. One ``index_reduce_`` where it is deterministic; where deterministic
    algorithms are asked for on an accelerator, the sums and counts of the distinct rows."""
    global _SAID_BETA
    values = values.to(target.device)
    index = index.to(target.device)
    if target.device.type != "cpu" and torch.are_deterministic_algorithms_enabled():
        rows, inverse = index.unique(return_inverse=True)
        sums = values.new_zeros(rows.shape).index_add_(0, inverse, values)
        counts = values.new_zeros(rows.shape).index_add_(0, inverse, torch.ones_like(values))
        target[rows] = sums / counts
        return
    if _SAID_BETA:
        target.index_reduce_(0, index, values, "mean", include_self=False)
        return
    with warnings.catch_warnings():  # torch says it once per process: not the user's concern
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
        target.index_reduce_(0, index, values, "mean", include_self=False)
    _SAID_BETA = True


class RowRecord(RowEvidence):
    """The record of the training rows (see the module docstring), kept by the problem that
    reads the batches: it gives ``weights``, ``per``, ``prefetch``, ``target`` (with
    ``_own_target`` and ``_labels_by_position``: where a batch's labels are read),
    ``_gather`` (DDP's ``all_gather``), ``_index_and_data`` and, for the masked-row check, the
    wrapped module and its own ``training_step`` (``_module``, ``_original``)."""

    prefetch: Callable[[], tuple[Tensor, Callable[[list[float]], None]] | None] | None
    target: Callable[[Any], Tensor]
    _own_target: bool
    _labels_by_position: bool
    _gather: Callable[[Tensor], Tensor] | None
    _module: Any
    _original: Callable[..., Any] | None

    def __init__(self) -> None:
        #: per row: the label seen at its first visit (per sample, where the batch holds integer
        #: labels: an index whose label changes is not a stable index) and the training loss at
        #: its last visit (the evidence :meth:`flag_evidence` reads)
        self._labels: Tensor | None = None
        #: the labels a checkpoint held, taken over at the resumed fit's ``build``
        self.checkpointed_labels: Tensor | None = None
        #: the per-row losses and visits a checkpoint held (``data_last_loss``,
        #: ``data_visits``), taken over at the resumed fit's ``build`` beside the labels
        self.checkpointed_rows: dict[str, Tensor] = {}
        self._last_loss: Tensor | None = None
        #: per row: the times a training batch held it (the loader's draws, a sampler's
        #: included), which :meth:`class_shares` counts the training distribution by
        self._visits: Tensor | None = None
        #: whether the labels are binary targets stored as floats, read as 0 / 1 (decided at
        #: each fit's first training step, :meth:`_read_binary_floats`)
        self._binary_floats = False
        self._said_masked = False  # masked rows said in this fit (at a batch or an epoch's end)
        self._reread_rows: set[int] = set()  # rows of loss 0 re-read for masking (this fit)
        #: per row: whether its training loss was ever other than 0 in this fit (so not masked)
        self._lossy: Tensor | None = None
        #: the validation set's size (set by the callback at fit start; None where unknown, a
        #: stream) and, per class, the validation examples the hyper steps read (integer labels
        #: only): summed over their batches, with the rows and batches read (the evidence
        #: :meth:`validation_shortfall` reads)
        self.validation_examples: int | None = None
        self._val_counts: Tensor | None = None
        #: per class (``per="class"``): which classes the training batches held
        self._trained_classes: Tensor | None = None
        self._val_rows = self._val_batches = 0
        #: the per-sample losses of the latest validation batches the hyper steps read through
        #: ``training_step`` (the last :attr:`validation_examples` of them, or
        #: :data:`VAL_LOSSES_KEPT`; newest last): the clean rows' loss scale that
        #: :meth:`flag_contrast` reads where the rows carry no class labels (a regression)
        self._val_losses: Tensor | None = None

    def _read_checks(
        self, index: Tensor, data: Any, carried: Tensor | None = None
    ) -> Tensor | None:
        """What a training step of the loop reads of the device, in one wait for it (a
        launch-bound GPU pays for each): the batch's index range (refused where it is not rows
        of the weights, :meth:`SampleWeights.accept_index`), whether a row's label changed since
        its first visit (refused: the dataset's order moved, so a weight no longer belongs to
        one example), and what the cross term will read (:attr:`prefetch`). Returns the
        batch's integer labels (per sample, where it holds them), which :meth:`_seen` records."""
        weights = self.weights
        assert weights is not None
        flat, bounds = weights.index_bounds(index)
        parts = [] if bounds is None else [bounds]
        labels = self._labels_of(data, int(flat.numel()), carried) if self.per == "sample" else None
        known = clash = None
        if labels is not None:
            labels = labels.to(flat.device)
            seen = self._labels
            if seen is not None and seen.shape[0] == weights.n and flat.numel():
                # clamped: the range is refused below, before anything reads these rows
                known = seen.to(flat.device)[flat.clamp(0, weights.n - 1)]
                clash = (known != _UNSEEN) & (known != labels)
                parts.append(clash.any(0, keepdim=True))
        ahead = self.prefetch() if self.prefetch is not None else None
        if ahead is not None:
            parts.append(ahead[0])
        values = torch.cat(parts).tolist() if parts else []  # the one read of the device
        low, high = (int(values[0]), int(values[1])) if bounds is not None else (0, 0)
        weights.accept_index(index, flat, low, high)
        k = 0 if bounds is None else 2
        if clash is not None:
            if values[k]:
                j = int(clash.nonzero()[0, 0])
                raise ConfigurationError(
                    f"LearnedDataWeights: example {int(flat[j])} had label {int(known[j])} on "  # type: ignore[index]
                    f"an earlier visit and has label {int(labels[j])} now: the training set's "  # type: ignore[index]
                    "indices are not stable (its order changes between epochs, or its labels "
                    "are drawn anew, or this callback learned its weights on another data set "
                    "of the same size), so a weight would not belong to one example. Keep the "
                    "order fixed (shuffle in the DataLoader, not in the dataset), or use a "
                    "new LearnedDataWeights for another data set."
                )
            k += 1
        if ahead is not None:
            ahead[1](values[k:])
        return labels

    def _seen(self, index: Tensor, losses: Tensor, labels: Tensor | None) -> None:
        """Record a training batch's rows (checked by :meth:`_read_checks`): each row's label
        at its first visit (``labels``, per sample) and its training loss at this visit (the
        batch's mean for a row it holds twice, or per class: the class's mean)."""
        n = self.weights.n  # type: ignore[union-attr]
        rows = index
        if self._gather is not None and self.weights.gauge == "class":  # type: ignore[union-attr]
            rows, labels = self._every_ranks_rows(index, labels)
        if labels is not None:
            if self._labels is None or self._labels.shape[0] != n:
                self._labels = torch.full((n,), _UNSEEN, dtype=torch.long, device=index.device)
            if self._labels.device != index.device:  # restored from a checkpoint on the CPU
                self._labels = self._labels.to(index.device)
            self._labels[rows] = labels.to(index.device)
        if self._last_loss is not None and self._last_loss.device != index.device:
            self._last_loss = self._last_loss.to(index.device)  # restored on the CPU
        if self._last_loss is None or self._last_loss.shape[0] != n:
            # float32 by name: precision="64-true" / "bf16-true" change torch's default dtype
            self._last_loss = torch.full(
                (n,), float("nan"), dtype=torch.float32, device=index.device
            )
        with torch.no_grad():
            values = losses.float()
            values = values if values.dim() == 1 else values.reshape(-1)
            _row_means_into(self._last_loss, index, values)
            if self._lossy is None or self._lossy.shape[0] != n:
                self._lossy = torch.zeros(n, dtype=torch.bool, device=index.device)
            self._lossy[index] |= self._last_loss[index] != 0
            self._count_visits(n, index, torch.ones_like(values))  # a row held twice: 2 draws

    def _every_ranks_rows(
        self, index: Tensor, labels: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """Under DDP with the class gauge: the rows of this step's batches on every rank, and
        their labels, so that every rank records the same labels and the gauge (eq.
        classgauge, read from all n rows after each outer step) shifts the same rows by the
        same amounts on every rank; recording only its own rows', each rank shifted by other
        class means and the ranks' weights drifted apart. Every rank takes part at every step
        of the loop (a batch without labels gives none); the batches may differ in size."""
        gather = self._gather
        assert gather is not None
        own = 0 if labels is None else int(index.numel())
        sizes = gather(torch.tensor([own], device=index.device)).reshape(-1)
        width = int(sizes.max())
        if width == 0:  # no rank read labels: nothing to record
            return index, labels
        pairs = torch.full((2, width), -1, dtype=torch.long, device=index.device)
        if labels is not None:
            pairs[0, :own] = index.reshape(-1)
            pairs[1, :own] = labels.reshape(-1).to(index.device)
        every = gather(pairs).reshape(-1, 2, width).transpose(0, 1).reshape(2, -1)
        kept = every[0] >= 0  # the padding's columns dropped
        return every[0][kept], every[1][kept]

    def masked_rows(self, reread: Callable[[list[int]], Any] | None = None) -> str | None:
        """Why some rows the training read are masked examples, once per fit: a negative
        integer label (``-100``, F.cross_entropy's ``ignore_index``: no class id is negative)
        with a loss exactly 0 at the row's last visit, wherever in the fit the row first came
        (the per-batch check, :func:`_warn_masked_samples`, reads only the fit's first
        :data:`MASKED_CHECKS` batches, where any exact 0 is suspect; later a well-fitted example
        can reach 0 in float32). Read from the per-row records :meth:`_seen` keeps on the
        device: the callback asks at each epoch's end (one read), not at every step.

        Rows without such a label (a loss multiplied by a mask; dict samples without a label
        key) and a loss exactly 0: up to :data:`MASKED_REREADS` of them not re-read before are
        given back by ``reread`` (rows → the training batch of them, on the module's device)
        and their losses computed again with the weights shrunk (:meth:`_zero_when_shrunk`): a
        loss still exactly 0 does not depend on the weights, a masked example; a well-fitted
        one's is no longer 0. Session 49 left these unsaid. Only rows whose loss was 0 at every
        visit of this fit are candidates (``_lossy``): a row fitted to 0 was not 0 at first,
        and 16 such rows re-read before the masked ones left these to a later epoch's end
        (session 51)."""
        labels, loss = self._labels, self._last_loss
        if self._said_masked or loss is None:
            return None
        negative = torch.zeros(loss.shape, dtype=torch.bool, device=loss.device)
        if labels is not None and labels.shape == loss.shape:
            negative = ((labels < 0) & (labels != _UNSEEN)).to(loss.device)
            masked = negative & (loss == 0)
            count = int(masked.sum())
            if count:
                self._said_masked = True
                return (
                    f"{count} training examples have a negative label "
                    f"({int(labels[masked.to(labels.device)].min())}: ignore_index?) and a "
                    f"loss exactly 0: masked examples. {_MASKED_LATE_WHY}"
                )
        if reread is None or self._module is None or self.per != "sample":
            return None
        zero_now = (loss == 0) & ~negative
        if self._lossy is not None and self._lossy.shape == loss.shape:
            zero_now &= ~self._lossy  # a loss once other than 0 depends on something: no mask
        zero = zero_now.nonzero().flatten().tolist()
        fresh = [r for r in zero if r not in self._reread_rows][:MASKED_REREADS]
        if not fresh:
            return None
        self._reread_rows.update(fresh)
        try:  # a data set that cannot give its rows again (a stream's state): nothing said
            data = self._index_and_data(reread(fresh))[1]
        except Exception:
            return None
        shrunk = self._zero_when_shrunk(data)
        constant = [r for r, z in zip(fresh, shrunk) if z]
        if not constant:
            return None
        self._said_masked = True
        return (
            f"{len(zero)} training examples had a loss exactly 0 at every visit, and of "
            f"the {len(fresh)} re-read, {len(constant)} (rows {constant[:5]}) still have a loss "
            "exactly 0 with the network's weights shrunk 1000-fold, so it does not depend on "
            f"them: masked examples (a per-sample loss multiplied by a mask?). {_MASKED_LATE_WHY}"
        )

    def _zero_when_shrunk(self, data: Any) -> Tensor:
        """Which rows of ``data`` (a training batch without its indices, on the module's
        device) still have a loss
        exactly 0 with every trained parameter shrunk 1000-fold: a well-fitted example's loss
        is 0 in float32 only at a large margin (logits ~17 apart for a cross-entropy; its
        gradient underflows too beyond ~100), which the shrunk network's logits lose; a masked
        one's is 0 at any weights. Computed in eval mode (no BatchNorm statistics updated, no
        dropout), its randomness private, the user's metrics muted. A forward that fails so
        confirms every row (the caller's exact zeros stand)."""
        from torch.nn.utils.stateless import _reparametrize_module

        module, step = self._module, self._original
        assert module is not None and step is not None
        shrunk = {n: p.detach() * 1e-3 for n, p in module.named_parameters() if p.requires_grad}
        with (
            torch.no_grad(),
            frozen_mode(module, "eval"),
            private_rng(0, module.device),
            muted_logging(module),
            metric_states_kept(module),
            _reparametrize_module(module, shrunk),
        ):
            try:
                out = step(data, 0)
            except Exception:
                return torch.ones(_rows(data), dtype=torch.bool)
        raw = out.get("loss") if isinstance(out, Mapping) else out
        return raw.detach().reshape(raw.shape[0], -1).eq(0).all(1).cpu()

    def _labels_of(self, data: Any, b: int | None, carried: Tensor | None = None) -> Tensor | None:
        """The batch's integer labels, or None where it holds none to read (soft labels, a
        sequence target): ``target(data)`` where the user gave it; else those ``indexed_collate``
        read from the samples before the user's ``collate_fn`` (``carried``, a
        :class:`LabelledIndexed` batch's); else :func:`batch_labels` under torch's default
        collation only: a ``collate_fn`` of the user's has a layout of its own, e.g.
        EmbeddingBag's offsets at ``[1]`` of ``(tokens, offsets, y)``, which change with the
        batch. Binary targets stored as floats (:attr:`_binary_floats`) are read as 0 / 1."""
        labels = self._raw_labels(data, carried)
        if self._binary_floats and isinstance(labels, Tensor) and labels.is_floating_point():
            labels = labels.long()
        return class_ids(labels).long() if _integer_vector(labels, b) else None

    def _raw_labels(self, data: Any, carried: Tensor | None) -> Any:
        """What :meth:`_labels_of` reads the labels from, before any check of them."""
        if self._own_target:
            try:
                return self.target(data)
            except (TypeError, IndexError, KeyError, AttributeError, ConfigurationError):
                return None
        if carried is not None:
            return carried
        return batch_labels(data) if self._labels_by_position else None

    def _read_binary_floats(self, data: Any, carried: Tensor | None) -> None:
        """At the fit's first training step (one read of the device): whether the labels are
        binary targets stored as floats, a vector or column of 0.0 and 1.0 only (what
        ``F.binary_cross_entropy_with_logits`` needs), which are then read as the class ids
        0 / 1 (:attr:`_binary_floats`). They were read as no labels before (session 52): the
        class gauge and every label check were silently off, and the weights differed from
        the same fit's on integer labels by up to 0.75. Other float targets (soft labels,
        a regression, class ids above 1 stored as floats) stay unread."""
        labels = self._raw_labels(data, carried)
        self._binary_floats = bool(
            isinstance(labels, Tensor)
            and labels.is_floating_point()
            and labels.numel() > 0
            and (labels.dim() == 1 or (labels.dim() == 2 and labels.shape[1] == 1))
            and bool(((labels == 0) | (labels == 1)).all())
        )

    def _count_validation(self, data: Any, carried: Tensor | None = None) -> None:
        """Add a validation batch's integer labels (:meth:`_labels_of`) to the per-class counts
        :meth:`validation_shortfall` reads; a batch without them adds none."""
        labels = self._labels_of(data, None, carried)  # per class too: a class none holds
        if labels is None:
            return
        labels, held = labels.detach().cpu(), self._val_counts
        counts = torch.bincount(labels[labels >= 0], minlength=0 if held is None else held.numel())
        if held is not None:
            counts[: held.numel()] += held
        self._val_counts = counts
        self._val_rows += int(labels.numel())
        self._val_batches += 1

    def _keep_validation_losses(self, losses: Tensor) -> Tensor:
        """Add a validation batch's per-sample losses (each sample's mean over any further
        dimensions) to :attr:`_val_losses`, dropping the oldest beyond the validation set's
        size; returns ``losses``. Kept on the losses' device (no wait for it)."""
        if losses.dim() == 0 or losses.shape[0] == 0:
            return losses
        with torch.no_grad():
            new = losses.detach().float().reshape(losses.shape[0], -1).mean(1)
            held = self._val_losses
            if held is not None:
                new = torch.cat([held.to(new.device), new])
            self._val_losses = new[-(self.validation_examples or VAL_LOSSES_KEPT) :]
        return losses

    def _count_visits(self, n: int, rows: Tensor, counts: Tensor) -> None:
        """Add a training batch's draws of its ``rows`` (``counts`` each) to :attr:`_visits`."""
        if self._visits is None or self._visits.shape[0] != n:
            self._visits = torch.zeros(n, dtype=torch.float32, device=rows.device)
        self._visits.index_add_(0, rows.to(self._visits.device), counts.to(self._visits))
