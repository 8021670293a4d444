"""Per-sample (and per-class) data weights: a hyperparameter family indexed by example id.

The inner loss of data reweighting is the weighted empirical risk

    ℓ̂(w, x; ζ) = (1/|ζ|) Σ_{i∈ζ} ωᵢ(x) ℓᵢ(w)                                  (eq. weighted)

with one learned logit xᵢ per training example (or per class, indexed by the label) and the
weight ωᵢ = T(x)ᵢ given by a :class:`WeightParameterization`:

* :class:`SigmoidWeights` — ωᵢ = σ(xᵢ) ∈ (0, 1), the literature's choice (the benchopt
  data-cleaning problem, Franceschi et al. 2017);
* :class:`SoftmaxWeights` — ωᵢ = n·exp(xᵢ)/Σⱼ exp(xⱼ), normalised over the data set (mean 1).

A minibatch reads only its own rows of x, so the cross term of eq. gradestim,

    ∂₂Φ̂(w, x; ζ)ᵀv = −α ∂ₓ⟨∇₁ℓ̂(w, x; ζ), v⟩,   row i: −(α/|ζ|) T'(xᵢ) ⟨∇ℓᵢ(w), v⟩ for i ∈ ζ,

is zero outside ζ: the rows are gathered (``torch.gather``; with ``sparse_grad=True`` its
backward is a sparse COO tensor of the rows read, else an ``index_add`` into the full tensor) and
:class:`LazyAdam` moves only the rows whose hypergradient is non-zero. With ``sparse_grad=True``
the whole hyper step (cross term, checks, outer step) costs the same for any n, the statistics
of all n rows that softmax weights and the mean-logit gauge read included: they are kept from
the rows that moved (:class:`Normaliser`, eq. keptsum).
:class:`IndexedDataset` adds the index to each sample so that a batch says which rows it reads.

Usage with a plain :class:`~hypertorch_sid.SIDHyperOptimizer`::

    train = IndexedDataset(train_set)                 # each sample: Indexed(index, data)
    weights = SampleWeights(len(train), sparse_grad=True)   # x = 0: ω = σ(0) = ½ everywhere
    def inner_loss(batch):
        index, (X, y) = batch
        losses = F.cross_entropy(model(X), y, reduction="none")
        return weights.weighted_mean(losses, index)
    hopt = SIDHyperOptimizer(
        weights.hyperparameters, model.parameters(), inner_loss, outer_loss,
        LazyAdam(weights.hyperparameters, lr=0.1),
        config=SIDConfig(feasible_set=FeasibleSet(project=weights.projection)),
    )

Per class (imbalance): ``SampleWeights(num_classes)`` indexed by the labels
(``weights.weighted_mean(losses, y)``) — :func:`class_weights` says so by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from .directional import (
    DirectionalDerivative,
    ForwardDifference,
    ForwardMode,
    TrainingCrossTerm,
    directional_losses,
)
from .errors import ConfigurationError
from .flag_rules import FLAG_RULES, BelowWeight, FlagRule, TwoComponentSplit, as_flag_rule
from .indexing import (
    LABEL_KEYS,
    Indexed,
    IndexedDataset,
    LabelledIndexed,
    indexed_collate,
    sample_label,
    split_indexed,
)
from .lazy_adam import LazyAdam
from .normalisers import (
    CLASS_GAUGES,
    ClassMeanLogitGauge,
    LogitMean,
    MeanLogitGauge,
    Normaliser,
    SoftmaxNormaliser,
)
from .objectives import (
    OBJECTIVES,
    AdaptiveMarginError,
    ClassRelativeError,
    ExpectedError,
    KeptEvidenceError,
    LabelledLosses,
    MarginError,
    MeanLoss,
    ValidationObjective,
    as_validation_objective,
)
from .parameterizations import (
    PARAMETERIZATIONS,
    NaturalSigmoidWeights,
    SharedLossWeights,
    SigmoidWeights,
    SoftmaxWeights,
    WeightParameterization,
    as_weight_parameterization,
    biased_hinge_basis,
    hinge_basis,
)
from .rows import ROW_SPARSE, mark_row_sparse
from .validation import check_bool, check_integer
from .weighted_loss import (
    RowMasks,
    ZeroLossMasks,
    check_index_shape,
    check_per_sample,
    class_centred,
    weighted_loss,
)

Tensors = list[Tensor]
#: how the self-normalised loss's scale is fixed (:class:`SampleWeights`' ``gauge``)
Gauge = Literal["batch", "mean_logit", "class", "class_centred"]

#: the public names of this module before its split (session 52): each is importable from here
#: as before; its home is the module named in the import above.
__all__ = [
    "AdaptiveMarginError",
    "as_flag_rule",
    "as_validation_objective",
    "as_weight_parameterization",
    "BelowWeight",
    "biased_hinge_basis",
    "check_per_sample",
    "class_centred",
    "class_weights",
    "ClassMeanLogitGauge",
    "ClassRelativeError",
    "directional_losses",
    "DirectionalDerivative",
    "ExpectedError",
    "FLAG_RULES",
    "FlagRule",
    "ForwardDifference",
    "ForwardMode",
    "Gauge",
    "hinge_basis",
    "Indexed",
    "indexed_collate",
    "IndexedDataset",
    "KeptEvidenceError",
    "LABEL_KEYS",
    "LabelledIndexed",
    "LabelledLosses",
    "LazyAdam",
    "LogitMean",
    "MarginError",
    "MeanLogitGauge",
    "MeanLoss",
    "NaturalSigmoidWeights",
    "Normaliser",
    "OBJECTIVES",
    "PARAMETERIZATIONS",
    "RowMasks",
    "sample_label",
    "SampleWeights",
    "SharedLossWeights",
    "SigmoidWeights",
    "SoftmaxNormaliser",
    "SoftmaxWeights",
    "split_indexed",
    "TrainingCrossTerm",
    "TwoComponentSplit",
    "ValidationObjective",
    "weighted_loss",
    "WeightParameterization",
    "ZeroLossMasks",
]


# ---------------------------------------------------------------------- the family
class SampleWeights:
    """One learned weight per training example (or per class), indexed by id.

    Parameters
    ----------
    n:
        The number of rows: ``len(train_set)`` per sample, the number of classes per class.
    parameterization:
        ``"sigmoid"`` (ω = σ(x), default), ``"softmax"`` (ω = n·softmax(x)) or a
        :class:`WeightParameterization`.
    initial:
        ω₀ of every row. Default: ½ for sigmoid (x₀ = 0, the benchopt problem's start), 1 for
        softmax.
    dtype, device:
        Of the logits (float32 on the CPU by default).
    logits:
        An existing leaf tensor of shape ``(n,)`` to use as x (its values are kept), e.g. a
        hyperparameter registered on a :class:`~hypertorch_sid.BilevelModule`:
        ``SampleWeights(n, logits=self.register_hyperparameter("x", torch.zeros(n)))``.
    sparse_grad:
        ``True``: the rows are gathered with a sparse backward, so the gradient of the
        logits (the hypergradient of ``SIDHyperOptimizer``, ``logits.grad``) is a sparse COO
        tensor holding only the rows read, and a hyper step costs the same for any n (its
        checks read the rows, :mod:`~hypertorch_sid.core.rows`). The outer optimizer must then
        accept sparse gradients and move only their rows: :class:`LazyAdam` or ``SGD`` without
        momentum (``torch.optim.Adam`` refuses them), in one process (a sparse tensor is not
        averaged across DDP ranks). ``False`` (default): a dense n-vector gradient (any
        optimizer, DDP), a few passes over n per hyper step.
    gauge:
        How the self-normalised loss's scale, which it does not see, is fixed (only with
        ``weighted_mean(..., normalize=True)``). ``"batch"`` (default): the exact derivative of
        the minibatch's Σ ωᵢℓᵢ / Σ ωᵢ, row i's hypergradient −α ω′ᵢ(uᵢ − û)/Σ ω with
        uᵢ = ⟨∇ℓᵢ, v⟩ and û their weighted mean over the minibatch. ``"mean_logit"``: each row's
        own −α ω′ᵢuᵢ/Σ ω (the normaliser held in the weights' gradient), and the mean logit
        held at x₀ after every outer step (:meth:`projection`; with ``sparse_grad`` the
        shift is held and folded in by the readers, :class:`MeanLogitGauge`, O(rows) per
        step). The two differ only along the common shift of the logits, which the
        self-normalised loss does not see (exactly for small ω); they differ in noise where a
        few rows carry û: a squared error with outlying targets, whose û then swings the whole
        minibatch with those rows (the per-row outer step turns that common noise into each
        row's own walk). Sigmoid parameterisations only.

    Attributes
    ----------
    logits:
        The learned tensor x, shape ``(n,)``, ``requires_grad=True``: the hyperparameter of
        :class:`~hypertorch_sid.SIDHyperOptimizer` (``hyperparameters == [logits]``). Under
        ``gauge="mean_logit"`` with ``sparse_grad`` it holds the logits up to a common shift
        that the weights fold in: read them with :meth:`logits_of`.
    normaliser:
        The statistic of all n logits the weights read (:class:`Normaliser`: log Z of softmax
        weights, the mean logit of the mean-logit gauge), or None; kept across outer steps at
        O(rows moved) per step with ``sparse_grad``.
    """

    #: how many checked indices are kept (:meth:`check_index` reads each batch's range once)
    CHECKED_KEPT = 4

    def __init__(
        self,
        n: int,
        parameterization: str | WeightParameterization = "sigmoid",
        initial: float | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        logits: Tensor | None = None,
        sparse_grad: bool = False,
        gauge: Gauge = "batch",
    ) -> None:
        if isinstance(n, Tensor) and n.numel() == 1 and not n.is_floating_point():
            n = int(n)  # class_weights(int(y.max()) + 1) written without int() (session 56)
        self.n = n = check_integer("SampleWeights: the number of rows n", n, 1)
        self.parameterization = as_weight_parameterization(parameterization)
        self.gauge: Gauge = "batch"
        softmax = isinstance(self.parameterization, SoftmaxWeights)
        if isinstance(initial, (str, bool)):  # "0.5" was taken as 0.5, True as 1 (s56)
            raise ConfigurationError(
                f"SampleWeights: initial must be a number (the starting weight ω₀), got "
                f"{initial!r}."
            )
        if logits is not None and (
            not isinstance(logits, Tensor) or logits.shape != (n,) or not logits.is_leaf
        ):
            raise ConfigurationError(
                f"SampleWeights(logits=...) takes a leaf tensor of shape ({n},), e.g. "
                "self.register_hyperparameter('x', torch.zeros(n)) in a BilevelModule."
            )
        if logits is not None and not softmax:  # ω₀ is where the given logits start (s56)
            initial = _initial_of_logits(logits, initial)
        if initial is None:
            initial = 1.0 if softmax else 0.5
        self._initial = float(initial)
        x0 = self.parameterization.logit(self._initial, n)
        if logits is None:
            if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise ConfigurationError(
                    f"SampleWeights: dtype must be a floating-point torch.dtype (the logits are "
                    f"learned), got {dtype!r}: e.g. torch.float32."
                )
            logits = torch.full((n,), x0, dtype=dtype, device=device, requires_grad=True)
        else:
            dtype, device = logits.dtype, logits.device
        self.logits = logits
        self.normaliser: Normaliser | None = None
        #: the last :data:`CHECKED_KEPT` indices checked, latest first (a hyper step's
        #: curvature estimate reads two or more batches in turn: each is read of the device once)
        self._checked: list[tuple[Tensor, int, Tensor]] = []
        self.parameterization.bind(self)
        self.use_sparse_grad(sparse_grad)
        self.parameterization.refresh(self)
        self.use_gauge(gauge)
        #: which rows of a batch the training's loss masks at a visit (:meth:`use_masks`)
        self.masks: RowMasks = RowMasks()

    def use_masks(self, masks: RowMasks) -> None:
        """Which rows of a training batch the loss masks at a visit (:class:`RowMasks`, the
        default: none; :class:`ZeroLossMasks`: a row whose loss is exactly 0, for a loss known
        to mask rows, ``losses * keep``): their weights enter Σ ω by value only
        (:meth:`weighted_mean`) and the training batches' cross term does not move them
        (:class:`TrainingCrossTerm`). ``LearnedDataWeights`` sets it from what the fit's first
        batches show (:class:`~hypertorch_sid.lightning.batch_masks.MaskDetection`)."""
        if not isinstance(masks, RowMasks):
            raise ConfigurationError(
                f"SampleWeights.use_masks takes a RowMasks (RowMasks() or ZeroLossMasks()), got "
                f"{type(masks).__name__}."
            )
        self.masks = masks

    def use_gauge(self, gauge: Gauge) -> None:
        """Switch how the self-normalised loss's scale is fixed (see ``gauge``)."""
        if gauge in CLASS_GAUGES:
            raise ConfigurationError(
                "SampleWeights: the class gauges need each row's label: "
                f"use_class_gauge(labels, {gauge!r}) rather than use_gauge({gauge!r})."
            )
        if gauge not in ("batch", "mean_logit"):
            raise ConfigurationError(
                f"SampleWeights: gauge must be 'batch' or 'mean_logit', got {gauge!r}."
            )
        if gauge == "mean_logit" and not isinstance(self.parameterization, SigmoidWeights):
            raise ConfigurationError(
                f"SampleWeights(gauge='mean_logit') holds the mean of independent logits; "
                f"{self.parameterization!r} is not a sigmoid parameterisation: use "
                "gauge='batch' (or parameterization='sigmoid')."
            )
        self._hold(lambda: setattr(self, "gauge", gauge))

    def use_class_gauge(self, labels: Callable[[], Tensor | None], gauge: Gauge = "class") -> None:
        """A class gauge (:data:`CLASS_GAUGES`); ``labels()`` gives each row's integer label
        (negative: none) or None. The weights' gradient is the ``"batch"`` gauge's (the
        minibatch's exact derivative), but for the training batches' cross term
        (:class:`TrainingCrossTerm`), whose u is centred on each row's class
        (:func:`class_centred`, session 51). ``"class"``: each class's mean logit held at x₀
        after every outer step (eq. classgauge, :class:`ClassMeanLogitGauge`);
        ``"class_centred"``: nothing held (session 52). Sigmoid parameterisations only."""
        if gauge not in CLASS_GAUGES:
            raise ConfigurationError(
                f"SampleWeights.use_class_gauge: gauge must be one of {sorted(CLASS_GAUGES)}, "
                f"got {gauge!r}."
            )
        if not isinstance(self.parameterization, SigmoidWeights):
            raise ConfigurationError(
                f"SampleWeights: the class gauge holds each class's mean of independent logits; "
                f"{self.parameterization!r} is not a sigmoid parameterisation: use "
                "parameterization='sigmoid' with it, or another gauge."
            )
        if not callable(labels):
            raise ConfigurationError(
                "SampleWeights.use_class_gauge(labels) takes a callable giving each row's "
                f"integer label (a long tensor of shape ({self.n},)), got {type(labels).__name__}."
            )
        self._class_labels = labels
        self._hold(lambda: setattr(self, "gauge", gauge))

    def labels_of(self, index: Tensor) -> Tensor | None:
        """The integer labels the class gauge reads, of the rows ``index`` (negative: none
        yet), or None (no class gauge, or no labels)."""
        if self.gauge not in CLASS_GAUGES:
            return None
        labels = self._class_labels()
        if labels is None or labels.shape != (self.n,):
            return None
        return labels.to(index.device)[index]

    def use_sparse_grad(self, sparse_grad: bool) -> None:
        """Switch between row-sparse and dense gradients of the logits (see ``sparse_grad``)."""

        check_bool("SampleWeights: sparse_grad", sparse_grad)  # "no" read as True (s56)

        def switch() -> None:
            self.sparse_grad = bool(sparse_grad)
            if self.sparse_grad:
                mark_row_sparse(self.logits)
            elif hasattr(self.logits, ROW_SPARSE):
                delattr(self.logits, ROW_SPARSE)

        self._hold(switch)

    def _hold(self, change: Callable[[], None]) -> None:
        """Apply ``change`` (the gauge or the gradients) and the :class:`Normaliser` it asks
        for: the parameterisation's (softmax's log Z) or the mean-logit gauge's, or none; a
        shift the old one held is folded into the logits first (the weights do not change)."""
        if self.normaliser is not None:
            self.normaliser.release()
        change()
        self.normaliser = self.parameterization.normaliser(self)
        if self.gauge == "mean_logit":
            self.normaliser = MeanLogitGauge(self)
        elif (held := CLASS_GAUGES.get(self.gauge)) is not None:
            self.normaliser = held(self, self._class_labels)

    @property
    def hyperparameters(self) -> Tensors:
        """``[logits]`` and the parameterisation's own tensors (θ of
        :class:`SharedLossWeights`): what ``SIDHyperOptimizer`` and the outer optimizer learn."""
        return [self.logits, *self.parameterization.hyperparameters]

    @property
    def hyperparameter_names(self) -> list[str]:
        """The names of :attr:`hyperparameters`, by which a saved state is matched to them."""
        own = type(self.parameterization).__name__
        return ["logits", *(f"{own}[{i}]" for i in range(len(self.hyperparameters) - 1))]

    # ------------------------------------------------------------------ reading the weights
    def logits_of(self, index: Tensor | None = None) -> Tensor:
        """x of the rows ``index`` (a checked 1-D long tensor; None: every row) as the weights
        read them: gathered from :attr:`logits` (differentiable; a sparse backward with
        ``sparse_grad``), less the mean-logit gauge's held shift (:class:`MeanLogitGauge`).
        Every reader of the weights goes through here, which also tells the
        :attr:`normaliser` which rows the next outer step may move."""
        x = self.logits
        if index is not None:
            x = torch.gather(x, 0, index, sparse_grad=self.sparse_grad)
        held = self.normaliser
        if held is None:
            return x
        held.check_held()
        if index is not None:
            held.read(index, x)
        offset = held.offset()
        return x if offset is None else x - offset.to(x.dtype)

    @property
    def log_normaliser(self) -> Tensor:
        """log Z = logsumexp(x) of softmax weights (held within a hyper step), in the logits'
        dtype; log n for another parameterisation."""
        x = self.logits
        log_z = None if self.normaliser is None else self.normaliser.log_partition()
        if log_z is not None:
            return log_z.to(x.dtype)
        return torch.tensor(math.log(self.n), dtype=x.dtype, device=x.device)

    def check_index(self, index: Tensor) -> Tensor:
        """``index`` as a 1-D long tensor on the logits' device, or a clear error."""
        given = index if isinstance(index, Tensor) else torch.as_tensor(index)
        for kept, version, index in self._checked:
            if kept is given and version == given._version:  # a batch's index, checked already
                return index
        index, bounds = self.index_bounds(given)
        low, high = bounds.tolist() if bounds is not None else (0, 0)  # one read of the device
        return self.accept_index(given, index, low, high)

    def index_bounds(self, index: Tensor) -> tuple[Tensor, Tensor | None]:
        """``index`` (a tensor of integers) as a 1-D long tensor on the logits' device, and its
        smallest and largest entries as a tensor there, not read (None: an empty index). For a
        caller that reads them with values of its own, in one wait for the device, then hands
        them to :meth:`accept_index`; :meth:`check_index` does both."""
        if not isinstance(index, Tensor):
            index = torch.as_tensor(index)
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ConfigurationError(
                f"sample-weight indices must be integers, got a {index.dtype} tensor."
            )
        check_index_shape(index)
        index = index if index.dim() == 1 else index.reshape(-1)
        index = index.to(device=self.logits.device, dtype=torch.long)
        return index, torch.stack(torch.aminmax(index)) if index.numel() else None

    def accept_index(self, given: Tensor, index: Tensor, low: int, high: int) -> Tensor:
        """``index`` (:meth:`index_bounds` of ``given``), whose entries run from ``low`` to
        ``high``: a clear error where they are not rows of the weights, else kept as checked
        (the same batch's ``given`` is not read again) and returned."""
        if index.numel() and low < 0:  # -100 was called "sized for another data set" (s56)
            raise ConfigurationError(
                f"sample-weight index out of range: got {low} for {self.n} rows; an index is a "
                "row ≥ 0. A negative one is not a row: -100 is F.cross_entropy's ignore_index "
                "(an unlabelled row given class weights: leave those rows out of the weighted "
                "loss, e.g. keep = y >= 0; weights.weighted_mean(losses[keep], y[keep]))."
            )
        if index.numel() and high >= self.n:
            raise ConfigurationError(
                f"sample-weight index out of range: got [{low}, {high}] for {self.n} rows. "
                "The weights were sized for another data set (n = len of the "
                "IndexedDataset, or the number of classes)."
            )
        checked = [c for c in self._checked if c[0] is not given]
        self._checked = [(given, given._version, index), *checked][: self.CHECKED_KEPT]
        return index

    def weights(self, index: Tensor, losses: Tensor | None = None) -> Tensor:
        """ω of the rows ``index`` (differentiable in the logits; only these rows get a
        gradient: a sparse one with ``sparse_grad``, else an ``index_add`` into an n-vector).
        ``losses``: the rows' per-sample losses now, for a parameterisation that reads them
        (:class:`SharedLossWeights`; without them it uses each row's last ones)."""
        index = self.check_index(index)
        return self.parameterization.rows(self.logits_of(index), self, index, losses)

    def weighted_mean(self, losses: Tensor, index: Tensor, normalize: bool = False) -> Tensor:
        """ℓ̂ = (1/|ζ|) Σᵢ ωᵢ ℓᵢ (eq. weighted) from per-sample losses ``losses`` (shape (b,));
        with ``normalize=True`` the self-normalised Σᵢ ωᵢ ℓᵢ / Σᵢ ωᵢ (Ren et al. 2018): equal
        weights then give the plain mean loss, whatever their value. Either reads only the rows
        ``index``.

        A loss that is already reduced (a scalar) is refused: compute it with
        ``reduction="none"``.
        """
        losses = check_per_sample(losses, index)
        normalize = check_bool("weighted_mean: normalize", normalize)
        held = self.gauge == "mean_logit"
        omega = self.weights(index, losses)
        return weighted_loss(losses, omega, normalize, held, self.masks.masked(losses))

    def values(self) -> Tensor:
        """Every ω (detached, shape ``(n,)``)."""
        with torch.no_grad():
            every = torch.arange(self.n, device=self.logits.device)
            return self.parameterization.rows(self.logits_of().detach(), self, every).clone()

    def flagged(self, rule: FlagRule | float | None = None) -> Tensor:
        """Indices of the rows the outer objective learned to distrust, by ``rule``: a
        :class:`FlagRule` or its name, a number (ω below it: :class:`BelowWeight`) or ``None``
        (:class:`TwoComponentSplit`: the low component of the learned logits)."""
        return torch.nonzero(as_flag_rule(rule).flags(self)).flatten()

    @property
    def initial_weight(self) -> float:
        """ω₀ (what every row started at)."""
        return self._initial

    def shrink(self, keep: float) -> None:
        """Move every logit toward its start x₀: x ← x₀ + keep·(x − x₀) (``keep=0``: every row
        back at ω₀, the weights uniform), through :meth:`load_state_dict` (a held shift folded
        in, the normaliser refreshed)."""
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 <= keep < 1:
            raise ConfigurationError(
                f"SampleWeights.shrink: keep must be a number in [0, 1) (the share of each "
                f"logit's move from its start kept; 0 resets it), got {keep!r}."
            )
        with torch.no_grad():
            x = self.logits_of().detach()
            x0 = torch.full_like(x, self.parameterization.logit(self._initial, self.n))
            self.load_state_dict({"logits": x0 + keep * (x - x0)})

    # ------------------------------------------------------------------ after an outer step
    def projection(self, hyperparameters: Iterable[Tensor] | None = None) -> None:
        """P_Λ for :class:`SIDHyperOptimizer` (``FeasibleSet(project=weights.projection)``): the
        logits are unconstrained, but a normaliser (softmax's log Z) follows them; with
        ``gauge="mean_logit"`` their mean is moved back to x₀ (a common shift). Both are kept
        by the :attr:`normaliser`: O(rows moved) with ``sparse_grad``, one pass over n
        otherwise."""
        if self.normaliser is not None:
            self.normaliser.update()
        self.parameterization.refresh(self)

    def state_dict(self) -> dict[str, Any]:
        """The logits as the weights read them (:meth:`logits_of`: a held mean-logit shift
        folded in; a checkpoint of the callback holds the stored ones, through the optimizer,
        from which the same weights follow)."""
        with torch.no_grad():
            return {"logits": self.logits_of().detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the same n rows), or a clear error."""
        x = state.get("logits") if isinstance(state, dict) else None
        if not isinstance(x, Tensor):  # was "of shape None ... another data set" (session 61)
            got = (
                f"a dict of keys {sorted(map(str, state))[:6]}"
                if isinstance(state, dict)
                else f"a {type(state).__name__}"
            )
            raise ConfigurationError(
                f"not a SampleWeights state: it holds no 'logits' tensor, got {got} (a "
                "SIDHyperOptimizer's or a callback's state?). Load what SampleWeights."
                "state_dict() returned; a LearnedDataWeights checkpoint resumes through "
                "trainer.fit(..., ckpt_path=...)."
            )
        if x.shape != self.logits.shape:
            raise ConfigurationError(
                f"saved sample weights of shape {getattr(x, 'shape', None)} do not fit these "
                f"{self.n} rows: the checkpoint belongs to another data set."
            )
        if not bool(torch.isfinite(x).all()):  # was copied in: NaN weights (session 56)
            raise ConfigurationError(
                f"saved sample weights hold {int((~torch.isfinite(x)).sum())} non-finite logits: "
                "the checkpoint was written after a diverged step; load an earlier one."
            )
        with torch.no_grad():
            self.logits.copy_(x)  # the normaliser sees the write (a full pass at the next read)
        self.parameterization.refresh(self)

    def __repr__(self) -> str:
        return f"SampleWeights(n={self.n}, {self.parameterization!r})"


def _initial_of_logits(logits: Tensor, initial: float | None) -> float:
    """ω₀ of sigmoid weights whose logits are given (``SampleWeights(logits=...)``): σ of their
    mean, which the mean-logit and class gauges hold and the flag rules compare with. Session
    56: ω₀ stayed ½ whatever the logits held, so a start at x = 2 (ω 0.88) was pulled to x̄ = 0 by
    the gauge's projection (refused as "outside the feasible set"). An ``initial`` that
    disagrees with the logits is refused: they keep their values."""
    with torch.no_grad():
        mean = float(logits.detach().double().mean())
    if not math.isfinite(mean):
        raise ConfigurationError(
            "SampleWeights(logits=...): the given logits hold NaN or ±inf; start them finite."
        )
    start = 1.0 / (1.0 + math.exp(-mean))
    if initial is not None and abs(float(initial) - start) > 1e-6:
        raise ConfigurationError(
            f"SampleWeights: initial={initial!r} and logits= disagree: the logits keep their "
            f"values, whose weights start at σ(mean logit) = {start:.4g}. Drop initial= (ω₀ is "
            "read from the logits), or fill the logits with log(ω₀ / (1 − ω₀)) for the ω₀ you "
            "want."
        )
    return start


def class_weights(
    num_classes: int, parameterization: str | WeightParameterization = "sigmoid", **kwargs: Any
) -> SampleWeights:
    """One weight per class (imbalance): a :class:`SampleWeights` indexed by the labels
    (``weights.weighted_mean(losses, y)``)."""
    return SampleWeights(num_classes, parameterization, **kwargs)
