"""The step-size probe reads the gradient the update used (session 56).

Where the training optimizer gives no reading of its step size (RMSprop), the callbacks measure
η̂ = ⟨w_before − w_after, g⟩/‖g‖² on the update before a hyper step
(:class:`~hypertorch_sid.core.horizon.StepSizeProbe`). ``LearnedDataWeights`` and the base
``HyperOptimizationCallback`` took the probe in ``on_before_optimizer_step``, before Lightning's
gradient clipping, which then rescaled the gradient the probe held in place: η̂ mixed the
unclipped and the clipped gradient. Oracle: η̂ recomputed from the weights before and after the
step and the final gradient (RMSprop leaves ``p.grad`` as its update used it).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import (
    LIGHTNING_NOISE,
    TOY_X,
    TOY_Y,
    Ridge,
    RidgeData,
    ToyClassifier,
    trainer,
)
from torch.optim.optimizer import (
    _global_optimizer_pre_hooks,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.core.horizon import StepSizeProbe

pytestmark = [*LIGHTNING_NOISE]

CLIP = 1e-3  # far below the gradients' norms: every step is clipped


class RMSpropToy(ToyClassifier):
    def configure_optimizers(self) -> Any:
        return torch.optim.RMSprop(self.parameters(), lr=0.01)


class RMSpropRidge(Ridge):
    def configure_optimizers(self) -> Any:
        return torch.optim.RMSprop(self.inner_parameters(), lr=0.01)


def _measured_against_truth(fit: Any) -> list[tuple[float, float]]:
    """(η̂ the probes measured, η the step took per unit of its final gradient), per probe."""
    before: dict[int, torch.Tensor] = {}
    pairs: list[tuple[float, float]] = []
    original = StepSizeProbe.moved  # each probed update's part (session 58: pooled by batch)

    def keep_weights(optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                before[id(p)] = p.detach().double().clone()

    def step_size(probe: StepSizeProbe) -> float:
        moved = sum(
            float(((before[id(p)] - p.detach().double()) * p.grad.double()).sum())
            for p in probe.params
        )
        norm = sum(float(p.grad.double().pow(2).sum()) for p in probe.params)
        part = original(probe)
        pairs.append((part / probe.grad_sq, moved / norm))
        return part

    handle = register_optimizer_step_pre_hook(keep_weights)
    StepSizeProbe.moved = step_size  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit()
    finally:
        StepSizeProbe.moved = original  # type: ignore[method-assign]
        handle.remove()
    return pairs


def _fit_data_weights(callbacks: list[Any], **kwargs: Any) -> None:
    train = DataLoader(IndexedDataset(TensorDataset(TOY_X, TOY_Y)), batch_size=16)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    trainer(callbacks, max_epochs=1, **kwargs).fit(RMSpropToy("none"), train, val)


def _weights() -> LearnedDataWeights:
    return LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)


def _decay() -> LearnedWeightDecay:
    return LearnedWeightDecay(0.3, every_n_steps=4, max_overhead=None)


def _assert_true(pairs: list[tuple[float, float]], probes: int) -> None:
    assert len(pairs) >= probes
    for measured, truth in pairs:
        assert truth > 0
        assert math.isclose(measured, truth, rel_tol=1e-9), (measured, truth)


def test_data_weights_probe_reads_the_clipped_gradient() -> None:
    """Before: η̂ was far from the step's (the clip rescaled the held gradient by ~1e-3)."""
    pairs = _measured_against_truth(lambda: _fit_data_weights([_weights()], gradient_clip_val=CLIP))
    _assert_true(pairs, 3)


def test_bilevel_module_probe_reads_the_clipped_gradient() -> None:
    """The base callback on a ``BilevelModule`` (RMSprop, clipped)."""

    def fit() -> None:
        cb = HyperOptimizationCallback(every_n_steps=5, max_overhead=None)
        fitter = trainer([cb], max_epochs=3, limit_val_batches=0, gradient_clip_val=CLIP)
        fitter.fit(RMSpropRidge(w0=1.0), datamodule=RidgeData())

    _assert_true(_measured_against_truth(fit), 2)


@pytest.mark.parametrize("order", ["decay_first", "weights_first"])
def test_both_probes_read_the_clipped_and_decayed_gradient(order: str) -> None:
    """With ``LearnedWeightDecay`` in the same fit (coupled: ``grad += λw`` inside the step),
    each callback's probe reads the gradient after the clip and the decay, whichever callback
    comes first."""
    decay, weights = _decay(), _weights()
    callbacks = [decay, weights] if order == "decay_first" else [weights, decay]
    pairs = _measured_against_truth(lambda: _fit_data_weights(callbacks, gradient_clip_val=CLIP))
    _assert_true(pairs, 6)


def test_the_step_hook_is_released_after_a_fit_and_after_an_exception() -> None:
    """One hook per fit, held by the first hyper-optimization callback; none left after."""
    hooks = len(_global_optimizer_pre_hooks)
    seen: list[int] = []

    def count(optimizer: Any, args: Any, kwargs: Any) -> None:
        seen.append(len(_global_optimizer_pre_hooks))

    handle = register_optimizer_step_post_hook(count)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit_data_weights([_decay(), _weights()], max_steps=3)
    finally:
        handle.remove()
    assert set(seen) == {hooks + 1}
    assert len(_global_optimizer_pre_hooks) == hooks

    class Failing(RMSpropToy):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 6:  # after a hyper step
                raise RuntimeError("the user's bug")
            return super().training_step(batch, batch_idx)

    train = DataLoader(IndexedDataset(TensorDataset(TOY_X, TOY_Y)), batch_size=16)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    with pytest.raises(RuntimeError, match="the user's bug"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([_weights()], max_epochs=1).fit(Failing("none"), train, val)
    assert len(_global_optimizer_pre_hooks) == hooks
