"""The drop-ins sign their data messages with their own name (session 59): a user who added
``LearnedWeightDecay`` read "HyperOptimizationCallback: the train dataloader draws its examples
with a WeightedRandomSampler …" and "HyperOptimizationCallback: … holds no example", a class
they never used (rec59's round of unseen recipes)."""

from __future__ import annotations

import warnings

import pytest
import torch
from lightning_problems import TOY_X, TOY_Y, ToyClassifier, trainer
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from hypertorch_sid import ConfigurationError, LearnedWeightDecay

VAL = TensorDataset(TOY_X[:60], TOY_Y[:60])


def _weighted_train() -> DataLoader:
    weights = torch.linspace(1.0, 3.0, 60)  # unequal draws
    sampler = WeightedRandomSampler(
        weights, num_samples=60, generator=torch.Generator().manual_seed(0)
    )
    return DataLoader(TensorDataset(TOY_X[60:120], TOY_Y[60:120]), batch_size=20, sampler=sampler)


def test_the_weighted_sampler_warning_names_the_drop_in():
    cb = LearnedWeightDecay(1e-3, every_n_steps=2, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(
            ToyClassifier(), _weighted_train(), DataLoader(VAL, batch_size=20)
        )
    said = [
        str(w.message)
        for w in caught
        if "WeightedRandomSampler of unequal weights" in str(w.message)
    ]
    assert said and said[0].startswith("LearnedWeightDecay: the train dataloader draws")


def test_an_empty_validation_set_is_refused_in_the_drop_ins_name():
    empty = DataLoader(TensorDataset(TOY_X[:0], TOY_Y[:0]), batch_size=20)
    train = DataLoader(TensorDataset(TOY_X[60:120], TOY_Y[60:120]), batch_size=20)
    cb = LearnedWeightDecay(1e-3, max_overhead=None)
    with pytest.raises(
        ConfigurationError,
        match=r"^LearnedWeightDecay: the validation dataloader's data set holds no example",
    ):
        trainer([cb], max_epochs=1, num_sanity_val_steps=0).fit(ToyClassifier(), train, empty)
