"""The run-time hint for imbalanced classes (session 55, eq. rarity).

Where a class is far rarer in the training draws than in the validation data, the fit says so
once, with what sessions 53–54 measured (docs/data_weights.md, "Session 55: a run-time hint for
imbalanced classes"); it is silent on balanced classes, with label noise that leaves the classes
balanced, and under a sampler that balances the draws; it changes nothing in the learning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from test_data_weights_imbalance_s53 import RareClass
from test_data_weights_lightning import Data, callback, fit
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import hypertorch_sid.lightning.data_weights as data_weights
from hypertorch_sid import IndexedDataset
from hypertorch_sid.lightning.imbalance import (
    ANCHOR,
    RARE_CLASS_FACTOR,
    ClassRarity,
    imbalance_advice,
)

HINT = "far rarer in the training draws"


def hints(cb, data, epochs: int = 6) -> list[str]:
    """The fit's imbalance hints."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(cb, epochs, data=data)
    return [str(w.message) for w in caught if HINT in str(w.message)]


class Balanced(Data):
    """Three balanced classes (80 rows each), clean labels, a balanced validation set."""

    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])

        def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.arange(n) % 3
            return centres[y] + 0.8 * torch.randn(n, 2, generator=gen), y

        self.X, self.y = draw(240)
        self.Xv, self.yv = draw(60)
        moved = torch.rand(240, generator=gen) < noise  # to a uniformly drawn other class
        shift = torch.randint(1, 3, (240,), generator=gen)
        self.y = torch.where(moved, (self.y + shift) % 3, self.y)


class Rebalanced(RareClass):
    """RareClass drawn by a WeightedRandomSampler that draws each class equally often."""

    def train_dataloader(self) -> DataLoader:
        counts = torch.bincount(self.y).double()
        gen = torch.Generator().manual_seed(0)
        sampler = WeightedRandomSampler(
            (1.0 / counts)[self.y], len(self.y), replacement=True, generator=gen
        )
        return DataLoader(IndexedDataset(TensorDataset(self.X, self.y)), 24, sampler=sampler)


def test_a_rare_class_is_said_once_with_its_factor_and_the_measured_advice():
    """Class 2 at a tenth (9 of 189 training rows, 20 of 60 validation rows): said once in a
    6-epoch fit, naming it and r₂ = (20/60) / (9/189) = 7 exactly (every row drawn once an
    epoch, every hyper step reading the whole validation set)."""
    cb = callback()
    said = hints(cb, RareClass())
    assert len(said) == 1, said
    assert "class 2: 4.8% of the training draws, 33.3% of the validation, 7.0× rarer" in said[0]
    assert "class 0" not in said[0] and "class 1" not in said[0]
    assert "about 1 point below" in said[0] and "noisy" in said[0] and ANCHOR in said[0]
    rarity = cb.class_imbalance()
    assert rarity is not None
    assert float(rarity.factor[2]) == pytest.approx((20 / 60) / (9 / 189), rel=1e-12)
    assert float(rarity.training.sum()) == pytest.approx(1.0)


def test_the_hint_changes_nothing_in_the_learning(monkeypatch):
    """The same fit with the hint and without it (its advice muted): the same weights, bit for
    bit."""
    said = callback()
    assert hints(said, RareClass(), epochs=3)
    monkeypatch.setattr(data_weights, "imbalance_advice", lambda rarity: None)
    muted = callback()
    assert not hints(muted, RareClass(), epochs=3)
    assert torch.equal(said.data_weights(), muted.data_weights())


@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_balanced_classes_are_not_said_clean_or_with_symmetric_noise(noise):
    """Balanced classes, clean and with 40 % of the labels moved to another class: judged (the
    shares known) and not said."""
    cb = callback()
    assert hints(cb, Balanced(noise)) == []
    rarity = cb.class_imbalance()
    assert rarity is not None and float(rarity.factor.max()) < 1.5, rarity


def test_a_sampler_that_balances_the_draws_is_not_said():
    """The rare class drawn as often as the others: its share of the draws is the
    validation's (r₂ ≈ 1), though it holds 9 of the 189 rows (7× by rows)."""
    cb = callback()
    assert hints(cb, Rebalanced()) == []
    rarity = cb.class_imbalance()
    assert rarity is not None and abs(float(rarity.factor[2]) - 1.0) < 0.3, rarity


def test_a_share_read_from_few_validation_examples_is_not_taken_at_face_value():
    """Eq. rarity's lower end: 8 of 20 validation examples in one of 10 balanced classes puts
    r at 4 but the lower end of its Wilson interval at 2.19 (not said); the same share read
    from 300 examples (120 of them) has its lower end at 3.46 (said)."""
    training = torch.full((10,), 0.1, dtype=torch.float64)
    validation = torch.full((10,), 0.6 / 9, dtype=torch.float64)
    validation[0] = 0.4
    few, many = ClassRarity(training, validation, 20.0), ClassRarity(training, validation, 300.0)
    assert float(few.factor[0]) == pytest.approx(4.0)
    # Wilson's lower end (p + z²/2n − z√(p(1−p)/n + z²/4n²)) / (1 + z²/n), z = 1.96, over 0.1
    assert float(few.lower_factor[0]) == pytest.approx(2.1880, abs=1e-4)
    assert float(many.lower_factor[0]) == pytest.approx(3.4616, abs=1e-4)
    assert float(few.lower_factor[0]) < RARE_CLASS_FACTOR <= float(many.lower_factor[0])
    assert few.rare() == [] and imbalance_advice(few) is None
    assert many.rare() == [0] and "class 0:" in imbalance_advice(many)


def test_the_hint_cites_a_heading_of_the_docs():
    """The anchor the message names is a heading of docs/data_weights.md."""
    from test_readme_links import anchors

    page, _, anchor = ANCHOR.partition("#")
    assert anchor in anchors(Path(__file__).resolve().parents[1] / page)
