"""``HyperData``: the data the callback's hyper steps read, apart from Lightning's training.

The adjoint solve and the ∂₂Φ̂ term of Algorithm 1 need *fresh* training minibatches ζ̂ (eq.
backalg), independent of the ones the training just used, and E needs validation data. The
callback draws them itself: from a seeded :class:`ShardedSampler` over the training (validation)
data set where the loader reads a map-style data set by index, or by iterating a worker-less copy
of the loader (:class:`LoaderBatches`) for a stream. Every batch goes through what Lightning's
loops do to a batch (precision, the module's transfer hooks, the device). Under DDP each rank
reads its shard of one global minibatch. The samplers' places are part of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch.utils.data import (
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from ..core.batches import BatchStream
from ..core.errors import ConfigurationError
from .namespaces import namespace_of
from .sampling import (
    LoaderBatches,
    SampledBatches,
    ShardedSampler,
    TrainingOrder,
    draws_by_index,
    fetch,
    first_loader,
    loader_parts,
    other_scale,
    sampled_part,
    shard_indices,
    shared_examples,
    validation_loader,
)

SAMPLERS = ("train_sampler", "val_sampler")
#: samplers that draw a new random order (or subset) every epoch
_RANDOM = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _length(dataset: Any) -> int | None:
    """A data set's length, None where it has none (a stream)."""
    try:
        return len(dataset)
    except TypeError:
        return None


