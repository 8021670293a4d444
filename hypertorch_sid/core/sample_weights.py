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

import contextlib
import dataclasses
import math
import numbers
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset

from .errors import ConfigurationError
from .rows import ROW_SPARSE, mark_row_sparse
from .validation import as_strategy

Tensors = list[Tensor]
#: how the self-normalised loss's scale is fixed (:class:`SampleWeights`' ``gauge``)
Gauge = Literal["batch", "mean_logit", "class"]

__all__ = [
    "BelowWeight",
    "ClassMeanLogitGauge",
    "FlagRule",
    "Indexed",
    "IndexedDataset",
    "LABEL_KEYS",
    "LabelledIndexed",
    "LazyAdam",
    "MeanLogitGauge",
    "Normaliser",
    "SampleWeights",
    "SharedLossWeights",
    "SigmoidWeights",
    "SoftmaxNormaliser",
    "SoftmaxWeights",
    "TrainingCrossTerm",
    "TwoComponentSplit",
    "WeightParameterization",
    "biased_hinge_basis",
    "class_weights",
    "directional_losses",
    "DirectionalDerivative",
    "ForwardDifference",
    "ForwardMode",
    "hinge_basis",
    "indexed_collate",
    "sample_label",
    "split_indexed",
]


# ---------------------------------------------------------------------- the index of each sample
class Indexed(NamedTuple):
    """One sample with its index in the training set (a batch of them after collation:
    ``default_collate`` keeps the named tuple, ``index`` becomes a ``LongTensor``)."""

    index: Any
    data: Any


class IndexedDataset(Dataset):
    """A map-style dataset whose samples carry their index: ``ds[i] == Indexed(i, base[i])``.

    Shuffling, several workers and ``DistributedSampler`` all keep working: they only choose
    which ``i`` to ask for, and the index travels with the sample. An ``IterableDataset`` (no
    stable index: the same position may hold another example on the next pass) is refused.
    """

    def __init__(self, dataset: Any) -> None:
        if isinstance(dataset, IterableDataset):
            raise ConfigurationError(
                f"IndexedDataset needs a map-style dataset, got the IterableDataset "
                f"{type(dataset).__name__}: a stream has no stable example index, so no weight can "
                "belong to an example. Materialise it (e.g. a TensorDataset or a list) first."
            )
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigurationError(
                f"IndexedDataset needs a map-style dataset with __len__ and __getitem__, got "
                f"{type(dataset).__name__}."
            )
        if isinstance(dataset, IndexedDataset):
            raise ConfigurationError("the dataset is already an IndexedDataset: wrap it once.")
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Indexed:
        sample = self.dataset[i]
        if isinstance(sample, Indexed):  # e.g. IndexedDataset(Subset(IndexedDataset(...)))
            raise ConfigurationError(
                f"IndexedDataset: sample {int(i)} of {type(self.dataset).__name__} already carries "
                "an index (an IndexedDataset sits inside it): wrap only the outermost dataset, "
                "IndexedDataset(Subset(train_set, ...)), not the set inside it too."
            )
        return Indexed(int(i), sample)


class LabelledIndexed(Indexed):
    """An :class:`Indexed` batch that also carries its samples' integer class labels, read one
    sample at a time before your ``collate_fn`` (:func:`sample_label`): ``index`` and ``data``
    as in :class:`Indexed` (``data`` is your collate function's batch, unchanged), ``labels`` a
    ``LongTensor`` with one entry per sample. :class:`indexed_collate` gives it where every
    sample of the batch has a label to read. Moved to the device, pinned and pickled as a named
    tuple of three entries."""

    __slots__ = ()
    _fields = ("index", "data", "labels")

    def __new__(cls, index: Any, data: Any, labels: Any) -> LabelledIndexed:
        return tuple.__new__(cls, (index, data, labels))

    @property
    def labels(self) -> Any:
        return self[2]

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> LabelledIndexed:
        return cls(*iterable)

    def _replace(self, **changes: Any) -> LabelledIndexed:
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise ValueError(f"LabelledIndexed has no field {sorted(unknown)}")
        return self._make(changes.get(f, v) for f, v in zip(self._fields, self))

    def __repr__(self) -> str:
        return f"LabelledIndexed(index={self.index!r}, data={self.data!r}, labels={self.labels!r})"


#: the keys of a dict sample (fields of a dataclass or namedtuple sample) that name its label
LABEL_KEYS = ("y", "label", "labels", "target", "targets")


def _integer_scalar(value: Any) -> bool:
    """Whether ``value`` is one integer: a Python or NumPy integer, or a 0-dim integer tensor
    (a bool is not a class id)."""
    if isinstance(value, Tensor):
        return (
            value.dim() == 0
            and not value.is_floating_point()
            and not value.is_complex()
            and value.dtype != torch.bool
        )
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def sample_label(sample: Any) -> int | None:
    """One sample's class label, read before collation by one rule, or None:

    * a dict sample (a dataclass's or named tuple's fields): the value of the one key of
      :data:`LABEL_KEYS` it holds (none, or two of them: None);
    * otherwise a pair ``(x, y)`` (a tuple or list of exactly two entries): ``y``;

    and only where that value is one integer (a Python or NumPy integer, a 0-dim integer
    tensor; not a bool, a float, a one-hot vector, a string or a sequence). Nothing else is
    guessed: ``(x, y, w)`` (which of the three?), a bare tensor, ``(text, y)`` with ``y`` of
    shape (1,) give None."""
    if isinstance(sample, Mapping):
        found = [sample[k] for k in LABEL_KEYS if k in sample]
    elif dataclasses.is_dataclass(sample) or hasattr(sample, "_fields"):
        found = [getattr(sample, k) for k in LABEL_KEYS if hasattr(sample, k)]
        if not found and isinstance(sample, tuple) and len(sample) == 2:
            found = [sample[1]]
    elif isinstance(sample, (tuple, list)) and len(sample) == 2:
        found = [sample[1]]
    else:
        found = []
    if len(found) != 1 or not _integer_scalar(found[0]):
        return None
    return int(found[0])


class indexed_collate:  # noqa: N801 (used as a function: collate_fn=indexed_collate(fn))
    """A ``collate_fn`` for a DataLoader over an :class:`IndexedDataset` whose samples need your
    own collation (sequences padded per batch, dicts, ...): ``fn`` collates the samples as
    before, and the batch keeps their indices, ``Indexed(LongTensor of indices, fn(samples))``.

    ``DataLoader(IndexedDataset(train_set), collate_fn=indexed_collate(pad_batch))``: your
    ``training_step`` receives ``pad_batch``'s batch, as without the index. Picklable (worker
    processes) where ``fn`` is.

    Where every sample of the batch has a class label to read (:func:`sample_label`: the
    ``y`` of an ``(x, y)`` pair, or a dict sample's one label key, an integer), the batch is a
    :class:`LabelledIndexed` that carries them too: your ``fn``'s batch has a layout of its own
    (``(tokens, offsets, y)`` for an ``EmbeddingBag``), from which nothing could tell the
    labels, and ``LearnedDataWeights`` reads these (without ``target=``) for its class gauge
    and its label checks.
    """

    def __init__(self, fn: Any) -> None:
        if not callable(fn):
            raise ConfigurationError(
                f"indexed_collate needs your collate function, got {type(fn).__name__}."
            )
        self.fn = fn

    def __call__(self, samples: list[Any]) -> Indexed:
        if not all(isinstance(s, Indexed) for s in samples):
            raise ConfigurationError(
                "indexed_collate got samples without an index: it collates an IndexedDataset's "
                "samples, DataLoader(IndexedDataset(train_set), collate_fn=indexed_collate(fn)); "
                "over another dataset pass fn itself."
            )
        index = torch.tensor([int(s.index) for s in samples], dtype=torch.long)
        labels = [sample_label(s.data) for s in samples]
        data = self.fn([s.data for s in samples])
        if not samples or any(y is None for y in labels):
            return Indexed(index, data)
        return LabelledIndexed(index, data, torch.tensor(labels, dtype=torch.long))

    def __repr__(self) -> str:
        return f"indexed_collate({getattr(self.fn, '__name__', repr(self.fn))})"


def split_indexed(batch: Any, what: str = "the training batch") -> tuple[Tensor, Any]:
    """(index, data) of a collated :class:`Indexed` batch, or a :class:`ConfigurationError`
    saying how to give the batch its indices."""
    if isinstance(batch, Indexed):
        index = batch.index
        if not isinstance(index, Tensor):
            index = torch.as_tensor(index)
        if index.dtype not in (torch.int64, torch.int32) or index.dim() > 1:
            raise ConfigurationError(
                f"{what} carries indices of dtype {index.dtype} and shape {tuple(index.shape)}: "
                "they must be a 1-D integer tensor (IndexedDataset's default collation)."
            )
        return (index if index.dim() == 1 else index.reshape(-1)).long(), batch.data
    raise ConfigurationError(
        f"{what} carries no example indices (got {type(batch).__name__}): per-sample weights "
        "need stable indices. Wrap the training dataset: IndexedDataset(train_set) (a map-style "
        "dataset; each sample becomes Indexed(index, data))."
    )


# ---------------------------------------------------------------------- parameterisations
class WeightParameterization(ABC):
    """ω = T(x): how the learned logits x give the weights ω ≥ 0 (elementwise on the rows
    read, apart from a normaliser that is held fixed within a hyper step)."""

    @abstractmethod
    def logit(self, weight: float, n: int) -> float:
        """x₀ for the initial weight ω₀ (the same for every row)."""

    @abstractmethod
    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        """ω of the gathered rows ``x`` (differentiable in ``x``); ``index`` says which rows
        they are and ``losses`` their per-sample losses now (read by a parameterisation with a
        shared term, :class:`SharedLossWeights`; ignored by the per-row ones)."""

    def refresh(self, family: SampleWeights) -> None:
        """Update any state of the parameterisation after x changed (called after each outer
        step; a normaliser over all rows is a :meth:`normaliser`, kept by the family)."""
        return None

    def normaliser(self, family: SampleWeights) -> Normaliser | None:
        """The statistic of all n logits that :meth:`rows` reads (log Z of softmax weights), or
        None: the family keeps it across outer steps."""
        return None

    def bind(self, family: SampleWeights) -> None:
        """Size any state of the parameterisation for ``family`` (called by its constructor)."""
        return None

    @property
    def hyperparameters(self) -> Tensors:
        """Learned tensors of the parameterisation itself, beside the logits (none here)."""
        return []

    def effective_logits(self, family: SampleWeights) -> Tensor:
        """The logit each row's weight is now the σ/softmax of (detached): x itself here
        (:meth:`SampleWeights.logits_of`)."""
        return family.logits_of().detach()

    def param_groups(self, hyperparameters: Tensors) -> list[dict[str, Any]]:
        """The outer optimizer's parameter groups over ``family.hyperparameters``: one here
        (the optimizer's own settings for every tensor)."""
        return [{"params": list(hyperparameters)}]


