"""``LearnedDataWeights`` on tasks other than single-label classification (session 43,
docs/data_weights.md "Other tasks"): regression with outlying targets, multi-label, token-level
sequence losses with padding, a contrastive loss with in-batch negatives, and noisy labels with a
tiny class. Each either learns (the corrupted examples' weights fall below the clean ones',
finite) or is refused naming the cause and the fix."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, IndexedDataset, LearnedDataWeights
from hypertorch_sid.core.flag_rules import BelowWeight
from hypertorch_sid.core.objectives import ExpectedError

N, BAD = 240, 72  # the first BAD training examples are corrupted


class Task(pl.LightningModule):
    """A small MLP (or token classifier) with Adam; ``step`` gives the per-sample losses."""

    def __init__(self, net: torch.nn.Module, step: Any) -> None:
        super().__init__()
        self.net, self.step = net, step

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return self.step(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def mlp(d_in: int, d_out: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, 16), torch.nn.Tanh(), torch.nn.Linear(16, d_out)
    )


def fit(
    model: pl.LightningModule, data: tuple[Tensor, ...], indexed: bool = True, **kwargs: Any
) -> LearnedDataWeights:
    X, Y, XV, YV = data
    kwargs = {"every_n_steps": 2, "start_step": 0, "seed": 0, **kwargs}
    cb = LearnedDataWeights(**kwargs)
    train = TensorDataset(X, Y)
    loader = DataLoader(
        IndexedDataset(train) if indexed else train,
        batch_size=24,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toy's adjoint solves warn; not the point
        trainer([cb], max_epochs=15).fit(model, loader, DataLoader(TensorDataset(XV, YV), 60))
    return cb


def separation(cb: LearnedDataWeights) -> tuple[float, float]:
    w = cb.data_weights()
    assert w.shape == (N,) and bool(torch.isfinite(w).all())
    return float(w[:BAD].mean()), float(w[BAD:].mean())


def flagged_quietly(cb: LearnedDataWeights) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flagged() warns where its flags are no evidence
        return cb.flagged()


# ---------------------------------------------------------------------------- 1. regression
def regression(outputs: int, scale: float = 1.0) -> tuple[Tensor, ...]:
    """y = xA + noise; the first BAD training targets moved by ±6 (outliers)."""
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(4, outputs, generator=gen)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, 4, generator=gen)
        return x, x @ A + 0.1 * torch.randn(n, outputs, generator=gen)

    X, Y = draw(N)
    XV, YV = draw(60)
    Y[:BAD] += 6.0 * torch.sign(torch.randn(BAD, outputs, generator=gen))
    return X, scale * Y, XV, scale * YV


LOSSES = {"l1": F.l1_loss, "huber": F.huber_loss}


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("outputs", [1, 3])
def test_a_robust_regression_loss_drops_the_outlying_targets(loss, outputs):
    """L1 / Huber per sample, shape (B,) (one output) or (B, D) (three, averaged over D), with
    the objective a regression needs (the mean validation loss), and the minibatch's centre
    (gauge="batch", the default for regression until session 44; the default "mean_logit" on
    these losses: tests/test_data_weights_outliers.py). The split flags about 160 rows, under
    half of them outliers: flagged("split") says so (its losses' contrast,
    tests/test_regression_flags_s62.py) and returns them anyway. Since session 62 the default
    keeps the split's rows above the clean validation losses' 90 % quantile (eq. scalemisfit,
    tests/test_regression_misfits_s62.py): 75-87 rows at precision 0.80-0.95, silently."""

    def step(z: Tensor, y: Tensor) -> Tensor:
        out = LOSSES[loss](z, y, reduction="none")
        return out[:, 0] if outputs == 1 else out

    data = regression(outputs)
    cb = fit(Task(mlp(4, outputs), step), data, objective="mean_loss", gauge="batch")
    outliers, clean = separation(cb)
    assert outliers < 0.1 < 0.4 < clean, (outliers, clean)
    with pytest.warns(UserWarning, match="no class labels.*contrast"):
        split = cb.flagged("split")
    assert float((split < BAD).float().mean()) > 0.4 and int((split < BAD).sum()) >= 68
    flagged = flagged_quietly(cb)
    assert float((flagged < BAD).float().mean()) > 0.75 and int((flagged < BAD).sum()) >= 66
    assert set(flagged.tolist()) <= set(split.tolist())


def test_a_regression_is_refused_under_the_default_objective_naming_mean_loss():
    """Real-valued validation targets under the default ExpectedError(q=0.5), which reads a loss
    as −log p. Before: it ran, silently; with targets in the tens (scale 30) it learned noise
    (outliers 0.39 / clean 0.44, 140 flagged of which 45 outliers)."""
    step = lambda z, y: F.mse_loss(z, y, reduction="none")  # noqa: E731
    with pytest.raises(ConfigurationError, match="real numbers.*objective='mean_loss'"):
        fit(Task(mlp(4, 3), step), regression(3, scale=30.0))
    cb = fit(Task(mlp(4, 1), step), regression(1), objective=ExpectedError(q=0.5))
    assert bool(torch.isfinite(cb.data_weights()).all())  # asked for knowingly: it runs


@pytest.mark.parametrize("outputs", [1, 3])
def test_squared_error_with_outliers_needs_the_unnormalised_weighted_loss(outputs):
    """MSE: the outliers' gradients (6² larger) dominate the self-normalised loss's batch mean,
    and every weight moves with it: measured 0.37 / 0.36, flagged() warned and flagged nothing.
    normalize=False (mean ωᵢℓᵢ) separates, and the rows below ω₀/2 are outliers."""

    def step(z: Tensor, y: Tensor) -> Tensor:
        out = F.mse_loss(z, y, reduction="none")
        return out[:, 0] if outputs == 1 else out

    data = regression(outputs)
    cb = fit(Task(mlp(4, outputs), step), data, objective="mean_loss", normalize=False)
    outliers, clean = separation(cb)
    assert outliers < clean - 0.25, (outliers, clean)
    # BelowWeight, not flagged()'s TwoComponentSplit: only about a third of the outliers move
    # (their logits 10/50/90 % −4.0 / 2.0 / 4.2, the clean 3.3 / 4.1 / 5.0), no second bump, and
    # the split sits at its D ≥ 2 edge: with three outputs under the curvature estimate
    # minibatches="each" (session 44) the same logits (−4.25 / 2.0 / 4.1 under "mean") fit at
    # D = 1.96 and it flags nothing (31 under "mean"); ω < ω₀/2 flags 21 / 24 under "each",
    # 23 / 26 under "mean", all outliers (runs/s44_each/moved_tests_rules.txt)
    flagged = cb.flagged(BelowWeight())
    assert len(flagged) >= 18 and bool((flagged < BAD).all()), flagged


@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_regression_in_large_units_learns_with_mean_loss(loss):
    step = lambda z, y: LOSSES[loss](z, y, reduction="none")  # noqa: E731
    cb = fit(Task(mlp(4, 3), step), regression(3, scale=30.0), objective="mean_loss")
    outliers, clean = separation(cb)
    assert outliers < clean - 0.08, (outliers, clean)


def test_expected_error_refuses_only_a_batch_whose_every_weight_vanished():
    E = ExpectedError(q=0.5)
    assert torch.isfinite(E(torch.tensor([0.1, 30.0, 200.0])))  # one example still counts
    with pytest.raises(ConfigurationError, match="smallest in this batch is 30"):
        E(torch.tensor([30.0, 200.0]))


# ---------------------------------------------------------------------------- 2. multi-label
def multi_label() -> tuple[Tensor, ...]:
    """Five binary labels thresholding xA; the first BAD training examples' labels inverted."""
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(4, 5, generator=gen)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, 4, generator=gen)
        return x, (x @ A > 0.3).float()

    X, Y = draw(N)
    XV, YV = draw(60)
    Y[:BAD] = 1 - Y[:BAD]
    return X, Y, XV, YV


