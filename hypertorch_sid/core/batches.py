"""Minibatch streams: the random variables ζ_t (inner solve) and ζ̂_k (adjoint solve).

Algorithm 1 needs an endless supply of independent minibatches. :class:`BatchStream` turns any
iterable (a ``DataLoader``, a list, an endless generator) into one: a re-iterable source is
re-iterated when exhausted (a shuffling ``DataLoader`` then yields a fresh permutation), a one-shot
iterator is consumed once and its end is reported clearly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .errors import ConfigurationError


def batch_size(batch: Any) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values()))) if batch else 1
    if isinstance(batch, (tuple, list)) and batch:
        return batch_size(batch[0])
    return 1


def _leaves(x: Any) -> list[torch.Tensor] | None:
    """The tensors of a tensor, tuple/list or dict batch (nested), or None for anything else."""
    if isinstance(x, torch.Tensor):
        return [x]
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (tuple, list)) else None
    if items is None:
        return None
    found: list[torch.Tensor] = []
    for item in items:
        sub = _leaves(item)
        if sub is None:
            return None
        found += sub
    return found


def _sliceable(batch: Any, n: int) -> bool:
    """Whether every tensor of ``batch`` is dense with at least ``n`` samples along dim 0."""
    tensors = _leaves(batch)
    return bool(tensors) and all(
        t.layout == torch.strided and t.dim() > 0 and t.shape[0] >= n for t in tensors
    )


def _slice(x: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of every tensor of ``x``, the structure kept."""
    if isinstance(x, torch.Tensor):
        return x[start:stop]
    if isinstance(x, dict):
        return {k: _slice(v, start, stop) for k, v in x.items()}
    parts = [_slice(v, start, stop) for v in x]
    return type(x)(*parts) if hasattr(x, "_fields") else type(x)(parts)


def split_samples(batch: Any, limit: int) -> list[Any] | None:
    """The first ``limit`` samples of a batch, each as a batch of one (same structure).

    Works for a tensor, a tuple/list or a dict of dense tensors sharing the leading (sample)
    dimension; returns None for anything else (sparse tensors, other objects).
    """
    n = min(batch_size(batch), limit)
    if not _sliceable(batch, n):
        return None
    return [_slice(batch, i, i + 1) for i in range(n)]


def _samples_aligned(batch: Any) -> bool:
    """Whether every tensor of ``batch`` is dense with exactly ``batch_size(batch)`` samples."""
    n = batch_size(batch)
    return _sliceable(batch, n) and all(t.shape[0] == n for t in _leaves(batch) or [])


def _cat(batches: Sequence[Any]) -> Any:
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(batches))
    if isinstance(first, dict):
        return {k: _cat([b[k] for b in batches]) for k in first}
    parts = [_cat([b[i] for b in batches]) for i in range(len(first))]
    return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)


def concatenate(batches: Sequence[Any]) -> Any | None:
    """The samples of several batches as one batch (same structure), or None where they cannot be
    joined (sparse tensors, other objects, tensors without a shared sample dimension)."""
    if not batches or not all(_samples_aligned(b) for b in batches):
        return None
    try:
        return _cat(batches)
    except (RuntimeError, KeyError, IndexError, TypeError):
        return None


def join(batches: Sequence[Any], per: int) -> list[Any]:
    """``batches`` joined ``per`` at a time into larger batches (kept apart where they cannot be
    concatenated): the same samples, fewer and larger tensor operations."""
    joined: list[Any] = []
    for i in range(0, len(batches), per):
        group = list(batches[i : i + per])
        whole = concatenate(group) if len(group) > 1 else group[0]
        joined += group if whole is None else [whole]
    return joined


def nbytes(batch: Any) -> int:
    """Bytes held by the tensors of a batch (0 for anything else)."""
    return sum(t.nelement() * t.element_size() for t in _leaves(batch) or [])


def head(batch: Any, n: int) -> Any:
    """The first ``n`` samples of a batch as one batch (same structure), or the batch itself where
    its samples cannot be told apart (see :func:`split_samples`)."""
    n = min(batch_size(batch), n)
    return _slice(batch, 0, n) if _sliceable(batch, n) else batch


def _refuse_one_batch(source: Any, name: str) -> None:
    """One batch where an iterable of batches belongs: ``hypergradient((X, y), val_batch)`` or
    ``hypergradient(X, ...)``. Iterating it gives X and then y (or X's rows) as "batches", so the
    losses read a row of X as the inputs and the next as the targets: a loss of the user's that
    indexes ``batch[0]``, ``batch[1]`` ran on them without a word, another failed inside it with
    an ``IndexError`` (session 51). A tensor is refused, and a tuple of tensors (one batch's
    parts), and a list of tensors of different numbers of dimensions (``[X, y]``); a list of
    same-shaped tensor batches stays a list of batches."""
    if isinstance(source, Tensor):
        given = f"a tensor of shape {tuple(source.shape)}: its rows would be taken as batches"
    elif isinstance(source, Mapping):  # its keys were the batches (session 56)
        keys = ", ".join(map(repr, list(source)[:4]))
        given = f"a {type(source).__name__} of keys {keys}: its keys would be taken as batches"
    elif isinstance(source, (tuple, list)) and any(
        isinstance(b, (DataLoader, Dataset)) for b in source
    ):
        given = (
            f"a {type(source).__name__} holding a DataLoader or dataset, each item of which "
            "would be taken as one batch (pass the DataLoader itself; for several data sets, "
            "one DataLoader over a ConcatDataset)"
        )
    elif (
        isinstance(source, (tuple, list))
        and len(source) > 1
        and all(isinstance(t, Tensor) for t in source)
        and (isinstance(source, tuple) or len({t.dim() for t in source}) > 1)
    ):
        shapes = ", ".join(str(tuple(t.shape)) for t in source[:4])
        given = (
            f"a {type(source).__name__} of tensors of shapes {shapes}: one batch's parts, each "
            "of which would be taken as a batch"
        )
    else:
        return
    raise ConfigurationError(
        f"{name} must be an iterable of minibatches; got {given}. Pass one batch in a list "
        "([(X, y)]) or a DataLoader."
    )


