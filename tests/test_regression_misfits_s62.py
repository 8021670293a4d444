"""``LearnedDataWeights.flagged()``'s default on targets without class labels (session 62,
docs/data_weights.md "Regression flags filtered by the validation scale (session 62)"): of the
split's rows, those whose last-visit training loss is above τ, the clean validation losses' 90 %
quantile (eq. scalemisfit, ``RowEvidence.misfits``), judged by the share of them the excess of
training rows above τ accounts for (eq. scaleprecision, ``RowEvidence._no_scale_precision``).
Before, the split's rows were returned as they were: 40-46 % of a regression's rows whatever
share was corrupted (precision 0.15-0.19 with 8 % of the targets moved)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_regression_flags_s62 import (
    BAD,
    FEW,
    Record,
    fit,
    flagged_said,
    precision,
    resumed_fit,
)
from torch import Tensor

from hypertorch_sid.lightning.evidence import CONTRAST_QUANTILE


# ------------------------------------------------------------------- fits
def test_a_regressions_default_flags_are_its_moved_targets():
    """20 of 240 targets moved by ±6: the split holds 31 rows, 11 of them moved (precision
    0.35, returned by the default before). The default now keeps the split's rows above τ:
    14 rows, the same 11 moved (precision 0.79), with no warning; the split's rows are still
    ``flagged("split")``."""
    cb = fit("few")
    flags, said = flagged_said(cb)
    assert said == [], said
    assert len(flags) > 0 and float((flags < FEW).float().mean()) >= 0.7, flags
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the split's contrast doubts them (J 0.33)
        split = cb.flagged("split")  # the rows the default returned before
    assert set(flags.tolist()) <= set(split.tolist())
    assert float((split < FEW).float().mean()) < 0.5 and len(split) > len(flags)
    assert int((split < FEW).sum()) == int((flags < FEW).sum())  # no moved row lost


def test_gross_outlier_targets_keep_their_recall():
    """Control: 72 of 240 targets moved by ±6: the default keeps (almost) every outlier the
    split found, more precisely, without a warning."""
    cb = fit("outliers")
    flags, said = flagged_said(cb)
    assert said == [], said
    split = cb.flagged("split")
    assert precision(flags) >= precision(split) and precision(flags) >= 0.9
    assert int((flags < BAD).sum()) >= 0.95 * int((split < BAD).sum())


def test_control_a_clean_regression_flags_nothing():
    """No target moved: the split's rows are fitted no worse than the rest, so the default
    flags nothing with flag_evidence's warning (unchanged)."""
    flags, said = flagged_said(fit("clean"))
    assert len(flags) == 0 and len(said) == 1 and "fitted no worse" in said[0], said


def test_a_resumed_fit_flags_the_same_rows(tmp_path):
    """τ and the last-visit losses are checkpointed (``data_val_losses``, ``data_last_loss``):
    a fit resumed for one batch (no hyper step since) flags the rows of the fit it resumes.
    Without the validation losses its default would be the split's rows, unfiltered."""
    first, resumed = resumed_fit(tmp_path, "outliers")
    assert len(resumed.history) == len(first.history)  # no hyper step since the resume
    flags, said = flagged_said(first)
    again, said_again = flagged_said(resumed)
    assert len(flags) > 0 and torch.equal(flags, again), (flags, again)
    assert said == said_again
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(again) < len(resumed.flagged("split"))  # filtered, not the split's rows


# ------------------------------------------------------------------- the record by hand
def clean_record(n_split: int, n_above: int, n_bad: int = 0) -> tuple[Record, Tensor]:
    """1000 rows, validation losses uniform on [0, 1] (τ ≈ 0.9): the first ``n_bad`` grossly
    wrong (loss 5), then clean rows with ``n_above`` of them at 0.95 (above τ) and the rest at
    0.1; the split flags the first ``n_split`` rows."""
    val = torch.linspace(0, 1, 200)
    loss = torch.full((1000,), 0.1)
    loss[:n_bad] = 5.0
    loss[n_bad : n_bad + n_above] = 0.95
    return Record(loss, val), torch.arange(n_split)


def test_misfits_keep_the_split_rows_above_the_validation_scale():
    """Eq. scalemisfit without class labels: the rows above τ; without validation losses the
    rows as they are; with class labels log 2 (another class predicted), τ unread."""
    record, split = clean_record(400, 50, n_bad=100)
    tau = float(record._val_losses.quantile(CONTRAST_QUANTILE))
    assert 0.85 < tau < 0.95
    assert torch.equal(record.misfits(split), torch.arange(150))
    record._val_losses = None
    assert torch.equal(record.misfits(split), split)
    record._labels = torch.zeros(1000, dtype=torch.long)
    # τ = 10, not read: a cross entropy's clean validation losses, some below log 2 (with none
    # below, the losses are no −log p of the labels and τ is read: session 63)
    record._val_losses = torch.cat([torch.full((199,), 10.0), torch.tensor([0.1])])
    assert torch.equal(record.misfits(split), torch.arange(150))  # 0.95 > log 2


def test_the_default_flags_precision_estimate_warns_where_they_are_clean():
    """Eq. scaleprecision: with 70 of 1000 rows above τ and no wrong target, fewer than the
    100 a clean set holds, p̂ < 0 warns; with 100 wrong targets and 50 clean rows above τ in
    the split, p̂ = (150 − 100) / 150 = 1/3 < ½ warns; with 300 wrong targets, (350 − 100) /
    350 = 0.71 does not. The split's own contrast (eq. scalecontrast) is unchanged."""
    record, split = clean_record(450, 70)
    said = record.flag_contrast(split, misfits=True)
    assert said is not None and "no class labels" in said and "0.5" in said, said
    record, split = clean_record(400, 50, n_bad=100)
    said = record.flag_contrast(split, misfits=True)
    assert said is not None and "of 0.33 < 0.5" in said, said
    record, split = clean_record(400, 50, n_bad=300)
    assert record.flag_contrast(split, misfits=True) is None
    assert record.flag_contrast(split) is None  # J = (0.875 − 0) / 1: the split's contrast
    record._val_losses = None
    said = record.flag_contrast(split, misfits=True)
    assert said is not None and "no per-sample validation loss was read" in said


@pytest.mark.parametrize("labels", [True, False])
def test_no_split_row_above_the_scale_returns_nothing_silently(labels):
    """No split row above τ: the default returns no row and its precision is not doubted;
    with class labels the check is still the log-2 contrast."""
    record, split = clean_record(100, 0)
    if labels:
        record._labels = torch.zeros(1000, dtype=torch.long)
        assert record.flag_contrast(split, misfits=True) is not None  # 0 % against 0 %
    else:
        assert record.flag_contrast(split, misfits=True) is None
        assert record.misfits(split).numel() == 0