class SigmoidWeights(WeightParameterization):
    """ωᵢ = σ(xᵢ) ∈ (0, 1): each row independent (the literature's choice)."""

    def logit(self, weight: float, n: int) -> float:
        if not 0 < weight < 1:
            raise ConfigurationError(
                f"the sigmoid parameterisation needs an initial weight in (0, 1), got {weight!r}."
            )
        return math.log(weight / (1 - weight))

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        return torch.sigmoid(x)

    def __repr__(self) -> str:
        return "SigmoidWeights()"


class _SigmoidInWeightCoordinates(torch.autograd.Function):
    """ω = σ(x) forward; backward hands ∂Φ/∂ω to x unchanged (no σ'(x) factor)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        return torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad


class NaturalSigmoidWeights(SigmoidWeights):
    """ωᵢ = σ(xᵢ) as :class:`SigmoidWeights`, stepped along the natural gradient of the logit:

        xᵢ ← xᵢ − lr · Adam(∂Φ/∂ωᵢ),   ∂Φ/∂ωᵢ = (∂Φ/∂xᵢ) / σ'(xᵢ),                (eq. natsig)

    the gradient in ω (the Fisher metric of the Bernoulli σ(x) is σ'(x), so this is x's natural
    gradient, and the step is mirror descent on ω ∈ (0, 1) with the Bernoulli entropy as mirror
    map). With the plain sigmoid the hypergradient of a row carries σ'(xᵢ), which falls from ¼
    at x = 0 to 0.05 at x = −3: a corrupted example's logit slows down as it falls, although its
    evidence (uᵢ − ū) does not weaken, and with the row's Adam scale dominated by its first,
    larger hypergradients it stops near ω ≈ 0.1 (docs/data_weights.md, the diagnosis). In ω's
    coordinates each visit moves the logit by its evidence relative to that row's earlier
    evidence: steps shrink only where the evidence does (a clean example the network fits).

    The gradient the logits receive (``logits.grad``, any hypergradient through
    :meth:`SampleWeights.weights`) is therefore ∂Φ/∂ω, not ∂Φ/∂x.
    """

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        return _SigmoidInWeightCoordinates.apply(x)

    def __repr__(self) -> str:
        return "NaturalSigmoidWeights()"


class SoftmaxWeights(WeightParameterization):
    """ωᵢ = n·exp(xᵢ − log Z), log Z = logsumexp(x): weights that average 1 over the data set.

    log Z follows the logits after every outer step (:class:`SoftmaxNormaliser`: one pass over
    the n logits with dense gradients, O(rows moved) with row-sparse ones) and is held fixed
    within a hyper step: the exact gradient also moves every row j outside the minibatch, by
    −pⱼ·c with pⱼ = exp(xⱼ)/Z ≈ 1/n and c a scalar of the batch, a term of order 1/n per row
    that is dropped (it would make every hyper step cost O(n)).
    """

    def logit(self, weight: float, n: int) -> float:
        if weight != 1.0:
            raise ConfigurationError(
                f"softmax-normalised weights average 1 over the data set; the initial weight must "
                f"be 1.0, got {weight!r}."
            )
        return 0.0

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        return family.n * torch.exp(x - family.log_normaliser)

    def normaliser(self, family: SampleWeights) -> Normaliser:
        return SoftmaxNormaliser(family)

    def __repr__(self) -> str:
        return "SoftmaxWeights()"


def hinge_basis(z: Tensor) -> Tensor:
    """φ(z) = (z, max(z, 0)): a slope, and another above the batch's mean loss."""
    return torch.stack([z, z.clamp_min(0)], -1)


def biased_hinge_basis(z: Tensor) -> Tensor:
    """φ(z) = (1, z, max(z, 0)): :func:`hinge_basis` and a shared offset of every logit."""
    return torch.stack([torch.ones_like(z), z, z.clamp_min(0)], -1)


class SharedLossWeights(WeightParameterization):
    """ωᵢ = σ(xᵢ + θᵀφ(zᵢ)): the per-sample logit plus a small function of the example's
    current loss whose few parameters θ every example's hypergradient trains:

        ωᵢ = σ(xᵢ + θᵀφ(zᵢ)),   zᵢ = clip((ℓᵢ − ℓ̄_ζ) / s_ζ, ±3),                (eq. sharedloss)

    φ = ``basis`` (default :func:`hinge_basis`, φ(z) = (z, max(z, 0)); or
    :func:`biased_hinge_basis`, which adds a constant),

    with ℓ̄_ζ, s_ζ the mean and standard deviation of the losses over the minibatch ζ (so θ
    reads where an example's loss sits among its batch, whatever the training's stage), the
    losses detached (a feature of the example, not a path for the training's gradient), θ₀ = 0.
    x keeps the per-row part (each row ~one hypergradient per epoch); θ gets the sum over every
    row read of ∂Φ̂/∂(xᵢ + sᵢ) · φ(zᵢ), i.e. the statistical strength of all examples (a
    Meta-Weight-Net-like term, Shu et al. 2019, learned by SID like any hyperparameter). With
    θ = 0 it is :class:`SigmoidWeights`.

    ``lr`` and ``betas``: the outer step on θ (the data-weights drop-in gives θ its own
    :class:`LazyAdam` group with them; each row of x keeps the drop-in's). A row's last z is
    kept (O(n) storage), so :meth:`SampleWeights.values` and the flags read ω at the example's
    last visit.
    """

    def __init__(
        self,
        lr: float = 0.005,
        betas: tuple[float, float] = (0.9, 0.999),
        clip: float = 3.0,
        basis: Callable[[Tensor], Tensor] = hinge_basis,
    ) -> None:
        if not lr > 0 or not clip > 0:
            raise ConfigurationError(
                f"SharedLossWeights: lr and clip must be > 0, got lr={lr!r}, clip={clip!r}."
            )
        if not callable(basis):
            raise ConfigurationError("SharedLossWeights: basis must be a callable z -> φ(z).")
        self.lr, self.betas, self.clip, self.basis = float(lr), tuple(betas), float(clip), basis
        #: the number of basis functions, dim φ
        self.features = int(basis(torch.zeros(1)).shape[-1])
        self.theta: Tensor | None = None
        self.last_z: Tensor | None = None

    def logit(self, weight: float, n: int) -> float:
        return SigmoidWeights().logit(weight, n)

    def bind(self, family: SampleWeights) -> None:
        x = family.logits
        if self.theta is None or self.theta.dtype != x.dtype:
            self.theta = torch.zeros(self.features, dtype=x.dtype, device=x.device)
            self.theta.requires_grad_(True)
        elif self.theta.device != x.device:  # the fit moved the logits: θ follows, kept
            self.theta.data = self.theta.data.to(x.device)
        if self.last_z is None or self.last_z.shape != x.shape:
            self.last_z = torch.zeros_like(x.detach())
        self.last_z = self.last_z.to(x.device)

    def param_groups(self, hyperparameters: Tensors) -> list[dict[str, Any]]:
        """x with the optimizer's settings, θ with its own ``lr`` and ``betas``."""
        shared = {id(t) for t in self.hyperparameters}
        rows = [h for h in hyperparameters if id(h) not in shared]
        own = [h for h in hyperparameters if id(h) in shared]
        groups: list[dict[str, Any]] = [{"params": rows}]
        if own:
            groups.append({"params": own, "lr": self.lr, "betas": self.betas})
        return groups

    @property
    def hyperparameters(self) -> Tensors:
        return [] if self.theta is None else [self.theta]

    def standardised(self, losses: Tensor) -> Tensor:
        """z of eq. sharedloss: the batch-standardised, clipped, detached losses."""
        ell = losses.detach().reshape(-1).to(self.theta.dtype)  # type: ignore[union-attr]
        if ell.numel() < 2:
            return torch.zeros_like(ell)
        z = (ell - ell.mean()) / ell.std().clamp_min(1e-8)
        return z.clamp(-self.clip, self.clip)

    def shift(self, z: Tensor) -> Tensor:
        """s_θ(z) = θᵀφ(z) (differentiable in θ)."""
        theta = self.theta
        assert theta is not None, "bind the parameterisation first"
        return self.basis(z.to(theta.dtype)) @ theta

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        if index is None:  # x is already an effective logit (e.g. a flag rule's component mean)
            return torch.sigmoid(x)
        if losses is None:  # the rows' last visit
            z = self.last_z.index_select(0, index)  # type: ignore[union-attr]
        else:
            z = self.standardised(losses)
            with torch.no_grad():
                self.last_z.index_copy_(0, index, z.to(self.last_z.dtype))  # type: ignore[union-attr]
        return torch.sigmoid(x + self.shift(z).to(x.dtype))

    def effective_logits(self, family: SampleWeights) -> Tensor:
        with torch.no_grad():
            x = family.logits_of().detach()
            return x + self.shift(self.last_z).to(x.dtype)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (
            f"SharedLossWeights(lr={self.lr:g}, betas={self.betas}, clip={self.clip:g}, "
            f"basis={getattr(self.basis, '__name__', self.basis)})"
        )


PARAMETERIZATIONS: dict[str, Callable[[], WeightParameterization]] = {
    "sigmoid": SigmoidWeights,
    "softmax": SoftmaxWeights,
    "shared_loss": SharedLossWeights,
    "natural_sigmoid": NaturalSigmoidWeights,
}


def as_weight_parameterization(value: str | WeightParameterization) -> WeightParameterization:
    """A :class:`WeightParameterization` from its name (``"sigmoid"``, ``"softmax"``) or itself."""
    return as_strategy("parameterization", value, WeightParameterization, PARAMETERIZATIONS)