class BatchStream:
    """An endless stream of minibatches drawn from ``source``.

    Parameters
    ----------
    source:
        Any iterable of minibatches. Re-iterable sources (lists, ``DataLoader``) restart when
        exhausted; one-shot iterators (generators) must be endless or long enough.
    name:
        Used in error messages (``"train_batches"``, ...).
    """

    def __init__(self, source: Iterable[Any], name: str = "train_batches") -> None:
        if isinstance(source, BatchStream):
            source = source.source
        if not isinstance(source, Iterable):
            raise ConfigurationError(
                f"{name} must be an iterable of minibatches (a DataLoader, a list of batches or a "
                f"generator); got {type(source).__name__}."
            )
        _refuse_one_batch(source, name)
        self.source = source
        self.name = name
        self._reiterable = not isinstance(source, Iterator)
        self._iterator: Iterator[Any] | None = None
        #: batches drawn since the source was last iterated from its start (a resumed run
        #: skips as many: :meth:`skip`)
        self.position = 0
        self.samples_drawn = 0
        self.batches_drawn = 0
        self.bytes_drawn = 0

    @property
    def mean_batch_size(self) -> float | None:
        """Mean samples per minibatch drawn so far (None before the first)."""
        return self.samples_drawn / self.batches_drawn if self.batches_drawn else None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator, self.position = iter(self.source), 0
        try:
            batch = next(self._iterator)
        except StopIteration:
            if not self._reiterable or self.samples_drawn == 0:
                raise ConfigurationError(self._exhausted_message()) from None
            self._iterator, self.position = iter(self.source), 0
            try:
                batch = next(self._iterator)
            except StopIteration:
                raise ConfigurationError(self._exhausted_message()) from None
        self._drawn(batch)
        return batch

    def skip(self, n: int) -> bool:
        """Go on from the ``n``-th batch of a fresh pass of a re-iterable source, as a run that
        drew ``n`` batches of its pass did (a resumed run). False, and the stream unchanged, for
        a one-shot iterator (its position is its owner's) or a pass shorter than ``n``."""
        if not self._reiterable or n <= 0:
            return n == 0
        iterator = iter(self.source)
        skipped = list(itertools.islice(iterator, n))
        if len(skipped) < n:
            return False
        for batch in skipped:  # counted as drawn: the source is known not to be empty
            self._drawn(batch)
        self._iterator, self.position = iterator, n
        return True

    def _drawn(self, batch: Any) -> None:
        _refuse_no_samples(batch, self.name)
        self.position += 1
        self.samples_drawn += batch_size(batch)
        self.batches_drawn += 1
        self.bytes_drawn += nbytes(batch)

    @property
    def batches_per_pass(self) -> int | None:
        """Minibatches in one pass (an epoch) of a re-iterable, sized source (a ``DataLoader``, a
        list); None for one-shot iterators and sources without a length."""
        if not self._reiterable:
            return None
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            return None

    def next_pass(self) -> list[Any]:
        """One whole pass of a re-iterable source from its start: an epoch, every sample once for
        a shuffling ``DataLoader`` or a list. The rest of the current pass is skipped; the stream
        goes on with a fresh pass."""
        if not self._reiterable:
            raise ConfigurationError(
                f"{self.name} is a one-shot iterator: it has no passes to read an epoch from. "
                "Pass a re-iterable source (a DataLoader or a list)."
            )
        # at most its stated length: a source whose len() understates an endless pass ends too
        batches = list(itertools.islice(iter(self.source), self.batches_per_pass))
        self._iterator = None
        self.position = -len(batches)  # the next draw starts a fresh pass (position 0)
        if not batches:
            raise ConfigurationError(self._exhausted_message())
        for batch in batches:
            self._drawn(batch)
        return batches

    def take(self, n: int) -> list[Any]:
        """The next ``n`` minibatches as a list."""
        return [next(self) for _ in range(n)]

    def _exhausted_message(self) -> str:
        if self.samples_drawn == 0:
            return f"{self.name} is empty: it yielded no minibatch. Pass a non-empty data source."
        return (
            f"{self.name} is a one-shot iterator and ran out after {self.samples_drawn} samples. "
            "Pass a re-iterable source (a DataLoader or a list) or an endless generator, or ask "
            "for fewer inner/adjoint steps."
        )


def _refuse_no_samples(batch: Any, name: str) -> None:
    """A batch whose every tensor has 0 rows: ℓ̂ on it is the penalty alone (a mean over no
    rows drops out of the gradient), so its inner step shrank w with no data, silently
    (session 61: a list [(X[i:i + 20], y[i:i + 20]) for i in range(0, n + 20, 20)] ends with
    one; the validation batch is refused so since session 54)."""
    tensors = [t for t in _leaves(batch) or [] if t.dim() > 0]
    if tensors and all(t.shape[0] == 0 for t in tensors):
        raise ConfigurationError(
            f"{name} gave a batch with no samples (a tensor of shape {tuple(tensors[0].shape)}): "
            "the training loss on it would be the penalty alone. Check how the batches are "
            "cut, e.g. range(0, n, batch_size) rather than range(0, n + batch_size, "
            "batch_size), or a slice X[i:i + b] past the end of X."
        )


def repeat(batch: Any) -> Iterator[Any]:
    """An endless stream repeating one batch: the deterministic map Φ (the paper's *Batch*)."""
    while True:
        yield batch
