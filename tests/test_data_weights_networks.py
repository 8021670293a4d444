"""``LearnedDataWeights()`` with every default on small real networks, trained as users train
them: an MLP, a CNN with BatchNorm and an LSTM on scikit-learn's bundled 8×8 digits (no
download) with 30 % of the training labels replaced by another class, under SGD, SGD with
momentum, Adam and AdamW (the other data-weight tests train 2-D toys with SGD or Adam).

Each fit must end with finite weights whose corrupted examples sit clearly below the clean ones:
the mean weight apart by a margin, and a clean example outranking a corrupted one far more often
than chance (the area under the ROC curve of ω as a score of "clean"; chance gives 0.5 ± 0.03
here). Measured on these six cases (600 optimizer steps, one thread): mean ω corrupted 0.09–0.26
against clean 0.60–0.72, AUC 0.73–0.91; the assertions sit below every measured value. (With
Adam at 3e-3 the LSTM, which fits this data least in 60 epochs, separated less: AUC 0.62–0.65.)"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_cnn, digits_split, trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights

N, N_VAL, NOISE, EPOCHS = 400, 150, 0.3, 60  # 10 steps an epoch: 600 optimizer steps


def noisy_digits(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Digits split by ``seed``; 30 % of the training labels moved to another class (uniform).
    Also the mask of the corrupted examples."""
    X, y, Xv, yv = digits_split(N, N_VAL, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    bad = torch.randperm(N, generator=gen)[: int(NOISE * N)]
    y = y.clone()
    y[bad] = (y[bad] + torch.randint(1, 10, (len(bad),), generator=gen)) % 10
    corrupted = torch.zeros(N, dtype=torch.bool)
    corrupted[bad] = True
    return X, y, Xv, yv, corrupted


class LastStepLSTM(nn.Module):
    """An LSTM reading the image's 8 rows as a sequence; the last state classifies."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x.view(-1, 8, 8))
        return self.head(out[:, -1])


NETWORKS: dict[str, Callable[[], nn.Module]] = {
    "mlp": lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
    "cnn_bn": digits_cnn,
    "lstm": LastStepLSTM,
}
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=3e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=1e-2),
}


class Classifier(pl.LightningModule):
    """A user's classifier with the one change the drop-in needs: ``reduction="none"``."""

    def __init__(self, network: str, optimizer: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.optimizer = NETWORKS[network](), optimizer

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return OPTIMIZERS[self.optimizer](self.parameters())


def auc(score: Tensor, positive: Tensor) -> float:
    """P(score of a positive > score of a negative): the area under the ROC curve."""
    return float((score[positive][:, None] > score[~positive][None, :]).float().mean())


CASES = [  # (network, optimizer, seed): every network and every optimizer, two seeds each
    ("mlp", "sgd", 0),
    ("mlp", "adamw", 1),
    ("cnn_bn", "momentum", 0),
    ("cnn_bn", "adam", 1),
    ("lstm", "momentum", 0),
    ("lstm", "momentum", 1),
]


def fit_noisy_digits(
    network: str, optimizer: str, seed: int, callbacks: list[pl.Callback]
) -> tuple[Classifier, Tensor]:
    """One fit of ``network`` under ``optimizer`` on :func:`noisy_digits` with ``callbacks``
    (a LearnedDataWeights among them); the model and the corrupted examples' mask."""
    X, y, Xv, yv, corrupted = noisy_digits(seed)
    train = DataLoader(
        IndexedDataset(TensorDataset(X, y)),
        batch_size=40,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = Classifier(network, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short fit's unconverged adjoint solves warn
        trainer(callbacks, max_epochs=EPOCHS).fit(
            model, train, DataLoader(TensorDataset(Xv, yv), batch_size=150)
        )
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return model, corrupted


def assert_separates(cb: LearnedDataWeights, corrupted: Tensor) -> None:
    """The corrupted examples' weights clearly below the clean ones' (module docstring)."""
    w = cb.data_weights()
    assert w.shape == (N,) and bool(torch.isfinite(w).all())
    bad, clean = float(w[corrupted].mean()), float(w[~corrupted].mean())
    assert bad < clean - 0.25, (bad, clean)
    assert auc(w, ~corrupted) > 0.65, auc(w, ~corrupted)
    reading = cb.weight_signal()  # and no "no more signal than a random walk" (session 63):
    assert reading is None or reading.advice() is None, reading  # unread: v held 4 epochs


@pytest.mark.parametrize(("network", "optimizer", "seed"), CASES)
def test_the_defaults_learn_which_examples_to_trust_on_real_networks(network, optimizer, seed):
    cb = LearnedDataWeights(seed=seed)
    _, corrupted = fit_noisy_digits(network, optimizer, seed, [cb])
    assert_separates(cb, corrupted)


def _precision_recall(flags: Tensor, corrupted: Tensor) -> tuple[float, float]:
    hit = corrupted[flags]
    return float(hit.float().mean()), float(hit.sum()) / float(corrupted.sum())


@pytest.mark.parametrize(("network", "optimizer"), [("mlp", "sgd"), ("cnn_bn", "momentum")])
def test_split_misfit_flags_the_split_rows_the_network_contradicts(network, optimizer):
    """On small networks the two-component split's low bump (the default) holds clean rows too
    (hard examples whose weights the validation data also lowered): it flagged 45-57 % of the
    rows at precision 0.45-0.55. ``flagged("split_misfit")`` keeps those of its rows the network
    predicts as another class at their last visit (training loss > log 2): a subset of the
    split, every one of them contradicted, at a clearly higher precision and nearly the same
    recall. (Not the default: on the noisy-label CNN benchmark it lost recall, see the docs.)"""
    cb = LearnedDataWeights(seed=0)
    _, corrupted = fit_noisy_digits(network, optimizer, 0, [cb])
    with warnings.catch_warnings():  # the rule's rows, whether or not the evidence check
        warnings.simplefilter("ignore")  # withholds the default's (at ½ contradicted: a tie)
        split, default = cb.flagged("split"), cb.flagged("split_misfit")
    assert set(default.tolist()) < set(split.tolist())
    assert bool((cb.problem._last_loss.cpu()[default] > math.log(2)).all())
    (p_split, r_split), (p, r) = (_precision_recall(f, corrupted) for f in (split, default))
    # the class gauge (the default since session 51): mlp / sgd split 0.61 at recall 0.95
    assert p_split < 0.65 and p > p_split + 0.15, (p_split, p)
    assert r > 0.7 and r > r_split - 0.1, (r_split, r)