# ---------------------------------------------------------------------- statistics of all n rows
class Normaliser(ABC):
    """A statistic of all n logits that the weights read, held within a hyper step and kept
    across outer steps: log Z of :class:`SoftmaxWeights` (:class:`SoftmaxNormaliser`), the mean
    logit x̄ of the mean-logit gauge (:class:`MeanLogitGauge`). The family owns one
    (:attr:`SampleWeights.normaliser`) and updates it after every outer step (its projection).

    With dense gradients (every row may move: ``torch.optim.Adam``) it is recomputed after
    every outer step, one pass over the n logits. With row-sparse ones (``sparse_grad=True``:
    the outer optimizer moves only the rows of its gradient, which a minibatch read) it is kept
    from a sum over the rows that moved,

        S = Σᵢ f(xᵢ − m),   S ← S + Σ_{i read} [f(xᵢ − m) − f(xᵢ° − m)],          (eq. keptsum)

    xᵢ° a row's logit when a minibatch read it (:meth:`read` keeps it until the outer step), m
    the statistic at the last full pass (f(z) = z for the mean logit, eᶻ for log Z), in
    float64: O(rows read) per outer step. Once the rows moved since the last full pass reach n
    (about n/b steps of b rows moved: every row read is kept, only those that changed count),
    S is recomputed in one pass, so the amortised cost stays O(rows) and the rounding drift is
    that of at most n/b updates of a float64 sum. So it is wherever the logits were written
    other than by an outer step on the rows read (a checkpoint restored, a ``copy_``: the
    tensor's version counter says so at the next read or step). A due full pass that finds
    the kept statistic off by more than rounding (an optimizer that moved rows it was not
    given, e.g. SGD with momentum on sparse gradients) says so once and recomputes after every
    step from then on. ``full_passes`` counts the passes over the n rows.
    """

    #: S right after a full pass, Σᵢ f(xᵢ − m): 0 for the mean, 1 for log Z
    START: float = 0.0
    #: |kept − recomputed| above DRIFT·(1 + |statistic|): rows moved that were not read
    DRIFT = 1e-9

    def __init__(self, family: SampleWeights) -> None:
        self.family = family
        self.full_passes = 0
        #: False once a full pass found rows moved that no minibatch had read
        self.trusted = True
        self._centre = torch.zeros((), dtype=torch.float64)  # m of eq. keptsum
        self._sum = torch.zeros((), dtype=torch.float64)  # S of eq. keptsum
        self._exact_for: tuple[Any, ...] | None = None  # the logits m and S are exact for
        self._reads: list[tuple[Tensor, Tensor]] = []
        self._read_rows = 0
        self._moved = 0  # rows moved since the last full pass

    # ------------------------------------------------------------------ what it is
    @staticmethod
    @abstractmethod
    def f(z: Tensor) -> Tensor:
        """f of eq. keptsum, elementwise."""

    @abstractmethod
    def statistic_of(self, x: Tensor) -> Tensor:
        """The statistic of all the logits ``x`` (float64), in one pass: m."""

    @abstractmethod
    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        """The statistic from m and S."""

    def in_range(self, total: Tensor) -> bool:
        """Whether S keeps its relative precision (else a full pass re-centres it)."""
        return True

    # ------------------------------------------------------------------ how it is kept
    @property
    def kept(self) -> bool:
        """Whether S is kept from the rows moved (eq. keptsum) rather than recomputed."""
        return self.family.sparse_grad and self.trusted

    def value(self) -> Tensor:
        """The statistic the weights read (float64, a 0-d tensor): that of the logits after the
        last outer step, recomputed where anything else wrote them since."""
        if self._exact_for != self._logits_now():
            self.full_pass()
        return self.value_of(self._centre, self._sum)

    def read(self, index: Tensor, rows: Tensor) -> None:
        """A minibatch reads the rows ``index`` (``rows``: their logits now), which the next
        outer step may move: their values are kept until then (at most n of them)."""
        if not self.kept:
            return
        if self._exact_for != self._logits_now():
            self.full_pass()
        if self._read_rows <= self.family.n:
            self._reads.append((index, rows.detach().clone()))
            self._read_rows += int(index.numel())

    @torch.no_grad()
    def full_pass(self) -> None:
        """m ← the statistic of the n logits, S ← its value at m (``START``): one pass."""
        self._centre = self.statistic_of(self.family.logits.detach().double())
        self._sum = torch.full_like(self._centre, self.START)
        self._settle(moved=0)
        self.full_passes += 1

    def _logits_now(self) -> tuple[Any, ...]:
        """What identifies the logits' values (an in-place write bumps the version)."""
        x = self.family.logits
        return (x._version, x.data_ptr(), x.dtype, x.device)

    def _settle(self, moved: int) -> None:
        self._exact_for = self._logits_now()
        self._reads, self._read_rows, self._moved = [], 0, moved

    @torch.no_grad()
    def update(self) -> None:
        """After an outer step: eq. keptsum over the rows it moved, or a full pass where due."""
        if not self.kept:
            self.step_full()
            return
        if self._exact_for == self._logits_now():
            return  # nothing moved
        if not self._reads or self._read_rows > self.family.n:
            self.step_full()  # written without a read to account for it, or too many reads
            return
        index = torch.cat([i for i, _ in self._reads])
        before = torch.cat([r for _, r in self._reads])
        rows, inverse = torch.unique(index, return_inverse=True)
        old = before.new_empty(rows.shape).scatter_(0, inverse, before).double()
        new = self.family.logits.detach().index_select(0, rows).double()
        total = self._sum + (self.f(new - self._centre) - self.f(old - self._centre)).sum()
        if not bool(torch.isfinite(total)):  # a non-finite step: λ is restored, then re-read
            self._exact_for, self._reads, self._read_rows = None, [], 0
            return
        moved = self._moved + int((new != old).sum())  # rows read that the step moved
        if moved < self.family.n and self.in_range(total):
            self._sum = total
            self._settle(moved)
            return
        kept = self.value_of(self._centre, total)
        exact = self.statistic_of(self.family.logits.detach().double())
        if float((kept - exact).abs()) > self.DRIFT * (1 + float(exact.abs())):
            self._untrusted(kept, exact)
        self.step_full()

    def step_full(self) -> None:
        """After an outer step, one pass over the n rows."""
        self.full_pass()

    def offset(self) -> Tensor | None:
        """A common shift the weights read the stored logits with (None: none)."""
        return None

    def log_partition(self) -> Tensor | None:
        """log Z that softmax weights divide by (float64; None: this statistic is no log Z)."""
        return None

    def release(self) -> None:
        """Before the family stops keeping this statistic (another gauge or gradient)."""
        return None

    def _untrusted(self, kept: Tensor, exact: Tensor) -> None:
        self.trusted = False
        warnings.warn(
            f"{type(self).__name__}: the outer step moved rows of the {self.family.n} logits "
            f"that no minibatch had read (kept {float(kept):.10g}, recomputed "
            f"{float(exact):.10g}): with sparse_grad=True the outer optimizer must move only the "
            "rows of its gradient (LazyAdam, or SGD without momentum). It is recomputed over "
            "all n rows after every outer step from now on.",
            UserWarning,
            stacklevel=2,
        )


class LogitMean(Normaliser):
    """The mean logit x̄ (eq. keptsum with f(z) = z) and x₀, the logit of the starting weight:
    what the mean-logit gauges hold (:class:`MeanLogitGauge` over all rows,
    :class:`ClassMeanLogitGauge` per class)."""

    START = 0.0

    @staticmethod
    def f(z: Tensor) -> Tensor:
        return z

    def statistic_of(self, x: Tensor) -> Tensor:
        return x.mean()

    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        return centre + total / self.family.n

    @property
    def x0(self) -> float:
        family = self.family
        return family.parameterization.logit(family.initial_weight, family.n)


class MeanLogitGauge(LogitMean):
    """The mean logit x̄ that ``SampleWeights(gauge="mean_logit")`` holds at x₀.

    With dense gradients each outer step is followed by the shift x ← x − (x̄ − x₀) of every
    row. With row-sparse ones the shift is held, not applied: the weights read
    ωᵢ = T(xᵢ − c), c = x̄ − x₀ (:meth:`SampleWeights.logits_of`; x̄ kept by eq. keptsum with
    f(z) = z), the same numbers to rounding at O(rows) per step, and c is folded into the
    logits (the shift applied) at each full pass after a step. The stored logits then differ
    from the dense path's by c, one common shift that the self-normalised loss does not see;
    :meth:`SampleWeights.logits_of` and :meth:`SampleWeights.state_dict` give them shifted.
    """

    def offset(self) -> Tensor | None:
        """c = x̄ − x₀, the common shift the weights read the logits with (None: none held,
        the logits are shifted in place)."""
        return self.value() - self.x0 if self.kept else None

    @torch.no_grad()
    def step_full(self) -> None:
        """x ← x − (x̄ − x₀) in place, then x̄ in one pass."""
        x = self.family.logits
        x.sub_(x.mean() - self.x0)
        if self.kept:
            self.full_pass()
        else:  # x̄ = x₀ now; nothing else reads it
            self.full_passes += 1

    @torch.no_grad()
    def release(self) -> None:
        c = self.offset()
        if c is not None and float(c) != 0.0:
            self.family.logits.sub_(c.to(self.family.logits.dtype))


class ClassMeanLogitGauge(LogitMean):
    """Each class's mean logit held at x₀ (:meth:`SampleWeights.use_class_gauge`, the drop-in's
    ``gauge="class"``): after every outer step the rows labelled c are shifted by one common
    amount,

        xᵢ ← xᵢ − (x̄_c − x₀)  for every row i of class c, x̄_c their mean logit,  (eq. classgauge)

    so the weights can still order the examples within a class (a wrong label below a right
    one) but cannot push a whole class down: the weighted class shares stay near the unweighted
    ones, not the prior that the validation objective rewards on a short fit (session 50: 20
    Newsgroups, whole classes at mean ω 0.32–0.35, accuracy 0.64 against plain 0.79). Rows with
    no label yet (not visited) or a negative one are not shifted. ``labels()`` gives each row's
    integer label (a long tensor of shape (n,), negative where none), or None (nothing held).

    The shift is applied in place on both paths (dense and ``sparse_grad``), one pass over the n
    rows per outer step (an ``index_add`` and a subtraction), like the dense mean-logit gauge:
    no shift is held, so the stored logits are the weights' own and every reader (checkpoints
    included) sees them as they are. Sigmoid parameterisations only.
    """

    def __init__(self, family: SampleWeights, labels: Callable[[], Tensor | None]) -> None:
        super().__init__(family)
        self.labels = labels

    def read(self, index: Tensor, rows: Tensor) -> None:
        return None  # nothing kept between steps: every step recomputes the class means

    def _classes(self) -> tuple[Tensor, Tensor] | None:
        """(the labelled rows' mask, their labels), or None where no row has a label."""
        labels = self.labels()
        if labels is None or labels.shape != (self.family.n,):
            return None
        labels = labels.to(self.family.logits.device)
        known = labels >= 0
        return (known, labels[known]) if bool(known.any()) else None

    @torch.no_grad()
    def class_means(self) -> Tensor | None:
        """x̄_c of every class 0..max label (float64; NaN for a class without rows), or None."""
        classes = self._classes()
        if classes is None:
            return None
        known, y = classes
        k = int(y.max()) + 1
        x = self.family.logits.detach()[known].double()
        sums = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, y, x)
        counts = torch.bincount(y, minlength=k).double()
        return sums / counts  # 0/0: NaN for a class with no row

    @torch.no_grad()
    def update(self) -> None:
        """After an outer step: eq. classgauge, in place (one pass over the n rows)."""
        means = self.class_means()
        if means is None:
            return
        known, y = self._classes()  # type: ignore[misc]
        shift = torch.nan_to_num(means - self.x0, nan=0.0)
        x = self.family.logits
        delta = torch.zeros_like(x)
        delta[known] = shift[y].to(x.dtype)
        x.sub_(delta)
        self.full_passes += 1

    def step_full(self) -> None:
        self.update()