@pytest.mark.parametrize("reduce", [False, True], ids=["(B,C) mean over labels", "(B,) sum"])
def test_multi_label_bce_per_sample_and_label_drops_the_inverted_label_sets(reduce):
    def step(z: Tensor, y: Tensor) -> Tensor:
        out = F.binary_cross_entropy_with_logits(z, y, reduction="none")
        return out.sum(1) if reduce else out

    cb = fit(Task(mlp(4, 5), step), multi_label())
    corrupted, clean = separation(cb)
    assert corrupted < 0.05 and clean > 0.4, (corrupted, clean)
    assert int((flagged_quietly(cb) < BAD).sum()) == BAD


# ---------------------------------------------------------------------------- 3. tokens
T, VOCAB, PAD = 10, 8, -100


def sequences() -> tuple[Tensor, ...]:
    """Token classification (label = token mod 3), lengths 2..10 right-padded (input 0, label
    PAD); the first BAD training sequences' labels shifted by one."""
    gen = torch.Generator().manual_seed(0)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        x = torch.randint(1, VOCAB, (n, T), generator=gen)
        real = torch.arange(T)[None] < torch.randint(2, T + 1, (n,), generator=gen)[:, None]
        return x.masked_fill(~real, 0), (x % 3).masked_fill(~real, PAD)

    X, Y = draw(N)
    XV, YV = draw(60)
    Y[:BAD] = torch.where(Y[:BAD] == PAD, PAD, (Y[:BAD] + 1) % 3)
    return X, Y, XV, YV


