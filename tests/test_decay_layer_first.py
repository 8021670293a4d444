"""Per-element decay that starts from per-layer decay (:class:`LayerThenShrunk`): λ_layer
stepped exactly as the per-layer default (TrustRprop on log λ_layer), deviations by James–Stein
shrinkage (eq. shrink).

Known answers: held at s = 0 the fit IS the per-layer default's, bit for bit (λ path and
weights, the drop-in on a tanh MLP, same seed); the orthogonal ridge of
``test_decay_shrinkage.py`` where every element wants λ = 1 leaves the deviations near 0 and
λ_layer on per layer's path, and where half want λ = 3 and half 0.25 separates the halves;
a resumed fit equals a straight one.
"""

from __future__ import annotations

import functools
import math

import lightning_problems
import pytest
import torch
from lightning_problems import RidgeData, TanhRegressor
from test_decay_shrinkage import _ridge_fit

from hypertorch_sid import LayerThenShrunk, LearnedWeightDecay, TrustShrinkageStep
from hypertorch_sid.core import decay as decay_module
from hypertorch_sid.core.outer_step import ShrinkFallRprop

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*λ will barely move.*"),
]


def _fit(granularity: str, max_epochs: int = 4, ckpt=None, outer=None, **kw):
    cb = LearnedWeightDecay(
        1e-2,
        granularity=granularity,
        elements="layer_then_shrunk",
        every_n_steps=2,
        max_overhead=None,  # no clock-read budget: seeded fits repeat exactly
        **({"outer_optimizer": outer} if outer is not None else {}),
    )
    trainer = lightning_problems.trainer([cb], max_epochs=max_epochs, limit_val_batches=0, **kw)
    module = TanhRegressor(hidden=16, seed=0, momentum=0.9)
    trainer.fit(module, datamodule=RidgeData(batch_size=20), ckpt_path=ckpt)
    return cb, trainer, module


def test_deviations_held_at_zero_give_the_per_layer_fit_bit_for_bit(monkeypatch):
    """With c = 0 at every step (eq. shrink never passes) the deviations stay exactly 0 and the
    per-element fit equals the per-layer fit with the step its layer part mirrors
    (``ShrinkFallRprop``, the per-layer default before session 60's ``ReachRprop``): the same
    λ_layer and the same weights."""
    mirrored = functools.partial(ShrinkFallRprop, lr=0.3, step_sizes=(0.01, 2.0))
    layer, _, m_layer = _fit("per_layer", outer=mirrored)
    monkeypatch.setattr(decay_module, "shrinkage", lambda *a, **k: 0.0)
    element, _, m_element = _fit("per_element")
    assert isinstance(element.sid.outer_optimizer, TrustShrinkageStep)
    assert all(bool((s == 0).all()) for s in element.rho[1:])
    assert torch.equal(layer.rho[0].detach(), element.rho[0].detach())
    for a, b in zip(m_layer.parameters(), m_element.parameters()):
        assert torch.equal(a, b)
    assert layer.sid.hyper_step == element.sid.hyper_step > 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_per_element_signal_keeps_the_layer_on_the_per_layer_path(seed):
    """Every element of the ridge wants λ = 1: the deviations stay near 0 (rms < 0.45) and
    λ_layer ends where per layer's TrustRprop ends (within 0.3 in log λ; exactly on its path
    while every c is 0)."""
    s, c, path = _ridge_fit(False, LayerThenShrunk(), seed)
    _, _, layer = _ridge_fit(False, LayerThenShrunk(), seed, granularity="per_layer")
    assert float(s.pow(2).mean().sqrt()) < 0.45
    assert c is not None and 0 <= c <= 1
    assert abs(path[-1] - layer[-1]) < 0.3, (path[-1], layer[-1])
    assert abs(layer[-1] - math.log(1.0)) < 0.5  # the population optimum λ = 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_element_signal_separates_the_halves(seed):
    """Half the elements want λ = 3, half 0.25: the deviations separate the halves by about
    log 12 = 2.48 (within 1), the right way round."""
    s, _, _ = _ridge_fit(True, LayerThenShrunk(), seed)
    gap = float(s[:10].mean() - s[10:].mean())
    assert abs(gap - math.log(12)) < 1.0, gap


def test_resume_equals_a_straight_fit(tmp_path):
    """Rprop's step sizes and the shrinkage averages live in the outer optimizer's state: a fit
    stopped and resumed from its checkpoint ends with the λ of a straight fit."""
    straight, _, _ = _fit("per_element")
    _, trainer, _ = _fit("per_element", max_epochs=2, default_root_dir=tmp_path)
    path = tmp_path / "half.ckpt"
    trainer.save_checkpoint(path)
    resumed, _, _ = _fit("per_element", ckpt=str(path))
    for a, b in zip(straight.rho, resumed.rho):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-10, atol=1e-12)
    sa, sb = straight.sid.outer_optimizer.state, resumed.sid.outer_optimizer.state
    torch.testing.assert_close(
        sa[straight.rho[0]]["step_size"], sb[resumed.rho[0]]["step_size"], rtol=0, atol=0
    )
    for pa, pb in zip(straight.rho[1:], resumed.rho[1:]):
        assert sa[pa]["step"] == sb[pb]["step"]
