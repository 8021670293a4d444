"""The index of each training sample: :class:`IndexedDataset` adds it, :func:`indexed_collate`
batches it (with each sample's label, :func:`sample_label`), :func:`split_indexed` reads it back.

Per-sample hyperparameters (eq. weighted) read the rows of the current minibatch by these
indices; DDP's sharding and any map-style data set keep working."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset

from .errors import ConfigurationError

Tensors = list[Tensor]


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
        if isinstance(dataset, Mapping):  # its length is its keys': a raw KeyError: 0 after
            raise ConfigurationError(
                f"IndexedDataset needs a data set of samples, got a {type(dataset).__name__} of "
                f"{len(dataset)} keys ({', '.join(map(repr, list(dataset)[:4]))}): columns? Its "
                "samples would be its keys. Make rows of it first, e.g. "
                "TensorDataset(columns['x'], columns['y'])."
            )
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Indexed:
        i = self._position(i)
        try:
            sample = self.dataset[i]
        except IndexError as err:  # a length that counts rows the set does not hold (s61)
            raise IndexError(
                f"IndexedDataset: position {i} is within its {len(self)} examples, but the "
                f"wrapped {type(self.dataset).__name__} raised IndexError ({err}): its length "
                "may count examples it does not hold (a Subset whose indices run past its data "
                "set's end, or a __len__ larger than the data), or its __getitem__ failed "
                "inside. Check the indices of the Subset (or your data set's __len__ and "
                "__getitem__)."
            ) from err
        if isinstance(sample, Indexed):  # e.g. IndexedDataset(Subset(IndexedDataset(...)))
            raise ConfigurationError(
                f"IndexedDataset: sample {int(i)} of {type(self.dataset).__name__} already carries "
                "an index (an IndexedDataset sits inside it): wrap only the outermost dataset, "
                "IndexedDataset(Subset(train_set, ...)), not the set inside it too."
            )
        return Indexed(i + len(self) if i < 0 else i, sample)  # ds[-1]: row n − 1, not -1 (s56)

    def _position(self, i: Any) -> int:
        """``i`` as one integer position in −n..n − 1. A list or tensor of positions (a
        ``BatchSampler`` given as ``sampler=`` with ``batch_size=None``), a float or a slice
        failed inside the wrapper with a raw ``TypeError`` (``int()`` of a list); a position
        past the end raised the wrapped set's bare ``IndexError``, naming neither (session 61).
        Past the end is still an ``IndexError``: Python's old iteration protocol stops on it."""
        if type(i) is int and -len(self) <= i < len(self):  # what a sampler gives: fast
            return i
        shape = getattr(i, "shape", None)  # a tensor or a NumPy array (of one value: read)
        if shape is not None and hasattr(i, "item") and math.prod(shape) == 1:
            i = i.item()
        if isinstance(i, (list, tuple)) or shape is not None and math.prod(shape) != 1:
            many = len(i) if isinstance(i, (list, tuple)) else math.prod(shape)
            raise ConfigurationError(
                f"IndexedDataset: asked for {many} positions at once ({type(i).__name__}); it "
                "reads one position at a time, each with its own index. A BatchSampler given as "
                "sampler= with batch_size=None does this: pass it as batch_sampler= instead, "
                "DataLoader(ds, batch_sampler=BatchSampler(...)), which asks for the positions "
                "one by one and collates them."
            )
        if not (isinstance(i, numbers.Integral) and not isinstance(i, bool)):
            whole = (
                isinstance(i, numbers.Real) and not isinstance(i, bool) and float(i).is_integer()
            )
            raise ConfigurationError(
                f"IndexedDataset: a position must be an integer, got {i!r} "
                f"({type(i).__name__})"
                + (f": pass ds[{int(i)}] (e.g. ds[n // 2], not ds[n / 2])." if whole else ".")
            )
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(
                f"IndexedDataset: position {int(i)} is out of range for its {n} examples (0 to "
                f"{n - 1}, or -{n} to -1). Check the sampler or the indices you ask for (a "
                "SubsetRandomSampler or Subset built for a larger set, or a length changed "
                "since the DataLoader was made)."
            )
        return int(i)


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
    """Whether ``value`` is one integer: a Python or NumPy integer, or an integer tensor holding
    one value, of shape () or (1,) (a label stored as ``torch.tensor([y])``, read as the (B, 1)
    column it collates to is read); a bool is the binary class 0 / 1, as a collated bool label
    column is read (session 53)."""
    if isinstance(value, Tensor):
        return (
            value.dim() <= 1
            and value.numel() == 1
            and not value.is_floating_point()
            and not value.is_complex()
        )
    return isinstance(value, numbers.Integral) or type(value).__name__ in ("bool", "bool_")


def sample_label(sample: Any) -> int | None:
    """One sample's class label, read before collation by one rule, or None:

    * a dict sample (a dataclass's or named tuple's fields): the value of the one key of
      :data:`LABEL_KEYS` it holds (none, or two of them: None);
    * otherwise a pair ``(x, y)`` (a tuple or list of exactly two entries): ``y``;

    and only where that value is one integer (a Python or NumPy integer, an integer tensor of
    shape () or (1,), or a bool read as 0 / 1; not a float, a one-hot vector, a string or a
    sequence). Nothing else is guessed: ``(x, y, w)`` (which of the three?) and a bare tensor
    give None."""
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