class SoftmaxNormaliser(Normaliser):
    """log Z = logsumexp(x) of :class:`SoftmaxWeights`, kept by eq. keptsum with f(z) = eᶻ
    around the last full pass's log Z (S starts at 1; once it leaves [½, 2] a full pass
    re-centres it, so a row's term cannot overflow and the sum keeps its relative precision)."""

    START = 1.0

    @staticmethod
    def f(z: Tensor) -> Tensor:
        return torch.exp(z)

    def statistic_of(self, x: Tensor) -> Tensor:
        return torch.logsumexp(x, 0)

    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        return centre + torch.log(total)

    def in_range(self, total: Tensor) -> bool:
        return 0.5 <= float(total) <= 2.0

    def log_partition(self) -> Tensor:
        return self.value()


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
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigurationError(f"SampleWeights needs a number of rows n ≥ 1, got {n!r}.")
        self.n = n
        self.parameterization = as_weight_parameterization(parameterization)
        self.gauge: Gauge = "batch"
        if initial is None:
            initial = 1.0 if isinstance(self.parameterization, SoftmaxWeights) else 0.5
        self._initial = float(initial)
        x0 = self.parameterization.logit(self._initial, n)
        if logits is None:
            logits = torch.full((n,), x0, dtype=dtype, device=device, requires_grad=True)
        elif not isinstance(logits, Tensor) or logits.shape != (n,) or not logits.is_leaf:
            raise ConfigurationError(
                f"SampleWeights(logits=...) takes a leaf tensor of shape ({n},), e.g. "
                "self.register_hyperparameter('x', torch.zeros(n)) in a BilevelModule."
            )
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

    def use_gauge(self, gauge: Gauge) -> None:
        """Switch how the self-normalised loss's scale is fixed (see ``gauge``)."""
        if gauge == "class":
            raise ConfigurationError(
                "SampleWeights: the class gauge needs each row's label: "
                "use_class_gauge(labels) rather than use_gauge('class')."
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

    def use_class_gauge(self, labels: Callable[[], Tensor | None]) -> None:
        """Hold each class's mean logit at x₀ after every outer step (eq. classgauge,
        :class:`ClassMeanLogitGauge`); ``labels()`` gives each row's integer label (negative:
        none) or None. The weights' gradient is the ``"batch"`` gauge's (the minibatch's exact
        derivative), but for the training batches' cross term (:class:`TrainingCrossTerm`),
        whose u is centred on each row's class (:func:`class_centred`, session 51). Sigmoid
        parameterisations only."""
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
        self._hold(lambda: setattr(self, "gauge", "class"))

    def labels_of(self, index: Tensor) -> Tensor | None:
        """The integer labels the class gauge reads, of the rows ``index`` (negative: none
        yet), or None (no class gauge, or no labels)."""
        if self.gauge != "class":
            return None
        labels = self._class_labels()
        if labels is None or labels.shape != (self.n,):
            return None
        return labels.to(index.device)[index]

    def use_sparse_grad(self, sparse_grad: bool) -> None:
        """Switch between row-sparse and dense gradients of the logits (see ``sparse_grad``)."""

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
        elif self.gauge == "class":
            self.normaliser = ClassMeanLogitGauge(self, self._class_labels)

    @property
    def hyperparameters(self) -> Tensors:
        """``[logits]`` and the parameterisation's own tensors (θ of
        :class:`SharedLossWeights`): what ``SIDHyperOptimizer`` and the outer optimizer learn."""
        return [self.logits, *self.parameterization.hyperparameters]

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
        index = index if index.dim() == 1 else index.reshape(-1)
        index = index.to(device=self.logits.device, dtype=torch.long)
        return index, torch.stack(torch.aminmax(index)) if index.numel() else None

    def accept_index(self, given: Tensor, index: Tensor, low: int, high: int) -> Tensor:
        """``index`` (:meth:`index_bounds` of ``given``), whose entries run from ``low`` to
        ``high``: a clear error where they are not rows of the weights, else kept as checked
        (the same batch's ``given`` is not read again) and returned."""
        if index.numel() and (low < 0 or high >= self.n):
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
        held = self.gauge == "mean_logit"
        return weighted_loss(losses, self.weights(index, losses), normalize, held)

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
        if not isinstance(x, Tensor) or x.shape != self.logits.shape:
            raise ConfigurationError(
                f"saved sample weights of shape {getattr(x, 'shape', None)} do not fit these "
                f"{self.n} rows: the checkpoint belongs to another data set."
            )
        with torch.no_grad():
            self.logits.copy_(x)  # the normaliser sees the write (a full pass at the next read)
        self.parameterization.refresh(self)

    def __repr__(self) -> str:
        return f"SampleWeights(n={self.n}, {self.parameterization!r})"


# ---------------------------------------------------------------------- the outer objective
class ValidationObjective(ABC):
    """E from the per-sample losses ℓⱼ of a validation batch (the outer objective the weights
    are tuned for)."""

    @abstractmethod
    def __call__(self, losses: Tensor) -> Tensor:
        """E (a scalar, differentiable in the losses)."""

    def read(self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]) -> Tensor:
        """What :meth:`__call__` reads from a validation ``batch``: by default the per-sample
        losses (``losses()``, the user's own on that batch); :class:`MarginError` reads the
        logits' margins instead."""
        return losses()


class MeanLoss(ValidationObjective):
    """E = mean ℓⱼ: the validation loss itself (with cross entropy, its calibration too)."""

    def __call__(self, losses: Tensor) -> Tensor:
        return losses.mean()

    def __repr__(self) -> str:
        return "MeanLoss()"


class ExpectedError(ValidationObjective):
    """E = mean (1 − e^{−q ℓⱼ}) / q: with the cross entropy ℓⱼ = −log p_{yⱼ}, GCE's
    (1 − p^q)/q of the validation predictions, and at q = 1 (default) their expected 0-1 error
    1 − p_{yⱼ}:

        E(w) = (1/|V|) Σⱼ (1 − exp(−q ℓⱼ(w))) / q,   ∇E = (1/|V|) Σⱼ e^{−q ℓⱼ} ∇ℓⱼ   (eq. softerr)

    (q → 0: the mean loss; a negative loss is refused). Each validation example's gradient is
    weighted by p_y^q, so the examples the network gets badly wrong (p_y → 0) no longer dominate
    E. Under the cross entropy they do, and a training label that only softens the network
    between two look-alike classes (a T-shirt labelled "shirt") lowers their loss: on the
    noisy-label CNNs such corrupted examples, 42–60 % of them from the ten most look-alike class
    pairs, were the ones the weights kept, and under this E their share of the weighted loss falls
    (Fashion symmetric seed 1: 13.6 → 7.4 %; docs/data_weights.md).
    """

    def __init__(self, q: float = 1.0) -> None:
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and q > 0):
            raise ConfigurationError(f"ExpectedError: q must be a number > 0, got {q!r}.")
        self.q = float(q)

    def __call__(self, losses: Tensor) -> Tensor:
        low = float(losses.detach().min()) if losses.numel() else 0.0  # both checks' one read
        self.refuse_negative(losses, low)
        self.refuse_saturated(losses, self.q, low)
        return (-torch.expm1(-self.q * losses)).mean() / self.q

    #: the largest e^{−qℓⱼ} below which E's gradient is refused as vanished (10⁻⁶ of the mean
    #: loss's); with a cross entropy: every validation example at p_y < (10⁻⁶)^{1/q}
    SATURATED = 1e-6

    @classmethod
    def refuse_saturated(cls, losses: Tensor, q: float, low: float | None = None) -> None:
        """A clear error where every validation example's e^{−qℓⱼ} is below
        :attr:`SATURATED`: E is then flat at 1/q and its gradient Σⱼ e^{−qℓⱼ}∇ℓⱼ vanishes (or
        underflows to exactly 0), so no weight would learn; a loss in other units than −log p
        (a squared error of targets in the tens) does this at the start of the fit. ``low``:
        the smallest loss, where the caller has read it."""
        if low is None:
            low = float(losses.detach().min()) if losses.numel() else 0.0
        if q * low > -math.log(cls.SATURATED):
            raise ConfigurationError(
                f"ExpectedError(q={q:g}) reads each validation loss as −log p of the right "
                f"answer, but the smallest in this batch is {low:.3g}: every e^(−qℓ) is below "
                f"{cls.SATURATED:g}, so E is flat and its gradient vanishes (no weight would "
                "learn). A loss that is not a log-likelihood of labels, e.g. a squared or "
                "absolute error of a regression, needs objective='mean_loss'."
            )

    @staticmethod
    def refuse_negative(losses: Tensor, low: float | None = None) -> None:
        """A clear error for a negative validation loss (e^(−ℓ) is then no probability).
        ``low``: the smallest loss, where the caller has read it (no second read)."""
        negative = low < 0 if low is not None else bool((losses.detach() < 0).any())
        if negative:
            raise ConfigurationError(
                f"ExpectedError reads each validation loss as −log p of the right answer (≥ 0), "
                f"but got a negative one ({float(losses.detach().min()):.3g}): e^(−ℓ) is then "
                "no probability and its gradient grows without bound. Use objective='mean_loss' "
                "for such a loss (e.g. a Gaussian negative log-likelihood)."
            )

    def __repr__(self) -> str:
        return f"ExpectedError(q={self.q})"