def tagger() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    )


def tokens(z: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(z.transpose(1, 2), y, ignore_index=PAD, reduction="none")  # (B, T)


def test_a_padded_token_loss_is_refused_naming_the_mean_over_real_tokens():
    """Before: the (B, T) loss was averaged over T, padding included: the clean sequences'
    weights followed their length (correlation 0.82) and flagged() named 124 sequences, 52 of
    them clean short ones."""
    with pytest.raises(
        ConfigurationError, match=r"exactly 0.*ignore_index.*\(y != pad\)\.sum\(1\)"
    ):
        fit(Task(tagger(), tokens), sequences())


def test_each_sequence_s_mean_over_its_real_tokens_flags_exactly_the_corrupted():
    """What the refusal says to write: tok.sum(1) / (y != pad).sum(1)."""

    def step(z: Tensor, y: Tensor) -> Tensor:
        return tokens(z, y).sum(1) / (y != PAD).sum(1).clamp_min(1)

    data = sequences()
    cb = fit(Task(tagger(), step), data)
    corrupted, clean = separation(cb)
    assert corrupted < 0.05 and clean > 0.8, (corrupted, clean)
    flagged = flagged_quietly(cb)
    assert sorted(flagged.tolist()) == list(range(BAD))
    lengths = (data[1][BAD:] != PAD).sum(1).float()
    w = cb.data_weights()[BAD:]
    assert abs(float(torch.corrcoef(torch.stack([w, lengths]))[0, 1])) < 0.3


def test_a_dense_two_dimensional_loss_is_not_refused():
    """Only exact zeros at the first step are refused: a (B, C) BCE has none."""
    step = lambda z, y: F.binary_cross_entropy_with_logits(z, y, reduction="none")  # noqa: E731
    X, Y, XV, YV = multi_label()
    cb = fit(Task(mlp(4, 5), step), (X[:48], Y[:48], XV, YV), start_step=10**6)
    assert cb.data_weights().shape == (48,)


# ---------------------------------------------------------------------------- 5. InfoNCE
def pairs() -> tuple[Tensor, ...]:
    """Two noisy views of one point; the first BAD training examples' second view belongs to
    another example (a wrong positive)."""
    gen = torch.Generator().manual_seed(0)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        c = torch.randn(n, 8, generator=gen)
        return c + 0.3 * torch.randn(n, 8, generator=gen), c + 0.3 * torch.randn(
            n, 8, generator=gen
        )

    X, Y = draw(N)
    XV, YV = draw(60)
    Y[:BAD] = Y[:BAD].roll(1, 0)
    return X, Y, XV, YV


def info_nce(net: torch.nn.Module) -> Any:
    def step(a: Tensor, p: Tensor) -> Tensor:
        za, zp = F.normalize(a, dim=1), F.normalize(net(p), dim=1)
        return F.cross_entropy(za @ zp.T / 0.2, torch.arange(len(a)), reduction="none")

    return step


def test_info_nce_with_in_batch_negatives_lowers_the_wrong_pairs():
    """Row i's loss reads every example of the batch (its negatives): ωᵢ weights the anchor's
    row only, so the wrong pairs fall, less cleanly than with a per-example loss."""
    net = mlp(8, 8)
    cb = fit(Task(net, info_nce(net)), pairs())
    wrong, right = separation(cb)
    assert wrong < right - 0.15, (wrong, right)


# ---------------------------------------------------------------------------- 6. a tiny class
def imbalanced(tiny: int = 12) -> tuple[Tensor, ...]:
    """Three Gaussian classes, class 2 only ``tiny`` of 240 (20 of 60 in validation); the first
    BAD (shuffled) training labels shifted by one."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])

    def draw(n: int, t: int) -> tuple[Tensor, Tensor]:
        y = torch.cat([torch.arange(n - t) % 2, torch.full((t,), 2)])
        return centres[y] + 0.8 * torch.randn(n, 2, generator=gen), y

    X, Y = draw(N, tiny)
    XV, YV = draw(60, 20)
    order = torch.randperm(N, generator=gen)
    X, Y = X[order], Y[order].clone()
    Y[:BAD] = (Y[:BAD] + 1) % 3
    return X, Y, XV, YV


def cross_entropy(z: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(z, y, reduction="none")


def test_noisy_labels_with_a_tiny_class_keep_its_clean_examples():
    """Under the batch gauge. The default class gauge (session 51) keeps the tiny class too
    (corrupted mean ω 0.12, clean 0.67, against 0.03 / 0.44) and flags 105 rows."""
    data = imbalanced()
    cb = fit(Task(mlp(2, 3), cross_entropy), data, gauge="batch")
    corrupted, clean = separation(cb)
    assert corrupted < 0.1 and clean > 0.4, (corrupted, clean)
    tiny = BAD + torch.nonzero(data[1][BAD:] == 2).flatten()
    assert len(tiny) >= 4 and bool((cb.data_weights()[tiny] > 0.5).all())
    # the split holds the corrupted labels (70 of 72) with many clean rows: the clean rows'
    # weights drift down (median logit −1.1), 175 rows, precision 0.40. With the curvature
    # estimate minibatches="each" (an option, session 44): 64 of 72 among 67 (precision 0.96),
    # but on the benchmarks within noise and leaning worse (docs/data_weights.md). Only 42 % of
    # the 175 are predicted as another class than their label, so flagged() flags nothing and
    # says so (session 48: it returned them silently); the split asked for by name returns them
    with pytest.warns(UserWarning, match="predicted as another class.*Flagged nothing"):
        assert len(cb.flagged()) == 0
    with pytest.warns(UserWarning, match="predicted as another class"):
        flagged = cb.flagged("split")
    assert not set(tiny.tolist()) & set(flagged.tolist())
    assert int((flagged < BAD).sum()) >= 65


def test_per_class_weights_with_a_tiny_class_are_finite_and_flag_only_the_mislabelled_one():
    """Per class: the weights fall with each class's share of wrong training labels (class 0: 7
    of 88, class 1: 33 of 115, class 2: 32 of 37, mostly shifted ones of class 1), and only
    class 2 may be flagged. Measured: ω = 0.77 / 0.36 / 0.21, class 2 below ω₀/2 = 0.25 and
    flagged with the curvature estimate minibatches="each" (session 44); under "mean"
    0.66 / 0.38 / 0.32, none flagged (the default)."""
    data = imbalanced()
    cb = fit(Task(mlp(2, 3), cross_entropy), data, indexed=False, per="class", num_classes=3)
    given, true = data[1], data[1].clone()
    true[:BAD] = (true[:BAD] - 1) % 3
    wrong = [float((true[given == c] != c).float().mean()) for c in range(3)]
    assert wrong[0] < 0.1 < wrong[1] < 0.5 < 0.8 < wrong[2]
    w = cb.data_weights()
    assert w.shape == (3,) and bool(torch.isfinite(w).all())
    assert float(w[2]) < float(w[1]) < float(w[0]), w
    assert set(flagged_quietly(cb).tolist()) <= {2}