class HyperData:
    """The training stream and the validation source of the callback's hyper steps.

    Parameters
    ----------
    trainer: the fit's trainer (its loaders, precision, strategy, world size and rank).
    batch_size, val_batch_size: the samplers' minibatch sizes per process (None: the loaders').
    val: ``"batch"`` (one validation minibatch per hyper step) or ``"full"`` (all of it).
    seed: the training sampler's seed (the validation sampler uses ``seed + 1``).
    who: the callback's name in the messages (a drop-in's, e.g. ``"LearnedWeightDecay"``).
    """

    def __init__(
        self,
        trainer: pl.Trainer,
        *,
        batch_size: int | None,
        val_batch_size: int | None,
        val: str,
        seed: int,
        who: str = "HyperOptimizationCallback",
    ) -> None:
        self.trainer = trainer
        self.who = who
        self.world_size, self.rank = trainer.world_size, trainer.global_rank
        self.n_train = self.n_val = 0
        #: validation samples read so far (all processes)
        self.val_samples = 0
        self.train_parts: tuple[Dataset, Callable[[list[Any]], Any]] | None = None
        self.val: SampledBatches | LoaderBatches | None = None
        self.val_full: Any = None
        self.val_dataset: Any = None
        #: the validation loaders after the first (which the hyper steps do not read)
        self.other_val_loaders: list[Any] = []
        self.train = self._train_source(batch_size, seed)
        kind = "stream" if self.train_parts is None else "sampler"
        self.train_stream = BatchStream(self.train, f"the callback's training {kind}")
        self._build_val(val, val_batch_size, seed + 1)
        self._warn_shared_examples()
        self._warn_other_scale()
        #: the RNG states that shuffle the training loader (a resumed fit repeats its order)
        self.order = TrainingOrder(trainer.train_dataloader)
        self._loaded = self._loaded_datasets()
        self._sizes = tuple(_length(d) for d in self._loaded)
        self._part = _drawn_part(trainer.train_dataloader)

    def _warn_shared_examples(self) -> None:
        """A warning where the validation examples are training examples too (the same data
        set passed as both, or overlapping splits of one): E then measures the fit to data the
        training minimises over, and the hypergradient tunes λ for that (a weight decay falls
        towards 0, data weights trust what the network fits) instead of for held-out data.
        Where there are several validation loaders and another one holds no training example
        (a probe of the training set listed first, the held-out set second), the fix is to list
        that one first (session 57: the warning told the user to hold out data they had)."""
        if self.train_parts is None or self.val_dataset is None:
            return
        shared = shared_examples(self.train_parts[0], self.val_dataset)
        if shared is None or shared[0] == 0:
            return
        held_out = [
            i
            for i, loader in enumerate(self.other_val_loaders, start=1)
            if not _shares_training_examples(self.train_parts[0], loader)
        ]
        which = (
            f"the first of the {len(self.other_val_loaders) + 1} validation dataloaders, the "
            "one the hyper steps read,"
            if self.other_val_loaders
            else "the validation loader"
        )
        fix = (
            f"List your held-out validation loader first: val_dataloader()[{held_out[0]}] "
            "holds no training example, so return it first (e.g. [val_loader, probe_loader]; "
            "the hyper steps read only the first)."
            if held_out
            else "Hold out validation examples the training never reads, e.g. "
            "torch.utils.data.random_split(data, [0.8, 0.2])."
        )
        rank_zero_warn(
            f"{self.who}: {shared[0]} of the {shared[1]} validation examples are "
            f"training examples too ({which} reads the training loader's data set, or "
            "TensorDatasets whose rows hold the same values: overlapping slices or index splits "
            "of one tensor): the hyper steps tune the hyperparameters for the fit to data the "
            "training minimises over, not for held-out data (a learned weight decay falls "
            "towards 0; data weights learn to trust the rows the network fits, wrong labels "
            f"included). {fix}"
        )

    def _warn_other_scale(self) -> None:
        """A warning where the validation tensors are on another scale than the training ones
        (:func:`~.sampling.other_scale`: a preprocessing step applied to one set only)."""
        if self.train_parts is None or self.val_dataset is None:
            return
        said = other_scale(self.train_parts[0], self.val_dataset)
        if said is not None:
            rank_zero_warn(
                f"{self.who}: {said}: a preprocessing step applied to one set only (x / 255, "
                "a Normalize or standardisation, other units)? The hyper steps tune the "
                "hyperparameters for the validation data as they are, inputs the training "
                "never sees. Preprocess both sets alike."
            )

    # ------------------------------------------------------------------ reloaded loaders
    def _loaded_datasets(self) -> tuple[Any, Any]:
        """The data sets of the train and validation loaders Lightning holds now (None where
        it holds none yet: the validation loop sets its loaders up when it first runs)."""

        def dataset(loaders: Any) -> Any:
            if isinstance(loaders, (list, tuple)):
                loaders = loaders[0] if loaders else None
            return getattr(loaders, "dataset", loaders)

        return dataset(self.trainer.train_dataloader), dataset(self.trainer.val_dataloaders)

    def reloaded(self) -> bool:
        """Whether Lightning has reloaded a loader over another data set since these samplers
        were built (``reload_dataloaders_every_n_epochs``, e.g. a curriculum): they would draw
        from the old one. Another part of the same data set counts too: a reloaded training
        loader whose ``SubsetRandomSampler`` picks other rows (a new random part of one
        ``IndexedDataset`` each epoch; session 57: the hyper steps kept drawing the first
        epoch's part, and the weights of the other rows never moved)."""
        now = self._loaded_datasets()
        changed = any(
            o is not None and n is not None and (n is not o or _length(n) != size)
            for n, o, size in zip(now, self._loaded, self._sizes)
        )  # the same data set grown or shrunk in place: its samplers drew from the old rows
        part = _drawn_part(self.trainer.train_dataloader)
        changed = changed or (part is not None and part != self._part)
        self._loaded = tuple(n if n is not None else o for n, o in zip(now, self._loaded))
        self._sizes = tuple(_length(d) for d in self._loaded)
        self._part = part if part is not None else self._part
        return changed

    def resized_by_reload(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's ``state`` in which, where Lightning reloads the loaders
        (``reload_dataloaders_every_n_epochs``), a sampler's state over a data set of another
        size than the loaders' now (written before a reload resized it) is this run's fresh
        sampler's: the uninterrupted fit started a fresh sampler at that reload too
        (:meth:`continue_from`). Without reloads a resized data set stays refused."""
        if not self.trainer.reload_dataloaders_every_n_epochs:
            return state
        state = dict(state)
        for key, sampler in self.samplers().items():
            saved = state.get(key)
            n = getattr(sampler, "n", None)
            if n is None or not isinstance(saved, dict) or saved.get("n", n) == n:
                continue
            state[key] = sampler.state_dict()
            if "loader_order" in saved:
                state[key]["loader_order"] = saved["loader_order"]
        return state

    def continue_from(self, old: HyperData) -> None:
        """Built after a reload: each sampler over a data set of the old one's size continues
        where the old one stopped (a reload over equal data then changes nothing, and a fit
        resumed after it, whose samplers are built on the reloaded loaders, draws the same); one
        over a resized data set starts afresh."""
        self.val_samples = old.val_samples
        before = old.samplers()
        for key, sampler in self.samplers().items():
            if sampler is None or before[key] is None:
                continue
            state = before[key].state_dict()
            try:
                sampler.check_state(state, key)
            except ConfigurationError:
                continue
            sampler.load_state_dict(state)

    # ------------------------------------------------------------------ reading
    def full_train_batch(self) -> Any:
        """This process's shard of the whole training set as one batch."""
        if self.train_parts is None:
            raise ConfigurationError(
                "these settings read the whole training set at once (batches='full'), which a "
                "streamed train dataloader (an IterableDataset, or batch_size=None) cannot give: "
                "use minibatch settings, or a map-style dataset."
            )
        dataset, collate = self.train_parts
        idx = shard_indices(len(dataset), self.rank, self.world_size)
        return self._prepare()(fetch(dataset, collate, idx))

    def validation_batch(self) -> Any:
        """The next validation minibatch, or the whole (sharded) validation set."""
        if self.val is None:
            self.val_samples += self.n_val
            return self.val_full
        batch = next(self.val)
        self.val_samples += self.val.sampler.global_batch
        return batch

    # ------------------------------------------------------------------ state
    def samplers(self) -> dict[str, Any]:
        """The samplers whose places are checkpointed (None where there is none)."""
        return {
            "train_sampler": self.train.sampler,
            "val_sampler": self.val.sampler if self.val is not None else None,
        }

    def state_dict(self) -> dict[str, Any]:
        states = {k: s.state_dict() if s else None for k, s in self.samplers().items()}
        if states["train_sampler"] is not None:  # beside the sampler: the state's keys are kept
            states["train_sampler"]["loader_order"] = self.order.state_dict()
        return {**states, "val_samples": self.val_samples}

    @staticmethod
    def _order_state(state: dict[str, Any]) -> Any:
        train = state["train_sampler"]
        return train.get("loader_order") if isinstance(train, dict) else None

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise unless ``state`` (a checkpoint's) fits these samplers; changes nothing."""
        for key, sampler in self.samplers().items():
            if (state[key] is None) != (sampler is None):
                raise ConfigurationError(
                    f"the checkpoint {'has no' if state[key] is None else 'has a'} "
                    f"{key.replace('_', ' ')} state but this run "
                    f"{'has no' if sampler is None else 'has'} "
                    "such sampler: resume with the same val / val_batch_size settings."
                )
            if sampler is not None:
                sampler.check_state(state[key], key.replace("_", " "))
        if self._order_state(state) is not None:
            self.order.check_state(self._order_state(state))
        val_samples = state["val_samples"]
        if isinstance(val_samples, bool) or not isinstance(val_samples, int) or val_samples < 0:
            raise ConfigurationError(
                f"the checkpoint's val_samples must be an integer ≥ 0, got {val_samples!r}."
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checked state (:meth:`check_state`)."""
        for key, sampler in self.samplers().items():
            if sampler is not None:
                sampler.load_state_dict(state[key])
        self.val_samples = state["val_samples"]
        order = self._order_state(state)
        if order is not None:
            self.order.load_state_dict(order)
        else:
            rank_zero_warn(
                f"{self.who}: the checkpoint holds no training-order state "
                "(written by an older version): a shuffling train loader will not repeat the "
                "uninterrupted fit's order after this resume."
            )

    # ------------------------------------------------------------------ building
    def _prepare(self, validation: bool = False) -> Callable[[Any], Any]:
        """What Lightning's loops do to each batch before a step sees it: the precision's dtype
        conversion (e.g. to float64 under ``precision="64-true"``), the module's
        ``on_before_batch_transfer``, then the strategy's ``batch_to_device`` (which runs
        ``transfer_batch_to_device`` and ``on_after_batch_transfer``). Validation batches are
        prepared with the trainer in its validating stage, so hooks that augment only while
        ``self.trainer.training`` leave them alone, as in Lightning's validation loop."""
        trainer = self.trainer

        def prepare(batch: Any) -> Any:
            return prepared(trainer, batch, validation)

        return prepare

    def _train_source(self, batch_size: int | None, seed: int) -> SampledBatches | LoaderBatches:
        loader = first_loader(self.trainer.train_dataloader, "train dataloader", self.who)
        if not draws_by_index(loader):  # a stream: read from the loader itself
            return LoaderBatches(
                loader, self._prepare(), self.world_size, batch_size, "train dataloader"
            )
        dataset, collate, loader_bs = loader_parts(loader, "train dataloader", self.who)
        dataset = sampled_part(loader, dataset, "train dataloader", self.who)
        dataset = self._read_by_training(loader, dataset, loader_bs)
        _refuse_empty(dataset, "train dataloader", self.who)
        batch_size = batch_size or self._whole_set_at_most(loader_bs, len(dataset))
        if batch_size is None:
            raise ConfigurationError(
                f"{self.who} cannot tell the training batch size: pass batch_size."
            )
        self.n_train = len(dataset)
        sampler = ShardedSampler(self.n_train, batch_size, seed, self.rank, self.world_size)
        self.train_parts = (dataset, collate)
        return SampledBatches(dataset, collate, sampler, self._prepare())

    def _read_by_training(
        self, loader: DataLoader, dataset: Dataset, loader_bs: int | None
    ) -> Dataset:
        """The part of the training set the training loop reads: all of it, unless the loop
        reads only the first k batches of a loader that does not shuffle (``overfit_batches=k``,
        or ``limit_train_batches`` on a loader with ``shuffle=False``): then its first k·b
        samples, every epoch. ℓ̂ must be the loss the training minimises: drawn from the whole
        set, the hyper steps would tune λ for a training on samples it never sees (with
        ``overfit_batches=2`` on 640 digits, a fixed point of 64 samples differentiated as
        one of 640)."""
        k = self.trainer.num_training_batches
        try:
            n_batches = len(loader)
        except TypeError:
            return dataset
        if not isinstance(k, int) or k >= n_batches or loader_bs is None:
            return dataset
        sampler = loader.sampler
        if isinstance(sampler, _RANDOM) or getattr(sampler, "shuffle", False):
            return dataset  # a new random subset each epoch: the training sees the whole set
        if self.world_size > 1 or not isinstance(sampler, SequentialSampler):
            rank_zero_warn(
                f"{self.who}: the training reads only {k} of the train "
                f"dataloader's {n_batches} batches (overfit_batches / limit_train_batches) in "
                "an order that does not shuffle, but the hyper steps draw from the whole "
                "training set: λ is tuned for a training on samples it never sees. Shuffle the "
                "train dataloader, or train on all of it."
            )
            return dataset
        return Subset(dataset, range(min(len(dataset), k * loader_bs)))

    def _whole_set_at_most(self, loader_batch_size: int | None, n: int) -> int | None:
        """A loader's batch size, capped at this process's share of its ``n`` samples: a
        DataLoader whose ``batch_size`` exceeds its data set (``batch_size=1000`` over 500
        validation samples) yields the whole set as one batch, and so do the samplers. (A
        ``batch_size=``/``val_batch_size=`` given to the callback is taken as asked, and refused
        when too large.)"""
        if loader_batch_size is None:
            return None
        return max(1, min(loader_batch_size, n // self.world_size))

    def _build_val(self, val: str, batch_size: int | None, seed: int) -> None:
        loader = validation_loader(self.trainer)
        if loader is None or (isinstance(loader, (list, tuple)) and not loader):
            got = "" if loader is None else f" (got an empty {type(loader).__name__})"
            raise ConfigurationError(
                f"{self.who} needs validation data for the outer objective "
                f"E{got}: pass val_dataloaders to trainer.fit, or define val_dataloader() in "
                "the module or the datamodule."
            )
        to_device = self._prepare(validation=True)
        if isinstance(loader, (list, tuple)):
            self.other_val_loaders = list(loader[1:])
        loader = first_loader(loader, "validation dataloader", self.who)
        if not draws_by_index(loader):  # a stream: read from the loader itself
            if val == "full":
                raise ConfigurationError(
                    "val='full' reads the whole validation set by index, which a streamed "
                    "validation dataloader (an IterableDataset, or batch_size=None) cannot give: "
                    "use val='batch', or a map-style dataset."
                )
            self.val = LoaderBatches(
                loader, to_device, self.world_size, batch_size,
                "validation dataloader", "val_batch_size",
            )  # fmt: skip
            return
        dataset, collate, loader_bs = loader_parts(loader, "validation dataloader", self.who)
        dataset = self.val_dataset = sampled_part(
            loader, dataset, "validation dataloader", self.who
        )
        self.n_val = len(dataset)
        _refuse_empty(dataset, "validation dataloader", self.who)
        if val == "full":
            idx = shard_indices(len(dataset), self.rank, self.world_size)
            if batch_size is None:
                self.val_full = to_device(fetch(dataset, collate, idx))
            else:
                shard = torch.utils.data.Subset(dataset, idx.tolist())
                self.val_full = DataLoader(
                    shard,
                    batch_size=batch_size,
                    shuffle=False,
                    collate_fn=lambda items: to_device(collate(items)),
                )
            return
        batch_size = batch_size or self._whole_set_at_most(loader_bs, len(dataset))
        if batch_size is None:
            raise ConfigurationError(
                f"{self.who} cannot tell the validation batch size: pass val_batch_size."
            )
        sampler = ShardedSampler(len(dataset), batch_size, seed, self.rank, self.world_size)
        # a hyper-step batch above the loader's is read in parts of the loader's size
        self.val = SampledBatches(dataset, collate, sampler, to_device, chunk=loader_bs)


def _drawn_part(loaders: Any) -> tuple[int, ...] | None:
    """The rows a training loader's ``SubsetRandomSampler`` draws (None: no such sampler)."""
    if isinstance(loaders, (list, tuple)):
        loaders = loaders[0] if loaders else None
    sampler = getattr(loaders, "sampler", None)
    if not isinstance(sampler, SubsetRandomSampler):
        return None
    return tuple(int(i) for i in sampler.indices)


def _shares_training_examples(train: Dataset, loader: Any) -> bool:
    """Whether a validation ``loader`` reads examples of the training set ``train`` (a loader
    over another data set, or over a disjoint split of the same one, does not)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return False
    shared = shared_examples(train, dataset)
    return shared is not None and shared[0] > 0


def _refuse_empty(dataset: Dataset, what: str, who: str) -> None:
    """A clear error for a data set with no example (it read as "the hyper-step batch (1 per
    process) is larger than the data set (0 samples): lower batch_size", which no batch size
    fixes)."""
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ConfigurationError(
            f"{who}: the {what}'s data set holds no example (after its "
            "sampler's and the Trainer's limits): the hyper steps need "
            f"{'validation examples for E' if what.startswith('val') else 'training examples'}. "
            "Check the split that built it (e.g. random_split's sizes)."
        )


def prepared(trainer: pl.Trainer, batch: Any, validation: bool = False) -> Any:
    """``batch`` as Lightning's loops hand it to a step: the precision's dtype conversion (e.g.
    to bfloat16 under ``precision="bf16-true"``), the module's ``on_before_batch_transfer``,
    then the strategy's ``batch_to_device`` (``transfer_batch_to_device``,
    ``on_after_batch_transfer``); a validation batch with the trainer in its validating stage."""
    with _validating(trainer) if validation else nullcontext():
        batch = trainer.precision_plugin.convert_input(batch)
        batch = trainer.lightning_module._on_before_batch_transfer(batch, dataloader_idx=0)
        return trainer.strategy.batch_to_device(batch, dataloader_idx=0)


@contextmanager
def _validating(trainer: pl.Trainer) -> Iterator[None]:
    """The trainer in its validating stage for the duration (the stage of the trainer's own
    Lightning namespace)."""
    stage = namespace_of(trainer).trainer.states.RunningStage.VALIDATING
    before, trainer.state.stage = trainer.state.stage, stage
    try:
        yield
    finally:
        trainer.state.stage = before
