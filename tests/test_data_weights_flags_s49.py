"""``LearnedDataWeights.flagged()`` on a network that contradicts the labels it keeps (session
49, issue 27): the flags' contrast J = s_flagged − s_kept (shares of rows predicted as another
class than their label at their last visit) below ½ is said, with the rows returned anyway."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_data_weights_lightning import NOISY, Data, N, blobs, callback, fit

from hypertorch_sid import LearnedDataWeights
from hypertorch_sid.lightning.data_weights_problem import DataWeightsProblem

CONTRAST = "contrast of"


def losses_problem(flagged_high: float, kept_high: float, n: int = 100) -> DataWeightsProblem:
    """A per-sample problem whose rows 0..n/2 are flagged: a share ``flagged_high`` of them and
    ``kept_high`` of the others had a last-visit loss above log 2 (integer labels seen)."""
    problem = LearnedDataWeights(seed=0).problem
    half = n // 2
    loss = torch.full((n,), 0.1)
    loss[: round(flagged_high * half)] = 2.0
    loss[half : half + round(kept_high * (n - half))] = 2.0
    problem._last_loss = loss
    problem._labels = torch.arange(n) % 3
    return problem


@pytest.mark.parametrize(
    ("flagged_high", "kept_high", "said"),
    [(0.9, 0.3, False), (0.9, 0.5, True), (0.6, 0.0, False), (0.6, 0.2, True)],
)
def test_the_contrast_is_the_flagged_share_above_the_kept_share(flagged_high, kept_high, said):
    """J = s_flagged − s_kept against ½: 0.9 − 0.3 and 0.6 − 0 pass; 0.9 − 0.5 and 0.6 − 0.2,
    whose flagged shares alone pass session 48's majority check, do not."""
    problem = losses_problem(flagged_high, kept_high)
    doubt = problem.flag_contrast(torch.arange(50))
    assert (doubt is not None) == said, doubt
    if said:
        assert f"{flagged_high:.0%} of the 50" in doubt and f"{kept_high:.0%} of the 50" in doubt
        assert "fits the data too poorly" in doubt and "more clean validation" in doubt


def test_the_contrast_reads_only_rows_with_class_labels():
    """Without integer labels (a regression) the log 2 reading means nothing: not this
    contrast. Since session 62 the losses are read against the clean validation losses
    instead (tests/test_regression_flags_s62.py); none read here, so the flags are said to be
    unchecked (silent before)."""
    problem = losses_problem(0.6, 0.5)
    problem._labels = None
    said = problem.flag_contrast(torch.arange(50))
    assert said is not None and "another class than the label" not in said
    assert "no per-sample validation loss was read" in said


class Overlapping(Data):
    """The tests' blobs pulled 90 % of the way to the origin: three classes that overlap, so a
    network trained on the clean rows still predicts another class for many of them."""

    def __init__(self) -> None:
        super().__init__()
        X, _, Xv, _ = blobs()
        centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
        self.X = X - 0.9 * centres[torch.arange(N) % 3]
        self.Xv = Xv - 0.9 * centres[torch.arange(len(Xv)) % 3]


def flags_and_warnings(cb: LearnedDataWeights) -> tuple[torch.Tensor, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flags = cb.flagged()
    return flags, [str(w.message) for w in caught if "flagged" in str(w.message)]


def test_flags_of_a_network_that_contradicts_its_kept_rows_are_said_to_be_doubtful():
    """On overlapping classes the split flagged 139 of 240 rows at precision 0.32 (72 wrong
    labels), silently before: the network predicted another class for 94 % of them but also
    for 76 % of the rows it kept. Now a warning says so and why; the rows are still returned
    (the split's own). The well separated toy keeps its flags without that warning."""
    cb = callback()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(cb, 15, data=Overlapping())
    flags, said = flags_and_warnings(cb)
    assert torch.equal(flags, cb.flagged("split"))
    assert len(said) == 1 and CONTRAST in said[0] and "Returned anyway" in said[0], said
    loss, kept = cb.problem._last_loss.cpu(), torch.ones(N, dtype=torch.bool)
    kept[flags] = False
    s_flagged = float((loss[flags] > math.log(2)).double().mean())
    s_kept = float((loss[kept] > math.log(2)).double().mean())
    assert s_flagged > 0.5 and s_flagged - s_kept < 0.5  # session 48's check alone passes it
    assert float((flags < NOISY).double().mean()) < 0.5  # mostly clean rows

    healthy = callback()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(healthy, 15)
    flags, said = flags_and_warnings(healthy)
    assert not said and float((flags < NOISY).double().mean()) > 0.8, said
