"""The statistics of all n logits the weights read — softmax's log Z, the mean-logit gauge's
x̄ — kept at O(rows moved) per outer step with row-sparse gradients (eq. keptsum,
:class:`~hypertorch_sid.core.sample_weights.Normaliser`), and the same weights as the dense
path's one pass over n per step, to float64 rounding."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from hypertorch_sid.core.flag_rules import BelowWeight, TwoComponentSplit
from hypertorch_sid.core.lazy_adam import LazyAdam
from hypertorch_sid.core.normalisers import MeanLogitGauge, SoftmaxNormaliser
from hypertorch_sid.core.sample_weights import SampleWeights

D64 = torch.float64

#: (parameterization, gauge, weighted_mean's normalize): the two families with a normaliser
FAMILIES = [("sigmoid", "mean_logit", True), ("natural_sigmoid", "mean_logit", True)]
FAMILIES += [("softmax", "batch", False)]


def family(n, parameterization, gauge, sparse_grad, x=None):
    w = SampleWeights(n, parameterization, dtype=D64, sparse_grad=sparse_grad, gauge=gauge)
    if x is not None:
        with torch.no_grad():
            w.logits.copy_(x)
        w.projection()
    return w


def outer_step(w, opt, index, losses, normalize):
    """One outer step on the rows ``index``: the gradient of a weighted loss that reads them
    (sparse with ``sparse_grad``, else an n-vector), the optimizer's step, the projection."""
    w.weighted_mean(losses, index, normalize).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    w.projection()


def recomputed(w):
    """The statistic from the stored logits in one pass (what the kept one must equal)."""
    x = w.logits.detach().double()
    return x.mean() if isinstance(w.normaliser, MeanLogitGauge) else torch.logsumexp(x, 0)


