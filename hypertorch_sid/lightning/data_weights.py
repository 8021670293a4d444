"""``LearnedDataWeights``: learn which training examples to trust, for any ``LightningModule``.

A classifier trained on noisy labels switches to per-example weights learned from a small clean
validation set with three changed lines::

    +from hypertorch_sid import IndexedDataset, LearnedDataWeights
     ...
         def training_step(self, batch, batch_idx):
             x, y = batch
    -        loss = F.cross_entropy(self(x), y)
    +        loss = F.cross_entropy(self(x), y, reduction="none")   # one loss per sample
             self.log("train_loss", loss.mean())
             return loss
     ...
    -train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    +train_loader = DataLoader(IndexedDataset(train_set), batch_size=64, shuffle=True)
    -trainer = pl.Trainer(max_epochs=10)
    +trainer = pl.Trainer(max_epochs=10, callbacks=[LearnedDataWeights()])

``training_step`` still receives ``(x, y)``: the callback takes the index off the batch, calls
the user's ``training_step`` and returns the weighted loss ℓ̂ = Σᵢ ωᵢℓᵢ / Σᵢ ωᵢ over the batch
(self-normalised: with equal weights this is the plain mean loss, so the training starts as the
user's own). The validation loader stays as it is: its batches give the outer objective
E from the per-sample losses on validation data (the same ``training_step`` on validation
batches, logging muted, unless ``validation_loss=`` is given): by default ``ExpectedError(q=0.5)``,
mean 2(1 − √p_y) for a cross entropy (eq. softerr); ``objective="mean_loss"`` for their mean.

The weights ωᵢ = σ(xᵢ) (or n·softmax(x)) are a core
:class:`~hypertorch_sid.core.sample_weights.SampleWeights`, tuned by SID through the
:class:`~hypertorch_sid.lightning.HyperOptimizationCallback` machinery (adjoint solve, eq.
gradestim's cross term on the rows of its minibatches only, :class:`LazyAdam` on the rows read).
They are checkpointed and resumed like λ, identical on every DDP rank, and readable after fit:
:meth:`LearnedDataWeights.data_weights` and :meth:`LearnedDataWeights.flagged`.

``per="class"`` learns one weight per class (imbalance) from the same machinery, indexed by the
label (``target(batch)``, by default :func:`batch_labels`: ``batch[1]``, or a dict sample's
``"y"`` / ``"label"`` / ``"target"``); the training set need not be indexed then.

Refused, each with what to do: a ``training_step`` that returns an already reduced loss, or
a loss of more than one dimension with entries exactly 0 at the fit's first step (padding
dropped by ``ignore_index``: reduce each sequence over its real tokens yourself); a regression
(real-valued validation targets, one per loss) under the default objective (give
``objective="mean_loss"``); a training batch without indices (the dataset is not an
``IndexedDataset``); a training loader over a stream (``IterableDataset``) or without
automatic batching; manual optimisation.

Where the parts are: this module holds the callback; :class:`DataWeightsProblem` (the
problem's arguments, its build, the training set's checks, ℓ̂ and E) is in
``lightning/data_weights_problem.py``; the problem is a
:class:`~.weighted_step.WeightedStep` (the wrapped ``training_step``,
``lightning/weighted_step.py``), which is a :class:`~.row_record.RowRecord` (the record of the
training rows, ``lightning/row_record.py``), read by :class:`~.evidence.RowEvidence`
(``lightning/evidence.py``).
Where a batch's labels are and the refusals and warnings about the user's data are in
``lightning/data_checks.py``; the training batches' cross term's pieces (:class:`RandomState`,
:func:`directional_losses`) in ``lightning/cross_term.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader

from ..core.budget import make_budget
from ..core.config import Batches
from ..core.directional import (
    DirectionalDerivative,
    ForwardDifference,
    ForwardMode,
    TrainingCrossTerm,
)
from ..core.errors import ConfigurationError
from ..core.flag_rules import FLAG_RULES, BelowWeight, FlagRule, TwoComponentSplit
from ..core.lazy_adam import LazyAdam
from ..core.normalisers import CLASS_GAUGES
from ..core.objectives import ValidationObjective
from ..core.parameterizations import WeightParameterization
from ..core.sample_weights import SampleWeights
from ..core.validation import as_strategy, check_bool
from .batch_masks import MaskDetection
from .callback import HyperOptimizationCallback, refuse_a_class
from .callback_settings import (
    config_given,
    default_unless_given,
    refuse_settings_given_positionally,
)
from .cross_term import RandomState, _cross_term_for, directional_losses
from .data_checks import (
    _examples_digest,
    _warn_indexed_validation,
    batch_labels,  # noqa: F401  (importable from here, as before)
)
from .data_weights_problem import DEFAULT_OBJECTIVE, DataWeightsProblem
from .early_stop_hold import EarlyStopHold, hold_step
from .evidence import (  # the constants stay importable from here
    _UNSEEN,  # noqa: F401
    CLASS_SHIFT_FACTOR,  # noqa: F401
    MIN_VAL_PER_CLASS,  # noqa: F401
)
from .imbalance import ClassRarity, class_rarity, imbalance_advice
from .isolation import metric_states_kept
from .metrics import late_first_hyper_step
from .namespaces import classes, is_overridden
from .no_signal import (
    NoSignalPolicy,
    WarnAtEnd,
    as_no_signal,
    planned_intervals,
    settled_advice,
)
from .problem import (
    MEANING_KEY,
    check_meaning,
    check_still_trained,
)
from .sampling import (
    draws_by_index,
    first_loader,
    loader_parts,
    validation_loader,
)
from .sources import prepared
from .training_length import planned_steps
from .weight_signal import SignalReading, WeightSignal

__all__ = ["DataWeightsProblem", "LearnedDataWeights"]  # the problem importable here, as before

#: the fewest validation examples a hyper step of the drop-in reads by default (all processes
#: together; the whole validation set if it is smaller): the v that every training batch's cross
#: term uses until the next hyper step is solved against this batch's ∇₁E
MIN_VAL_BATCH = 256

#: :meth:`LearnedDataWeights.flagged`'s rule: the two-component split's rows the network
#: contradicts (:meth:`DataWeightsProblem.misfits`)
SPLIT_MISFIT = "split_misfit"


def _lazy_adam(
    parameterization: WeightParameterization, hyperparameters: list[Tensor], **settings: Any
) -> LazyAdam:
    """The drop-in's outer optimizer: :class:`LazyAdam` over the parameterisation's groups (a
    shared term's θ with its own step size)."""
    return LazyAdam(parameterization.param_groups(hyperparameters), **settings)


def _training_rows(trainer: pl.Trainer, rows: list[int]) -> Any:
    """The training batch of ``rows`` of the training set, collated by its DataLoader and
    prepared as Lightning's loop prepares a training batch (:func:`~.sources.prepared`: the
    precision's dtype, the module's transfer hooks, the device). Only moved to the device until
    session 53: under ``precision="bf16-true"`` the re-read's float32 inputs failed in the
    bfloat16 network, and that failure confirmed rows fitted to a loss exactly 0 (common in
    bfloat16) as masked examples."""
    loader = first_loader(trainer.train_dataloader, "train dataloader", "LearnedDataWeights")
    return prepared(trainer, loader.collate_fn([loader.dataset[r] for r in rows]))


#: the per-row record a checkpoint keeps beside the labels (key: RowRecord attribute): each
#: row's training loss at its last visit and its visits. Not kept before session 52: a resumed
#: fit read them afresh, so flagged("split_misfit") (losses above log 2) and the flags'
#: contrast checks saw only the rows read since the resume (128 of 240 had none after a
#: mid-epoch resume), and the class shares counted the visits since the resume only
_ROW_RECORDS = {
    "data_last_loss": "_last_loss",
    "data_visits": "_visits",
    "data_val_losses": "_val_losses",  # not per row: the scale flag_contrast reads (s62)
}


def _every_ranks_rows(gather: Callable[[Tensor], Tensor], g: Tensor, n: int) -> Tensor:
    """Under DDP: every rank's sparse cross-term gradient ``g`` (coalesced, shape ``(n,)``) in
    one, from ``gather`` (the strategy's ``all_gather``). Each rank's rows are padded to the
    largest count first: the counts differ where a rank leaves its masked rows out (session
    63, :class:`~hypertorch_sid.core.weighted_loss.ZeroLossMasks`) or its batch holds a row
    twice, and an ``all_gather`` of tensors of other sizes fails in the backend ("Received
    data size doesn't match expected size")."""
    rows, values = g.indices()[0], g.values()
    sizes = gather(torch.tensor([rows.numel()], device=rows.device)).reshape(-1)
    pad = int(sizes.max()) - rows.numel()
    if pad:
        rows = torch.cat([rows, rows.new_full((pad,), -1)])
        values = torch.cat([values, values.new_zeros(pad)])
    rows, values = gather(rows).reshape(-1), gather(values).reshape(-1)
    kept = rows >= 0  # the padding dropped
    return torch.sparse_coo_tensor(rows[kept][None], values[kept], (n,))


def _stopped_by(trainer: pl.Trainer) -> str:
    """What stopped the fit, as far as the Trainer tells: an ``EarlyStopping`` whose patience
    ran out (or that says why it stopped), else a guess."""
    timers = [c for c in trainer.callbacks if isinstance(c, classes("callbacks.Timer"))]
    left = [t.time_remaining() for t in timers]
    if any(r is not None and r <= 0 for r in left):
        return "the Timer, max_time"
    for stopper in trainer.early_stopping_callbacks:
        if stopper.wait_count >= stopper.patience or getattr(
            stopper, "stopping_reason_message", None
        ):
            mode = "" if stopper.mode == "min" else f", mode={stopper.mode!r}"  # a slip shows
            return f"EarlyStopping(monitor={stopper.monitor!r}, patience={stopper.patience}{mode})"
    return "EarlyStopping, max_time?"


def _best_checkpoint(keeper: Any) -> tuple[int, str, float | None] | None:
    """A ``ModelCheckpoint``'s best checkpoint as (the callback, its path, its score): a path
    overwritten by a later best (a fixed ``filename``) gets another score; None before any."""
    path = getattr(keeper, "best_model_path", "")
    if not path:
        return None
    score = getattr(keeper, "best_model_score", None)
    return id(keeper), str(path), None if score is None else float(score)


class LearnedDataWeights(HyperOptimizationCallback):
    """Per-example (or per-class) data weights learned by SID (see the module docstring).

    Parameters
    ----------
    per:
        ``"sample"`` (one weight per training example; the dataset must be an
        :class:`~hypertorch_sid.core.indexing.IndexedDataset`) or ``"class"`` (one per
        class, indexed by the label; needs ``num_classes``).
    num_classes:
        The number of classes, for ``per="class"``.
    parameterization:
        ``"sigmoid"`` (ω = σ(x), the default), ``"softmax"`` (ω = n·softmax(x), mean 1),
        ``"shared_loss"`` or a :class:`~hypertorch_sid.core.parameterizations.SharedLossWeights`
        (ω = σ(x + θᵀφ(z)), eq. sharedloss: the per-sample logit plus a function of the
        example's batch-standardised loss whose two parameters every example trains; θ is
        stepped by its own Adam group, ``SharedLossWeights(lr=0.005)``), or any
        :class:`~hypertorch_sid.core.parameterizations.WeightParameterization`.
    initial:
        ω₀ of every row (default ½ for sigmoid, 1 for softmax). With the self-normalised loss
        (``normalize=True``) only ratios of weights matter, so ω₀ only sets where σ saturates.
    normalize:
        ``True``: ℓ̂ = Σ ωᵢℓᵢ / Σ ωᵢ over the batch (Ren et al. 2018; equal weights give the plain
        loss). ``False``: ℓ̂ = mean ωᵢℓᵢ (the benchopt data-cleaning objective).
    gauge:
        How the self-normalised loss's scale (which it does not see) is fixed: ``"batch"``, each
        row's hypergradient against its minibatch's weighted mean (the exact derivative);
        ``"mean_logit"``, each row's own, with the mean logit held at its start (see
        :class:`~hypertorch_sid.core.sample_weights.SampleWeights`). ``"class"`` (per sample,
        sigmoid, integer class labels): each training row's cross term against its own
        class's weighted mean in the batch
        (:func:`~hypertorch_sid.core.weighted_loss.class_centred`, eq. classcentre), and each
        class's mean logit held at its start after every outer step
        (:class:`~hypertorch_sid.core.normalisers.ClassMeanLogitGauge`), so the weights
        reorder the examples within a class but cannot push a whole class down (see
        :meth:`DataWeightsProblem.class_shift`). ``"class_centred"`` (the same cases): the
        centring alone, no class's mean logit held (nothing held, as under ``"batch"``): on
        fresh seeds +1.8 points on the imbalanced recipe under a ``WeightedRandomSampler``,
        −0.5 on 20 Newsgroups, even on the noisy-label CNNs and the AdamW MLP, so an option,
        not ``"auto"``'s choice (session 52, docs/data_weights.md). ``"auto"`` (default):
        ``"mean_logit"`` where the training targets ``batch[1]`` are real numbers (a
        regression: under ``"batch"`` a squared error with outlying targets learned nothing,
        the outliers carrying each minibatch's centre); ``"class"`` where the drop-in reads
        integer class labels
        (``target=``; else each sample's, read by ``indexed_collate`` before a ``collate_fn``
        of yours: an ``(x, y)`` pair's integer ``y`` or a dict sample's one label key; else
        ``batch[1]`` under torch's default collation) and ``cross_term="training"``, in one
        process or under DDP (session 51: on 20 Newsgroups the part of the
        rows' hypergradient common to a class was validation noise, and ``"batch"`` lost 14.5
        points of accuracy to plain training; ``"class"`` gained 1.6 on fresh seeds, and on
        the noisy-label CNNs kept the gain within 0.3 point; with most of a class's labels
        wrong, 90 % noise, ``"batch"`` flags more of them: docs/failures.md), except under a
        ``WeightedRandomSampler`` (a class-rebalancing sampler: a class's common part is
        evidence there, and ``"batch"`` was 0.1–3.6 points above ``"class"`` on all 8 seeds of
        the imbalanced recipe, session 52); ``"batch"`` otherwise (no labels read: a
        ``collate_fn`` of yours over samples without a label to read, and no ``target=``, is
        warned about).
    target:
        ``target(batch) -> labels`` for ``per="class"`` (default :func:`batch_labels`:
        ``batch[1]``, or the one of the keys / fields ``"y"``, ``"label"``, ``"labels"``,
        ``"target"``, ``"targets"`` of a dict or dataclass sample); with ``per="sample"`` the
        labels its checks and ``flagged("split_misfit")`` read (by default under a
        ``collate_fn`` of yours those ``indexed_collate`` read from the samples, none where
        they name none).
    validation_loss:
        ``validation_loss(module, batch) -> tensor``: the validation losses that ``objective``
        turns into E (default: ``training_step``'s per-sample losses on the validation batch); a
        scalar it returns is E as it is, whatever ``objective``.
    objective:
        E from the per-sample validation losses. Default :class:`ExpectedError` ``(q=0.5)``
        (eq. softerr: mean (1 − e^{−qℓ})/q, with the cross entropy 2(1 − √p_y): each validation
        example counts by √p_y, so the ones the network gets badly wrong do not decide which
        training labels look helpful; a negative loss, e.g. a Gaussian NLL, is refused naming
        ``"mean_loss"``, and so is a regression, whose validation targets are real numbers:
        e^{−qℓ} of a squared error depends on the targets' units). ``"mean_loss"``
        (:class:`MeanLoss`, their mean: the default until this version), ``"expected_error"``
        (q = 1), ``"kept_evidence"`` (:class:`KeptEvidenceError`: q chosen per validation
        batch, eq. keptevidence),
        ``"margin_error"`` / ``"adaptive_margin_error"`` (:class:`MarginError`: the 0-1 error
        smoothed in the logit margin, read from ``module(batch[0])``; eq. marginerr),
        ``"class_relative_error"`` (:class:`ClassRelativeError`: the mean log of each class's
        error, labels ``batch[1]``; eq. classrel) — options, not better than the default on
        the noisy-label screen (docs/data_weights.md, session 43) — or any
        :class:`ValidationObjective` (its ``read`` says what it takes from a validation batch).
        q = 0.5 against the mean loss, test accuracy: +0.65 / +1.23 / +0.93 / +1.12 points on
        the noisy-label CNNs (MNIST / Fashion-MNIST × symmetric / pair-flip, 14 seeds), +0.96 on
        the 20 Newsgroups MLP (12 seeds), where q = 1 lost 2.0 (docs/data_weights.md).
    cross_term:
        ``"training"`` (the default without a budget): every training batch's rows also get
        their hypergradient, from the last hyper step's v by one extra forward
        (``_training_cross_term``, ``directional``); ``"hyper_step"``: only the hyper steps' own
        minibatches (Algorithm 1 as written), the default with a compute budget
        (``max_overhead=0.5``): the training batches' cross term is work at every step (0.45–0.48×
        the training on the noisy digits' MLP and CNN), which a budget cannot space, and
        under one it left the hyper steps 3 of 400 due (no separation); with ``"hyper_step"``
        the budget spaces the hyper steps (22–30 ran, the corrupted examples' mean weight 0.03 /
        0.19 against the clean ones' 0.66 / 0.53). ``"training"`` with a budget is refused.
    directional:
        How that cross term's uⱼ = ⟨∇ℓⱼ(w), v⟩ is computed (with ``cross_term="hyper_step"``
        there is none: giving it is refused): ``"forward_difference"`` /
        :class:`~hypertorch_sid.core.directional.ForwardDifference` (default; eq. fdcross:
        (ℓⱼ(w + hv) − ℓⱼ(w))/h from the losses the training step already computed and one
        no-grad forward, with the step's own dropout masks; falls back to ForwardMode, with a
        warning, for half-precision parameters or under autocast) or ``"forward_mode"`` /
        :class:`~hypertorch_sid.core.directional.ForwardMode` (one dual-number pass, exact;
        the default until this version). On the noisy-label CNNs and the 20 Newsgroups MLP the
        difference cut the drop-in's CPU from 1.91–1.98× plain to 1.65–1.81× at the same
        accuracy (within ±0.7 points, 5 seeds; docs/data_weights.md).
    row_scale:
        :class:`LazyAdam`'s ``row_scale`` (each row's own second moment, default; ``False``: one
        running scale shared by all rows; ``"batch"``: the RMS of the rows of each step, eq.
        batchscale). Ignored when ``outer_optimizer`` is given.
    outer_betas:
        :class:`LazyAdam`'s ``betas`` (default ``(0.0, 0.999)``). Ignored when
        ``outer_optimizer`` is given. Per sample a row is read about once an epoch, so a β₁ of
        0.9 would add gradients up to epochs old; β₁ = 0 moves each row by its own visit's
        gradient only: on the noisy-label CNNs +0.3 to +2.0 points of test accuracy over β₁ = 0.9
        (5 seeds, docs/data_weights.md) and on benchopt's data cleaning within 0.5 point of the
        perfect weights' test error (docs/benchopt_data_cleaning.md). The clean examples'
        logits then random-walk around their start, which :meth:`flagged`'s two-component
        split (not a fixed weight threshold) tells apart from the corrupted examples' drift.
    scale_prior:
        :class:`LazyAdam`'s ``scale_prior`` (k pseudo-visits of the population's second moment
        in each row's, eq. scaleprior; default 0: each row's own). Ignored when
        ``outer_optimizer`` is given.
    sparse_grad:
        Row-sparse gradients of the logits (``SampleWeights(sparse_grad=...)``: an outer step
        costs O(batch), not O(n)). Default ``None``: on per sample with the default
        :class:`LazyAdam` in a single-process fit, off otherwise (DDP averages dense gradients;
        a user's ``outer_optimizer`` may not take sparse ones). ``True`` needs an outer
        optimizer that moves only the rows given (``LazyAdam``, ``SGD`` without momentum).
    schedule:
        ``"fixed"`` (default): ``start_step=50``, ``every_n_steps=40`` whatever the fit's
        length. ``"fit_length"``: those of the two not given are scaled down to the fit's
        length T (``planned_steps``, read at the fit's start) in the
        proportions of the benchmark where 50 / 40 were chosen (T = 384):
        ``min(50, ⌈13 T / 100⌉)`` / ``min(40, ⌈5 T / 48⌉)`` (:meth:`fit_length_schedule`;
        T ≥ 383 or unknown keeps 50 / 40). The resolved schedule is logged at the fit's start.
    hold_early_stopping:
        ``True`` (default): where an ``EarlyStopping`` is among the trainer's callbacks, a stop
        it asks for before the weights could act — before the first hyper step plus two epochs
        of optimizer steps, capped by the fit's planned length — waits until that step
        (the fit's ``min_steps`` raised to it for the fit, the user's larger one kept and
        restored after; a ``Timer`` / ``max_time`` still stops the fit on time; one warning says
        when a stop was held). Plain training on noisy labels reaches its lowest validation
        loss before the first hyper step, so the stopper ended such fits before the weights
        moved and the checkpoint kept a plain fit's model (session 56, ``ckpt_cnn``: 19 of 60
        seeds; session 57, docs/data_weights.md). ``False``: the stop ends the fit when asked.
    no_signal:
        What the drop-in does where its per-sample weights move no more than a random walk of
        their own steps (eq. drift, :mod:`~.weight_signal`; such weights only shrink the
        effective sample): a :class:`~.no_signal.NoSignalPolicy`.
        :class:`~.no_signal.WarnAtEnd` (default): learn them to the fit's end and warn there
        (session 63). :class:`~.no_signal.ResetWeights` ``(after=0.5)``: read eq. drift once,
        after half the fit's planned hyper steps (at least 4), and where it reads no signal put
        every weight back at its start and learn them no further (the rest of the fit trains
        plainly; said once, with the numbers; rank 0's reading decides for every DDP rank;
        checkpointed). On session 63's recipes, seeds 0–5, it lowered the deployed test loss
        on 17 of the 18 fits whose weights separated nothing (a VAE's outliers by 0.19–1.06
        nats, GCE by 0.09–0.34, a char-CNN by 0.01–0.18) and acted on none of the 30 whose
        weights separated; but on session 64's unseen recipes it reset 5 of 6 fits whose
        weights did separate (a hinge loss, a trusted + untrusted 20 Newsgroups set: AUC
        0.7–0.8), giving back their gain (up to +0.31 test loss, one fit ending worse than
        plain), so it is not the default (docs/data_weights.md, session 64).
        :class:`~.no_signal.ShrinkWeights` ``(keep, after)`` moves each logit back a
        share ``1 − keep`` of the way instead. :meth:`settled` says where it acted.
    **kwargs:
        Settings of :class:`~hypertorch_sid.lightning.HyperOptimizationCallback`. The drop-in's
        defaults differ from the callback's: ``start_step=50`` with ``every_n_steps=40``
        (the first hyper step, from which the weights move, at optimizer step 80: the first
        80 optimizer steps train plainly), ``adjoint_steps=3``,
        ``val_batch_size``: at least :data:`MIN_VAL_BATCH` = 256 validation examples per hyper
        step (the validation loader's batch size where larger, the whole set where smaller;
        ``val_batch_size=`` sets it), ``batches=Batches(d2=1)`` (with
        ``cross_term="hyper_step"``: every 10 steps,
        ``Batches(d2=4)``, the hyper steps' minibatches being then the only place a weight gets
        its gradient), and the outer optimizer :class:`LazyAdam` at ``outer_lr=1.0``
        (each visit of an example moves its logit by about 1; ``0.02`` per class, whose rows
        every step reads).
    """

    hyperparameters_named = "the data weights"

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
        cross_term: Literal["training", "hyper_step"] | None = None,
        directional: str | DirectionalDerivative | None = None,
        row_scale: bool | Literal["batch"] = True,
        sparse_grad: bool | None = None,
        outer_betas: tuple[float, float] = (0.0, 0.999),
        scale_prior: float = 0.0,
        gauge: Literal["auto", "batch", "mean_logit", "class", "class_centred"] = "auto",
        schedule: Literal["fit_length", "fixed"] = "fixed",
        hold_early_stopping: bool = True,
        no_signal: NoSignalPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_settings_given_positionally(type(self), per)
        self.no_signal = as_no_signal(WarnAtEnd() if no_signal is None else no_signal)
        if kwargs.get("problem") is not None:
            raise ConfigurationError("LearnedDataWeights builds its own problem.")
        check_bool("LearnedDataWeights: hold_early_stopping", hold_early_stopping)
        if schedule not in ("fit_length", "fixed"):
            raise ConfigurationError(
                f"LearnedDataWeights: schedule must be 'fit_length' (start_step and "
                f"every_n_steps scaled down to the fit's length) or 'fixed' (50 / 40 whatever "
                f"the length), got {schedule!r}."
            )
        kwargs.pop("problem", None)  # None: a LightningCLI passes every parameter it knows
        # built once, here: a refusal in this class's name, a warning said once (session 62)
        overhead = kwargs.get("max_overhead")
        kwargs["max_overhead"] = budget = make_budget(overhead, "LearnedDataWeights: ")
        cross_term = _cross_term_for(cross_term, budget, overhead)
        check_bool("LearnedDataWeights: normalize", normalize)  # normalize="false" is truthy
        if sparse_grad is not None:
            check_bool("LearnedDataWeights: sparse_grad", sparse_grad)
        if sparse_grad and per == "class":
            raise ConfigurationError(
                "LearnedDataWeights: sparse_grad=True makes the per-sample logits' gradients "
                "row-sparse; per='class' every step reads (almost) every class's weight, so its "
                "gradient is dense and the setting would be ignored. Drop sparse_grad=."
            )
        if directional is not None and cross_term == "hyper_step":
            raise ConfigurationError(
                f"LearnedDataWeights: directional={directional!r} says how the training "
                "batches' cross term is computed, which cross_term='hyper_step' (given, or the "
                f"default under max_overhead={overhead!r}) does not run: it "
                "would be ignored. Drop directional=, or pass cross_term='training' (without a "
                "compute budget: max_overhead=None)."
            )
        self.directional: DirectionalDerivative = as_strategy(
            "LearnedDataWeights: directional",
            directional if directional is not None else "forward_difference",
            DirectionalDerivative,
            {"forward_mode": ForwardMode, "forward_difference": ForwardDifference},
            "ForwardDifference(relative_step=1e-3)",
        )
        self._said_unreplayable = False
        self._said_shortfall = False
        self._signal: WeightSignal = WeightSignal()  # eq. drift (weight_signal.py)
        self._signal_read: SignalReading | None = None
        self._signal_at = 0
        self._judge_k: int | None = None  # the interval after which no_signal judges
        self._judged = False  # no_signal judged in this fit
        self._settled: dict[str, float] | None = None  # where no_signal acted: step, R, ...
        self._no_signal_pending: dict[str, Any] | None = None  # a checkpoint's, to apply
        self._said_untrained = False  # validation classes no training label holds, said
        #: at which optimizer step each ModelCheckpoint's best checkpoint of this fit was saved
        self._saved_at: dict[tuple[int, str, float | None], int] = {}
        #: the schedule's settings the user left to the drop-in, with their caps: with
        #: schedule="fit_length" each is scaled to the fit's length at its start
        #: (:meth:`fit_length_schedule`); a value given is kept
        self.schedule = schedule
        caps = {"start_step": 50, "every_n_steps": 40 if cross_term == "training" else 10}
        self._schedule_caps = {
            name: cap
            for name, cap in caps.items()
            if schedule == "fit_length" and kwargs.get(name) is None
        }
        default_unless_given(kwargs, "every_n_steps", caps["every_n_steps"])
        # the first hyper step (from which the weights move) at step 80, the first multiple of
        # every_n_steps=40 from start_step=50: until then the fit trains plainly; a network
        # near its initialisation says little about which example to trust (a warm-up against
        # none: +2 to +4 points, less cost). 50 rather than 100, session 45's confirmation on
        # fresh seeds 16-30
        # (bench_noisy_labels, paired by seed): +0.68 / +0.43 points on MNIST / Fashion
        # symmetric, +0.32 / +1.17 on pair-flip, +1.24 on 20 Newsgroups, at 1.82-1.85x plain CPU
        # (the caps of schedule="fit_length", which scales them down in fits shorter than the
        # benchmark's 384 optimizer steps: :meth:`fit_length_schedule`)
        default_unless_given(kwargs, "start_step", caps["start_step"])
        default_unless_given(kwargs, "adjoint_steps", 3)
        # v steers the next 40 training batches' weights: read ≥ MIN_VAL_BATCH validation
        # examples for it, not the validation loader's batch (bench_noisy_labels: see the docs)
        self._val_floor = (
            MIN_VAL_BATCH
            if kwargs.get("val_batch_size") is None and kwargs.get("val", "batch") == "batch"
            else None
        )
        if not config_given(kwargs) and kwargs.get("batches") is None:
            kwargs["batches"] = Batches(d2=1 if cross_term == "training" else 4)
        # the curvature estimate is the callbacks' (the mean of its minibatches' Hessians).
        # EstimatedCurvature(minibatches="each") (the union of their spectra), against it,
        # paired by seed (session 44, docs/data_weights.md): bench_noisy_labels 40 % noise, test
        # accuracy MNIST / Fashion symmetric −0.04 ± 0.36 / −0.13 ± 0.22 points (10 / 15 seeds;
        # Fashion 11 of 15 lower), pair −0.21 ± 0.60 / +0.17 ± 0.53; the imbalanced example per
        # class −0.15 ± 0.13 (4 of 5 lower), per sample +0.23 ± 0.73; better only on a toy tiny
        # class (64 of 67 flagged rows corrupted, against 70 of 175). Not adopted.
        # per sample a row is read about once per epoch: each visit moves its logit by ~1; per
        # class every row is read at every step, so each step moves it by ~0.02
        given_lr = kwargs.get("outer_lr")
        default_unless_given(kwargs, "outer_lr", 1.0 if per == "sample" else 0.02)
        problem = DataWeightsProblem(
            per,
            num_classes,
            parameterization,
            initial,
            normalize,
            target,
            validation_loss,
            objective,
            gauge,
        )
        try:
            betas = tuple(outer_betas)
        except TypeError:  # one number: refused below, naming it (a raw TypeError before)
            betas = outer_betas
        own_settings = {
            name: value
            for name, value, default in (
                ("outer_betas", betas, (0.0, 0.999)),
                ("row_scale", row_scale, True),
                ("scale_prior", scale_prior, 0.0),
            )
            if value != default
        }
        if given_lr is not None:
            own_settings["outer_lr"] = given_lr
        if kwargs.get("outer_optimizer") is not None and own_settings:
            raise ConfigurationError(
                f"LearnedDataWeights: {', '.join(f'{k}={v!r}' for k, v in own_settings.items())} "
                f"{'sets' if len(own_settings) == 1 else 'set'} the drop-in's own outer optimizer "
                "(LazyAdam), but outer_optimizer= replaces it, so it would be ignored: give it "
                "to your optimizer (e.g. outer_optimizer=functools.partial(torch.optim.Adam, "
                "lr=0.1)), or drop outer_optimizer=."
            )
        self._own_outer = kwargs.get("outer_optimizer") is None
        outer_lr = kwargs.pop("outer_lr")  # the drop-in's own LazyAdam's (refused beside another)
        if self._own_outer:  # its settings refused now, not at the fit's first hyper step
            settings = {"lr": outer_lr, "betas": outer_betas, "row_scale": row_scale}
            try:
                LazyAdam([torch.zeros(1, requires_grad=True)], scale_prior=scale_prior, **settings)
            except (ConfigurationError, TypeError) as err:
                raise ConfigurationError(
                    f"LearnedDataWeights: its outer optimizer (outer_lr={outer_lr!r}, "
                    f"outer_betas={outer_betas!r}, row_scale={row_scale!r}, "
                    f"scale_prior={scale_prior!r}): {err}"
                ) from None
            kwargs["outer_optimizer"] = functools.partial(
                _lazy_adam,
                problem.parameterization,
                lr=outer_lr,
                betas=betas,
                row_scale=row_scale,
                scale_prior=scale_prior,
            )
        super().__init__(problem=problem, **kwargs)
        self.outer_lr = outer_lr  # the drop-in's LazyAdam's (a user's optimizer: its own)
        self.problem: DataWeightsProblem = problem
        problem.class_by_default = cross_term == "training"
        self.per = per
        self.cross_term = cross_term
        self.sparse_grad = sparse_grad
        self._trainer: pl.Trainer | None = None
        self._module: pl.LightningModule | None = None
        self._cross: TrainingCrossTerm | None = None
        self.hold_early_stopping = hold_early_stopping
        self._hold = EarlyStopHold()

    @staticmethod
    def fit_length_schedule(
        total: float, start_cap: int = 50, every_cap: int = 40
    ) -> tuple[int, int]:
        """``(start_step, every_n_steps)`` of ``schedule="fit_length"`` in a fit of ``total``
        optimizer steps (``planned_steps``): the benchmark's proportions
        (bench_noisy_labels, T = 384, where 50 / 40 were chosen) carried to any length: the
        first 13 % of the fit trains plainly (50 ≈ 0.13 · 384) and the fit gets ~9.6
        hyper-step intervals (384 / 40), each capped by its fixed default:

            start_step = min(50, ⌈13 T / 100⌉),  every_n_steps = min(40, ⌈5 T / 48⌉)

        (at least 1 each). T ≥ 384 keeps 50 / 40 exactly; 96 steps (gradient accumulation)
        give 13 / 10, the first hyper step at step 20 rather than 80. A length unknown or
        infinite (``max_steps=-1``, ``max_epochs=-1``) keeps the caps."""
        if not isinstance(total, (int, float)) or not math.isfinite(total) or total < 0:
            return start_cap, every_cap
        t = int(total)
        start = min(start_cap, max(1, -(-13 * t // 100)))
        every = min(every_cap, max(1, -(-5 * t // 48)))
        return start, every

    def _resolve_schedule(self, trainer: pl.Trainer) -> None:
        """Set this fit's ``start_step`` / ``every_n_steps`` (those the user did not give) from
        the fit's length, and say them. Every fit resolves anew from its whole length
        (the planned steps count from step 0, so a resumed fit gets the
        uninterrupted one's schedule)."""
        if not self._schedule_caps:
            return
        total = planned_steps(trainer)
        start, every = self.fit_length_schedule(
            total,
            self._schedule_caps.get("start_step", self.start_step),
            self._schedule_caps.get("every_n_steps", self.every_n_steps),
        )
        if "start_step" in self._schedule_caps:
            self.start_step = start
        if "every_n_steps" in self._schedule_caps:
            self.every_n_steps = every
        first = -(-max(self.start_step, 1) // self.every_n_steps) * self.every_n_steps
        length = (
            f"{int(total)} optimizer steps"
            if math.isfinite(total)
            else "a length unknown (max_steps=-1, max_epochs=-1)"
        )
        rank_zero_info(
            f"LearnedDataWeights: schedule='fit_length' for a fit of {length}: "
            f"start_step={self.start_step}, every_n_steps={self.every_n_steps}; the first hyper "
            f"step (from which the weights move) at optimizer step {first}."
        )

    def sparse_grad_for(self, world_size: int) -> bool:
        """Whether the per-sample logits get row-sparse gradients in a fit on ``world_size``
        processes: as given (``sparse_grad=``), else where that is safe and O(batch): per
        sample, with the drop-in's own outer optimizer (:class:`LazyAdam`, which moves only
        the rows given), in one process (a sparse tensor is not averaged across DDP ranks)."""
        if self.sparse_grad is not None:
            return bool(self.sparse_grad)
        return self.per == "sample" and self._own_outer and world_size == 1

    def hyper_steps_needed(self) -> int:
        """With ``cross_term="training"`` every training batch moves its rows' weights once a
        hyper step has given v, so only a fit without any hyper step learns nothing."""
        return 1 if self.cross_term == "training" else super().hyper_steps_needed()

    def _warn_if_few_hyper_steps(self, trainer: pl.Trainer) -> None:
        """Also say so where the first hyper step comes in the fit's second half with less than
        two epochs after it (:func:`~hypertorch_sid.lightning.metrics.late_first_hyper_step`);
        not in a resumed fit whose weights moved before its checkpoint."""
        super()._warn_if_few_hyper_steps(trainer)
        self._said_late = False
        if self._planned_short or self.cross_term != "training" or self.history:
            return
        epoch = trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)
        said = late_first_hyper_step(
            planned_steps(trainer), self.every_n_steps, self.start_step,
            trainer.global_step, epoch,
        )  # fmt: skip
        if said is not None:  # a fit stopped before that step is still told it learned nothing
            if self.schedule == "fixed":
                said += (
                    " Or LearnedDataWeights(schedule='fit_length'), which scales start_step / "
                    "every_n_steps to the fit's length (docs/data_weights.md)."
                )
            rank_zero_warn(f"LearnedDataWeights: {said}")
        self._said_late = said is not None

    def _warn_if_ended_before_learning(self, trainer: pl.Trainer) -> None:
        """Also where a fit planned long enough stopped early (``EarlyStopping``, ``max_time``)
        after its first hyper step but with less than two epochs of training under the weights:
        the fit's start judged the planned length, and ``flagged()`` of such a fit is near
        empty (a 20-row MNIST recipe with 40 % noise and ``EarlyStopping(patience=2)`` stopped
        at step 96 of 256, one hyper step in: AUC 0.52, nothing flagged, the plain fit's test
        loss to every digit). It names the ``EarlyStopping`` that stopped the fit and the
        ``Trainer(min_steps=...)`` that keeps it two epochs past the first hyper step (session
        56, ``ckpt_cnn``: 17 of 19 such fits rescued, none worse; docs/data_weights.md)."""
        super()._warn_if_ended_before_learning(trainer)
        stopped, planned = trainer.global_step, planned_steps(trainer)
        if (
            getattr(self, "_said_late", False)
            or self.cross_term != "training"
            or not self._ran_in_fit
            or self._fit_start > 0
            or not stopped < planned
        ):
            return
        epoch = trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)
        said = late_first_hyper_step(stopped, self.every_n_steps, self.start_step, 0, epoch)
        if said is not None:
            of = f" of the {int(planned)} planned" if math.isfinite(planned) else ""
            hold = hold_step(self.first_hyper_step(), epoch, math.inf)
            advice = (
                "If EarlyStopping stopped it (it judged the plain training before the first "
                "hyper step, which fits the noisy labels), keep the fit going two epochs past "
                f"that step: LearnedDataWeights(hold_early_stopping=True), the default, holds "
                f"its stop to step {hold}, as Trainer(min_steps={hold}) does"
                if not self.hold_early_stopping
                else f"An EarlyStopping's stop is held to step {hold}, two epochs past that "
                "step, but not a Timer's: give the fit the time (max_time) to reach it"
            )
            rank_zero_warn(
                f"LearnedDataWeights: the fit stopped at optimizer step {stopped}{of} "
                f"({_stopped_by(trainer)}), so the weights and flagged() say little: {said} "
                f"{advice} (sessions 56-57, docs/data_weights.md)."
            )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Also note at which optimizer step each ``ModelCheckpoint``'s best checkpoint was
        saved (Lightning sets its ``best_model_path`` before it saves), for
        :meth:`_warn_if_best_checkpoint_plain`."""
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        for keeper in trainer.checkpoint_callbacks:
            best = _best_checkpoint(keeper)
            if best is not None:
                self._saved_at.setdefault(best, trainer.global_step)

    def _warn_if_best_checkpoint_plain(self, trainer: pl.Trainer) -> None:
        """Say where a ``ModelCheckpoint``'s best checkpoint was saved at or before this fit's
        first hyper step: the model it holds trained under the weights' start, i.e. plainly,
        and a user who loads it (``ckpt_path="best"``, ``load_from_checkpoint``) deploys a
        plain fit's model whatever the weights learned after (``ckpt_cnn`` of
        ``bench_user_recipes_s50.py``, 6 of 30 seeds: EarlyStopping stopped at step 80–96, the
        best checkpoint from step 32–64, the plain fit's test loss to every digit; session
        56). Not in a resumed fit."""
        if self._fit_start > 0:
            return
        first = self.history[0]["global_step"] if self.history else math.inf
        for keeper in trainer.checkpoint_callbacks:
            step = self._saved_at.get(_best_checkpoint(keeper))  # type: ignore[arg-type]
            if step is not None and step <= first:
                when = (
                    f"at or before the first hyper step (step {int(first)})"
                    if math.isfinite(first)
                    else "and no hyper step ran"
                )
                rank_zero_warn(
                    f"LearnedDataWeights: the best checkpoint of {type(keeper).__name__}"
                    f"(monitor={getattr(keeper, 'monitor', None)!r}) was saved at optimizer "
                    f"step {step}, {when}: the model it holds trained under the weights' "
                    "start (a plain fit), so loading it (ckpt_path='best', "
                    "load_from_checkpoint) gives a plain fit's model whatever the weights "
                    "learned after. Let the fit run longer under the weights (a larger "
                    "Trainer(min_steps=...), EarlyStopping's patience) and keep a checkpoint "
                    "from after it."
                )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A weight belongs to one example of one data set: dataloaders reloaded
        (``reload_dataloaders_every_n_epochs``) over a training set of another size are refused
        here, naming the cause (they failed at the next hyper step with an index error)."""
        problem = self.problem
        if self.data is not None and problem.per == "sample" and problem.weights is not None:
            dataset = problem._training_dataset(trainer)
            n = len(dataset)
            if n != problem.weights.n or problem.reads_other_examples(dataset):
                what = (
                    f"a training set of {n} examples"
                    if n != problem.weights.n
                    else "other examples (another split or data set)"
                )
                cause = (
                    "the train dataloader was reloaded (reload_dataloaders_every_n_epochs) over"
                    if trainer.reload_dataloaders_every_n_epochs
                    else "the training set changed in place during the fit (no loader was "
                    "reloaded: a data set that grows or shrinks itself?) and now holds"
                )  # blamed on a reload nobody asked for before (session 55)
                raise ConfigurationError(
                    f"LearnedDataWeights: {cause} {what}; "
                    f"the weights belong to the {problem.weights.n} examples this fit started "
                    "with. Keep one training set for the fit (reload loaders over the same data "
                    "set), or learn its weights in a new fit (a new LearnedDataWeights)."
                )
        super().on_train_epoch_start(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Mark ``batch`` as the loop's: its ``training_step`` records its rows and, with
        ``cross_term="training"``, moves their weights; nobody else's call does."""
        self.problem.loop_batch = batch

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build (see the base class); with ``cross_term="training"`` every training batch also
        moves its own rows' weights."""
        self._resolve_schedule(trainer)
        self.problem.sparse_grad = self.sparse_grad_for(trainer.world_size)
        self.problem.validation_examples = self._validation_size(trainer)
        self._said_shortfall = self._said_untrained = False
        self._judged_rarity = False  # the imbalance hint: once per fit, when first known
        self._signal, self._signal_read = WeightSignal(), None  # eq. drift, per fit
        self._signal_at = trainer.global_step  # the optimizer step of its last reading
        self._judged, self._settled = False, None
        self._saved_at = {}  # (ModelCheckpoint, best path, score) -> step saved, this fit
        if self._val_floor is not None:
            self.val_batch_size = self._default_val_batch(trainer, self._val_floor)
        super().on_train_start(trainer, pl_module)
        self._trainer, self._module = trainer, pl_module
        intervals = planned_intervals(planned_steps(trainer), self.start_step, self.every_n_steps)
        self._judge_k = self.no_signal.judged_at(intervals)
        self._resume_no_signal()
        if self.cross_term == "training":
            self.problem.on_training_batch = self._training_cross_term
            self.problem.prefetch = self._cross_term_reads
        self._hold.step = self._hold.held_at = None
        if self.hold_early_stopping:
            self._engage_hold(trainer)

    def first_hyper_step(self, global_step: int = 0) -> int:
        """The optimizer step of this fit's first hyper step (from which the weights move):
        the first multiple of ``every_n_steps`` from ``start_step`` after ``global_step`` (a
        resumed fit's), or the one recorded where one ran before the checkpoint."""
        if self.history:
            return int(self.history[0]["global_step"])
        n = self.every_n_steps
        return -(-max(self.start_step, global_step + 1, 1) // n) * n

    def _engage_hold(self, trainer: pl.Trainer) -> None:
        """Hold an ``EarlyStopping`` stop until the first hyper step plus two epochs
        (:mod:`~.early_stop_hold`); an epoch of unknown length holds nothing."""
        epoch = trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)
        if math.isfinite(epoch):
            first = self.first_hyper_step(trainer.global_step)
            self._hold.engage(trainer, hold_step(first, epoch, planned_steps(trainer)))

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Also keep a held ``EarlyStopping`` stop held (:meth:`_check_hold`)."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._check_hold(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Note the step: an ``EarlyStopping`` decides here."""
        self._hold.mark(trainer.global_step)

    def _check_hold(self, trainer: pl.Trainer) -> None:
        """Release the hold once a ``Timer``'s time is up; say once which step a stop was
        held to, why, and how to switch it off."""
        if not self._hold.check(trainer):
            return
        first = self.first_hyper_step()
        rank_zero_warn(
            f"LearnedDataWeights: {_stopped_by(trainer)} asked to stop the fit at optimizer "
            f"step {self._hold.held_at}, before the data weights could act (they move from the "
            f"first hyper step, at step {first}); the fit goes on to step {self._hold.step} "
            "(two epochs past it, or the fit's end: Trainer min_steps raised for this fit, "
            "yours restored after), so the model trains under the weights. "
            "LearnedDataWeights(hold_early_stopping=False) stops when asked "
            "(session 57, docs/data_weights.md)."
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Say once per fit, as soon as the hyper steps have read the validation data, where it
        holds too few examples of a class for the per-sample weights to carry evidence
        (:meth:`DataWeightsProblem.validation_shortfall`; :meth:`flagged` then flags nothing),
        and where the training read masked examples (:meth:`DataWeightsProblem.masked_rows`).
        Judge once, at the first epoch's end that knows both sides' class shares, whether some
        class is far rarer in the training draws than in the validation data
        (:func:`~.imbalance.imbalance_advice`, eq. rarity): a hint, the learning unchanged."""
        masked = self.problem.masked_rows(functools.partial(_training_rows, trainer))
        if masked is not None:
            rank_zero_warn(f"LearnedDataWeights: {masked}")
        self._hold.mark(trainer.global_step)
        self._check_hold(trainer)
        if not self._said_shortfall:
            said = self.problem.validation_shortfall()
            if said is not None:
                self._said_shortfall = True
                rank_zero_warn(f"LearnedDataWeights: {said}")
        if not self._said_untrained:
            said = self.problem.validation_classes_untrained()
            if said is not None:
                self._said_untrained = True
                rank_zero_warn(f"LearnedDataWeights: {said}")
        rarity = None if self._judged_rarity else self.class_imbalance()
        if rarity is not None:
            self._judged_rarity = True
            said = imbalance_advice(rarity)
            if said is not None:
                rank_zero_warn(f"LearnedDataWeights: {said}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Also say, at the fit's end, where the weights pushed whole classes away from the
        validation's class shares (:meth:`DataWeightsProblem.class_shift`), and where
        ``gauge="class"`` held nothing because no label was read. The fit's ``min_steps``
        is the user's again."""
        self._hold.release()
        super().on_train_end(trainer, pl_module)
        self._warn_if_best_checkpoint_plain(trainer)
        problem = self.problem
        if problem.weights is None or problem.per != "sample":
            return
        said = problem.class_shift()
        if said is not None:
            rank_zero_warn(f"LearnedDataWeights: {said}")
        self._say_no_signal()
        if problem.gauge in CLASS_GAUGES and problem._labels is None:
            rank_zero_warn(
                f"LearnedDataWeights(gauge={problem.gauge!r}) held nothing: no training "
                "batch's integer labels were read (a collate_fn of yours, dict samples, soft "
                "labels). Pass target=lambda batch: <its integer labels>."
            )

    def _hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Before each hyper step (a new v): add the rows' steps since the last one, all taken
        under one v, to eq. drift's sums (:class:`~.weight_signal.WeightSignal`), and let
        ``no_signal`` judge them (:meth:`_judge_signal`): where it settles the weights, this
        hyper step and every later one is skipped."""
        self._watch_signal()
        if self._judge_signal(trainer):
            return
        super()._hyper_step(trainer, pl_module)

    def _due(self, trainer: pl.Trainer) -> bool:
        """No hyper step is due once ``no_signal`` settled the weights."""
        return self._settled is None and super()._due(trainer)

    def _judge_signal(self, trainer: pl.Trainer) -> bool:
        """Once per fit, after the interval ``no_signal`` names: read eq. drift and, where it
        reads no signal, let the policy act on the weights (rank 0's reading decides on every
        rank), said once. True where the weights are settled now."""
        k, weights = self._judge_k, self.problem.weights
        if self._judged or k is None or weights is None or self._signal.steps < k:
            return False
        self._judged = True
        reading = self._signal.reading()
        if trainer.world_size > 1:  # the ranks' logits agree; rank 0's decides for all
            reading = trainer.strategy.broadcast(reading, src=0)
        if reading is None or reading.separates:
            return False
        done = self.no_signal.settle(weights)
        self._signal_read = reading
        self._settled = {"step": trainer.global_step, **dataclasses.asdict(reading)}
        rank_zero_warn(f"LearnedDataWeights: {settled_advice(reading, trainer.global_step, done)}")
        return True

    def settled(self) -> dict[str, float] | None:
        """Where ``no_signal`` acted on the weights in the last fit: the optimizer ``step`` and
        eq. drift's reading then (``drift``, ``median``, ``steps``, ``rows``); None where it did
        not (they separated, were not judged, or the policy is :class:`~.no_signal.WarnAtEnd`)."""
        return None if self._settled is None else dict(self._settled)

    def _resume_no_signal(self) -> None:
        """A checkpoint's eq. drift sums and ``no_signal``'s decision, applied at the resumed
        fit's start (read by :meth:`load_state_dict`)."""
        state, self._no_signal_pending = self._no_signal_pending, None
        if state is None:
            return
        self._signal.load_state_dict(state["signal"])
        self._signal_at = int(state["signal_at"])
        self._judged, self._settled = bool(state["judged"]), state["settled"]
        if self._settled is not None:
            self._signal_read = SignalReading(
                **{f: self._settled[f] for f in ("drift", "median", "steps", "rows")}
            )

    def _watch_signal(self) -> None:
        weights, trainer = self.problem.weights, self._trainer
        if weights is None or self.problem.per != "sample" or trainer is None:
            return
        epoch = trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)
        since, self._signal_at = trainer.global_step - self._signal_at, trainer.global_step
        self._signal.observe(weights.logits, since / epoch if epoch > 0 else math.nan)

    def _say_no_signal(self) -> None:
        """At the fit's end: read eq. drift (:meth:`weight_signal`) and say where the weights
        moved no more than a random walk of their own steps."""
        if self._settled is not None:
            return  # said when it acted; the reading kept is the one it acted on
        if self.history:
            self._watch_signal()  # the steps under the last hyper step's v
        self._signal_read = self._signal.reading()
        said = None if self._signal_read is None else self._signal_read.advice()
        if said is not None:
            rank_zero_warn(f"LearnedDataWeights: {said}")

    def weight_signal(self) -> SignalReading | None:
        """Whether the last fit's per-sample weights carried more signal than a random walk
        (eq. drift, session 63): ``.drift`` R and ``.median`` (the median over rows of each
        row's own ratio), both about 1 for a random walk; ``.separates``; ``.advice()`` (the
        warning said at the fit's end and by :meth:`flagged`, None where they separate). None
        before a fit's end, per class, or where the fit had fewer than
        :data:`~.weight_signal.MIN_STEPS` hyper steps or had them more than
        :data:`~.weight_signal.MAX_EPOCHS_PER_STEP` epochs apart (nothing judged). Where
        ``no_signal`` acted during the fit (:meth:`settled`), the reading it acted on."""
        return self._signal_read

    @staticmethod
    def _validation_size(trainer: pl.Trainer) -> int | None:
        """The validation set's number of examples (all processes), None where it has no
        length to read (no loader, a stream)."""
        loader = validation_loader(trainer)
        if isinstance(loader, (list, tuple)) and loader:
            loader = loader[0]  # the one the hyper steps read
        if not isinstance(loader, DataLoader) or not draws_by_index(loader):
            return None
        return len(loader.dataset)

    @staticmethod
    def _default_val_batch(trainer: pl.Trainer, floor: int) -> int | None:
        """The hyper steps' validation minibatch per process: the loader's batch size, raised to
        ``floor`` examples over all processes, capped at the validation set (None: the loader's,
        where it has no length or no batch size to read, e.g. a stream)."""
        loader = validation_loader(trainer)
        if loader is None:
            return None  # the base callback says what is missing
        loader = first_loader(loader, "validation dataloader", "LearnedDataWeights")
        if not draws_by_index(loader):
            return None
        dataset, _, batch_size = loader_parts(loader, "validation dataloader", "LearnedDataWeights")
        world = trainer.world_size
        wanted = max(batch_size or 1, -(-floor // world))
        return max(1, min(wanted, len(dataset) // world))

    def _training_cross_term(
        self, index: Tensor, data: Any, losses: Tensor, rng: RandomState | None = None
    ) -> None:
        """Eq. gradestim's cross term on the training batch ζ with the last hyper step's v, and
        the outer step on ζ's rows: the core
        :class:`~hypertorch_sid.core.directional.TrainingCrossTerm`, with
        uⱼ = ⟨∇ℓⱼ(w), v⟩ by ``directional`` (:func:`directional_losses`; the training step's
        ``losses`` are ℓ(w) and its ``rng`` its dropout masks). Every example is
        then visited once per epoch at the cost of about one more forward/backward per step,
        instead of only in the hyper steps' own J minibatches. Hyper work: a budget beside it
        in the fit (``LearnedWeightDecay(max_overhead=…)``) does not count it as training.

        It runs the user's ``training_step`` again on the training batch, outside a hyper step:
        the module's torchmetrics states are kept as the training made them (a
        ``self.train_acc(logits, y)`` there counted every training batch twice from the first
        hyper step on: 6064 samples in an epoch of 3000, session 48)."""
        if self._module is None or self._settled is not None:
            return
        with self.budget.added_work(every_step=True), metric_states_kept(self._module):
            self._move_training_rows(index, data, losses, rng)

    def _cross_term_reads(self) -> tuple[Tensor, Callable[[list[float]], None]] | None:
        """What this step's cross term will read of the device (the forward difference's ‖w‖,
        and ‖v‖ after a hyper step), for the training step to read with its own checks
        (:attr:`DataWeightsProblem.prefetch`); None where the cross term will not run or
        reads nothing."""
        sid, active = self.sid, self._active
        if sid is None or sid.v is None or sid.alpha is None or active is None:
            return None
        if self._settled is not None:
            return None
        if sid.phi.scale is not None or self._module is None or self.problem.weights is None:
            return None
        if not isinstance(self.directional, ForwardDifference):
            return None
        return self.directional.prefetch(active.inner_parameters, sid.v)

    def _move_training_rows(
        self, index: Tensor, data: Any, losses: Tensor, rng: RandomState | None
    ) -> None:
        """:meth:`_training_cross_term`'s work."""
        sid, weights, problem = self.sid, self.problem.weights, self.problem
        if sid is None or sid.v is None or sid.alpha is None or weights is None:
            return
        if sid.phi.scale is not None or self._module is None or self._active is None:
            return  # v in preconditioned coordinates: only the hyper steps' own cross term
        cross = self._cross
        if (
            cross is None
            or cross.optimizer is not sid.outer_optimizer
            or cross.weights is not weights
        ):
            self._cross = TrainingCrossTerm(weights, sid.outer_optimizer, problem.normalize)
        inner = self._active.inner_parameters
        try:
            u = directional_losses(
                self._module,
                problem._original,
                data,
                inner,
                sid.v,
                self._directional_for(rng),
                at=losses,
                rng=rng,
            )
        except KeyError:  # a trained tensor no longer the module's: a layer replaced (s63)
            check_still_trained(type(self).__name__, inner, self._module, self._named_at_start)
            raise
        g, *shared = self._cross.gradients(index, u, float(sid.alpha), losses)
        # a user's optimizer may take no sparse gradient (Adam, ReachRprop crashed: s58)
        g = g.coalesce() if self._own_outer or problem.sparse_grad else g.to_dense()
        if self._world_size > 1 and self._trainer is not None:  # every rank moves every row
            strategy = self._trainer.strategy
            if g.is_sparse:
                g = _every_ranks_rows(strategy.all_gather, g, weights.n)
            else:  # dense (sparse_grad off): zero off each rank's rows, so their sum
                g = strategy.reduce(g, reduce_op="sum")
            shared = [strategy.reduce(t, reduce_op="mean") for t in shared]
        self._cross.apply([g, *shared])

    def _directional_for(self, rng: RandomState | None) -> DirectionalDerivative:
        """``directional``, or dual numbers where the training step's randomness cannot be
        replayed (an accelerator whose RNG torch cannot read back): a difference of two
        forwards with different dropout masks would be noise, not ⟨∇ℓᵢ, v⟩ (said once)."""
        if rng is None or rng.replayable:
            return self.directional
        if not self._said_unreplayable:
            self._said_unreplayable = True
            rank_zero_warn(
                f"LearnedDataWeights: torch cannot read back the random state of "
                f"{rng.device.type!r}, so the cross term's extra forward could not reuse the "
                "training step's dropout masks; it uses ForwardMode (dual numbers) instead. "
                'Pass LearnedDataWeights(directional="forward_mode") to silence this.'
            )
        return ForwardMode()

    def state_dict(self) -> dict[str, Any]:
        """The callback's state and, per sample, each example's label at its first visit (a
        resumed fit on relabelled or reordered data is refused as a continued one is)."""
        state = super().state_dict()
        labels = self.problem._labels
        if state and labels is not None:
            state["data_labels"] = labels.detach().cpu().clone()
        for key, rows in _ROW_RECORDS.items():  # the evidence flagged() reads (session 52)
            kept = getattr(self.problem, rows)
            if state and kept is not None:
                state[key] = kept.detach().cpu().clone()
        if state:  # whether the loss masks rows: a resumed fit goes on with it (s63)
            state["data_batch_masks"] = self.problem.masks.state_dict()
        examples = self.problem._examples
        digest = _examples_digest(examples) if examples is not None else None
        if state and digest is not None:
            state["data_examples"] = digest
        if state and self.problem.per == "sample":  # eq. drift and no_signal's decision (s64)
            state["data_no_signal"] = {
                "signal": self._signal.state_dict(),
                "signal_at": self._signal_at,
                "judged": self._judged,
                "settled": self._settled,
            }
        if state:
            state[MEANING_KEY] = self._meaning()
        return state

    def _meaning(self) -> dict[str, str]:
        """What the stored logits mean: one per example or class (of how many: another
        ``num_classes`` was refused as "truncated or another model", session 53), through which
        map."""
        meaning = {
            "per": self.per,
            "parameterization": type(self.problem.parameterization).__name__,
        }
        if self.per == "class":
            meaning["num_classes"] = str(self.problem.num_classes)
        return meaning

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and MEANING_KEY in state_dict:
            state_dict = dict(state_dict)
            check_meaning("LearnedDataWeights", state_dict.pop(MEANING_KEY), self._meaning())
        if isinstance(state_dict, dict) and "data_labels" in state_dict:
            state_dict = dict(state_dict)
            labels = state_dict.pop("data_labels")
            if not (
                isinstance(labels, Tensor) and labels.dim() == 1 and labels.dtype == torch.long
            ):
                raise ConfigurationError(
                    "LearnedDataWeights: the checkpoint's data_labels must be a 1-D int64 "
                    "tensor: it is corrupted."
                )
            self.problem.checkpointed_labels = labels
        for key in _ROW_RECORDS:
            if isinstance(state_dict, dict) and key in state_dict:
                state_dict = dict(state_dict)
                rows = state_dict.pop(key)
                if not (isinstance(rows, Tensor) and rows.dim() == 1 and rows.is_floating_point()):
                    raise ConfigurationError(
                        f"LearnedDataWeights: the checkpoint's {key} must be a 1-D float "
                        "tensor: it is corrupted."
                    )
                self.problem.checkpointed_rows[key] = rows
        if isinstance(state_dict, dict) and "data_batch_masks" in state_dict:
            state_dict = dict(state_dict)
            masks = MaskDetection.from_state(state_dict.pop("data_batch_masks"))
            self.problem.checkpointed_masks = masks
        if isinstance(state_dict, dict) and "data_no_signal" in state_dict:
            state_dict = dict(state_dict)
            kept = state_dict.pop("data_no_signal")
            if not (isinstance(kept, dict) and {"signal", "judged", "settled"} <= set(kept)):
                raise ConfigurationError(
                    "LearnedDataWeights: the checkpoint's data_no_signal must be a dict of "
                    "'signal', 'signal_at', 'judged' and 'settled': it is corrupted."
                )
            self._no_signal_pending = kept
        if isinstance(state_dict, dict) and "data_examples" in state_dict:
            state_dict = dict(state_dict)
            self.problem.checkpointed_examples = str(state_dict.pop("data_examples"))
        super().load_state_dict(state_dict)

    def setup(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule | None = None, stage: str = ""
    ) -> None:
        """Before the build, ``training_step`` takes Indexed batches too
        (:meth:`DataWeightsProblem.stand_in`: Lightning's tuner trials run in between). The
        defaults: ``callbacks=[LearnedDataWeights]`` (:func:`~.callback.refuse_a_class`)."""
        refuse_a_class(self)
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self.problem.stand_in(pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module its own ``training_step`` back (and the fit its ``min_steps``)."""
        super().teardown(trainer, pl_module, stage)
        if stage == "fit":
            self._hold.release()
            self.problem.unwrap()
            self.problem.on_training_batch = self.problem.prefetch = None
            self.problem.loop_batch = None

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``trainer.test`` over an ``IndexedDataset``: said (:func:`_warn_indexed_validation`)."""
        super().on_test_start(trainer, pl_module)
        if is_overridden("test_step", pl_module):
            _warn_indexed_validation(trainer.test_dataloaders, "test")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``trainer.predict`` over an ``IndexedDataset`` (e.g. the training loader, to set the
        network's own suspects beside :meth:`flagged`): said, before ``predict_step`` reads
        the index as its input (:func:`_warn_indexed_validation`)."""
        super().on_predict_start(trainer, pl_module)
        if is_overridden("predict_step", pl_module):
            _warn_indexed_validation(trainer.predict_dataloaders, "predict")

    def on_exception(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        exception: BaseException | None = None,
    ) -> None:
        if isinstance(self, LearnedDataWeights):  # not the class given for a callback
            super().on_exception(trainer, pl_module, exception)
            self.problem.unwrap()
            self._hold.release()

    @property
    def weights(self) -> SampleWeights | None:
        """The core :class:`SampleWeights` (None before the first fit built it per sample)."""
        return self.problem.weights

    def data_weights(self) -> Tensor:
        """ω of every example (or class), detached, on the CPU; empty before a fit built them.

        Row i is the weight of ``IndexedDataset(train_set)[i]``: a position in the data set the
        IndexedDataset wraps. Where that is a ``Subset`` (``random_split``), the example's index
        in the full data set is ``train_set.indices[i]`` (so for :meth:`flagged` too)."""
        self._refuse_unapplied_checkpoint("data_weights")
        w = self.problem.weights
        if w is None:
            self._say_unbuilt("data_weights", "an empty tensor")
        return w.values().cpu() if w is not None else torch.empty(0)

    def class_imbalance(self) -> ClassRarity | None:
        """Each class's share of the training draws s⁰_c and of the validation rows the hyper
        steps read π_c, and r_c = π_c / s⁰_c (``.factor``, eq. rarity: how many times rarer
        the class is in training), as the fit's record holds them now; None where they are
        unknown (no integer labels read, per-class weights, no hyper step yet). Where some
        class's r_c is ≥ 3 also at the lower end of π_c's interval (:meth:`ClassRarity.rare`)
        the fit said so once, with what was measured (docs/data_weights.md, session 55)."""
        return class_rarity(self.problem)

    def flagged(self, rule: FlagRule | str | float | None = None) -> Tensor:
        """Indices of the examples (classes) the validation data says not to trust, by
        ``rule`` (see :meth:`SampleWeights.flagged`: a number t flags ω < t). Default: per
        sample the :class:`~hypertorch_sid.core.flag_rules.TwoComponentSplit` of the
        learned logits (the corrupted examples' bump, apart from the clean examples' spread);
        per class (a handful of rows, no mixture to fit) ω below half its start. On the CPU,
        wherever the training ran. ``"split_misfit"``: of the split's rows, with integer class
        labels, those the network predicted as another class at their last visit
        (:meth:`DataWeightsProblem.misfits`, eq. scalemisfit; an option: far more precise on
        small networks, where the split's low bump holds clean hard examples too, but on the
        noisy-label CNN benchmark it lost 0.076 of recall on MNIST pair-flip noise). Per sample
        without class labels (a regression, multi-label or sequence targets) the default is
        the split's rows whose last-visit training loss is above τ, the 90 % quantile of the
        clean validation losses (eq. scalemisfit; the split's rows where none was read): the
        split flagged 40-46 % of a regression's rows whatever share was corrupted (session 62).

        The default flags nothing, with a warning saying why, where its flags are no evidence of
        wrong labels (:meth:`DataWeightsProblem.flag_evidence`): the validation data holds fewer
        than :data:`~hypertorch_sid.lightning.evidence.MIN_VAL_PER_CLASS` examples of a class, the
        flagged rows are fitted no worse than the rest, or (class labels) at most half of them were
        predicted as another class. A ``rule`` asked for returns its rows, with the same warning.
        Where these checks pass but the network predicted another class for nearly as large a share
        of the kept rows (:meth:`DataWeightsProblem.flag_contrast`: the shares differ by less than
        ½, e.g. a network that fits the data poorly), the rows are returned with a warning saying
        the flags may be mostly hard clean examples; without class labels the default's rows
        are judged by the share of them the excess of training rows above τ accounts for (eq.
        scaleprecision, below ½ warned). Before any fit it returns no row, with a warning (an
        empty result reads as "no suspect")."""
        self._refuse_unapplied_checkpoint("flagged")
        w = self.problem.weights
        if w is None:  # no suspects: "nothing flagged" silently (session 55)
            self._say_unbuilt("flagged", "no row to flag")
            return torch.empty(0, dtype=torch.long)
        if not self.history:  # no hyper step in the state held: every weight at its start
            rank_zero_warn(
                "LearnedDataWeights.flagged: the state this callback holds has run no hyper "
                "step, so every weight is at its start and there is nothing to flag: its fit "
                "stopped before the first hyper step, or a checkpoint written before it was "
                "loaded since (trainer.test / validate / predict(..., ckpt_path=...) give the "
                "callbacks the checkpoint's state too, e.g. ckpt_path='best' of an early "
                "epoch). Read flagged() before loading such a checkpoint, or load one written "
                "after the hyper steps began."
            )
            return torch.empty(0, dtype=torch.long)
        if self._settled is not None:
            rank_zero_warn(
                f"LearnedDataWeights.flagged: the weights read no signal and were settled at "
                f"optimizer step {int(self._settled['step'])} (no_signal={self.no_signal!r}): "
                "they are no evidence of bad examples, so nothing is flagged."
            )
            return torch.empty(0, dtype=torch.long)
        default, misfit = rule is None, isinstance(rule, str) and rule == SPLIT_MISFIT
        if isinstance(rule, str) and not misfit and rule not in FLAG_RULES:  # a name mistyped
            names = ", ".join(repr(n) for n in (*FLAG_RULES, SPLIT_MISFIT))
            raise ConfigurationError(
                f"LearnedDataWeights.flagged: the rule must be {names}, a number t (flags the "
                f"weights below t) or a FlagRule (e.g. TwoComponentSplit()), got {rule!r}."
            )
        if default:
            rule = TwoComponentSplit() if self.per == "sample" else BelowWeight()
        misfit = misfit or (default and self.problem.misfits_by_default())
        flags = w.flagged(TwoComponentSplit() if misfit else rule).cpu()
        said = self.problem.flag_evidence(flags)
        walk = self.weight_signal()
        if walk is not None and walk.advice() is not None:
            rank_zero_warn(f"LearnedDataWeights.flagged: {walk.advice()}")
        if said is not None and default:
            rank_zero_warn(
                f"LearnedDataWeights.flagged: {said} Flagged nothing; flagged(rule) returns a "
                "rule's rows anyway."
            )
            return flags[:0]
        if said is not None:
            rank_zero_warn(f"LearnedDataWeights.flagged: {said}")
        elif (doubt := self.problem.flag_contrast(flags, misfit)) is not None:
            rank_zero_warn(f"LearnedDataWeights.flagged: {doubt} Returned anyway.")
        return self.problem.misfits(flags) if misfit else flags
