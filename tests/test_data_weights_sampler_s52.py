"""``gauge="auto"`` under a class-rebalancing sampler (session 52): where the training DataLoader
draws with a ``WeightedRandomSampler`` the part of each row's hypergradient common to its class
is evidence (two disjoint validation halves agree on it, docs/data_weights.md), so the drop-in
keeps it (``"batch"``) instead of holding each class; ``gauge="class"`` given still holds them."""

from __future__ import annotations

import pytest
import torch
from test_data_weights_lightning import Data, callback, fit
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from hypertorch_sid import IndexedDataset
from hypertorch_sid.lightning.data_checks import draws_weighted


class Rebalanced(Data):
    """The tests' noisy blobs drawn by a WeightedRandomSampler (class 0 drawn 3× as often)."""

    def train_dataloader(self) -> DataLoader:
        data = IndexedDataset(TensorDataset(self.X, self.y))
        w = torch.where(self.y == 0, 3.0, 1.0).double()
        gen = torch.Generator().manual_seed(0)
        sampler = WeightedRandomSampler(w, len(w), replacement=True, generator=gen)
        return DataLoader(data, batch_size=24, sampler=sampler)


def test_auto_keeps_the_batch_gauge_under_a_weighted_sampler():
    cb = callback()
    fit(cb, 2, data=Rebalanced())
    assert cb.weights is not None and cb.weights.gauge == "batch"
    w = cb.data_weights()
    assert torch.isfinite(w).all() and (w != 0.5).any()  # it learned


def test_auto_holds_each_class_without_one_and_class_given_holds_them_with_one():
    cb = callback()
    fit(cb, 2)
    assert cb.weights is not None and cb.weights.gauge == "class"
    given = callback(gauge="class")
    fit(given, 2, data=Rebalanced())
    assert given.weights is not None and given.weights.gauge == "class"


@pytest.mark.parametrize("weighted", [True, False])
def test_draws_weighted_sees_the_sampler_also_inside_lightnings_ddp_wrapper(weighted):
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper

    data = TensorDataset(torch.zeros(6, 1))
    sampler = (
        WeightedRandomSampler(torch.ones(6).double(), 6)
        if weighted
        else torch.utils.data.RandomSampler(data)
    )
    assert draws_weighted(DataLoader(data, sampler=sampler)) is weighted
    wrapped = DistributedSamplerWrapper(sampler, num_replicas=2, rank=0, shuffle=False)
    assert draws_weighted(DataLoader(data, sampler=wrapped)) is weighted
    assert not draws_weighted(DataLoader(data, shuffle=True))
