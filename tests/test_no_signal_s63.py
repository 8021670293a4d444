"""Data weights that find no signal are said at the fit's end (session 63, issue 27).

Where the validation data tells no training row from another, every row's logit random-walks
(each visit moves it about ``outer_lr`` whatever its hypergradient): eq. drift's R (net drift² /
summed step², :mod:`hypertorch_sid.lightning.weight_signal`) stays near 1 and the fit warns;
where it does (flipped labels, a clean validation set) the rows with wrong labels drift down
visit after visit, R is well above the threshold and nothing is said.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_split, trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.lightning.no_signal import WarnAtEnd
from hypertorch_sid.lightning.weight_signal import NO_SIGNAL_DRIFT, NO_SIGNAL_MEDIAN, WeightSignal

N, N_VAL, EPOCHS = 400, 150, 12


class Classifier(pl.LightningModule):
    """A small MLP with per-sample cross entropy, SGD with momentum."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Regression(Classifier):
    """A linear regression with per-sample squared errors."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y, reduction="none")


def fit(
    model: Classifier, data: tuple[Tensor, ...], **kwargs: Any
) -> tuple[LearnedDataWeights, list[str]]:
    """A fit with the default data weights (and ``kwargs``) on ``data`` = (X, y, X_val, y_val);
    the callback and the warnings said about a random walk."""
    X, y, Xv, yv = data
    cb = LearnedDataWeights(seed=0, every_n_steps=10, **kwargs)  # a new v every epoch
    train = DataLoader(
        IndexedDataset(TensorDataset(X, y)),
        batch_size=40,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=EPOCHS).fit(
            model, train, DataLoader(TensorDataset(Xv, yv), batch_size=N_VAL)
        )
    said = [str(w.message) for w in caught if "random walk" in str(w.message)]
    return cb, said


def test_weights_without_a_signal_are_said_at_the_fits_end():
    """Targets of pure noise, drawn alike for training and validation: no row is any likelier
    than another to help the validation loss, so the weights only random-walk."""
    gen = torch.Generator().manual_seed(1)
    X, Xv = torch.randn(N, 4, generator=gen), torch.randn(N_VAL, 4, generator=gen)
    y, yv = torch.randn(N, generator=gen), torch.randn(N_VAL, generator=gen)
    # session 64's default acts half-way (ResetWeights): session 63's warning is WarnAtEnd's
    cb, said = fit(Regression(), (X, y, Xv, yv), objective="mean_loss", no_signal=WarnAtEnd())
    reading = cb.weight_signal()
    assert reading is not None and not reading.separates, reading
    assert reading.drift <= NO_SIGNAL_DRIFT and reading.median <= NO_SIGNAL_MEDIAN
    assert reading.steps >= 4 and reading.rows == N
    assert len(said) == 1 and said[0].startswith("LearnedDataWeights: the learned weights")
    assert "no_signal=ResetWeights()" in said[0]
    assert "Compare with a fit without LearnedDataWeights" in said[0]
    with pytest.warns(UserWarning, match="random walk"):  # flagged() says it too
        cb.flagged()


def test_control_flipped_labels_are_read_as_a_signal_and_nothing_is_said():
    """40 % of the digits' training labels moved to another class, a clean validation set."""
    X, y, Xv, yv = digits_split(N, N_VAL, seed=0)
    gen = torch.Generator().manual_seed(0)
    bad = torch.randperm(N, generator=gen)[: int(0.4 * N)]
    y = y.clone()
    y[bad] = (y[bad] + torch.randint(1, 10, (len(bad),), generator=gen)) % 10
    cb, said = fit(Classifier(), (X, y, Xv, yv))
    reading = cb.weight_signal()
    assert reading is not None and reading.separates and reading.advice() is None, reading
    assert said == []
    w = cb.data_weights()
    assert float(w[bad].mean()) < float(w.mean()) - 0.1  # the weights did separate


def test_drift_is_near_one_for_a_random_walk_and_grows_with_a_drift():
    """Eq. drift on made-up steps: random signs give R ≈ 1 whatever the step sizes; a third of
    the rows stepping down under each of 8 vs gives R ≈ 3 (about 4: the median moves)."""
    gen = torch.Generator().manual_seed(0)
    for drifting in (False, True):
        signal, x = WeightSignal(), torch.zeros(3000)
        signal.observe(x)
        for _ in range(8):
            step = torch.where(torch.rand(3000, generator=gen) < 0.5, -1.0, 1.0)
            step = step * torch.rand(3000, generator=gen) * 2  # sizes vary
            if drifting:
                step[:1000] = -1.0
            x = x + step + 5.0  # a common shift (a gauge) is no drift
            signal.observe(x)
        reading = signal.reading()
        assert reading is not None and reading.steps == 8
        if drifting:
            assert 2.5 < reading.drift < 5 and reading.separates  # the median step moves too
        else:
            assert 0.9 < reading.drift < 1.1 and not reading.separates


def test_too_few_epochs_judge_nothing():
    signal = WeightSignal()
    for k in range(3):
        signal.observe(torch.randn(50) * k)
    assert signal.reading() is None  # two epochs of steps: below MIN_EPOCHS


def test_hyper_steps_far_apart_judge_nothing():
    """With v held for more than two epochs a row overshoots under it and comes back: its
    steps are no random walk's, so nothing is read (the networks test: a hyper step every 4
    epochs, weights that separate, R 0.65-0.91)."""
    signal, gen = WeightSignal(), torch.Generator().manual_seed(0)
    for _ in range(9):
        signal.observe(torch.randn(100, generator=gen), epochs=4.0)
    assert signal.steps == 8 and signal.reading() is None