@pytest.mark.parametrize("parameterization, gauge, normalize", FAMILIES)
def test_the_kept_statistic_and_every_reader_equal_the_dense_path(
    parameterization, gauge, normalize
):
    """300 random outer steps of 12 rows (with repeats) on n = 400 rows, LazyAdam on the
    row-sparse gradient against the same on the dense one (the exact path: x shifted in place
    / log Z recomputed after every step): the kept statistic equals its recomputation, and
    ω through every reader equals the dense path's, to 1e-12. Several full passes happen on
    the way (rows moved reach n every ~33 steps) and the mean-logit shift is really held
    (the stored logits differ from the dense path's by it)."""
    n, b = 400, 12
    gen = torch.Generator().manual_seed(0)
    x = 0.5 * torch.randn(n, generator=gen, dtype=D64)
    lazy, eager = (family(n, parameterization, gauge, s, x) for s in (True, False))
    opts = [LazyAdam([w.logits], lr=0.3) for w in (lazy, eager)]
    held = 0.0
    for step in range(300):
        index = torch.randint(0, n, (b,), generator=gen)
        losses = torch.rand(b, generator=gen, dtype=D64) * 3
        for w, opt in zip((lazy, eager), opts):
            outer_step(w, opt, index, losses, normalize)
        if gauge == "mean_logit":
            held = max(held, float((lazy.logits - eager.logits).abs().max()))
        if step % 50 == 49:
            statistic = lazy.normaliser.value()
            assert abs(float(statistic - recomputed(lazy))) < 1e-12
    assert lazy.logits.grad is None and lazy.normaliser.kept and lazy.normaliser.trusted
    assert 3 <= lazy.normaliser.full_passes <= 300 * b / n + 3
    if gauge == "mean_logit":
        assert held > 1e-3  # the shift was held, not applied, between full passes
        torch.testing.assert_close(lazy.logits_of(), eager.logits.detach(), rtol=0, atol=1e-12)
        assert abs(float(lazy.logits_of().mean())) < 1e-12  # x̄ = x₀ = 0 as the weights read it
    else:
        torch.testing.assert_close(lazy.log_normaliser, eager.log_normaliser, rtol=0, atol=1e-12)
    torch.testing.assert_close(lazy.values(), eager.values(), rtol=0, atol=1e-12)
    index = torch.randint(0, n, (50,), generator=gen)
    torch.testing.assert_close(
        lazy.weights(index).detach(), eager.weights(index).detach(), rtol=0, atol=1e-12
    )
    effective = [w.parameterization.effective_logits(w) for w in (lazy, eager)]
    torch.testing.assert_close(*effective, rtol=0, atol=1e-12)
    middle = eager.values().sort().values[n // 2 - 1 : n // 2 + 1]  # between two rows, not at
    threshold = float(middle.mean())  # one: ω < t must not hang on its last bits (1e-16 apart)
    for rule in (BelowWeight(threshold), TwoComponentSplit()):
        assert torch.equal(lazy.flagged(rule), eager.flagged(rule))
    torch.testing.assert_close(
        lazy.state_dict()["logits"], eager.state_dict()["logits"], rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("parameterization, gauge, normalize", FAMILIES)
def test_a_sparse_outer_step_costs_o_rows_a_dense_one_a_pass_over_n(
    parameterization, gauge, normalize
):
    """The passes over all n rows in 100 outer steps of b = 20 rows on n = 10⁴: at most
    ⌈100·b/n⌉ + 1 with row-sparse gradients (counted by the normaliser and by patching its
    one O(n) computation), one per step with dense ones."""
    n, b, steps = 10_000, 20, 100
    gen = torch.Generator().manual_seed(1)
    for sparse_grad in (True, False):
        w = family(n, parameterization, gauge, sparse_grad)
        opt = LazyAdam([w.logits], lr=0.3)
        calls = []
        original = type(w.normaliser).statistic_of

        def counted(self, x, original=original, calls=calls):
            calls.append(x.numel())
            return original(self, x)

        type(w.normaliser).statistic_of = counted
        try:
            start = w.normaliser.full_passes
            for _ in range(steps):
                index = torch.randperm(n, generator=gen)[:b]
                losses = torch.rand(b, generator=gen, dtype=D64)
                outer_step(w, opt, index, losses, normalize)
        finally:
            type(w.normaliser).statistic_of = original
        passes = w.normaliser.full_passes - start
        if sparse_grad:
            bound = math.ceil(steps * b / n) + 1
            assert passes <= bound and len(calls) <= bound, (passes, len(calls))
            assert w.normaliser.kept
        else:
            assert steps <= passes <= steps + 1 and not w.normaliser.kept


@pytest.mark.parametrize("parameterization, gauge, normalize", FAMILIES)
def test_state_dict_round_trip_with_a_held_shift(parameterization, gauge, normalize):
    """Saved while the mean-logit shift is held (or log Z kept), restored into a sparse and a
    dense family, or the stored logits copied into a fresh one (what the callback's
    checkpoint of λ does): the same ω."""
    n, b = 300, 10
    gen = torch.Generator().manual_seed(2)
    w = family(n, parameterization, gauge, True, 0.3 * torch.randn(n, generator=gen, dtype=D64))
    opt = LazyAdam([w.logits], lr=0.3)
    for _ in range(20):
        index = torch.randint(0, n, (b,), generator=gen)
        outer_step(w, opt, index, torch.rand(b, generator=gen, dtype=D64) * 3, normalize)
    if gauge == "mean_logit":
        assert abs(float(w.normaliser.offset())) > 1e-3  # a shift is held now
    omega = w.values()
    saved = w.state_dict()
    for sparse_grad in (True, False):
        restored = family(n, parameterization, gauge, sparse_grad)
        restored.load_state_dict(saved)
        torch.testing.assert_close(restored.values(), omega, rtol=0, atol=1e-12)
        copied = family(n, parameterization, gauge, True)
        copied.values()  # its statistic computed before the write
        with torch.no_grad():
            copied.logits.copy_(w.logits)
        torch.testing.assert_close(copied.values(), omega, rtol=0, atol=1e-12)


def test_switching_to_dense_gradients_or_another_gauge_keeps_the_weights():
    """A held shift is folded into the logits when the family stops holding it."""
    n = 200
    gen = torch.Generator().manual_seed(3)
    w = family(n, "sigmoid", "mean_logit", True)
    opt = LazyAdam([w.logits], lr=0.3)
    for _ in range(10):
        index = torch.randint(0, n, (8,), generator=gen)
        outer_step(w, opt, index, torch.rand(8, generator=gen, dtype=D64), True)
    omega = w.values()
    assert abs(float(w.normaliser.offset())) > 1e-3
    w.use_sparse_grad(False)
    torch.testing.assert_close(w.values(), omega, rtol=0, atol=1e-12)
    w.use_sparse_grad(True)
    w.use_gauge("batch")
    torch.testing.assert_close(w.values(), omega, rtol=0, atol=1e-12)
    assert w.normaliser is None


@pytest.mark.parametrize("parameterization, gauge, normalize", FAMILIES)
def test_an_optimizer_moving_rows_it_was_not_given_is_caught(parameterization, gauge, normalize):
    """SGD with momentum on sparse gradients keeps moving rows read earlier: the first due
    full pass finds the kept statistic off, says so, and every step recomputes from then on
    (the statistic is exact again)."""
    n, b = 60, 6
    gen = torch.Generator().manual_seed(4)
    w = family(n, parameterization, gauge, True)
    opt = torch.optim.SGD([w.logits], lr=0.5, momentum=0.9)
    with pytest.warns(UserWarning, match="moved rows .* that no minibatch had read"):
        for _ in range(30):
            index = torch.randperm(n, generator=gen)[:b]
            outer_step(w, opt, index, torch.rand(b, generator=gen, dtype=D64) * 3, normalize)
    assert not w.normaliser.trusted and not w.normaliser.kept
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no minibatch had read")
        for _ in range(5):
            index = torch.randperm(n, generator=gen)[:b]
            outer_step(w, opt, index, torch.rand(b, generator=gen, dtype=D64) * 3, normalize)
    if gauge == "batch":  # log Z of the logits as they are
        assert abs(float(w.normaliser.value() - recomputed(w))) < 1e-12
    else:  # shifted in place, as on the dense path: x̄ = x₀ = 0
        assert w.normaliser.offset() is None and abs(float(recomputed(w))) < 1e-12
    assert isinstance(w.normaliser, SoftmaxNormaliser if gauge == "batch" else MeanLogitGauge)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gauge": "mean_logit", "directional": "forward_mode"},
        {"parameterization": "softmax", "directional": "forward_mode"},
    ],
    ids=str,
)
def test_a_resumed_fit_ends_at_the_straight_fit_s_weights(tmp_path, kwargs):
    """The Lightning drop-in (one process, its own LazyAdam: row-sparse gradients, the
    statistic kept) checkpointed halfway and resumed: the same ω as the straight fit, up to the
    float32 rounding of where each run folds the held shift in (its full passes)."""
    from test_data_weights_lightning import Classifier, Data, callback, fit, trainer

    cb = callback(**kwargs)
    fit(cb, 4, data=Data(shuffle=False))
    assert cb.problem.weights.sparse_grad and cb.problem.weights.normaliser.kept
    straight = cb.data_weights()

    cb = callback(**kwargs)
    t = trainer([cb], max_epochs=2)
    t.fit(Classifier(), datamodule=Data(shuffle=False))
    t.save_checkpoint(tmp_path / "half.ckpt")
    cb = callback(**kwargs)
    trainer([cb], max_epochs=4).fit(
        Classifier(), datamodule=Data(shuffle=False), ckpt_path=tmp_path / "half.ckpt"
    )
    assert not torch.allclose(straight, straight.mean().expand_as(straight))  # it learned
    torch.testing.assert_close(cb.data_weights(), straight, rtol=1e-4, atol=1e-5)
