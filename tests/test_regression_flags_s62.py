"""``LearnedDataWeights.flagged()`` on targets without class labels (session 62,
docs/data_weights.md "Flags on a regression (session 62)"): the flags are checked by the contrast
of the flagged rows' last-visit training losses against the kept rows', read above the clean
validation losses' 90 % quantile (eq. scalecontrast, ``RowEvidence._no_scale_contrast``). Before,
a regression's flags were returned without a word whatever their precision (session 61's
rotated-digit angle: 824-1663 of 2000 rows at precision 0.32-0.51)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.lightning.evidence import CONTRAST_QUANTILE, RowEvidence

N, BAD, FEW = 240, 72, 20  # the first BAD (or FEW) training targets are corrupted


class Regressor(pl.LightningModule):
    """A small tanh MLP, squared error per sample, Adam."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self.net(x)[:, 0], y, reduction="none")

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def regression(kind: str) -> tuple[Tensor, ...]:
    """y = xA + N(0, 0.1²); the first BAD training targets moved by ±6 (``"outliers"``, gross
    errors), the first FEW of them only (``"few"``), or none (``"clean"``)."""
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(4, generator=gen)

    def draw(n: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, 4, generator=gen)
        return x, x @ A + 0.1 * torch.randn(n, generator=gen)

    X, Y = draw(N)
    XV, YV = draw(60)
    moved = {"outliers": BAD, "few": FEW}.get(kind, 0)
    Y[:moved] += 6.0 * torch.sign(torch.randn(moved, generator=gen))
    return X, Y, XV, YV