class KeptEvidenceError(ValidationObjective):
    """ExpectedError whose q each validation batch chooses: the largest q ≤ ``q_max`` whose
    weights p_y^q = e^{−qℓⱼ} keep at least a share κ of the batch's evidence, measured by their
    effective sample size,

        ESS(q) = (Σⱼ e^{−qℓⱼ})² / Σⱼ e^{−2qℓⱼ},   q* = max {q ∈ [0, q_max] : ESS(q) ≥ κ|V|},
        E(w) = (1/|V|) Σⱼ (1 − exp(−q* ℓⱼ(w))) / q*   (q* held fixed; q* = 0: the mean loss)
                                                                            (eq. keptevidence)

    ESS(0) = |V| and ESS falls as q grows (d log ESS/dq = 2(E_{2q}[ℓ] − E_q[ℓ]) ≤ 0, the
    tilted mean of ℓ falling in the tilt), so q* is well defined. A well-fit validation batch
    (every p_y high, the weights nearly equal) keeps q* = q_max: :class:`ExpectedError`
    ``(q_max)``. A poorly fit one, whose p_y^q_max would hand most of the gradient to the few
    examples already right, slides toward q = 0, the mean loss (:class:`MeanLoss`), which keeps
    every example's evidence. q* is searched on ``grid`` + 1 equally spaced values of [0, q_max]
    in one tensor operation (no host synchronisation) and is not differentiated. ``q``: the q*
    of the last batch (q_max before the first); ``qs``: every batch's q* so far (a list of
    0-d tensors, read after the fit).
    """

    def __init__(self, q_max: float = 0.5, kappa: float = 0.5, grid: int = 64) -> None:
        if not (isinstance(q_max, (int, float)) and not isinstance(q_max, bool) and q_max > 0):
            raise ConfigurationError(
                f"KeptEvidenceError: q_max must be a number > 0, got {q_max!r}."
            )
        if not (isinstance(kappa, (int, float)) and not isinstance(kappa, bool) and 0 < kappa <= 1):
            raise ConfigurationError(
                f"KeptEvidenceError: kappa (the share of the validation batch's effective sample "
                f"size to keep) must lie in (0, 1], got {kappa!r}."
            )
        if not (isinstance(grid, int) and not isinstance(grid, bool) and grid >= 1):
            raise ConfigurationError(f"KeptEvidenceError: grid must be an int ≥ 1, got {grid!r}.")
        self.q_max, self.kappa, self.grid = float(q_max), float(kappa), grid
        self.qs: list[Tensor] = []

    @property
    def q(self) -> float:
        """q* of the last validation batch (q_max before the first)."""
        return float(self.qs[-1]) if self.qs else self.q_max

    def choose_q(self, losses: Tensor) -> Tensor:
        """q* of eq. keptevidence for these losses (0-d, detached)."""
        ell = losses.detach().reshape(-1).to(torch.float64)
        candidates = torch.linspace(
            0.0, self.q_max, self.grid + 1, dtype=ell.dtype, device=ell.device
        )
        log_w = -candidates[:, None] * (ell - ell.min())[None, :]  # shift: ESS is scale-free
        log_ess = 2 * torch.logsumexp(log_w, 1) - torch.logsumexp(2 * log_w, 1)
        keep = log_ess >= math.log(self.kappa * ell.numel()) - 1e-12
        keep[0] = True  # ESS(0) = |V|
        return candidates[keep.cumprod(0).sum() - 1].to(losses.dtype)

    def __call__(self, losses: Tensor) -> Tensor:
        ExpectedError.refuse_negative(losses)
        q = self.choose_q(losses)
        self.qs.append(q)
        safe = torch.where(q > 0, q, torch.ones_like(q))
        soft = -torch.expm1(-safe * losses) / safe
        return torch.where(q > 0, soft, losses).mean()

    def __repr__(self) -> str:
        return f"KeptEvidenceError(q_max={self.q_max}, kappa={self.kappa})"


class MarginError(ValidationObjective):
    """E = the validation predictions' 0-1 error smoothed in the logit margin:

        mⱼ = z_{yⱼ} − max_{k≠yⱼ} z_k,   E(w) = (1/|V|) Σⱼ σ(−mⱼ/τ),
        ∇E = −(1/|V|) Σⱼ σ'(mⱼ/τ)/τ · (∇z_{yⱼ} − ∇z_{kⱼ*})                    (eq. marginerr)

    (τ → 0: the error count; kⱼ* the top rival). Unlike the cross entropy and
    :class:`ExpectedError`, each validation example's gradient reads only its label against its
    top rival, weighted by a kernel symmetric about the decision boundary (m = 0): a training
    label that moves probability from class a to b gains on the validation examples of b just
    wrong and loses on those of a just right by the same weight, so softening the network
    between two look-alike classes is not rewarded for its own sake (under the cross entropy the
    wrong side weighs 1 − p_y, the right side almost 0). It reads the logits, not the losses:
    ``logits(module, batch) -> (z, y)`` (default ``module(batch[0]), batch[1]``; z of shape
    (B, C), C ≥ 2, y integer labels); a ``validation_loss=`` given to the drop-in must then
    return the per-sample margins itself.
    """

    def __init__(
        self,
        tau: float = 1.0,
        logits: Callable[[Any, Any], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau > 0):
            raise ConfigurationError(
                f"{type(self).__name__}: tau (the margin's temperature, in logit units) must be "
                f"a number > 0, got {tau!r}."
            )
        if logits is not None and not callable(logits):
            raise ConfigurationError(
                f"{type(self).__name__}: logits must be a callable (module, batch) -> (logits, "
                f"labels), got {type(logits).__name__}."
            )
        self.tau, self.logits = float(tau), logits

    def read(self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]) -> Tensor:
        if self.logits is not None:
            z, y = self.logits(module, batch)
        else:
            if not (isinstance(batch, (tuple, list)) and len(batch) >= 2):
                raise ConfigurationError(
                    f"{type(self).__name__} reads (inputs, labels) from the validation batch, "
                    f"got a {type(batch).__name__}: give logits=lambda module, batch: "
                    "(logits, labels)."
                )
            z, y = module(batch[0]), batch[1]
        return self.margins(z, y)

    def margins(self, z: Tensor, y: Tensor) -> Tensor:
        """mⱼ = z_{yⱼ} − max_{k≠yⱼ} z_k of logits z (B, C) and integer labels y (B,)."""
        if not isinstance(z, Tensor) or z.dim() != 2 or z.shape[1] < 2:
            shape = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ConfigurationError(
                f"{type(self).__name__}: the validation logits must have shape (batch, classes) "
                f"with ≥ 2 classes, got {shape}: give logits=lambda module, batch: (logits, "
                "labels)."
            )
        _check_class_labels(
            type(self).__name__,
            y,
            z.shape[:1],
            "give logits=lambda m, b: (m(b[0]), b[1].argmax(1))",
        )
        z_y = z.gather(1, y[:, None]).squeeze(1)
        rival = z.scatter(1, y[:, None], float("-inf")).amax(1)
        return z_y - rival

    def temperature(self, margins: Tensor) -> Tensor | float:
        """τ of eq. marginerr for this batch (fixed here)."""
        return self.tau

    def __call__(self, margins: Tensor) -> Tensor:
        return torch.sigmoid(-margins / self.temperature(margins)).mean()

    def __repr__(self) -> str:
        return f"MarginError(tau={self.tau})"


class AdaptiveMarginError(MarginError):
    """:class:`MarginError` whose τ each validation batch takes from its own margins: ∇E of
    eq. marginerr is a kernel estimate (logistic kernel, standard deviation πτ/√3) of the margins'
    density at the decision boundary, times their direction, so τ is set by Silverman's rule for
    that kernel's bandwidth,

        h = 0.9 · min(sd(m), IQR(m)/1.34) · |V|^{−1/5},   τ = √3 h / π   (held fixed; eq. marginbw)

    floored at ``min_tau``: the same smoothing relative to the margins' spread early in the fit
    (small logits) and late (large ones), where a fixed τ first counts every example and then
    only the few at the boundary. ``last_tau``: τ of the last batch (0-d; ``None`` before the
    first). Measured worse than the default on the noisy-label screen (−7.6 / −4.1 points on
    MNIST / Fashion-MNIST symmetric 40 %, seeds 1–2; docs/data_weights.md, session 43): kept for
    the record, not for use.
    """

    def __init__(
        self,
        min_tau: float = 0.05,
        logits: Callable[[Any, Any], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        super().__init__(min_tau, logits)
        self.min_tau = float(min_tau)
        self.last_tau: Tensor | None = None

    def temperature(self, margins: Tensor) -> Tensor:
        m = margins.detach().reshape(-1).to(torch.float64)
        n = m.numel()
        sd = m.std() if n > 1 else m.new_zeros(())
        iqr = (torch.quantile(m, 0.75) - torch.quantile(m, 0.25)) / 1.34
        spread = torch.where(iqr > 0, torch.minimum(sd, iqr), sd)
        tau = (math.sqrt(3) / math.pi) * 0.9 * spread * n ** (-0.2)
        self.last_tau = tau.clamp_min(self.min_tau).to(margins.dtype)
        return self.last_tau

    def __repr__(self) -> str:
        return f"AdaptiveMarginError(min_tau={self.min_tau})"


def _check_class_labels(who: str, y: Any, shape: torch.Size, one_hot_fix: str) -> None:
    """Validation labels as integer class indices of ``shape`` (one per validation example)."""
    if not isinstance(y, Tensor) or y.dtype.is_floating_point or y.shape != shape:
        got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise ConfigurationError(
            f"{who}: the validation labels must be integer class indices of shape "
            f"{tuple(shape)}, one per validation example, got {got}"
            + (f" of {y.dtype}" if isinstance(y, Tensor) else "")
            + f" (one-hot labels: {one_hot_fix})."
        )


class LabelledLosses(NamedTuple):
    """Per-sample validation losses with the batch's integer labels (what
    :class:`ClassRelativeError` reads)."""

    losses: Tensor
    labels: Tensor


class ClassRelativeError(ValidationObjective):
    """E = the mean over the batch's classes of the log of each class's expected error, each
    shrunk toward the batch's error by one pseudo-example:

        eⱼ = (1 − e^{−qℓⱼ})/q,   Ē_c = (Σ_{j: yⱼ=c} eⱼ + ē) / (n_c + 1),   ē = mean eⱼ (held fixed),
        E(w) = (1/|C|) Σ_{c ∈ C} log Ē_c,   ∇E = (1/|C|) Σ_c Σ_{j: yⱼ=c} ∇eⱼ / ((n_c + 1) Ē_c)
                                                                              (eq. classrel)

    (C: the classes present in the batch; q = 0.5 by default: the per-example error of
    :class:`ExpectedError` ``(0.5)``). Each class counts by its *relative* change in error, so a
    training label that moves a look-alike pair's boundary toward the harder class a (large
    Ē_a) at the cost of the easier b gains δ/Ē_a and loses δ/Ē_b: softening between two classes
    pays only where it lowers the pair's errors in proportion, not because the hard class's
    examples dominate the mean (under :class:`ExpectedError` and the cross entropy the gain and
    the loss count in absolute terms, and the hard classes' examples carry most of ∇E). The
    pseudo-example keeps a class whose few validation examples of the batch are all right from
    dividing by ≈ 0. Reads the labels as ``batch[1]`` (or ``labels(batch)``); the per-sample losses
    are the user's own (a negative one is refused, as by :class:`ExpectedError`).
    """

    def __init__(self, q: float = 0.5, labels: Callable[[Any], Tensor] | None = None) -> None:
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and q > 0):
            raise ConfigurationError(f"ClassRelativeError: q must be a number > 0, got {q!r}.")
        if labels is not None and not callable(labels):
            raise ConfigurationError(
                f"ClassRelativeError: labels must be a callable batch -> integer labels, got "
                f"{type(labels).__name__}."
            )
        self.q, self.labels = float(q), labels

    def read(
        self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]
    ) -> LabelledLosses:
        if self.labels is not None:
            y = self.labels(batch)
        elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
            y = batch[1]
        else:
            raise ConfigurationError(
                f"ClassRelativeError reads the labels as batch[1], got a {type(batch).__name__}: "
                "give labels=lambda batch: ..."
            )
        return LabelledLosses(losses(), y)

    def __call__(self, read: LabelledLosses) -> Tensor:  # type: ignore[override]
        if not isinstance(read, LabelledLosses):
            raise ConfigurationError(
                "ClassRelativeError needs the validation labels with the losses (read() gives "
                f"both), got a {type(read).__name__}: a validation_loss= returning per-sample "
                "losses cannot be used with it; drop validation_loss= (it then reads "
                "training_step's losses and the labels batch[1], or labels=)."
            )
        losses, y = read
        losses = losses.reshape(losses.shape[0], -1).mean(1) if losses.dim() > 1 else losses
        _check_class_labels(
            "ClassRelativeError", y, losses.shape, "labels=lambda batch: batch[1].argmax(1)"
        )
        ExpectedError.refuse_negative(losses)
        e = -torch.expm1(-self.q * losses) / self.q
        classes, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
        sums = e.new_zeros(classes.shape[0]).index_add(0, inverse, e)
        per_class = (sums + e.detach().mean()) / (counts.to(e.dtype) + 1)
        return per_class.log().mean()

    def __repr__(self) -> str:
        return f"ClassRelativeError(q={self.q})"


