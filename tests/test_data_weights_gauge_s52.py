"""The class gauge without the class means' hold (session 52, issue 27): ``gauge="class_centred"``.

Session 51's ``"class"`` does two things: each training row's cross term is centred on its own
class's weighted mean in the batch (``class_centred``, eq. classcentre: the 20 Newsgroups fix),
and each class's mean logit is held at x₀ after every outer step (``ClassMeanLogitGauge``,
session 50: it cost the imbalanced recipe under a ``WeightedRandomSampler`` 1.3–1.6 points).
``"class_centred"`` keeps the first and holds nothing (as ``"batch"``): the centred gradient
has no part common to a class left to hold, and nothing else is held in its place."""

from __future__ import annotations

import pytest
import torch
from test_data_weights_lightning import NOISY, Data, callback, fit
from test_data_weights_s51 import LABELS, SkewedValidation, class_mean_logits

from hypertorch_sid import LearnedDataWeights
from hypertorch_sid.core.directional import TrainingCrossTerm
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.normalisers import CLASS_GAUGES, ClassMeanLogitGauge
from hypertorch_sid.core.sample_weights import SampleWeights

X = torch.linspace(-1.0, 1.5, 12)


def family(gauge: str) -> SampleWeights:
    """12 rows, the weights spread so that they differ from row to row, labels ``LABELS``."""
    w = SampleWeights(12)
    with torch.no_grad():
        w.logits.copy_(X)
    if gauge in CLASS_GAUGES:
        w.use_class_gauge(lambda: LABELS, gauge)  # type: ignore[arg-type]
    else:
        w.use_gauge(gauge)  # type: ignore[arg-type]
    return w


def cross_term(w: SampleWeights) -> TrainingCrossTerm:
    return TrainingCrossTerm(w, torch.optim.SGD([w.logits], lr=1.0), normalize=True)


def gradient(u: torch.Tensor, gauge: str) -> torch.Tensor:
    w = family(gauge)
    return cross_term(w).gradient(torch.arange(12), u, 0.5).to_dense()


def test_the_names_say_what_each_class_gauge_holds():
    assert CLASS_GAUGES == {"class": ClassMeanLogitGauge, "class_centred": None}
    assert isinstance(family("class").normaliser, ClassMeanLogitGauge)
    w = family("class_centred")
    assert w.gauge == "class_centred" and w.normaliser is None  # nothing held
    assert torch.equal(w.labels_of(torch.tensor([0, 2, 5])), torch.tensor([0, 1, 2]))
    assert family("batch").labels_of(torch.tensor([0])) is None


def test_a_shift_common_to_a_class_moves_no_row_and_the_gradient_is_the_oracle():
    """ĝᵢ = −α ω′ᵢ (uᵢ − ū_c(i)) / Σ ω by hand, ū_c the class's ω-weighted mean; u + c[label]
    gives the same gradient, and it is the class gauge's (only the hold differs)."""
    u = torch.randn(12, generator=torch.Generator().manual_seed(3))
    omega = torch.sigmoid(X)
    means = torch.stack(
        [(omega * u)[LABELS == c].sum() / omega[LABELS == c].sum() for c in range(3)]
    )
    expected = -0.5 * omega * (1 - omega) * (u - means[LABELS]) / omega.sum()
    g = gradient(u, "class_centred")
    assert torch.allclose(g, expected, atol=1e-6)
    shifted = u + torch.tensor([3.0, -2.0, 5.0])[LABELS]
    assert torch.allclose(gradient(shifted, "class_centred"), g, atol=1e-6)
    assert torch.allclose(gradient(u, "class"), g, atol=1e-7)
    assert (gradient(shifted, "batch") - gradient(u, "batch")).abs().max() > 0.05


def test_the_step_is_applied_as_it_is_no_class_mean_put_back():
    """SGD at lr 1 on the cross term's rows: under "class_centred" x ← x − ĝ exactly; under
    "class" each class's mean logit then goes back to x₀ = 0 (eq. classgauge)."""
    u = torch.randn(12, generator=torch.Generator().manual_seed(4))
    after = {}
    for gauge in ("class_centred", "class"):
        w = family(gauge)
        term = cross_term(w)
        g = term.gradient(torch.arange(12), u, 0.5)
        term.apply(g)
        after[gauge] = (w.logits.detach().clone(), g.to_dense())
    x, g = after["class_centred"]
    assert torch.allclose(x, X - g, atol=1e-7)
    held, _ = after["class"]
    means = torch.stack([held[LABELS == c].mean() for c in range(3)])
    assert means.abs().max() < 1e-6
    assert torch.stack([x[LABELS == c].mean() for c in range(3)]).abs().max() > 0.1  # X's own


