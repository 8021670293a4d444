"""The training's loss under the data weights: the module's own ``training_step``, wrapped.

:class:`WeightedStep` (which :class:`~hypertorch_sid.lightning.DataWeightsProblem`
is) gives the module a ``training_step`` that takes the index off the batch, calls the user's
and returns ℓ̂ = Σᵢ ωᵢℓᵢ / Σᵢ ωᵢ over the batch (or the mean of ωᵢℓᵢ, ``normalize=False``):
from the fit's ``setup`` a stand-in at the weights as they are (:meth:`WeightedStep.stand_in`,
for Lightning's tuner), from the build the wrapped step (:meth:`WeightedStep._wrap`), which at
each step of the loop also checks and records the batch's rows (the record,
:class:`~hypertorch_sid.lightning.row_record.RowRecord`), hands them to the training batches'
cross term, and at the fit's first step chooses the gauge (:meth:`WeightedStep._choose_gauge`,
eq. classgauge for ``"class"``). :meth:`WeightedStep.unwrap` gives the module its own back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor

from ..core.errors import ConfigurationError
from ..core.indexing import Indexed
from ..core.parameterizations import SigmoidWeights, SoftmaxWeights
from ..core.weighted_loss import check_per_sample, weighted_loss
from .batch_masks import MaskDetection
from .cross_term import RandomState
from .data_checks import (
    OneClassBatches,
    _carried_labels,
    _check_sample_target,
    _real_targets,
    _refuse_masked_entries,
    _warn_broadcast_losses,
    _warn_unread_labels,
)
from .problem import with_batch_idx
from .row_order import warn_if_losses_leave_rows
from .row_record import RowRecord

__all__ = ["WeightedStep"]


class WeightedStep(RowRecord):
    """The module's ``training_step`` wrapped to return the weighted loss (see the module
    docstring). The problem gives ``weights``, ``per``, ``normalize``, ``initial``,
    ``parameterization``, ``gauge`` and ``class_by_default``, ``_index_and_data``, and the
    hooks ``loop_batch`` (the batch the Trainer's loop hands over now) and
    ``on_training_batch`` (the cross term on it)."""

    #: the class gauge ``gauge="auto"`` chooses where integer labels are read
    #: (:data:`~hypertorch_sid.core.normalisers.CLASS_GAUGES`)
    AUTO_CLASS_GAUGE = "class"

    normalize: bool
    initial: float | None
    gauge: str
    class_by_default: bool
    _draws_weighted: bool
    loop_batch: Any
    on_training_batch: Callable[[Tensor, Any, Tensor, RandomState], None] | None
    _module: pl.LightningModule | None
    _stood_in: pl.LightningModule | None
    _checked_entries: bool
    masks: MaskDetection

    def stand_in(self, module: pl.LightningModule) -> None:
        """From the fit's ``setup`` until :meth:`_wrap` (the build, at ``on_train_start``):
        ``module.training_step`` takes the index off the batch and returns the weighted loss at
        the weights as they are (their start, ω₀ for every row, before a first fit), recording
        nothing and moving no weight. Lightning's tuner runs its trials in between
        (``Tuner(trainer).lr_find`` / ``scale_batch_size`` call ``training_step`` from
        ``on_fit_start`` with every other callback switched off): the user's
        ``training_step`` got the ``Indexed`` batch and failed inside the user's code, and its
        per-sample losses could not be backpropagated."""
        if self._module is not None or "training_step" in module.__dict__:
            return  # wrapped already (weighted, or the stand-in)
        original = with_batch_idx(module.training_step)

        @functools.wraps(original)
        def training_step(batch: Any, batch_idx: int = 0, *args: Any, **kwargs: Any) -> Any:
            index, data = self._index_and_data(batch)
            out = original(data, batch_idx, *args, **kwargs)
            raw = out.get("loss") if isinstance(out, Mapping) else out
            losses = check_per_sample(raw, index)
            weights = self.weights
            with torch.no_grad():
                if weights is not None and int(index.max()) < weights.n and int(index.min()) >= 0:
                    omega = weights.weights(index.to(weights.logits.device), losses)
                else:  # before the first build: every weight at its start
                    omega = torch.full_like(losses, self._initial_weight())
            loss = weighted_loss(losses, omega.to(losses.device), self.normalize)
            return {**out, "loss": loss} if isinstance(out, Mapping) else loss

        training_step.stand_in = True  # type: ignore[attr-defined]
        module.training_step = training_step  # type: ignore[method-assign]
        self._stood_in = module

    def _initial_weight(self) -> float:
        """ω₀, the weight every row starts at."""
        if self.initial is not None:
            return float(self.initial)
        return 1.0 if isinstance(self.parameterization, SoftmaxWeights) else 0.5

    @staticmethod
    def _drop_stand_in(module: pl.LightningModule) -> None:
        step = module.__dict__.get("training_step")
        if getattr(step, "stand_in", False):
            del module.__dict__["training_step"]

    def _wrap(self, module: pl.LightningModule) -> None:
        """``module.training_step`` returns the weighted loss from now until :meth:`unwrap`."""
        if self._module is module:
            return
        self.unwrap()
        self._drop_stand_in(module)
        self._checked_entries = False
        self._said_masked = self.masks.detected  # a resumed fit's mask: said in its first fit
        self._reread_rows, self._lossy = set(), None
        one_class = OneClassBatches() if self.per == "class" and self.normalize else None
        original = with_batch_idx(module.training_step)
        self._module, self._original = module, original
        edits_batch = False  # whether the user's step edits its batch in place (x /= 255)

        @functools.wraps(original)
        def training_step(batch: Any, batch_idx: int = 0, *args: Any, **kwargs: Any) -> Any:
            index, data = self._index_and_data(batch)
            carried = _carried_labels(batch)
            in_loop = batch is self.loop_batch  # not another callback's hyper step
            if in_loop:  # once: LBFGS's closure calls training_step again at its line points
                self.loop_batch = None
            rng = RandomState.capture(module.device, module) if self.on_training_batch else None
            nonlocal edits_batch
            replay = _copied(data) if edits_batch else data  # the batch as the step got it
            versions = None if edits_batch else _versions(data)
            out = original(data, batch_idx, *args, **kwargs)
            if versions is not None and _versions(data) != versions:
                edits_batch, replay = True, None  # this batch as it came is gone: no replay
                self._original = lambda data, *rest: original(_copied(data), *rest)
            raw = out.get("loss") if isinstance(out, Mapping) else out
            if raw is None:  # Lightning's skip of a training batch: nothing read or weighted
                if in_loop:
                    return out
                raise ConfigurationError(
                    "LearnedDataWeights: training_step returned None (Lightning's skip) on a "
                    "batch a hyper step drew: the hyper steps need the per-sample losses of "
                    "every batch they draw, training and validation. Skip only batches of the "
                    "training loop (e.g. by self.trainer.training and batch_idx), or leave the "
                    "skipped examples out of the data sets."
                )
            if not self._checked_entries:  # once, at the fit's first step
                self._checked_entries = True
                _refuse_masked_entries(raw)
                _warn_broadcast_losses(raw, int(index.numel()))
                if self.per == "sample":
                    self._read_binary_floats(data, carried)
                    if self._own_target and _rows_of(raw):
                        _check_sample_target(self.target, data, _rows_of(raw), self._binary_floats)
                    if not self._own_target and carried is None and _rows_of(raw):
                        _warn_unread_labels(data, _rows_of(raw))
                self._choose_gauge(data, raw, carried)
                if replay is not None and isinstance(raw, Tensor):  # in the batch's order (s63)
                    warn_if_losses_leave_rows(original, replay, raw, module)
            if in_loop and self.masks.watching:  # the fit's first batches: a mask? (s63)
                self.masks.watch(raw, replay, self._zero_when_shrunk, self._gather)
                if self.masks.detected:  # from this batch on, its exact zeros are masked
                    self._said_masked = True  # (said where seen: not again at an epoch's end)
                    self.weights.use_masks(self.masks.row_masks())  # type: ignore[union-attr]
            losses = check_per_sample(raw, index)
            if in_loop and one_class is not None:
                one_class.note(index)
            labels = self._read_checks(index, data, carried) if in_loop else None
            with torch.no_grad():  # the training never differentiates the weights
                weights = self.weights.weights(index, losses)  # type: ignore[union-attr]
            if in_loop:
                self._seen(index, losses, labels)
                if self.on_training_batch is not None and rng is not None and replay is not None:
                    self.on_training_batch(index, replay, losses.detach(), rng)
            loss = weighted_loss(losses, weights, self.normalize)
            return {**out, "loss": loss} if isinstance(out, Mapping) else loss

        def unweighted(batch: Any, batch_idx: int = 0) -> Tensor:
            """The mean of the per-sample losses on ``batch`` as its labels are, no weight
            applied: the training loss of a validation batch, which another callback's E
            (``LearnedWeightDecay`` without ``validation_loss=``) reads."""
            data = batch.data if isinstance(batch, Indexed) else batch
            out = original(data, batch_idx)
            raw = out.get("loss") if isinstance(out, Mapping) else out
            return raw.mean() if isinstance(raw, Tensor) else raw

        training_step.unweighted = unweighted  # type: ignore[attr-defined]
        module.training_step = training_step  # type: ignore[method-assign]

    def _choose_gauge(self, data: Any, losses: Any, carried: Tensor | None = None) -> None:
        """``gauge="auto"``, per sample under the self-normalised loss with a sigmoid
        parameterisation: ``"mean_logit"`` where the training targets are real numbers (a
        regression: a squared error's outlying targets carry the minibatch's centre, and under
        ``"batch"`` nothing was learned, docs/data_weights.md); ``"class"`` where the batch
        holds integer class labels that the drop-in reads (:meth:`_labels_of`: ``target=``,
        those ``indexed_collate`` read from the samples, or ``batch[1]`` under torch's default
        collation) and the training batches' cross term moves the weights
        (``cross_term="training"``): each row's hypergradient against its class's
        (:func:`~hypertorch_sid.core.weighted_loss.class_centred`) and each class's mean logit
        held (session 51: on 20 Newsgroups the part of the hypergradient common to a class was
        noise that pushed whole classes down), under DDP too (every rank records every rank's
        rows' labels, :meth:`_every_ranks_rows`), except where the training DataLoader draws
        with a ``WeightedRandomSampler`` (session 52: a class's common part is evidence there,
        and ``"batch"`` was 0.1–3.6 points above ``"class"`` on all 8 seeds of the imbalanced
        recipe); ``"batch"`` otherwise."""
        weights = self.weights
        if (
            self.gauge != "auto"
            or weights is None
            or self.per != "sample"
            or not self.normalize
            or not isinstance(weights.parameterization, SigmoidWeights)
        ):
            return
        if _real_targets(data, losses) is not None:
            weights.use_gauge("mean_logit")
            rank_zero_info(
                "LearnedDataWeights: the training targets are real numbers (a regression), so "
                "the weights' scale is held by their mean logit (gauge='mean_logit'), not by "
                "each minibatch's centre: gauge='batch' to keep the minibatch's."
            )
        elif self.class_by_default and self._draws_weighted:
            rank_zero_info(
                "LearnedDataWeights: the train DataLoader draws with a WeightedRandomSampler, "
                "so the part of each row's hypergradient common to its class is kept "
                "(gauge='batch'): under a class-rebalancing sampler it is evidence, and "
                "holding each class (gauge='class') cost 0.1-3.6 accuracy points on every one "
                "of 8 seeds of the imbalanced recipe (docs/data_weights.md, session 52). Pass "
                "gauge='class' to hold each class."
            )
        elif self.class_by_default:
            b = losses.shape[0] if isinstance(losses, Tensor) and losses.dim() > 0 else None
            if self._labels_of(data, b, carried) is not None:
                weights.use_class_gauge(lambda: self._labels, self.AUTO_CLASS_GAUGE)  # type: ignore[arg-type]

    def unwrap(self) -> None:
        """Give the module its own ``training_step`` back."""
        if self._module is not None:
            self._module.__dict__.pop("training_step", None)
        self._module = self._original = None
        if self._stood_in is not None:
            self._drop_stand_in(self._stood_in)
            self._stood_in = None


def _versions(data: Any) -> list[int]:
    """The version counters of the batch's tensors (each in-place write raises its tensor's)."""
    seen: list[int] = []
    apply_to_collection(data, Tensor, lambda t: seen.append(t._version))
    return seen


def _copied(data: Any) -> Any:
    """The batch with each tensor copied, for a step that edits its batch in place (``x /=
    255``, ``y[y == -1] = 0``, ``x.clamp_(0, 1)``): the cross term's and the masked-row check's
    replays of ``training_step`` then read the batch as the step got it, and write to copies.
    They ran on the batch itself (session 53): its tensors the training's backward still needs
    were written before that backward ran, a raw autograd "modified by an inplace operation"
    error at the first step after the first hyper step."""
    return apply_to_collection(data, Tensor, Tensor.clone)


def _rows_of(raw: Any) -> int:
    """The rows of a per-sample loss tensor (0 for anything else: a reduced loss is refused
    after)."""
    return raw.shape[0] if isinstance(raw, Tensor) and raw.dim() > 0 else 0