#: objectives by name (``LearnedDataWeights(objective=...)``)
OBJECTIVES: dict[str, Callable[[], ValidationObjective]] = {
    "mean_loss": MeanLoss,
    "expected_error": ExpectedError,
    "kept_evidence": KeptEvidenceError,
    "margin_error": MarginError,
    "adaptive_margin_error": AdaptiveMarginError,
    "class_relative_error": ClassRelativeError,
}


def as_validation_objective(value: str | ValidationObjective) -> ValidationObjective:
    """A :class:`ValidationObjective` from its name (``"mean_loss"``, ``"expected_error"``,
    ``"kept_evidence"``, ``"margin_error"``, ``"adaptive_margin_error"``,
    ``"class_relative_error"``)."""
    return as_strategy(
        "the validation objective", value, ValidationObjective, OBJECTIVES, "ExpectedError(q=0.7)"
    )


# ---------------------------------------------------------------------- which rows to flag
class FlagRule(ABC):
    """Which rows of a :class:`SampleWeights` count as flagged (distrusted)."""

    @abstractmethod
    def flags(self, weights: SampleWeights) -> Tensor:
        """A boolean mask over the n rows."""


class BelowWeight(FlagRule):
    """ω < ``threshold`` (default: half the initial weight ω₀)."""

    def __init__(self, threshold: float | None = None) -> None:
        self.threshold = threshold

    def flags(self, weights: SampleWeights) -> Tensor:
        threshold = self.threshold
        if threshold is None:
            threshold = 0.5 * weights.initial_weight
        return weights.values() < threshold

    def __repr__(self) -> str:
        return f"BelowWeight({self.threshold!r})"


