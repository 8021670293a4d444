"""Session 57's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen user
recipes (session 57)"; the recipes: benchmarks/bench_user_recipes_s57.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import three_class_sets
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)


def _trainer(callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


class Net(pl.LightningModule):
    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.per_sample = per_sample
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        return batch  # the user's would read x, y = batch: here, what it is handed

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _callback(kind: str) -> Any:
    if kind == "decay":
        return LearnedWeightDecay(1e-3, every_n_steps=2, start_step=0, max_overhead=None)
    return LearnedDataWeights(every_n_steps=2, start_step=0, max_overhead=None)


def _fit(cb: Any, train: Any, val: Any, **kw: Any) -> tuple[pl.Trainer, Net, list[str]]:
    model = Net(per_sample=isinstance(cb, LearnedDataWeights))
    trainer = _trainer([cb], **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train, val)
    return trainer, model, [str(w.message) for w in caught]


def _train_loader(kind: str, train: TensorDataset) -> DataLoader:
    data = IndexedDataset(train) if kind == "weights" else train
    return DataLoader(data, batch_size=16, shuffle=True)


def _shared(messages: list[str]) -> list[str]:
    return [m for m in messages if "validation examples are training examples too" in m]


# ----------------------------------------------------------------------------- two_val


@pytest.mark.parametrize("kind", ["decay", "weights"])
def test_a_training_probe_listed_before_the_validation_loader_names_the_loader_to_list_first(
    kind: str,
) -> None:
    """``val_dataloader`` returns [a probe of the training rows, the validation set]: the hyper
    steps read the first, training rows. The warning said "Hold out validation examples the
    training never reads, e.g. random_split" — data the user had, second in the list; it now
    names that loader and says to list it first (and what data weights do on training rows)."""
    train, val = three_class_sets()
    probe = DataLoader(Subset(train, range(32)), batch_size=32)
    held_out = DataLoader(val, batch_size=32)
    _, _, said = _fit(_callback(kind), _train_loader(kind, train), [probe, held_out],
                      max_epochs=1)  # fmt: skip
    shared = _shared(said)
    assert len(shared) == 1, said
    assert "32 of the 32 validation examples" in shared[0]
    assert "the first of the 2 validation dataloaders" in shared[0]
    assert "val_dataloader()[1] holds no training example" in shared[0]
    assert "random_split" not in shared[0]
    assert "data weights learn to trust the rows the network fits" in shared[0]


def test_control_one_overlapping_validation_loader_is_still_told_to_hold_out_data() -> None:
    """One validation loader over training rows: the old advice (hold out data) stands."""
    train, _ = three_class_sets()
    probe = DataLoader(Subset(train, range(32)), batch_size=32)
    _, _, said = _fit(_callback("decay"), _train_loader("decay", train), probe, max_epochs=1)
    shared = _shared(said)
    assert len(shared) == 1 and "random_split" in shared[0], said
    assert "first of the" not in shared[0]


def test_control_the_held_out_loader_first_says_nothing() -> None:
    train, val = three_class_sets()
    loaders = [DataLoader(val, batch_size=32), DataLoader(Subset(train, range(32)), batch_size=32)]
    _, _, said = _fit(_callback("decay"), _train_loader("decay", train), loaders, max_epochs=1)
    assert _shared(said) == []


# ----------------------------------------------------------------------------- predict


@pytest.mark.parametrize("call", ["predict", "test"])
def test_predicting_or_testing_an_indexed_loader_says_the_step_gets_indexed_batches(
    call: str,
) -> None:
    """After the fit the user predicts the training loader (the network's own suspects beside
    ``flagged()``): ``predict_step`` got ``Indexed(index, data)`` and the user's ``x, y = batch``
    read the index as the input ("IndexError: Dimension out of range" inside the model), with
    no word of ours. Said now, before the step runs; the same for ``test``."""
    train, val = three_class_sets()
    loader = _train_loader("weights", train)
    trainer, model, _ = _fit(_callback("weights"), loader, DataLoader(val, batch_size=32),
                             max_epochs=1)  # fmt: skip
    ordered = DataLoader(loader.dataset, batch_size=32)
    with pytest.warns(UserWarning, match=f"your {call}_step gets Indexed batches") as caught:
        if call == "predict":
            got = trainer.predict(model, ordered)
            assert type(got[0]).__name__ == "Indexed"  # what predict_step is handed
        else:
            with pytest.raises(Exception):  # noqa: B017 - the user's step fails on the index
                trainer.test(model, ordered, verbose=False)
    said = next(str(w.message) for w in caught if "Indexed batches" in str(w.message))
    assert "DataLoader(train_loader.dataset.dataset)" in said


def test_control_predicting_an_unwrapped_loader_says_nothing() -> None:
    train, val = three_class_sets()
    trainer, model, _ = _fit(_callback("weights"), _train_loader("weights", train),
                             DataLoader(val, batch_size=32), max_epochs=1)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.predict(model, DataLoader(val, batch_size=32))
    assert not [w for w in caught if "Indexed batches" in str(w.message)]


# ----------------------------------------------------------------------------- reload_pool


class PartPerEpoch(Net):
    """Each epoch a new random half of one data set (``reload_dataloaders_every_n_epochs=1``),
    by a ``SubsetRandomSampler`` over one (Indexed)Dataset."""

    def __init__(self, per_sample: bool, train: Any, val: TensorDataset) -> None:
        super().__init__(per_sample)
        self.pool, self.val = (IndexedDataset(train) if per_sample else train), val
        self.g = torch.Generator().manual_seed(1)
        self.parts: list[list[int]] = []

    def train_dataloader(self) -> DataLoader:
        part = torch.randperm(len(self.pool), generator=self.g)[: len(self.pool) // 2].tolist()
        self.parts.append(part)
        return DataLoader(self.pool, batch_size=16, sampler=SubsetRandomSampler(part))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=32)


@pytest.mark.parametrize("kind", ["decay", "weights"])
def test_a_new_part_of_one_data_set_each_epoch_is_what_the_hyper_steps_draw(kind: str) -> None:
    """The reloaded loader reads the same data set through a sampler over other rows: the hyper
    steps kept drawing the first epoch's rows (only a new data set counted as a reload), so the
    weights of rows first drawn later never moved (AUC 0.77 against 0.93 on MNIST). They now
    draw the part the training reads this epoch."""
    train, val = three_class_sets()
    cb = _callback(kind)
    model = PartPerEpoch(kind == "weights", train, val)
    trainer = _trainer([cb], max_epochs=3, reload_dataloaders_every_n_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
    assert len(model.parts) >= 3
    drawn = cb.data.train_parts[0]
    assert isinstance(drawn, Subset)
    assert sorted(int(i) for i in drawn.indices) == sorted(model.parts[-1])


def test_the_subset_of_an_indexed_dataset_refusal_names_the_sampler_route() -> None:
    """``Subset(IndexedDataset(pool), part)`` per epoch is refused (its indices are the pool's);
    the advice was to wrap the outermost set, which per epoch gives each part's examples the
    same indices 0..n-1 (refused again at the first reload). It now names the route that works:
    one IndexedDataset, a SubsetRandomSampler for the part."""
    train, val = three_class_sets()
    loader = DataLoader(Subset(IndexedDataset(train), range(64)), batch_size=16, shuffle=True)
    with pytest.raises(ConfigurationError, match=r"sampler=SubsetRandomSampler\(part\)"):
        _fit(_callback("weights"), loader, DataLoader(val, batch_size=32), max_epochs=1)


# ----------------------------------------------------------------------------- dev_run


@pytest.mark.parametrize("kind", ["decay", "weights"])
def test_fast_dev_run_says_it_is_a_smoke_test_that_learns_nothing(kind: str) -> None:
    """``fast_dev_run=True`` (1 optimizer step) said "this fit runs 1 optimizer steps, so only 0
    hyper steps … λ will barely move … Train longer, or pass every_n_steps=1 for 1 hyper
    steps": advice for a short fit, to a smoke test. It now names fast_dev_run and says that
    nothing is learned."""
    train, val = three_class_sets()
    cb = LearnedWeightDecay(1e-3) if kind == "decay" else LearnedDataWeights()
    _, _, said = _fit(cb, _train_loader(kind, train), DataLoader(val, batch_size=32),
                      fast_dev_run=True)  # fmt: skip
    short = [m for m in said if "fast_dev_run" in m and "hyper" in m]
    assert len(short) == 1, said
    assert "nothing learned" in short[0] and "Fit without fast_dev_run" in short[0]
    assert "Train longer" not in short[0]