def test_a_class_pushed_as_a_whole_moves_and_is_not_put_back():
    """A gradient (a hyper step's own, the batch gauge's derivative) that lowers every row of
    class 0 by the same amount: under "class_centred" class 0's mean logit moves by it; under
    "class" it is put back."""
    for gauge, moved in (("class_centred", True), ("class", False)):
        w = family(gauge)
        with torch.no_grad():
            w.logits.zero_()
        opt = torch.optim.SGD([w.logits], lr=1.0)
        w.logits.grad = (LABELS == 0).float()
        opt.step()
        w.projection()
        mean0 = float(w.logits.detach()[LABELS == 0].mean())
        assert mean0 == pytest.approx(-1.0 if moved else 0.0, abs=1e-6)
        assert float(w.logits.detach()[LABELS != 0].abs().max()) == 0.0


def test_bad_uses_are_refused_clearly():
    w = SampleWeights(4)
    with pytest.raises(ConfigurationError, match="use_class_gauge"):
        w.use_gauge("class_centred")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="gauge must be one of"):
        w.use_class_gauge(lambda: None, "batch")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a sigmoid"):
        SampleWeights(4, "softmax").use_class_gauge(lambda: None, "class_centred")
    with pytest.raises(ConfigurationError, match="gauge='class_centred'.*per='class'"):
        LearnedDataWeights(per="class", num_classes=3, gauge="class_centred")
    with pytest.raises(ConfigurationError, match="class_centred"):
        LearnedDataWeights(gauge="centred")  # type: ignore[arg-type]


def test_the_drop_in_centres_per_class_learns_and_lets_the_class_means_move():
    """LearnedDataWeights(gauge="class_centred") on the toy whose validation set favours class
    0: the labels are read (the rows' cross term centred per class), the corrupted rows fall
    below the clean ones, and the classes' mean logits are not held at their start."""
    data = SkewedValidation()
    cb = callback(gauge="class_centred")
    fit(cb, 6, data=data)
    assert cb.weights is not None and cb.weights.gauge == "class_centred"
    assert cb.weights.normaliser is None
    assert cb.weights.labels_of(torch.arange(len(data.y))) is not None
    w = cb.data_weights()
    assert float(w[:NOISY].mean()) < float(w[NOISY:].mean()) - 0.1  # it learned
    means = class_mean_logits(cb, data.y)
    assert float(means.abs().max()) > 1e-2  # not held at x₀ = 0


def test_it_differs_from_the_class_gauge_only_by_the_hold():
    """The same fit under "class" and "class_centred": different weights (the hold), and under
    "class" every class's mean logit at x₀."""
    runs = {}
    for gauge in ("class", "class_centred"):
        cb = callback(gauge=gauge)
        fit(cb, 3, data=Data())
        runs[gauge] = cb
    assert not torch.equal(runs["class"].data_weights(), runs["class_centred"].data_weights())
    assert class_mean_logits(runs["class"], Data().y).abs().max() < 1e-4


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_ddp_ranks_learn_identical_weights_under_the_centring_alone(tmp_path):
    """Under DDP (2 CPU processes, session 51's worker) each rank centres its own batch's rows
    on their classes with the labels it recorded for them, and the rows' gradients are gathered
    before the step: identical weights on both ranks, learned. Nothing is held per class, so
    the ranks need not record each other's labels (the class gauge's gather is not used)."""
    from test_data_weights_labels_s51 import _ddp_fit

    r0, r1 = _ddp_fit(tmp_path, "class_centred")
    assert r0["gauge"] == r1["gauge"] == "class_centred"
    assert torch.equal(r0["w"], r1["w"])
    assert r0["w"][:NOISY].mean() < r0["w"][NOISY:].mean() - 0.1