class TwoComponentSplit(FlagRule):
    """The rows of the lower of two Gaussian components fitted to the learned logits x by EM
    (each component its own mean, spread and share):

        flagged ⇔ P(low | xᵢ) > ½ and xᵢ < μ_high,

    where the two components are separated, Ashman's D = √2 |μ_high − μ_low| / √(σ²_low +
    σ²_high) ≥ ``min_separation`` (a bimodal split; a single bump gives D < 2), and the low
    component's weight ω(μ_low) lies below ω₀ (its rows' weights went down). Otherwise no row
    is flagged.

    The logits are clipped to ±``clip`` first (σ(±10) is within 5·10⁻⁵ of 0 or 1): a solver
    whose logits run off to ±100s, the weights long saturated, would otherwise hand the fit a
    few far tails that dwarf the two bumps. It reads only where the logits sit relative to
    each other, not how far each moved: with
    an outer step of about ±1 per visit and no momentum (``LazyAdam(betas=(0, ·))``), a clean
    example's logit random-walks around its start while a corrupted one's drifts down, and a
    fixed threshold on ω (:class:`BelowWeight`) catches the clean random walk's lower tail
    once it has walked far enough; the split places the boundary between the corrupted
    examples' bump and the clean examples' spread, wherever they are.
    """

    def __init__(
        self, min_separation: float = 2.0, clip: float = 10.0, iterations: int = 200
    ) -> None:
        if not min_separation >= 0:
            raise ConfigurationError(
                f"TwoComponentSplit: min_separation must be ≥ 0, got {min_separation!r}."
            )
        if not clip > 0:
            raise ConfigurationError(f"TwoComponentSplit: clip must be > 0, got {clip!r}.")
        self.min_separation, self.clip, self.iterations = (
            float(min_separation),
            float(clip),
            int(iterations),
        )

    def flags(self, weights: SampleWeights) -> Tensor:
        x = weights.parameterization.effective_logits(weights)
        x = x.to(torch.float64).reshape(-1).clamp(-self.clip, self.clip)
        none = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
        if x.numel() < 4 or not bool(x.std() > 0):
            return none
        low, (mu, sd) = self.fit(x)
        lo, hi = int(mu.argmin()), int(mu.argmax())
        separation = math.sqrt(2) * float(mu[hi] - mu[lo]) / float(sd.pow(2).sum().sqrt())
        omega_low = weights.parameterization.rows(mu[lo : lo + 1].to(x.dtype), weights)
        if separation < self.min_separation or not float(omega_low) < weights.initial_weight:
            return none
        return low & (x < mu[hi])

    def fit(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """EM for a two-component 1-D Gaussian mixture from the 10 % / 90 % quantiles: the mask
        P(low | x) > ½ and the components' (means, spreads); a spread never falls below 5 %
        of x's (rows that never moved sit at one value)."""
        floor = 0.05 * float(x.std())
        mu = torch.quantile(x, torch.tensor([0.1, 0.9], dtype=x.dtype, device=x.device))
        sd = x.std().repeat(2)
        share = torch.full((2,), 0.5, dtype=x.dtype, device=x.device)
        for _ in range(self.iterations):
            z = (x[:, None] - mu) / sd
            resp = torch.softmax(-0.5 * z * z - sd.log() + share.log(), dim=1)
            total = resp.sum(0).clamp_min(1e-12)
            new_mu = (resp * x[:, None]).sum(0) / total
            sd = ((resp * (x[:, None] - new_mu) ** 2).sum(0) / total).sqrt().clamp_min(floor)
            share = total / x.numel()
            done = bool((new_mu - mu).abs().max() < 1e-9 * (1 + float(mu.abs().max())))
            mu = new_mu
            if done:
                break
        return resp[:, int(mu.argmin())] > 0.5, (mu, sd)

    def __repr__(self) -> str:
        return f"TwoComponentSplit(min_separation={self.min_separation:g})"


FLAG_RULES: dict[str, Callable[[], FlagRule]] = {
    "split": TwoComponentSplit,
    "below_half": BelowWeight,
}


def as_flag_rule(rule: FlagRule | str | float | None) -> FlagRule:
    """A :class:`FlagRule`: ``None`` → :class:`TwoComponentSplit`, a number t → ω < t
    (:class:`BelowWeight`), a name (``"split"``, ``"below_half"``) or the rule itself."""
    if rule is None:
        return TwoComponentSplit()
    if isinstance(rule, (int, float)) and not isinstance(rule, bool):
        return BelowWeight(float(rule))
    return as_strategy("the flag rule", rule, FlagRule, FLAG_RULES, "0.25 or TwoComponentSplit()")


def class_weights(
    num_classes: int, parameterization: str | WeightParameterization = "sigmoid", **kwargs: Any
) -> SampleWeights:
    """One weight per class (imbalance): a :class:`SampleWeights` indexed by the labels
    (``weights.weighted_mean(losses, y)``)."""
    return SampleWeights(num_classes, parameterization, **kwargs)


def weighted_loss(
    losses: Tensor, weights: Tensor, normalize: bool = False, hold_normaliser: bool = False
) -> Tensor:
    """Σᵢ ωᵢℓᵢ / Σᵢ ωᵢ (``normalize``) or (1/b) Σᵢ ωᵢℓᵢ (eq. weighted) of per-sample losses.

    ``hold_normaliser`` (with ``normalize``): the same value and the same gradient in w, but
    Σᵢ ωᵢ is a constant for the weights' gradient, which is then ω′ᵢℓᵢ / Σ ω instead of
    ω′ᵢ(ℓᵢ − ℓ̂) / Σ ω: the minibatch's centre ℓ̂ is left to a global gauge
    (:attr:`SampleWeights.gauge`)."""
    weights = weights.to(losses.dtype)
    if normalize:
        total = weights.sum().clamp_min(1e-12)
        return (weights * losses).sum() / (total.detach() if hold_normaliser else total)
    return (weights * losses).mean()


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


def check_per_sample(losses: Any, index: Tensor) -> Tensor:
    """``losses`` as a (b,) tensor matching ``index``, or a clear error (a reduced loss)."""
    if not isinstance(losses, Tensor):
        raise ConfigurationError(
            f"per-sample weights need a tensor of per-sample losses, got {type(losses).__name__}."
        )
    b = int(index.numel()) if isinstance(index, Tensor) else len(index)
    if losses.dim() == 0 or (losses.numel() == 1 and b > 1):
        raise ConfigurationError(
            "the loss is already reduced to a scalar, so it cannot be weighted per sample: "
            "compute it with reduction='none' (e.g. F.cross_entropy(logits, y, reduction='none')) "
            "and return the vector of per-sample losses."
        )
    if losses.dim() > 1:
        losses = losses.reshape(losses.shape[0], -1).mean(1)
    if losses.shape[0] != b:
        raise ConfigurationError(
            f"{losses.shape[0]} per-sample losses for a batch of {b} indexed samples: return one "
            "loss per sample (reduction='none', not 'mean' or 'sum')."
        )
    return losses


# ---------------------------------------------------------------------- the lazy outer step
def _per_row(x: Tensor, p: Tensor) -> Tensor:
    """A per-row factor ``x`` (shape ``(rows,)``) in ``p``'s dtype, shaped to scale rows of
    ``p`` (no view for a vector: each is one more operation at every step)."""
    x = x.to(p.dtype)
    return x if p.dim() == 1 else x.view((-1,) + (1,) * (p.dim() - 1))


class LazyAdam(torch.optim.Optimizer):
    """Adam that moves only the rows whose gradient is non-zero (TensorFlow's LazyAdam).

    Dense Adam keeps moving every row by its momentum after the row's last minibatch, which for
    per-sample weights means all n rows change at every hyper step; here a row moves only when a
    minibatch reads it, with Adam's bias correction counted per row (its own number of visits).
    The cost is a scan for the non-zero rows plus O(rows read) arithmetic; the state (m, v, the
    visit counts) is O(n) storage. ``row_scale=False`` divides by one running RMS of the
    gradients of all rows read instead of each row's own (a row visited once then moves by
    lr·gᵢ/RMS, keeping how large its gradient was, not by ±lr whatever its size).
    ``row_scale="batch"`` divides by the RMS of this step's gradients over the rows read:

        xᵢ ← xᵢ − lr · m̂ᵢ / RMS_{j read}(gⱼ),                                  (eq. batchscale)

    so the rows of one minibatch keep the ratios of their evidence (an example the validation
    data barely cares about moves little beside one it clearly contradicts) and every step has
    RMS lr whatever the hypergradient's scale at that point of the training. Works on dense
    gradients (what ``SIDHyperOptimizer`` writes) and on sparse ones.

    ``scale_prior`` = k > 0 (with ``row_scale=True``) shrinks each row's second moment toward
    the running mean square V̄ of all rows read, as k pseudo-visits of a prior:

        sᵢ² = (tᵢ v̂ᵢ + k V̄) / (tᵢ + k),   xᵢ ← xᵢ − lr · m̂ᵢ / sᵢ,               (eq. scaleprior)

    so a row visited a few times whose hypergradients are small beside the population's moves
    little (not ±lr at its first visit whatever its size), while its own scale takes over as
    its visits accumulate (k = 0: each row's own, k → ∞: ``row_scale=False``).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        row_scale: bool | Literal["batch"] = True,
        scale_prior: float = 0.0,
    ) -> None:
        if not scale_prior >= 0:
            raise ConfigurationError(f"LazyAdam: scale_prior must be ≥ 0, got {scale_prior!r}.")
        if not lr > 0:
            raise ConfigurationError(f"LazyAdam: lr must be > 0, got {lr!r}.")
        if row_scale not in (True, False, "batch"):
            raise ConfigurationError(
                f"LazyAdam: row_scale must be True, False or 'batch', got {row_scale!r}."
            )
        if not (
            isinstance(betas, (tuple, list))
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
        ):
            raise ConfigurationError(
                f"LazyAdam: betas must be two numbers in [0, 1) (β₁, β₂), got {betas!r}."
            )
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "row_scale": row_scale,
            "scale_prior": float(scale_prior),
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()
                    rows, values = g.indices()[0], g.values()
                else:
                    flat = g.reshape(g.shape[0], -1) if g.dim() > 1 else g.reshape(-1, 1)
                    rows = torch.nonzero(flat.ne(0).any(1)).flatten()
                    values = g.index_select(0, rows)
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["visits"] = torch.zeros(p.shape[0], dtype=torch.float64, device=p.device)
                if rows.numel() == 0:
                    continue
                if b1 == 0:  # m = 0·m + 1·g = g and its bias correction 1 − 0ᵗ = 1, exactly
                    m = values
                else:
                    m = state["exp_avg"].index_select(0, rows).mul_(b1)
                    m.add_(values, alpha=1 - b1)
                v = state["exp_avg_sq"].index_select(0, rows).mul_(b2)
                v.addcmul_(values, values, value=1 - b2)
                t = state["visits"].index_select(0, rows).add_(1)
                state["exp_avg"].index_copy_(0, rows, m)
                state["exp_avg_sq"].index_copy_(0, rows, v)
                state["visits"].index_copy_(0, rows, t)
                shape = (-1,) + (1,) * (p.dim() - 1)
                m_hat = m if b1 == 0 else m / _per_row(1 - b1**t, p)
                row_scale = group.get("row_scale", True)
                if row_scale == "batch":  # eq. batchscale: one scale, this step's rows
                    scale = values.pow(2).mean().sqrt()
                elif row_scale:
                    c2 = _per_row(1 - b2**t, p)
                    scale = (v / c2).sqrt()
                    k = group.get("scale_prior", 0.0)
                    if k > 0:  # eq. scaleprior: k pseudo-visits of the population's scale
                        prior = self._shared_scale(state, values, b2).pow(2)
                        tt = t.to(p.dtype).view(shape)
                        scale = ((tt * scale.pow(2) + k * prior) / (tt + k)).sqrt()
                else:  # one scale for all rows: a row's step keeps its gradient's magnitude
                    scale = self._shared_scale(state, values, b2)
                update = m_hat / (scale + group["eps"])
                p.index_add_(0, rows, update, alpha=-group["lr"])
        return loss

    @staticmethod
    def _shared_scale(state: dict[str, Any], values: Tensor, beta2: float) -> Tensor:
        """√ of a bias-corrected running mean of the squared gradients of all rows read."""
        mean_sq = values.double().pow(2).mean()
        if "shared_sq" not in state:
            state["shared_sq"] = torch.zeros((), dtype=torch.float64, device=values.device)
            state["shared_steps"] = torch.zeros((), dtype=torch.float64, device=values.device)
        state["shared_sq"].mul_(beta2).add_(mean_sq, alpha=1 - beta2)
        state["shared_steps"].add_(1)
        corrected = state["shared_sq"] / (1 - beta2 ** state["shared_steps"])
        return corrected.sqrt().to(values.dtype)


# ---------------------------------------------------------------------- the training's cross term
def directional_losses(
    losses: Callable[..., Tensor], params: Sequence[Tensor], tangents: Sequence[Tensor]
) -> Tensor:
    """uᵢ = ⟨∇_w ℓᵢ(w), v⟩ for every sample at once: one forward-mode pass (dual numbers w + εv
    through the per-sample losses ``losses(*params) -> (b,)``), no per-sample gradients.
    ``losses`` must compute from the tensors it is given (not from captured parameters)."""
    import torch.autograd.forward_ad as fwAD

    with torch.no_grad(), fwAD.dual_level():
        duals = [fwAD.make_dual(p.detach(), t.detach()) for p, t in zip(params, tangents)]
        u = fwAD.unpack_dual(losses(*duals)).tangent
    if u is None:  # the losses do not read the parameters
        raise ConfigurationError(
            "directional_losses: the per-sample losses do not depend on the parameters given: "
            "compute them from the tensors passed to the function."
        )
    return u.detach()


class DirectionalDerivative(ABC):
    """How the training batch's cross term gets uᵢ = ⟨∇_w ℓᵢ(w), v⟩ for every sample (a
    strategy of :class:`TrainingCrossTerm`'s callers: :class:`ForwardMode` or
    :class:`ForwardDifference`).

    ``losses(*params) -> (b,)`` computes the per-sample losses from the tensors it is given;
    ``at`` (optional) is ℓ(w), the losses the training step already computed at ``params``
    (with the same randomness that ``losses`` replays)."""

    @abstractmethod
    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor: ...


class ForwardMode(DirectionalDerivative):
    """uᵢ = ⟨∇ℓᵢ(w), v⟩ exactly (to rounding), by one forward-mode (dual-number) pass:
    :func:`directional_losses`. Costs about 2 plain forwards (about a training step on a small
    CNN, 1.5 on an MLP); ``at`` is not used. Autocast is switched off for the pass (a
    dual-number matmul under autocast mixes a 16-bit primal with a 32-bit tangent)."""

    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor:
        with contextlib.ExitStack() as stack:
            for device in {p.device.type for p in params} | {"cpu"}:
                stack.enter_context(torch.autocast(device, enabled=False))
            try:
                return directional_losses(losses, params, tangents)
            except NotImplementedError as err:
                if "forward AD" not in str(err):
                    raise
                raise ConfigurationError(
                    f"ForwardMode: the training step's forward runs an operation torch has no "
                    f"forward-mode (dual-number) derivative for ({err}); the weight_norm and "
                    "spectral_norm parametrizations run such operations. Use "
                    "directional=ForwardDifference() (the drop-in's default; float32 "
                    "parameters, no autocast), or cross_term='hyper_step' (the cross term by "
                    "reverse mode, in the hyper steps only)."
                ) from err

    def __repr__(self) -> str:
        return "ForwardMode()"


#: parameter dtypes whose rounding makes a forward difference meaningless (half precision)
_LOW_PRECISION = (torch.float16, torch.bfloat16)


@torch.no_grad()
def _norm_tensor(tensors: Sequence[Tensor]) -> Tensor:
    """‖(t₁, …, tₖ)‖ over a non-empty set of tensors, each in its own dtype, as a float32
    tensor on their device, not read (one dispatch for all of them where they share a dtype
    and device: it runs at every training step)."""
    tensors = list(tensors)
    if len({(t.dtype, t.device) for t in tensors}) == 1 and not tensors[0].is_sparse:
        norms = torch._foreach_norm(tensors)
    else:
        norms = [torch.linalg.vector_norm(t) for t in tensors]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def _norm(tensors: Sequence[Tensor]) -> float:
    """:func:`_norm_tensor` read (0 for no tensor)."""
    return float(_norm_tensor(tensors)) if tensors else 0.0


#: a norm kept for the tensors it was read of, at their versions (an in-place change, such as
#: the optimizer's step on w, makes it stale)
_Kept = tuple[list[tuple[Tensor, int]], float]


def _kept(kept: _Kept | None, tensors: Sequence[Tensor]) -> float | None:
    """The norm ``kept``, where it was read of ``tensors`` as they are now (else None)."""
    if kept is None or len(kept[0]) != len(tensors):
        return None
    if all(a is b and u == b._version for (a, u), b in zip(kept[0], tensors)):
        return kept[1]
    return None


def _keep(tensors: Sequence[Tensor], norm: float) -> _Kept:
    return [(t, t._version) for t in tensors], norm


@torch.no_grad()
def _moved(params: Sequence[Tensor], tangents: Sequence[Tensor], h: float) -> list[Tensor]:
    """w + h·v, one fused add per tensor (a temporary h·v doubles the time on an MLP), in one
    dispatch for all of them where they share a dtype and a device (a launch-bound GPU pays for
    each)."""
    params, tangents = list(params), list(tangents)
    kinds = {(t.dtype, t.device, t.layout) for t in (*params, *tangents)}
    if len(kinds) == 1 and next(iter(kinds))[2] == torch.strided:
        return list(torch._foreach_add(params, tangents, alpha=h))
    return [torch.add(p, t.to(p.dtype), alpha=h) for p, t in zip(params, tangents)]


class ForwardDifference(DirectionalDerivative):
    """uᵢ ≈ (ℓᵢ(w + hv) − ℓᵢ(w)) / h (eq. fdcross), reusing ℓ(w) that the training step already
    computed: ONE no-grad forward at w + hv per training batch instead of a dual-number pass.

    The step h is relative to the scales of w and v over the whole parameter set,

        h·‖v‖ = c·max(‖w‖, 1)   (c = ``relative_step``),

    so it works at any scale of v and of a network's weights (the floor at 1: the losses do
    not vanish with w, so a step shrunk with a near-zero w would drown in their rounding).
    The default c = √ε of the parameters' dtype (3.5e-4 in float32, 1.5e-8 in float64)
    balances the O(h·vᵀ∇²ℓᵢv) truncation against the O(ε·|ℓᵢ|/h) rounding of the difference.

    Where a difference of losses cannot be accurate it falls back to :class:`ForwardMode` and
    says so once (a ``UserWarning``): half/bfloat16 parameters, or an autocast
    (mixed-precision) region around the call, whose 16-bit matmuls round ℓ to ~1e-3.

    The caller must evaluate ``losses`` with the same randomness (dropout masks) as ``at``,
    and leave normalisation statistics untouched (the Lightning drop-in replays the training
    step's RNG state in a forked stream and swaps BatchNorm's buffers for copies). That
    assumption is watched while it runs: at the first call and every ``check_every`` calls after
    it, ``losses`` is evaluated once more at w itself, and where it does not give back ``at``
    (to ``REPRODUCIBLE_RTOL`` of the losses' scale: randomness outside torch's generator, e.g. a
    mixup drawn with numpy, or a forward that changes state) the difference would be that
    randomness divided by h, not ⟨∇ℓᵢ, v⟩: it says so once and uses :class:`ForwardMode` from
    then on (one more forward every ``check_every`` batches, 2 % at the default)."""

    #: recomputed losses at w must match the step's own to this fraction of their scale
    REPRODUCIBLE_RTOL = 1e-3

    def __init__(self, relative_step: float | None = None, check_every: int = 50) -> None:
        if relative_step is not None and not (0.0 < float(relative_step) < 1.0):
            raise ConfigurationError(
                f"ForwardDifference: relative_step must be in (0, 1) (the step h·‖v‖ relative "
                f"to ‖w‖), got {relative_step!r}; None picks √ε of the parameters' dtype."
            )
        if int(check_every) < 1:
            raise ConfigurationError(
                f"ForwardDifference: check_every must be a positive number of calls between "
                f"reproducibility checks, got {check_every!r}."
            )
        self.relative_step = None if relative_step is None else float(relative_step)
        self.check_every = int(check_every)
        self.fallback = ForwardMode()
        self._warned = False
        self._calls = 0
        self._unreproducible: str | None = None
        self._v_norm: _Kept | None = None  # ‖v‖: v changes at the hyper steps
        self._w_norm: _Kept | None = None  # ‖w‖: read ahead by :meth:`prefetch`

    def inaccurate(self, params: Sequence[Tensor]) -> str | None:
        """Why a forward difference would be inaccurate here (None: it is not)."""
        if self._unreproducible is not None:
            return self._unreproducible
        low = sorted({str(p.dtype) for p in params if p.dtype in _LOW_PRECISION})
        if low:
            return f"the parameters are {', '.join(low)}"
        devices = {p.device.type for p in params} | {"cpu"}
        if any(torch.is_autocast_enabled(d) for d in devices):
            return "it runs under autocast (mixed precision)"
        return None

    def step(self, params: Sequence[Tensor], tangents: Sequence[Tensor]) -> float:
        """h with h·‖v‖ = c·max(‖w‖, 1) (0 where v = 0). ‖v‖ is read once per v (v changes
        at the hyper steps, the call comes at every training step); both norms are taken as
        :meth:`prefetch` read them, where it did for these tensors as they are."""
        v_norm = self._tangent_norm(tangents)
        if v_norm == 0.0 or not math.isfinite(v_norm):
            return 0.0
        w_norm = _kept(self._w_norm, params)  # read ahead for this call only
        self._w_norm = None
        if w_norm is None:
            w_norm = _norm(params)
        dtype = params[0].dtype if params else torch.get_default_dtype()
        c = self.relative_step or math.sqrt(torch.finfo(dtype).eps)
        return c * max(w_norm, 1.0) / v_norm

    def _tangent_norm(self, tangents: Sequence[Tensor]) -> float:
        """‖v‖, kept while v is the same tensors at the same versions."""
        norm = _kept(self._v_norm, tangents)
        if norm is None:
            norm = _norm(tangents)
            self._v_norm = _keep(tangents, norm)
        return norm

    def prefetch(
        self, params: Sequence[Tensor], tangents: Sequence[Tensor]
    ) -> tuple[Tensor, Callable[[Sequence[float]], None]] | None:
        """The norms the next call will read of the device and does not hold, ‖w‖ (and ‖v‖
        after a new v), as one float64 tensor on the device, not read, and the function to
        hand their values to once the caller has read them, with values of its own (one wait
        for the device per training step, not two or three). None: nothing to read (a
        difference that falls back to :class:`ForwardMode`)."""
        if not params or not tangents or self.inaccurate(params) is not None:
            return None
        # ‖w‖ for this step's call only (w moves at every step, also where its version does
        # not show it: a p.data edit), ‖v‖ where not held for v as it is
        v = _kept(self._v_norm, tangents) is None
        parts = [params, tangents] if v else [params]
        norms = torch.stack([_norm_tensor(ts).double() for ts in parts])

        def read(values: Sequence[float]) -> None:
            self._w_norm = _keep(params, float(values[0]))
            if v:
                self._v_norm = _keep(tangents, float(values[1]))

        return norms, read

    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor:
        why = self.inaccurate(params)
        if why is None and at is not None and self._calls % self.check_every == 0:
            why = self._unreproduced(losses, params, at)
        if why is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"ForwardDifference: {why}, so a difference of losses cannot be accurate; "
                    "the cross term uses ForwardMode (dual numbers) instead. Pass "
                    "directional=ForwardMode() to silence this.",
                    UserWarning,
                    stacklevel=2,
                )
            return self.fallback(losses, params, tangents, at)
        self._calls += 1
        h = self.step(params, tangents)
        with torch.no_grad():  # nothing here is differentiated: no detach needed
            if at is None:
                at = losses(*params)
            if h == 0.0:
                return torch.zeros_like(at)
            return (losses(*_moved(params, tangents, h)) - at) / h

    def _unreproduced(
        self, losses: Callable[..., Tensor], params: Sequence[Tensor], at: Tensor
    ) -> str | None:
        """Why ``losses`` at w does not give back the step's own ``at`` (the difference's
        premise; None: it does). Once it has not, every later call takes the fallback."""
        with torch.no_grad():
            again = losses(*params)
            at = at.to(again.dtype)
            if again.shape == at.shape:  # both read in one wait for the device
                mean, worst = torch.stack([at.abs().mean(), (again - at).abs().max()]).tolist()
        if again.shape == at.shape:
            scale = mean + torch.finfo(again.dtype).eps
            gap = worst / scale
            if gap <= self.REPRODUCIBLE_RTOL:
                return None
            what = f"differ from the step's own by {gap:.3g} of their mean"
        else:
            what = f"have shape {tuple(again.shape)}, the step's {tuple(at.shape)}"
        self._unreproducible = (
            "the per-sample losses recomputed at the same weights, with the training step's "
            f"torch RNG state, {what} (randomness outside torch's generator, e.g. a mixup or "
            "noise drawn with numpy or random, or a forward that changes state)"
        )
        return self._unreproducible

    def __repr__(self) -> str:
        return (
            f"ForwardDifference(relative_step={self.relative_step}, check_every={self.check_every})"
        )


class TrainingCrossTerm:
    """Eq. gradestim's cross term on a *training* minibatch ζ, from the last adjoint v:

        ĝᵢ = −α ∂ₓᵢ ⟨∇₁ℓ̂(w, x; ζ), v⟩ = −α ∂ₓᵢ ℓ̂ᵤ(x),   ℓ̂ᵤ = weighted_loss(u, ω(x_ζ)),
        uⱼ = ⟨∇ℓⱼ(w), v⟩,

    for the rows i ∈ ζ only (zero elsewhere), then the outer optimizer's step on those rows.
    With ``weights.gauge == "mean_logit"`` the normaliser of ℓ̂ᵤ is held: ĝᵢ = −α ω′ᵢuᵢ / Σ ω,
    without the minibatch's centre û (the mean logit is held instead, after the step).

    Where the training's own SGD steps are the warm-started inner solve (inner_steps = 0, the
    Lightning drop-in, or a loop of the user's), every training batch thus moves the weights of
    the examples it reads, at the cost of one forward-mode pass (u) per batch, and every example
    is visited once per epoch instead of only in the hyper steps' own J minibatches; the hyper
    steps (a few warm-started adjoint steps) only refresh v. Its cost is O(batch): the gradient
    is a sparse COO tensor of the batch's rows, which :class:`LazyAdam` (or SGD without
    momentum) applies to those rows only.

    ``weights``: the family; ``optimizer``: the outer optimizer over ``weights.logits`` (that of
    the :class:`~hypertorch_sid.SIDHyperOptimizer`); ``normalize``: as in
    :func:`weighted_loss` (the training's loss).
    """

    def __init__(
        self, weights: SampleWeights, optimizer: torch.optim.Optimizer, normalize: bool = False
    ) -> None:
        self.weights, self.optimizer, self.normalize = weights, optimizer, bool(normalize)

    def gradient(self, index: Tensor, u: Tensor, alpha: float) -> Tensor:
        """ĝ on the rows ``index`` as a sparse COO tensor of shape ``(n,)`` (duplicates summed)."""
        return self.gradients(index, u, alpha)[0]

    def gradients(
        self, index: Tensor, u: Tensor, alpha: float, losses: Tensor | None = None
    ) -> Tensors:
        """ĝ for every tensor of ``weights.hyperparameters``: the rows ``index`` of the logits
        (sparse COO, shape ``(n,)``), then the parameterisation's own tensors (dense: θ of
        :class:`SharedLossWeights` from every row, with the rows' current ``losses``)."""
        w = self.weights
        index = w.check_index(index)
        shared = w.parameterization.hyperparameters
        with torch.no_grad():
            x = w.logits_of(index)
        with torch.enable_grad():
            x.requires_grad_(True)
            omega = w.parameterization.rows(x, w, index, losses)
            held = w.gauge == "mean_logit"
            u = check_per_sample(u, index)
            if w.gauge == "class":
                u = class_centred(u, omega.detach(), w.labels_of(index))
            inner = weighted_loss(u, omega, self.normalize, held)
            g, *gs = torch.autograd.grad(inner, [x, *shared], allow_unused=True)
        g = -float(alpha) * g.to(w.logits.dtype)
        rows = torch.sparse_coo_tensor(index[None], g, (w.n,), check_invariants=False)
        own = [
            torch.zeros_like(t) if gt is None else -float(alpha) * gt.detach()
            for t, gt in zip(shared, gs)
        ]
        return [rows, *own]

    @torch.no_grad()
    def apply(self, gradient: Tensor | Sequence[Tensor]) -> None:
        """The outer step on the rows of ``gradient`` (sparse; or the list of
        :meth:`gradients`): each hyperparameter's grad ← its ĝ, step, projection."""
        grads = [gradient] if isinstance(gradient, Tensor) else list(gradient)
        for h, g in zip(self.weights.hyperparameters, grads):
            h.grad = g
        self.optimizer.step()
        for group in self.optimizer.param_groups:  # zero_grad(set_to_none=True), unprofiled
            for h in group["params"]:
                h.grad = None
        self.weights.projection()

    def step(
        self, index: Tensor, u: Tensor, alpha: float | None, losses: Tensor | None = None
    ) -> bool:
        """:meth:`gradients` then :meth:`apply`; nothing (False) before the first adjoint solve
        gave α."""
        if alpha is None:
            return False
        self.apply(self.gradients(index, u, alpha, losses))
        return True
