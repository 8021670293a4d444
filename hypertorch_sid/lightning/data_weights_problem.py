"""The bilevel problem of :class:`~hypertorch_sid.lightning.data_weights.LearnedDataWeights`:
:class:`DataWeightsProblem` holds the problem's arguments, its build (the weights sized from the
training set, the module's ``training_step`` wrapped), the training set's checks, ℓ̂ and E.

It is a :class:`~.weighted_step.WeightedStep` (the wrapped ``training_step``,
``lightning/weighted_step.py``), which is a :class:`~.row_record.RowRecord` (the record of the
training rows, ``lightning/row_record.py``), read by :class:`~.evidence.RowEvidence`
(``lightning/evidence.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data.dataloader import default_collate

from ..core.errors import ConfigurationError
from ..core.indexing import Indexed, sample_label, split_indexed
from ..core.normalisers import CLASS_GAUGES
from ..core.objectives import ExpectedError, MeanLoss, ValidationObjective, as_validation_objective
from ..core.parameterizations import WeightParameterization, as_weight_parameterization
from ..core.sample_weights import SampleWeights
from .batch_masks import MaskDetection
from .cross_term import RandomState
from .data_checks import (
    _carried_labels,
    _check_class_labels,
    _check_training_loader,
    _default_target,
    _examples_digest,
    _examples_of,
    _refuse_arguments,
    _refuse_class_gauge,
    _refuse_real_targets,
    _validation_tensor,
    _warn_indexed_validation,
    draws_weighted,
)
from .isolation import muted_logging
from .namespaces import is_overridden
from .problem import BilevelProblem, UntrainedGroups
from .sampling import first_loader, repeated_examples, validation_loader
from .weighted_step import WeightedStep

__all__ = ["DataWeightsProblem"]

#: E's default: ExpectedError(q=0.5) (eq. softerr; every setting measured, docs/data_weights.md)
DEFAULT_OBJECTIVE = ExpectedError(q=0.5)


class DataWeightsProblem(WeightedStep):
    """Per-sample (or per-class) data weights on any ``LightningModule`` as a
    :class:`~.problem.ProblemSource` (parameters: see :class:`~.data_weights.LearnedDataWeights`).

    At ``build`` it sizes the weights from the training set, wraps the module's
    ``training_step`` so that the training minimises the weighted loss, and gives the bilevel
    problem: ℓ̂ = Σ ωᵢℓᵢ/Σ ωᵢ on the callback's indexed minibatches, E = ``objective`` of the
    per-sample losses on validation batches, λ = the logits x of ω.
    """

    def __init__(
        self,
        per: Literal["sample", "class"] = "sample",
        num_classes: int | None = None,
        parameterization: str | WeightParameterization = "sigmoid",
        initial: float | None = None,
        normalize: bool = True,
        target: Callable[[Any], Tensor] | None = None,
        validation_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        objective: str | ValidationObjective = DEFAULT_OBJECTIVE,
        gauge: Literal["auto", "batch", "mean_logit", "class", "class_centred"] = "auto",
    ) -> None:
        _refuse_arguments(per, num_classes, gauge, target, validation_loss, initial)
        self.per = per
        self.num_classes = None if num_classes is None else int(num_classes)  # np.int64(3) too
        #: refused now, not at the fit; one object for every fit (a shared term's θ is kept)
        self.parameterization = as_weight_parameterization(parameterization)
        self.initial = initial
        self.normalize = normalize
        self.gauge = gauge
        self.target = target or _default_target
        self._own_target = target is not None
        #: whether ``gauge="auto"`` may choose ``"class"`` where labels are read (set by the
        #: callback: only with the training batches' cross term, where it was measured)
        self.class_by_default = False
        #: under DDP (set at the build) the strategy's ``all_gather``: under the class gauge
        #: every rank records the labels of every rank's rows (:meth:`_every_ranks_rows`)
        self._gather: Callable[[Tensor], Tensor] | None = None
        #: whether a batch's ``data[1]`` is its labels: only under torch's default collation,
        #: which keeps the samples' (x, y, ...) layout (set at each fit's start)
        self._labels_by_position = True
        #: whether the training DataLoader draws with a WeightedRandomSampler (set at each
        #: fit's start): ``gauge="auto"`` then keeps ``"batch"`` (session 52, eq. classcentre's
        #: class-common part is evidence there, docs/data_weights.md)
        self._draws_weighted = False
        self.validation_loss = validation_loss
        #: E from the validation batch's per-sample losses (refused now, not at the fit)
        self.objective = as_validation_objective(objective)
        #: the learned weights (built at the first fit's start; kept across fits)
        self.weights: SampleWeights | None = None
        if per == "class":  # known now: validates the parameterisation at construction
            self.weights = SampleWeights(self.num_classes, self.parameterization, initial)  # type: ignore[arg-type]
        elif initial is not None:  # the initial weight refused now, not at the fit's start
            SampleWeights(1, self.parameterization, initial)
        if gauge in CLASS_GAUGES:  # refused now where it cannot be held
            _refuse_class_gauge(per, self.parameterization, initial, gauge)
        if gauge == "mean_logit":  # refused now where it cannot be held, or is no gauge
            SampleWeights(1, self.parameterization, initial, gauge=gauge)
            if not normalize:
                raise ConfigurationError(
                    "LearnedDataWeights(gauge='mean_logit') fixes the scale that the "
                    "self-normalised loss does not see; with normalize=False the loss sees it, "
                    "and holding the mean logit would change the problem: use gauge='auto' or "
                    "'batch' there (or normalize=True)."
                )
        self._module: pl.LightningModule | None = None
        self._original: Callable[..., Any] | None = None
        #: the module given :meth:`stand_in` (until the build wraps it, or the fit ends)
        self._stood_in: pl.LightningModule | None = None
        #: row-sparse gradients of the logits (set by the callback before ``build``)
        self.sparse_grad = False
        #: the batch the Trainer's loop hands to ``training_step`` now (set by the callback at
        #: ``on_train_batch_start``): only that call records its rows and moves their weights;
        #: another callback's calls (``LearnedWeightDecay``'s hyper steps) get the loss alone
        self.loop_batch: Any = None
        #: called with (index, data, losses, RNG state at the step's start) at every training
        #: step before the losses are returned (the callback's cross term on the training
        #: batch, ``cross_term="training"``)
        self.on_training_batch: Callable[[Tensor, Any, Tensor, RandomState], None] | None = None
        #: called at every training step of the loop before the weights are read: what the
        #: cross term will read of the device at this step (a float64 tensor there, not read)
        #: and the function to hand its values to, or None; read with the batch's own checks in
        #: one wait for the device (:meth:`_read_checks`)
        self.prefetch: Callable[[], tuple[Tensor, Callable[[list[float]], None]] | None] | None
        self.prefetch = None
        super().__init__()  # the record of the training rows (RowRecord)
        #: the checkpoint's :func:`_examples_digest`, compared at the resumed fit's ``build``
        self.checkpointed_examples: str | None = None
        #: which examples the per-sample weights belong to (:func:`_examples_of`, at the build)
        self._examples: tuple[Any, tuple[int, ...] | None] | None = None
        self._examples_set: Any = None  # the training set they were read from
        #: whether the fit's first training step's losses were checked for masked entries
        self._checked_entries = False
        #: whether the training's loss masks rows (watched at each fit's first batches), and
        #: the one a checkpoint held, taken over at the resumed fit's ``build``
        self.masks = MaskDetection()
        self.checkpointed_masks: MaskDetection | None = None
        #: says when optimizer groups at lr=0 hold trained tensors (a new one at each build)
        self.untrained = UntrainedGroups("LearnedDataWeights")
        #: whether the default objective checked a validation batch's targets (a regression?)
        self._checked_targets = False

    # ------------------------------------------------------------------ ProblemSource
    def check(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not module.automatic_optimization:
            raise ConfigurationError(
                "LearnedDataWeights weights the per-sample losses that training_step returns, "
                "which manual optimisation does not hand to Lightning: use automatic "
                "optimisation."
            )
        if is_overridden("validation_step", module):
            _warn_indexed_validation(validation_loader(trainer))

    def build(self, trainer: pl.Trainer, module: pl.LightningModule) -> BilevelProblem:
        self.untrained = UntrainedGroups("LearnedDataWeights")
        self._gather = trainer.strategy.all_gather if trainer.world_size > 1 else None
        dataset = self._training_dataset(trainer)
        self._val_counts, self._val_rows, self._val_batches = None, 0, 0
        self._trained_classes = None
        if self.per == "sample":
            n = len(dataset)
            other = self.reads_other_examples(dataset)  # another fold of one data set?
            self._examples, self._examples_set = _examples_of(dataset), dataset
            if self.weights is None or self.weights.n != n or other:
                if self.weights is not None:
                    why = (
                        f"the training set holds other examples than the ones this callback "
                        f"learned its {n} weights on (another split, fold or data set)"
                        if other and self.weights.n == n
                        else f"the training set has {n} examples, the weights this callback "
                        f"learned {self.weights.n}"
                    )
                    rank_zero_warn(
                        f"LearnedDataWeights: {why}: they are dropped and every weight starts "
                        "again (use a new LearnedDataWeights for another data set)."
                    )
                self.weights = SampleWeights(n, self.parameterization, self.initial)
                _warn_repeated_examples(dataset)
                self._labels = self._last_loss = None
                self._visits = self._val_losses = None
            saved, self.checkpointed_examples = self.checkpointed_examples, None
            now = _examples_digest(self._examples)
            if saved is not None and now is not None and saved != now:
                raise ConfigurationError(
                    "LearnedDataWeights: this fit resumes weights learned on other examples "
                    "than its training set holds (a TensorDataset of other content, or other "
                    "rows of it): row i's weight would go to another example. Resume on the "
                    "checkpoint's training set, or start a new fit (no ckpt_path) for this one."
                )
            labels, self.checkpointed_labels = self.checkpointed_labels, None
            if labels is not None and labels.shape == (n,):  # else the sampler's state refuses
                self._labels = labels
            rows, self.checkpointed_rows = self.checkpointed_rows, {}
            self._val_losses = rows.pop("data_val_losses", self._val_losses)  # not per row
            if all(r.shape == (n,) for r in rows.values()):
                self._last_loss = rows.get("data_last_loss", self._last_loss)
                self._visits = rows.get("data_visits", self._visits)
            self.weights.use_sparse_grad(self.sparse_grad)
        weights = self.weights
        assert weights is not None
        # a fit watches its first batches for a mask anew; a resumed one goes on as it was
        self.masks, self.checkpointed_masks = self.checkpointed_masks or MaskDetection(), None
        weights.use_masks(self.masks.row_masks())
        # "auto": the exact minibatch derivative until the first training batch says regression
        if self.gauge in CLASS_GAUGES:  # centred per class (the labels seen so far)
            weights.use_class_gauge(lambda: self._labels, self.gauge)  # type: ignore[arg-type]
        else:
            weights.use_gauge("batch" if self.gauge == "auto" else self.gauge)
        inner = list(
            {
                id(p): p
                for opt in trainer.optimizers
                for g in opt.param_groups
                for p in g["params"]
                if p.requires_grad
            }.values()
        )
        if not inner:  # said here, not as the core's "inner_parameters is empty" (s58)
            raise ConfigurationError(
                "LearnedDataWeights: the training optimizers hold no trainable parameter (every "
                "tensor they were given has requires_grad=False), so the training moves nothing "
                "and no weight can be learned. Unfreeze the layers to train before the fit (or "
                "build the optimizer over the trainable ones)."
            )
        # the weights take the model's device and dtype (float64 under precision="64-true",
        # bfloat16 under "bf16-true"), as LearnedWeightDecay's λ does
        dtype = next((p.dtype for p in inner if p.is_floating_point()), weights.logits.dtype)
        with torch.no_grad():
            weights.logits.data = weights.logits.data.to(module.device, dtype)  # log Z follows
            weights.parameterization.bind(weights)
        self._wrap(module)
        return BilevelProblem(
            hyperparameters=weights.hyperparameters,
            inner_parameters=inner,
            inner_loss=lambda batch: self.weighted_loss(module, batch),
            outer_loss=lambda batch: self.validation(module, batch),
            summary=lambda: {"data_weight": weights.values()},
            projection=lambda hs: weights.projection(),
            names=weights.hyperparameter_names,
        )

    def reads_other_examples(self, dataset: Any) -> bool:
        """Whether ``dataset`` gives its rows to other examples than the weights were learned
        on: other positions of the same data set under its Subset wraps (another fold or split,
        possibly of the same size), or a ``TensorDataset`` of other content (another data set
        of the same size: a regression's weights went on with other rows without a word,
        session 51); False where that cannot be known (another data set object: the label
        check of :meth:`_seen` still sees relabelled rows)."""
        if self._examples is None or dataset is self._examples_set:
            return False
        examples = _examples_of(dataset)
        if examples[0] != self._examples[0]:  # both TensorDatasets: their content differs
            return all(isinstance(e[0], tuple) for e in (examples, self._examples))
        return examples[1] != self._examples[1]

    def before_hyper_step(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.untrained.check(trainer, module)

    # ------------------------------------------------------------------ the data
    def _training_dataset(self, trainer: pl.Trainer) -> Any:
        loader = first_loader(trainer.train_dataloader, "train dataloader", "LearnedDataWeights")
        dataset = loader.dataset
        _check_training_loader(loader, self.per)
        self._draws_weighted = draws_weighted(loader)
        if self.per == "sample":
            collate = getattr(loader.collate_fn, "fn", loader.collate_fn)
            said = not self._labels_by_position  # (this is checked at every epoch's start)
            self._labels_by_position = collate is default_collate
            if (
                not self._labels_by_position
                and not self._own_target
                and not said
                # else indexed_collate carries the labels it read from each sample
                and (len(dataset) == 0 or sample_label(dataset[0].data) is None)
            ):
                rank_zero_warn(
                    "LearnedDataWeights: the train DataLoader has a collate_fn of yours, so its "
                    "batches' [1] is not taken for the labels (it may be anything, e.g. "
                    "EmbeddingBag offsets), and its samples have no label indexed_collate can "
                    "read (an (x, y) pair with an integer y, or a dict sample's one label key: "
                    "hypertorch_sid.core.indexing.sample_label). Without labels the "
                    "check that each index keeps its example's label and the label evidence of "
                    "flagged() are off, and the "
                    "weights are not held per class (gauge='class', the default where labels "
                    "are read): they can push whole classes down (20 Newsgroups, session 51: "
                    "accuracy 0.654 against plain training's 0.799 without labels, 0.819 with "
                    "them). Pass target=lambda batch: <its integer labels> (e.g. batch[-1]); "
                    "a sample without one class (a sequence's tags, several labels) has none: "
                    "then ignore this."
                )
        if self.normalize and loader.batch_size == 1:
            raise ConfigurationError(
                "LearnedDataWeights: the train DataLoader has batch_size=1, and the "
                "self-normalised loss Σ ωᵢℓᵢ / Σ ωᵢ of one sample is ℓ itself: no weight would "
                "change the training, nor get a hypergradient. Use batches of several samples, "
                "or normalize=False (the mean of ωᵢℓᵢ)."
            )
        return dataset

    def _index_and_data(self, batch: Any) -> tuple[Tensor, Any]:
        if self.per == "sample":
            return split_indexed(batch)
        data, rows = (batch.data, len(batch.index)) if isinstance(batch, Indexed) else (batch, None)
        labels = _check_class_labels(self.target(data), self.num_classes, rows)  # type: ignore[arg-type]
        seen = torch.bincount(labels, minlength=self.num_classes) > 0  # type: ignore[arg-type]
        held = self._trained_classes
        self._trained_classes = seen if held is None else held.to(seen.device) | seen
        return labels, data

    # ------------------------------------------------------------------ ℓ̂ and E
    def _losses(self, module: pl.LightningModule, data: Any, batch_idx: int = 0) -> Any:
        assert self._original is not None
        return self._original(data, batch_idx)

    def weighted_loss(self, module: pl.LightningModule, batch: Any) -> Tensor:
        """ℓ̂ = Σᵢ ωᵢℓᵢ / Σᵢ ωᵢ (or the mean of ωᵢℓᵢ with ``normalize=False``) on ``batch``,
        differentiable in w and in the logits of the batch's rows."""
        assert self.weights is not None
        index, data = self._index_and_data(batch)
        with muted_logging(module):
            out = self._losses(module, data)
        return _weighted(out, index, self.weights, self.normalize)

    def validation(self, module: pl.LightningModule, batch: Any) -> Tensor:
        """E: ``objective`` of the per-sample losses on a validation batch
        (:class:`ExpectedError` ``(q=0.5)`` by default: eq. softerr; :class:`MeanLoss`: mean). A
        scalar from the user's ``validation_loss`` is E itself: the objective needs per-sample
        losses, and transforming a mean would only rescale its gradient."""
        data = batch.data if isinstance(batch, Indexed) else batch
        self._count_validation(data, _carried_labels(batch))
        if self.validation_loss is not None:
            out = _validation_tensor(self.validation_loss(module, data))
            if out.dim() == 0:
                # asked for, and nothing to apply to (the mean of one number is that number)
                if self.objective is not DEFAULT_OBJECTIVE and not isinstance(
                    self.objective, MeanLoss
                ):
                    raise ConfigurationError(
                        f"LearnedDataWeights: validation_loss returned one number (a mean?), "
                        f"which is E itself, so objective={self.objective!r} would be ignored: "
                        "it needs the per-sample validation losses. Return them "
                        "(reduction='none'), or drop objective=."
                    )
                return out
            self._check_targets(data, out)
            return self.objective(out)
        try:
            with muted_logging(module):
                read = self.objective.read(
                    module,
                    data,
                    lambda: self._keep_validation_losses(
                        _validation_tensor(self._losses(module, data))
                    ),
                )
        except ConfigurationError:
            raise
        except Exception as err:  # a raw IndexError from the user's code (session 51)
            raise ConfigurationError(
                f"LearnedDataWeights: E reads the per-sample training losses of validation "
                f"batches, and training_step failed on one ({type(err).__name__}: {err}). The "
                "validation loader's batches must have the training batches' structure (without "
                "the index), or pass validation_loss=lambda module, batch: <per-sample losses> "
                "for its batches."
            ) from err
        self._check_targets(data, read)
        return self.objective(read)

    def _check_targets(self, data: Any, losses: Any) -> None:
        """At the first validation batch under the default objective: refuse a regression."""
        if self.objective is DEFAULT_OBJECTIVE and not self._checked_targets:
            self._checked_targets = True
            _refuse_real_targets(data, losses)


def _warn_repeated_examples(dataset: Any) -> None:
    """Examples the training set holds at more than one position (oversampling by copies): each
    position has its own weight, learned apart (session 55: the two copies of an example ended
    0.71-0.83 apart on the toy, and ``flagged()`` could name one and keep the other)."""
    k = repeated_examples(dataset)
    if k:
        rank_zero_warn(
            f"LearnedDataWeights: {k} of the {len(dataset)} training positions read an example "
            "another position reads too (a Subset listing an index twice, a ConcatDataset "
            "holding a data set twice: oversampling by copies?). Each position gets its own "
            "weight, learned apart: the copies of one example end with different weights, and "
            "flagged() may name one copy and keep another. Keep one copy of each example and "
            "oversample with a WeightedRandomSampler instead."
        )


def _weighted(out: Any, index: Tensor, weights: SampleWeights, normalize: bool) -> Tensor:
    """Σ ωᵢℓᵢ / Σ ωᵢ (``normalize``) or mean ωᵢℓᵢ from ``training_step``'s output, the
    weights of the rows ``index`` differentiable in the hyperparameters."""
    losses = out.get("loss") if isinstance(out, Mapping) else out
    return weights.weighted_mean(losses, index, normalize)
