"""The effective λ a learned fit applied (eq. effectivedecay, session 61):
``LearnedWeightDecay.effective_weight_decay`` = Σ_t lr_t λ_t / Σ_t lr_t per λ group, the constant
to put in a plain training's ``weight_decay``; checkpointed with λ; and the fit's end names a
λ that ended far above it (a cosine tail's last rises)."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from test_weight_decay import MLP, RidgeData, _fit, _trainer

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning.weight_decay_problem import APPLIED_KEY

SGD_MOMENTUM = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
ADAMW = functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0)


class AppliedLog(pl.Callback):
    """Before each batch (the decay of its step uses the λ and lr of now): λ by slot and lr."""

    def __init__(self, decay: LearnedWeightDecay) -> None:
        self.decay, self.steps = decay, []

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, i: int) -> None:
        lam = {k: float(v.double().mean()) for k, v in self.decay.learned_weight_decay.items()}
        self.steps.append((float(trainer.optimizers[0].param_groups[0]["lr"]), lam))


def _learned(decoupled: bool = False, **kwargs: Any) -> LearnedWeightDecay:
    return LearnedWeightDecay(
        0.02,
        decoupled=decoupled,
        every_n_steps=2,
        adjoint_steps=4,
        outer_lr=0.1,
        max_overhead=None,
        **kwargs,
    )


@pytest.mark.parametrize("decoupled", [False, True])
def test_effective_decay_is_the_lr_weighted_mean_of_the_lambda_applied(decoupled):
    """Under a step schedule (lr halves every 4 steps) and moving λ, the effective λ of each
    layer is Σ lr_t λ_t / Σ lr_t over the λ and lr read before every step, to 1e-9."""
    cb = _learned(decoupled)
    log = AppliedLog(cb)
    _fit(MLP(ADAMW if decoupled else SGD_MOMENTUM, schedule=True), [cb, log])
    effective = cb.effective_weight_decay
    assert sorted(effective) == sorted(cb.learned_weight_decay) == ["net.0", "net.2"]
    lams = {lam for _, step in log.steps for lam in step.values()}
    assert len(lams) > 3  # λ moved: the mean is not λ₀ by construction
    for name, value in effective.items():
        num = sum(lr * step[name] for lr, step in log.steps)
        den = sum(lr for lr, _ in log.steps)
        assert value == pytest.approx(num / den, rel=1e-9), name
        last = float(cb.learned_weight_decay[name])
        plain = sum(step[name] for _, step in log.steps) / len(log.steps)
        assert value != pytest.approx(last, rel=1e-6) and value != pytest.approx(plain, rel=1e-6)


def test_effective_decay_of_a_held_lambda_is_that_lambda():
    """No hyper step: λ stays λ₀, and so does the effective λ, whatever the lr schedule."""
    cb = LearnedWeightDecay(0.02, every_n_steps=10**9)
    _fit(MLP(SGD_MOMENTUM, schedule=True), [cb])
    assert cb.effective_weight_decay == pytest.approx({"net.0": 0.02, "net.2": 0.02}, rel=1e-6)


def test_effective_decay_per_element_and_global():
    """Per element: one effective λ per layer (the tensors' mean λ, lr-weighted); global: one."""
    cb = _learned(granularity="per_element")
    _fit(MLP(SGD_MOMENTUM), [cb])
    assert sorted(cb.effective_weight_decay) == ["net.0", "net.2"]
    assert all(math.isfinite(v) and v > 0 for v in cb.effective_weight_decay.values())
    cb = _learned(granularity="global")
    _fit(MLP(SGD_MOMENTUM), [cb])
    assert len(cb.effective_weight_decay) == 1


def test_effective_decay_resumes_from_the_checkpoint(tmp_path):
    """A fit killed after epoch 2 and resumed from its checkpoint sums on from the checkpoint's
    sums: its effective λ equals the straight fit's (a fresh sum would count epochs 3-4 only)."""
    cb = _learned()
    every_epoch = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, filename="{epoch}"
    )
    _fit(
        MLP(SGD_MOMENTUM, schedule=True), [cb, every_epoch], max_epochs=4, enable_checkpointing=True
    )
    straight = cb.effective_weight_decay
    states = torch.load(tmp_path / "epoch=1.ckpt", weights_only=False)["callbacks"].values()
    assert any(APPLIED_KEY in state for state in states)
    cb = _learned()
    _trainer([cb], max_epochs=4).fit(
        MLP(SGD_MOMENTUM, schedule=True),
        datamodule=RidgeData(),
        ckpt_path=tmp_path / "epoch=1.ckpt",
    )
    assert cb.effective_weight_decay == pytest.approx(straight, rel=1e-12)


@pytest.mark.parametrize(
    "entry", [{"net.0": [1.0]}, {"net.0": [float("nan"), 1.0]}, ["net.0", 1.0], {"net.0": "1"}]
)
def test_a_malformed_checkpoint_entry_is_refused(entry):
    cb = _learned()
    with pytest.raises(ConfigurationError, match=APPLIED_KEY):
        cb.load_state_dict({APPLIED_KEY: entry})


def test_the_fit_end_names_a_lambda_far_above_the_decay_applied():
    """λ that ends ≥ 10× above the effective λ (as a cosine tail's last rises leave it) is named
    at the fit's end, pointing to effective_weight_decay; a λ near it is not."""
    cb = _learned()
    _fit(MLP(SGD_MOMENTUM), [cb])
    assert cb.problem.ended_above_applied() is None
    with torch.no_grad():  # the last λ of one layer 100× up, as if its rises came at lr ≈ 0
        cb.rho[0][0] += math.log(100.0)
    said = cb.problem.ended_above_applied()
    assert said is not None and "net.0" in said and "effective_weight_decay" in said
