"""The callback's hyper-step data: its own seeded, DDP-sharded minibatch samplers.

:class:`~hypertorch_sid.lightning.HyperOptimizationCallback` draws the minibatches ζ̂ of the
adjoint solve and of the validation gradient from the datasets behind the fit's DataLoaders,
with samplers of its own (independent of the training batches). Under DDP every rank draws the
same *global* batch from the same seed and keeps its shard, so the union over ranks is the batch
a single process would draw.

- :class:`ShardedSampler`: endless minibatch indices, rank r's shard of each global batch, with a
  checkpointable, validated state;
- :class:`SampledBatches`: collated, device-placed minibatches at those indices;
- :class:`LoaderBatches`: for data without random access (an ``IterableDataset``, a loader that
  yields whole batches): minibatches read by iterating a copy of the user's own loader, its
  position checkpointable like a sampler's (:class:`StreamPosition`);
- :func:`fetch`, :func:`shard_indices`: a batch at given indices; rank r's part of the whole set;
- :func:`loader_parts`, :func:`validation_loader`: the dataset, collate function and batch size
  of the fit's DataLoaders; :func:`sampled_part`: the part of a data set its loader's sampler
  reads; :func:`shared_examples`: how many validation examples the training set holds too.

Only :func:`loader_parts` (a log line) and :func:`validation_loader` use Lightning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data._utils.collate import default_collate

from ..core.batches import batch_size as samples_in
from ..core.errors import ConfigurationError
from ..core.indexing import Indexed, IndexedDataset
from ..core.outer import SeveralBatches
from .namespaces import is_overridden

__all__ = [
    "LoaderBatches",
    "SampledBatches",
    "ShardedSampler",
    "StreamPosition",
    "TrainingOrder",
    "draws_by_index",
    "first_loader",
    "fetch",
    "loader_parts",
    "repeated_examples",
    "sampled_part",
    "shard_indices",
    "shared_examples",
    "validation_loader",
]


class ShardedSampler:
    """Endless minibatch indices from a private generator; rank r takes its shard of each batch.

    One *global* batch of ``batch_size × world_size`` indices is cut from a permutation drawn with
    ``torch.Generator().manual_seed(seed)`` — the same on every rank — and rank r keeps the r-th
    contiguous block of ``batch_size``. The union over ranks is therefore the batch one process
    with ``batch_size × world_size`` would draw. Incomplete tails are dropped (every batch has the
    same size); a new permutation starts when the current one is used up.
    """

    def __init__(self, n: int, batch_size: int, seed: int, rank: int, world_size: int) -> None:
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.global_batch = batch_size * world_size
        if self.global_batch > n:
            raise ConfigurationError(
                f"the hyper-step batch ({batch_size} per process × {world_size} processes) is "
                f"larger than the data set ({n} samples): lower batch_size / val_batch_size."
            )
        self.generator = torch.Generator().manual_seed(seed)
        self.perm: Tensor | None = None
        self.pos = 0
        self.epoch = 0

    def next_indices(self) -> Tensor:
        if self.perm is None or self.pos + self.global_batch > self.n:
            self.perm = torch.randperm(self.n, generator=self.generator)
            self.pos = 0
            self.epoch += 1
        block = self.perm[self.pos : self.pos + self.global_batch]
        self.pos += self.global_batch
        return block[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "perm": None if self.perm is None else self.perm.clone(),
            "pos": self.pos,
            "epoch": self.epoch,
            "n": self.n,
            "global_batch": self.global_batch,
        }

    def check_state(self, state: Any, what: str) -> None:
        """Raise :class:`ConfigurationError` unless ``state`` is a sound :meth:`state_dict`."""
        keys = {"generator", "perm", "pos", "epoch", "n", "global_batch"}
        if not isinstance(state, dict) or not keys <= set(state):
            missing = sorted(keys - set(state)) if isinstance(state, dict) else sorted(keys)
            raise ConfigurationError(
                f"the checkpoint's {what} state is incomplete (missing {missing}): the "
                "checkpoint is truncated or was not written by this callback."
            )
        if state["n"] != self.n or state["global_batch"] != self.global_batch:
            raise ConfigurationError(
                f"the checkpoint's {what} drew global batches of "
                f"{state['global_batch']} from {state['n']} samples; this run has "
                f"{self.global_batch} from {self.n}. "
                "Resume with the same data, batch size and number of processes."
            )
        generator = state["generator"]
        try:
            if not isinstance(generator, Tensor) or generator.dtype != torch.uint8:
                raise TypeError("not a uint8 tensor")
            torch.Generator().set_state(generator)
        except (TypeError, RuntimeError) as err:
            raise ConfigurationError(
                f"the checkpoint's {what} random-generator state is corrupted ({err})."
            ) from None
        perm = state["perm"]
        if perm is not None and not (
            isinstance(perm, Tensor)
            and perm.shape == (self.n,)
            and torch.equal(perm.sort().values, torch.arange(self.n, dtype=perm.dtype))
        ):
            raise ConfigurationError(
                f"the checkpoint's {what} permutation is not a permutation of the {self.n} "
                "samples: the checkpoint is corrupted."
            )
        for name, high in (("pos", self.n), ("epoch", None)):
            value = state[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
                or (high is not None and value > high)
            ):
                raise ConfigurationError(
                    f"the checkpoint's {what} {name} must be an integer in [0, "
                    f"{high if high is not None else '∞'}], got {value!r}."
                )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state, "hyper-step sampler")
        self.generator.set_state(state["generator"])
        self.perm = None if state["perm"] is None else state["perm"].clone()
        self.pos, self.epoch = int(state["pos"]), int(state["epoch"])


class SampledBatches:
    """Endless iterator of collated, device-placed minibatches of ``dataset`` at sampled indices."""

    def __init__(
        self,
        dataset: Dataset,
        collate: Callable[[list[Any]], Any],
        sampler: ShardedSampler,
        to_device: Callable[[Any], Any],
        chunk: int | None = None,
    ) -> None:
        self.dataset, self.collate, self.sampler, self.to_device = (
            dataset,
            collate,
            sampler,
            to_device,
        )
        self.chunk = chunk
        self.samples = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        idx = self.sampler.next_indices()
        self.samples += len(idx)
        if self.chunk is None or len(idx) <= self.chunk:
            return self.to_device(fetch(self.dataset, self.collate, idx))
        return self._chunked(idx)

    def _chunked(self, idx: Tensor) -> Any:
        """A minibatch larger than ``chunk`` as a list of near-equal parts of at most ``chunk``
        samples, which the core averages E and ∇E over one part at a time: the model never
        sees more samples at once than the user's loader gives it (a drop-in that reads 256
        validation examples per hyper step would otherwise put 8× a batch of 32 through a
        network's backward pass at once). Marked :class:`~hypertorch_sid.core.outer.
        SeveralBatches`, so that parts padded to different lengths are never read as one."""
        parts = torch.tensor_split(idx, -(-len(idx) // self.chunk))
        return SeveralBatches(
            self.to_device(fetch(self.dataset, self.collate, part)) for part in parts
        )


#: the end of a loader's pass (a batch may be None)
_END = object()


class StreamPosition:
    """The sampler-like state of :class:`LoaderBatches`: its batch size and where it is.

    ``pos`` batches have been read in the current pass (``epoch`` passes started). A resumed run
    restarts the pass and skips ``pos`` batches, so a stream that repeats its order resumes
    exactly; one that reshuffles on every pass resumes at the same place in a new order.
    """

    def __init__(self, batch_size: int, world_size: int) -> None:
        self.batch_size, self.world_size = batch_size, world_size
        self.global_batch = batch_size * world_size
        self.pos = 0
        self.epoch = 0
        self.skip = 0  # batches to pass over when the next pass starts (after a resume)

    def state_dict(self) -> dict[str, Any]:
        return {
            "stream_pos": self.pos,
            "stream_epoch": self.epoch,
            "global_batch": self.global_batch,
        }

    def check_state(self, state: Any, what: str) -> None:
        """Raise :class:`ConfigurationError` unless ``state`` is a sound :meth:`state_dict`."""
        keys = {"stream_pos", "stream_epoch", "global_batch"}
        if not isinstance(state, dict) or not keys <= set(state):
            raise ConfigurationError(
                f"the checkpoint's {what} state is not a streamed loader's (missing "
                f"{sorted(keys - set(state)) if isinstance(state, dict) else sorted(keys)}): "
                "resume with the same kind of DataLoader (map-style or streamed)."
            )
        if state["global_batch"] != self.global_batch:
            raise ConfigurationError(
                f"the checkpoint's {what} read global batches of {state['global_batch']}; this "
                f"run reads {self.global_batch}. Resume with the same data, batch size and "
                "number of processes."
            )
        for name in ("stream_pos", "stream_epoch"):
            value = state[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(
                    f"the checkpoint's {what} {name} must be an integer ≥ 0, got {value!r}."
                )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state, "hyper-step stream")
        self.epoch, self.skip = int(state["stream_epoch"]), int(state["stream_pos"])
        self.pos = self.skip


class LoaderBatches:
    """Endless minibatches read from the user's own loader, for data without random access.

    An ``IterableDataset`` (a stream) or a loader with ``batch_size=None`` (its dataset yields
    whole batches) cannot be sampled by index; the callback then iterates a single-process copy
    of the loader (its dataset, batch size, collate function and sampler; no workers, so the
    training's own iterator and workers are never touched), starting a new pass when one ends.
    The minibatches are then the stream's next ones, not an independent draw: under DDP each
    process reads what its copy of the loader yields it.

    ``batch_size`` (the callback's ``argument``) re-batches a stream of samples; a loader that
    yields whole batches keeps its own.
    """

    def __init__(
        self,
        loader: DataLoader,
        to_device: Callable[[Any], Any],
        world_size: int,
        batch_size: int | None,
        what: str,
        argument: str = "batch_size",
    ) -> None:
        self.loader = _single_process_copy(loader, batch_size, what, argument)
        self.to_device, self.what = to_device, what
        self._iterator: Iterator[Any] | None = None
        self.samples = 0
        self._peeked, _ = self._read()  # the first batch tells the batch size
        self.sampler = StreamPosition(samples_in(self._peeked), world_size)
        self.sampler.epoch = 1

    def __iter__(self) -> Iterator[Any]:
        return self

    def _read(self) -> tuple[Any, bool]:
        """The loader's next batch, and whether it began a new pass."""
        if self._iterator is not None:
            batch = next(self._iterator, _END)
            if batch is not _END:
                return batch, False
        self._iterator = iter(self.loader)
        batch = next(self._iterator, _END)
        if batch is _END:
            raise ConfigurationError(f"the {self.what} yielded no batch.")
        return batch, True

    def __next__(self) -> Any:
        position = self.sampler
        if position.skip:  # resumed: a fresh pass, past the batches already read
            self._iterator, self._peeked = iter(self.loader), None
            for _ in range(position.skip):
                next(self._iterator, None)
            position.skip = 0
        if self._peeked is not None:
            batch, self._peeked = self._peeked, None
        else:
            batch, new_pass = self._read()
            if new_pass:
                position.epoch, position.pos = position.epoch + 1, 0
        position.pos += 1
        self.samples += samples_in(batch)
        return self.to_device(batch)


def _single_process_copy(
    loader: DataLoader, batch_size: int | None, what: str, argument: str
) -> DataLoader:
    """A loader over the same data with no worker processes (see :class:`LoaderBatches`)."""
    dataset = loader.dataset
    yields_batches = loader.batch_size is None and loader.batch_sampler is None
    if yields_batches and batch_size is not None:
        raise ConfigurationError(
            f"the {what} yields whole batches (batch_size=None), so the callback cannot re-batch "
            f"it to {argument}={batch_size}: drop {argument}=, or give the DataLoader a batch_size."
        )
    if isinstance(dataset, IterableDataset):
        size = batch_size or loader.batch_size
        return DataLoader(dataset, batch_size=size, collate_fn=loader.collate_fn)
    if yields_batches:
        return DataLoader(
            dataset, batch_size=None, sampler=loader.sampler, collate_fn=loader.collate_fn
        )
    raise ConfigurationError(
        f"the {what}'s dataset ({type(dataset).__name__}) is neither an IterableDataset nor a "
        "map-style dataset with __len__ and __getitem__: the callback cannot read minibatches "
        "from it."
    )


def fetch(dataset: Dataset, collate: Callable[[list[Any]], Any], idx: Tensor) -> Any:
    """``collate([dataset[i] for i in idx])``, vectorised for a ``TensorDataset`` and an
    ``IndexedDataset`` of one (the data weights' hyper steps: one gather per tensor, not one
    operation per sample and tensor)."""
    if isinstance(dataset, TensorDataset) and collate is default_collate:
        return [t[idx] for t in dataset.tensors]
    if (
        isinstance(dataset, IndexedDataset)
        and isinstance(dataset.dataset, TensorDataset)
        and collate is default_collate
    ):
        return Indexed(idx.long(), [t[idx] for t in dataset.dataset.tensors])
    if hasattr(dataset, "__getitems__"):
        return collate(dataset.__getitems__(idx.tolist()))
    return collate([dataset[i] for i in idx.tolist()])


def shard_indices(n: int, rank: int, world_size: int) -> Tensor:
    """Indices rank r holds of the whole set, padded by wrapping (like ``DistributedSampler``)."""
    per_rank = math.ceil(n / world_size)
    idx = torch.arange(per_rank * world_size) % n
    return idx[rank::world_size]


def first_loader(loader: Any, what: str, who: str = "HyperOptimizationCallback") -> DataLoader:
    """The user's DataLoader (the first of several validation loaders). Training loaders given
    as a list are refused: Lightning hands ``training_step`` a list of batches, one per loader,
    which the hyper steps, drawing from one data set, cannot give it (the user's step failed
    inside the user's code: "too many values to unpack"). ``who`` names the callback in its
    messages."""
    if what == "train dataloader" and isinstance(loader, (list, tuple)):
        raise ConfigurationError(
            f"{who}: the train dataloaders are a {type(loader).__name__} "
            f"of {len(loader)}, so Lightning hands training_step a list of batches (one per "
            "loader), but the hyper steps draw their minibatches from one data set and call "
            "training_step on one batch. Pass one DataLoader: the DataLoader itself for a list "
            "of one, or one over the combined data (a ConcatDataset) for several."
        )
    if isinstance(loader, (list, tuple)) and loader and isinstance(loader[0], DataLoader):
        if len(loader) > 1:
            rank_zero_info(f"{who}: using the first of {len(loader)} {what}s.")
        loader = loader[0]
    if not isinstance(loader, DataLoader):
        several = ""
        if isinstance(loader, dict) or type(loader).__name__ == "CombinedLoader":
            several = (
                " Several loaders combined into one batch (a dict, a CombinedLoader) leave it "
                "no single dataset to draw from: combine the data in one DataLoader (e.g. over "
                "a ConcatDataset, or a Dataset that returns the dict per sample)."
            )
        raise ConfigurationError(
            f"{who} draws its own minibatches from the {what}, so the {what} "
            f"must be a torch DataLoader; got {type(loader).__name__}.{several}"
        )
    return loader


def draws_by_index(loader: DataLoader) -> bool:
    """Whether the callback can draw its own minibatches by index: a map-style dataset (with
    ``__len__`` and ``__getitem__``) batched by the loader. Otherwise :class:`LoaderBatches`."""
    dataset = loader.dataset
    return (
        not isinstance(dataset, IterableDataset)
        and hasattr(dataset, "__len__")
        and hasattr(dataset, "__getitem__")
        and not (loader.batch_size is None and loader.batch_sampler is None)
    )


def loader_parts(
    loader: Any, what: str, who: str = "HyperOptimizationCallback"
) -> tuple[Dataset, Callable[[list[Any]], Any], int | None]:
    """(dataset, collate_fn, batch size) of the user's DataLoader."""
    loader = first_loader(loader, what, who)
    if loader.batch_size is None and loader.batch_sampler is None:
        raise ConfigurationError(
            f"the {what} has automatic batching disabled (batch_size=None): its dataset yields "
            "whole batches, so the callback cannot draw minibatches from it. Give the "
            "DataLoader a batch_size (or a batch_sampler)."
        )
    dataset = loader.dataset
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ConfigurationError(
            f"the {what}'s dataset ({type(dataset).__name__}) is not a map-style dataset with "
            "__len__ and __getitem__: the callback's sampler needs random access."
        )
    batch_size = loader.batch_size
    if batch_size is None and loader.batch_sampler is not None:
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    return dataset, loader.collate_fn or default_collate, batch_size


def _users_sampler(loader: DataLoader) -> Any:
    """The sampler that chooses the loader's examples: its batch sampler's, else its own; under
    DDP the user's sampler inside Lightning's ``DistributedSamplerWrapper``."""
    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    inner = getattr(getattr(sampler, "dataset", None), "_sampler", None)  # DDP's wrapper
    return inner if inner is not None else sampler


def sampled_part(
    loader: DataLoader, dataset: Dataset, what: str, who: str = "HyperOptimizationCallback"
) -> Dataset:
    """The part of ``dataset`` the loader's sampler reads, which the hyper steps must draw from
    too: the ``SubsetRandomSampler``'s indices (one data set split into training and validation
    by two samplers: drawn from the whole set, the hyper steps' E read the training examples and
    their ℓ̂ the validation ones), a ``WeightedRandomSampler``'s examples of nonzero weight where
    those weights are equal. Unequal weights are warned: the hyper steps draw uniformly."""
    sampler = _users_sampler(loader)
    if isinstance(sampler, SubsetRandomSampler):
        return Subset(dataset, [int(i) for i in sampler.indices])
    if isinstance(sampler, WeightedRandomSampler):
        weights = torch.as_tensor(sampler.weights, dtype=torch.float64)
        drawn = (weights > 0).nonzero().flatten()
        if len(drawn) and bool((weights[drawn] == weights[drawn[0]]).all()):
            return dataset if len(drawn) == len(dataset) else Subset(dataset, drawn.tolist())
        differs = (
            "ℓ̂ is not the loss the training minimises"
            if what.startswith("train")
            else "E is not the validation loss under those draws"
        )
        rank_zero_warn(
            f"{who}: the {what} draws its examples with a "
            "WeightedRandomSampler of unequal weights, but the hyper steps draw uniformly from "
            f"its data set: their {differs}. "
            "Weight the loss per example instead of the draws (e.g. "
            "F.cross_entropy(..., weight=class_weights)), or accept the mismatch."
        )
    return dataset


def _unwrapped(dataset: Any) -> tuple[Any, list[Subset]]:
    """(the data set at the bottom of ``IndexedDataset`` and ``Subset`` wraps, the Subsets on
    the way, outermost first)."""
    subsets: list[Subset] = []
    for _ in range(16):
        if isinstance(dataset, Subset):
            subsets.append(dataset)
            dataset = dataset.dataset
        elif isinstance(dataset, IndexedDataset):
            dataset = dataset.dataset
        else:
            break
    return dataset, subsets


def _positions(subsets: list[Subset]) -> set[int] | None:
    """The positions in the bottom data set that the Subsets read (None: all of it)."""
    positions: list[int] | None = None
    for subset in subsets:
        idx = [int(i) for i in subset.indices]
        positions = idx if positions is None else [idx[i] for i in positions]
    return None if positions is None else set(positions)


def _identity(dataset: Any) -> Any:
    """What makes two data sets the same examples: the object, or for a ``TensorDataset`` its
    tensors' content (:func:`_fingerprint`: ``TensorDataset(X, y)`` built twice, over the same
    tensors or over copies, a datamodule converting its arrays anew at each fit), so that two
    ``TensorDataset`` s of other content are known to hold other examples (session 51)."""
    if isinstance(dataset, TensorDataset):
        return ("tensors", tuple(_fingerprint(t) for t in dataset.tensors))
    return id(dataset)


def _fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    """A tensor's content in a few numbers: its shape and dtype, the sum of its rows' sums and
    their sum weighted by position (rows reordered differ); NaN counted as 0. One pass, no copy
    of the tensor (the sums accumulate in float64)."""
    rows = t.detach().reshape(t.shape[0] if t.dim() else 1, -1)
    sums = torch.nan_to_num(rows.sum(1, dtype=torch.float64))
    at = torch.arange(1, sums.shape[0] + 1, dtype=torch.float64, device=sums.device)
    return tuple(t.shape), t.dtype, *torch.stack([sums.sum(), (sums * at).sum()]).tolist()


def shared_examples(train: Any, val: Any) -> tuple[int, int] | None:
    """(how many of the validation examples the training set reads too, how many there are),
    where both read the same underlying data set (the same object under Subset /
    IndexedDataset wraps), or two ``TensorDataset`` s of other content compared row by row
    (:func:`_shared_rows`); None where they read different data sets of other kinds (nothing to
    compare)."""
    (train_base, train_subsets), (val_base, val_subsets) = _unwrapped(train), _unwrapped(val)
    train_at, val_at = _positions(train_subsets), _positions(val_subsets)
    if _identity(train_base) != _identity(val_base):
        return _shared_rows(train_base, train_at, val_base, val_at)
    n_val = len(val_at) if val_at is not None else len(val)
    if train_at is None:
        return n_val, n_val
    if val_at is None:
        return len(train_at), n_val
    return len(train_at & val_at), n_val


def other_scale(train: Any, val: Any, rows: int = 10_000) -> str | None:
    """Where two ``TensorDataset`` s (under ``Subset`` / ``IndexedDataset`` wraps) of the same
    columns hold a floating tensor on scales 10× apart (its interquartile ranges, or its
    medians 10 ranges apart), or on scales 1.5× apart (or medians a quarter range apart) where
    one set has no negative entry and the other is standardised (:func:`_one_standardised`),
    which one and its numbers; None otherwise (other data sets:
    nothing read). A preprocessing step applied to one set only (``X_train / 255``, the
    validation tensor left raw) tuned the hyperparameters for inputs the training never saw,
    silently (session 63: data weights 0.85 off, correlation 0.70). Up to ``rows`` rows each."""
    (train_base, train_subsets), (val_base, val_subsets) = _unwrapped(train), _unwrapped(val)
    if not (isinstance(train_base, TensorDataset) and isinstance(val_base, TensorDataset)):
        return None
    like = [(t.shape[1:], t.dtype) for t in train_base.tensors]
    if like != [(t.shape[1:], t.dtype) for t in val_base.tensors]:
        return None
    train_at, val_at = _positions(train_subsets), _positions(val_subsets)
    for i, (a, b) in enumerate(zip(train_base.tensors, val_base.tensors)):
        if not a.is_floating_point():
            continue
        robust, plain, negative = zip(_moments(a, train_at, rows), _moments(b, val_at, rows))
        (ma, sa), (mb, sb) = robust if robust[0][1] > 0 and robust[1][1] > 0 else plain
        if not (sa > 0 and sb > 0 and math.isfinite(sa * sb)):
            continue
        apart = max(sa, sb) / min(sa, sb)
        if apart > 10 or abs(ma - mb) > 10 * max(sa, sb):
            return (
                f"tensor {i} of the validation data is on another scale than the training "
                f"data's (its values spread {sb:.3g} against {sa:.3g}, around {mb:.3g} against "
                f"{ma:.3g})"
            )
        if _one_standardised(negative) and (apart > 1.5 or abs(ma - mb) > max(sa, sb) / 4):
            raw, other = (
                ("validation", "training") if negative[1] == 0 else ("training", "validation")
            )
            return (
                f"tensor {i} of the {raw} data has no negative value while "
                f"{max(negative):.0%} of the {other} data's are negative (the validation "
                f"values spread {sb:.3g} against {sa:.3g}, around {mb:.3g} against {ma:.3g}): "
                f"the {other} set standardised (a Normalize transform), the {raw} set not"
            )
    return None


def _one_standardised(negative: tuple[float, float]) -> bool:
    """Whether one set's entries are all ≥ 0 (raw pixels, counts: ``ToTensor``'s [0, 1]) while
    over a fifth of the other's are negative: the other was standardised, this one not
    (session 64: a missing ``Normalize`` puts MNIST's validation pixels 3× apart from the
    training's, within the 10× of the scale check, and the data weights came out 0.87 off,
    correlation 0.69, on the careless-user toy)."""
    return min(negative) == 0 and max(negative) > 0.2


def _moments(
    t: Tensor, at: set[int] | None, rows: int
) -> tuple[tuple[float, float], tuple[float, float], float]:
    """((median, interquartile range), (mean, standard deviation), the share of negative
    entries) of up to ``rows`` rows of ``t`` (those at ``at``; at most 10⁶ entries), NaN and
    Inf left out. The first pair is
    compared where both sets have a range: robust, so the outliers the data weights are there
    to find (a tenth of the training targets shifted by 50) do not make the training set look
    like another scale; the second where over half a set's entries are one value (the range
    0: MNIST's zero pixels)."""
    per_row = max(1, t[0].numel()) if len(t) else 1
    rows = max(1, min(rows, 1_000_000 // per_row))
    picked = sorted(at)[:rows] if at is not None else range(min(rows, len(t)))
    x = t[torch.as_tensor(list(picked), dtype=torch.long)].detach().double().flatten()
    x = x[torch.isfinite(x)]
    if x.numel() < 2:
        return (0.0, 0.0), (0.0, 0.0), 0.0
    q = torch.quantile(x, torch.tensor([0.25, 0.5, 0.75], dtype=x.dtype, device=x.device))
    negative = float((x < 0).double().mean())
    return (float(q[1]), float(q[2] - q[0])), (float(x.mean()), float(x.std())), negative


def _shared_rows(
    train: Any, train_at: set[int] | None, val: Any, val_at: set[int] | None
) -> tuple[int, int] | None:
    """For two ``TensorDataset`` s of other content: (how many of the validation rows read
    a training row's values, how many there are), compared by each row's fingerprint
    (:func:`_row_keys`); None for other data sets. Overlapping slices of one tensor
    (``X[:800]`` and ``X[700:]``, an off-by-one split) were not seen: each slice is a data set
    of its own (session 57)."""
    if not (isinstance(train, TensorDataset) and isinstance(val, TensorDataset)):
        return None
    like = [(t.shape[1:], t.dtype) for t in train.tensors]
    if like != [(t.shape[1:], t.dtype) for t in val.tensors]:
        return None  # other columns: other examples
    train_keys = set(_row_keys(train, train_at))
    val_keys = _row_keys(val, val_at)
    return sum(k in train_keys for k in val_keys), len(val_keys)


def _row_keys(dataset: TensorDataset, at: set[int] | None) -> list[tuple[float, ...]]:
    """Each row's content in a few numbers (per tensor: its sum and its sum weighted by column
    position, float64; NaN counted as 0), of the positions ``at`` (None: every row)."""
    columns = []
    for t in dataset.tensors:
        rows = t.detach().reshape(t.shape[0], -1)
        at_col = torch.arange(1, rows.shape[1] + 1, dtype=torch.float64, device=rows.device)
        parts = [r.to(torch.float64) for r in rows.split(4096)]  # a float64 copy of 4096 rows
        columns += [
            torch.nan_to_num(torch.cat([r.sum(1) for r in parts])),
            torch.nan_to_num(torch.cat([r @ at_col for r in parts])),
        ]
    keys = [tuple(row) for row in torch.stack(columns, 1).tolist()]
    return keys if at is None else [keys[i] for i in sorted(at)]


def repeated_examples(dataset: Any) -> int:
    """How many positions of ``dataset`` read an example an earlier position reads too: a
    ``Subset`` listing an index twice, a ``ConcatDataset`` holding one data set twice or a
    part of it again (oversampling by copies); 0 where there is no Subset or ConcatDataset
    to look through."""
    rows = _rows(dataset)
    return 0 if rows is None else len(rows) - len(set(rows))


def _rows(dataset: Any, depth: int = 0) -> list[tuple[Any, int]] | None:
    """(the bottom data set's identity, the position in it) of each position of ``dataset``,
    through IndexedDataset, Subset and ConcatDataset wraps; None where there is none of the
    last two (nothing can be repeated)."""
    if depth > 16:
        return None
    if isinstance(dataset, IndexedDataset):
        return _rows(dataset.dataset, depth + 1)
    if isinstance(dataset, Subset):
        inner = _rows(dataset.dataset, depth + 1) or _all_rows(dataset.dataset)
        return [inner[int(i)] for i in dataset.indices]
    if isinstance(dataset, ConcatDataset):
        parts = [_rows(d, depth + 1) or _all_rows(d) for d in dataset.datasets]
        return [row for part in parts for row in part]
    return None


def _all_rows(dataset: Any) -> list[tuple[Any, int]]:
    key = _identity(dataset)
    return [(key, i) for i in range(len(dataset))]


def validation_loader(trainer: pl.Trainer) -> Any:
    """The validation DataLoader(s) of this fit, or None when there is none.

    Where Lightning takes them from, in its order: the loaders its validation loop has set up
    (``trainer.val_dataloaders``; None while validation is off, e.g. ``limit_val_batches=0``),
    else the datamodule's ``val_dataloader()``, else the loaders passed to ``trainer.fit``, else
    the module's ``val_dataloader()``. Several loaders come as a list, however given: a
    ``CombinedLoader`` is read as its loaders and a dict as its values, in order (as Lightning's
    validation reads them), so the hyper steps read the first of them whichever form the user
    chose (session 62 refused a ``CombinedLoader`` of validation loaders, read a list's first).
    """
    return _as_list(_validation_loader(trainer))


def _as_list(loaders: Any) -> Any:
    """Several validation loaders, a CombinedLoader's or a dict's, as a list in their order."""
    if type(loaders).__name__ == "CombinedLoader":
        loaders = loaders.iterables
    if isinstance(loaders, dict) and loaders:
        return list(loaders.values())
    return loaders


def _validation_loader(trainer: pl.Trainer) -> Any:
    """The validation loader(s) of this fit as the user gave them (:func:`validation_loader`)."""
    if trainer.val_dataloaders is not None:
        return trainer.val_dataloaders
    datamodule = trainer.datamodule
    if datamodule is not None:  # a datamodule is the only source of a fit given one
        if is_overridden("val_dataloader", datamodule):
            return datamodule.val_dataloader()
        return None
    # Loaders passed as ``trainer.fit(..., val_dataloaders=...)`` have no public route in
    # Lightning 2.6 while validation is off: only the loop's private data source holds them.
    # It is checked before the module's own val_dataloader(), which they override.
    source = getattr(trainer.fit_loop.epoch_loop.val_loop, "_data_source", None)
    if source is not None and source.instance is not None and not source.is_module():
        return source.dataloader()
    module = trainer.lightning_module
    if module is not None and is_overridden("val_dataloader", module):
        return module.val_dataloader()
    return None


class TrainingOrder:
    """The random state that orders the training loader's next epoch, checkpointable.

    A shuffling ``DataLoader`` draws each epoch's permutation when the epoch's iterator is made:
    from its ``generator`` (``DataLoader(generator=...)`` or the sampler's own), or else from
    torch's global RNG. Lightning's checkpoints hold neither, so a fit resumed from an
    end-of-epoch checkpoint shuffled its next epochs differently from the uninterrupted fit
    (measured: λ 4.108e-4 against 4.141e-4). :meth:`state_dict` captures both states where the
    checkpoint is written and :meth:`load_state_dict` puts them back when the resumed fit
    starts, before its first epoch's iterator exists, so the resumed epochs see the same
    permutations. What it cannot restore is said in :data:`RESUME_LIMITS`.
    """

    def __init__(self, loader: Any) -> None:
        self.generators = _loader_generators(loader)
        try:
            self.loader_generator = first_loader(loader, "train dataloader").generator
        except ConfigurationError:
            self.loader_generator = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "torch": torch.get_rng_state(),
            "generators": [g.get_state() for g in self.generators],
        }

    def check_state(self, state: Any) -> None:
        ok = (
            isinstance(state, dict)
            and isinstance(state.get("torch"), Tensor)
            and state["torch"].dtype == torch.uint8
            and isinstance(state.get("generators"), list)
            and all(isinstance(s, Tensor) and s.dtype == torch.uint8 for s in state["generators"])
        )
        if not ok:
            raise ConfigurationError(
                "the checkpoint's training-order state (the RNG states that shuffle the training "
                "loader) is corrupted: it must hold uint8 RNG state tensors."
            )
        if len(state["generators"]) != len(self.generators):
            raise ConfigurationError(
                f"the checkpoint's training loader had {len(state['generators'])} generators, "
                f"this one has {len(self.generators)}: resume with the same training DataLoader "
                "(shuffle=, generator=) to reproduce its order."
            )

    def load_state_dict(self, state: dict[str, Any], iterator_made: bool = True) -> None:
        """Put the states back. ``iterator_made``: the resumed fit already made its first
        epoch's iterator (Lightning does, before ``on_train_start``), which drew the workers'
        base seed from the RNG the uninterrupted fit draws it from at that epoch's start: that
        one draw is replayed, so the permutation drawn next is the uninterrupted fit's."""
        self.check_state(state)
        torch.set_rng_state(state["torch"])
        for g, s in zip(self.generators, state["generators"]):
            g.set_state(s)
        if iterator_made:  # DataLoader's iterator: torch.empty(()).random_(generator=...)
            torch.empty((), dtype=torch.int64).random_(generator=self.loader_generator)


#: what :class:`TrainingOrder` cannot make reproduce (said in the docs and warned at resume)
RESUME_LIMITS = (
    "a mid-epoch checkpoint (Lightning restarts an ordinary DataLoader at the start of the "
    "epoch), CUDA and worker-process RNG used inside the training step, and samplers that keep "
    "their own random state elsewhere"
)


def _loader_generators(loader: Any) -> list[torch.Generator]:
    """The torch Generators that order ``loader``'s epochs (its own and its sampler's)."""
    try:
        loader = first_loader(loader, "train dataloader")
    except ConfigurationError:
        return []
    found: list[torch.Generator] = []
    for owner in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and g.device.type == "cpu" and g not in found:
            found.append(g)
    return found