def loaders(data: tuple[Tensor, ...]) -> tuple[DataLoader, DataLoader]:
    X, Y, XV, YV = data
    train = DataLoader(
        IndexedDataset(TensorDataset(X, Y)),
        batch_size=24,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    return train, DataLoader(TensorDataset(XV, YV), batch_size=60)


def weights(**kwargs: Any) -> LearnedDataWeights:
    settings = {"objective": "mean_loss", "every_n_steps": 2, "start_step": 0, "seed": 0}
    return LearnedDataWeights(**{**settings, **kwargs})


def fit(kind: str, epochs: int = 15, **kwargs: Any) -> LearnedDataWeights:
    cb = weights(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fit's own notes are not the point
        trainer([cb], max_epochs=epochs).fit(Regressor(), *loaders(regression(kind)))
    return cb


def flagged_said(cb: LearnedDataWeights, rule: str | None = None) -> tuple[Tensor, list[str]]:
    """``flagged(rule)`` and what it warned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flags = cb.flagged(rule)
    return flags, [str(w.message) for w in caught if "flagged" in str(w.message)]


def precision(flags: Tensor) -> float:
    return float((flags < BAD).float().mean()) if len(flags) else float("nan")


# ------------------------------------------------------------------- the check on fits
def test_a_regressions_poor_flags_are_warned_naming_soft_weights():
    """20 of 240 targets moved by ±6: the split flags 31 rows, 11 of them moved. Before: the
    rows returned silently. Now returned with a warning naming the losses' contrast (measured
    here: 45 % of the flagged rows and 19 % of the kept ones above τ, J = 0.33) and
    data_weights() as soft weights. The split's rows are ``flagged("split")`` since the
    default keeps those above τ (tests/test_regression_misfits_s62.py)."""
    cb = fit("few")
    flags, said = flagged_said(cb, "split")
    assert len(flags) > 0 and float((flags < FEW).float().mean()) < 0.5  # the truth it tells
    assert len(said) == 1, said
    assert "no class labels" in said[0] and "contrast" in said[0], said
    assert "data_weights() as soft weights" in said[0] and "Returned anyway" in said[0]


def test_control_a_clean_regressions_flags_are_doubted_as_before():
    """No target moved: the rows with low weights are fitted no worse than the rest, so the
    default flags nothing, with a warning (flag_evidence's median check, unchanged)."""
    flags, said = flagged_said(fit("clean"))
    assert len(flags) == 0 and len(said) == 1 and "fitted no worse" in said[0], said


def test_gross_outlier_targets_are_flagged_without_a_warning():
    """Control: targets moved by ±6 (the clean ones' residual s.d. 0.1) are what the flags
    hold, and no warning doubts them."""
    cb = fit("outliers")
    flags, said = flagged_said(cb)
    assert said == []
    assert precision(flags) >= 0.75 and int((flags < BAD).sum()) >= 0.9 * BAD


def test_without_validation_losses_the_flags_say_they_have_no_check():
    """E from a ``validation_loss=`` of the user's (its values need not be the training
    loss): nothing to read τ from, so flagged() says the flags are unchecked (before:
    silent)."""

    def validation_loss(module: pl.LightningModule, batch: Any) -> Tensor:
        x, y = batch
        return F.mse_loss(module.net(x)[:, 0], y, reduction="none")

    cb = fit("few", validation_loss=validation_loss)
    assert cb.problem._val_losses is None
    flags, said = flagged_said(cb)
    assert len(flags) > 0 and len(said) == 1, said
    assert "no per-sample validation loss was read" in said[0], said


def test_the_validation_losses_kept_are_the_latest_of_the_validation_sets_size():
    """The record keeps the per-sample losses of the latest validation batches the hyper
    steps read, at most the validation set's size (60 here), on the losses' scale."""
    cb = fit("outliers", epochs=2)
    kept = cb.problem._val_losses
    assert kept is not None and kept.shape == (60,) and bool(torch.isfinite(kept).all())
    assert float(kept.min()) >= 0


def resumed_fit(tmp_path: Path, kind: str) -> tuple[LearnedDataWeights, LearnedDataWeights]:
    """The data weights of a 6-epoch fit on ``regression(kind)``, checkpointed at
    ``tmp_path / "epoch6.ckpt"``, and of the fit resumed from it for one batch."""
    train, val = loaders(regression(kind))
    first = weights(every_n_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = trainer([first], max_epochs=6)
        fitted.fit(Regressor(), train, val)
        fitted.save_checkpoint(tmp_path / "epoch6.ckpt")
    resumed = weights(every_n_steps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([resumed], max_epochs=7, limit_train_batches=1).fit(
            Regressor(), train, val, ckpt_path=tmp_path / "epoch6.ckpt"
        )
    return first, resumed


# ------------------------------------------------------------------- resumed
def test_a_resumed_fit_keeps_the_validation_losses_and_the_checks_answer(tmp_path):
    """The validation losses are checkpointed beside the row record (``data_val_losses``) and
    taken over at the resumed fit's build: a fit resumed for one batch (no hyper step since)
    reads the same τ as the fit it resumes. Without them its check said "no per-sample
    validation loss was read" instead."""
    first, resumed = resumed_fit(tmp_path, "few")
    state = torch.load(tmp_path / "epoch6.ckpt", weights_only=False)
    saved = [s for s in state["callbacks"].values() if "data_val_losses" in s]
    assert len(saved) == 1 and torch.equal(saved[0]["data_val_losses"], first.problem._val_losses)
    assert len(resumed.history) == len(first.history)  # no hyper step since the resume
    assert torch.equal(resumed.problem._val_losses, first.problem._val_losses)
    flags = torch.arange(2 * FEW)  # the moved rows and as many clean ones
    said, said_again = first.problem.flag_contrast(flags), resumed.problem.flag_contrast(flags)
    assert said is not None and said_again is not None
    assert "no per-sample validation loss" not in said_again
    tau = said.split(" above ")[1].split(",")[0]
    assert tau == said_again.split(" above ")[1].split(",")[0]  # the same τ read


# ------------------------------------------------------------------- eq. scalecontrast
class Record(RowEvidence):
    """The evidence on a record set by hand: per sample, no class labels."""

    def __init__(self, last_loss: Tensor, val_losses: Tensor | None) -> None:
        self.per, self._labels = "sample", None
        self._last_loss, self._val_losses = last_loss, val_losses


def test_the_contrast_is_read_above_the_validation_quantile_and_scaled_by_the_kept_rows():
    """Eq. scalecontrast on a record of tiny clean losses (a well-fitted tagger): the clean
    training rows sit just above the validation rows' 90 % quantile (54 % of them above it),
    and 72 grossly wrong rows are flagged exactly. s_low − s_kept = 0.46 < ½ would have
    doubted flags of precision 1; J = 0.46 / 0.46 = 1."""
    g = torch.Generator().manual_seed(0)
    val = 0.0065 + 0.0004 * torch.rand(60, generator=g)
    tau = float(val.quantile(CONTRAST_QUANTILE))
    clean = torch.where(torch.arange(168) < 91, tau * 1.05, tau * 0.95)  # 54 % above τ
    loss = torch.cat([5.0 + torch.rand(72, generator=g), clean])
    record = Record(loss, val)
    assert record.flag_contrast(torch.arange(72)) is None
    # flags half of them clean rows below τ: J = (0.5 − s_kept) / (1 − s_kept) < ½
    half = torch.cat([torch.arange(36), torch.arange(72 + 91, 72 + 91 + 36)])
    said = record.flag_contrast(half)
    assert said is not None and "no class labels" in said


def test_class_labels_keep_their_own_check():
    """With class labels the contrast is still ``_no_contrast``'s (losses above log 2): the
    validation losses are not read."""
    loss = torch.cat([torch.full((10,), 3.0), torch.full((30,), 0.01)])
    record = Record(loss, None)
    record._labels = torch.zeros(40, dtype=torch.long)
    assert record.flag_contrast(torch.arange(10)) is None  # 100 % against 0 %
    said = record.flag_contrast(torch.arange(25))  # 40 % against 0 %
    assert said is not None and "another class than the label" in said
