"""LearnedWeightDecay(hypergradient=ForwardSensitivity()): z = ∂w/∂λ advanced at every optimizer
step along the decay path (eq. fwdcoupled / fwddecoupled), the hypergradient eq. forwardhyper.

Oracles: where the training loss is linear in w (H = 0) the decay path is the whole derivative,
so z equals the finite difference of the whole Lightning training in λ and the hypergradient
that of the validation loss; an uninterrupted run (for resume)."""

from __future__ import annotations

import functools
import math
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import D, RidgeData
from torch import Tensor

from hypertorch_sid import ConfigurationError, LearnedWeightDecay
from hypertorch_sid.core.forward_sensitivity import ForwardSensitivity

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval.*"),
    pytest.mark.filterwarnings("ignore:.*hyper steps.*"),
    pytest.mark.filterwarnings("ignore:.*decoupled decay is P.*"),
]

F64 = torch.float64
NEVER = 10**9  # every_n_steps that keeps λ fixed
OPTIMIZERS = {  # (optimizer, decoupled)
    "sgd_momentum": (functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9), False),
    "nesterov": (functools.partial(torch.optim.SGD, lr=0.05, momentum=0.8, nesterov=True), False),
    "adam": (functools.partial(torch.optim.Adam, lr=0.01), False),
    "adamw": (functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0), True),
}


class Linear(pl.LightningModule):
    """ℓ(w) = ⟨c, w⟩ + 0·(batch): H = 0, so the decay path is all λ does to w."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.w = torch.nn.Parameter(torch.randn(3, D, generator=gen, dtype=F64))
        self.b = torch.nn.Parameter(torch.randn(3, generator=gen, dtype=F64))
        self.c = torch.randn(3, D, generator=gen, dtype=F64)
        self.optimizer = optimizer

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, _ = batch
        return (self.w * self.c).sum() + 0.3 * self.b.sum() + 0.0 * x.sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())


def validation_loss(module: Linear, batch: Any) -> Tensor:
    x, y = batch
    return 0.5 * ((x @ module.w.T).sum(-1) + module.b.sum() - y).pow(2).mean()


class MLP(pl.LightningModule):
    """A tiny tanh MLP on the ridge data (float64)."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, 8, dtype=F64), torch.nn.Tanh(), torch.nn.Linear(8, 1, dtype=F64)
        )
        self.optimizer = optimizer

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())


def _trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    return lightning_problems.trainer(callbacks, **{"limit_val_batches": 0, **kwargs})


def _fixed(lam: float, name: str) -> tuple[Linear, LearnedWeightDecay]:
    """A fit of ``Linear`` at a fixed λ (no hyper step), with the forward sensitivity."""
    optimizer, decoupled = OPTIMIZERS[name]
    model = Linear(optimizer)
    cb = LearnedWeightDecay(
        lam,
        granularity="global",
        decoupled=decoupled,
        every_n_steps=NEVER,
        max_overhead=None,
        validation_loss=validation_loss,
        invariant="implicit",
        hypergradient=ForwardSensitivity(),
    )
    _trainer([cb], max_epochs=3).fit(model, datamodule=RidgeData(batch_size=5))
    return model, cb


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_z_and_hypergradient_equal_the_finite_difference_of_the_lightning_training(name):
    """H = 0: z of the callback is ∂w_T/∂λ of the whole fit (12 steps), and the hypergradient
    in ρ = log λ is λ · dE(w_T)/dλ; checked against central finite differences of fits."""
    lam, eps = 0.05, 1e-6
    model, cb = _fixed(lam, name)
    plus, _ = _fixed(lam + eps, name)
    minus, _ = _fixed(lam - eps, name)
    fd_w = (plus.w.detach() - minus.w.detach()) / (2 * eps)
    fd_b = (plus.b.detach() - minus.b.detach()) / (2 * eps)
    z_w, z_b = cb.sensitivity.z
    assert fd_w.abs().max() > 1e-3
    torch.testing.assert_close(z_w, fd_w, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(z_b, fd_b, rtol=1e-5, atol=1e-8)

    batch = (RidgeData().Xv, RidgeData().yv)
    (hg,), _ = cb.problem.forward_hypergradient(
        cb.sensitivity, lambda b: validation_loss(model, b), batch, model
    )
    fd_e = (validation_loss(plus, batch) - validation_loss(minus, batch)) / (2 * eps)
    assert hg.item() == pytest.approx(lam * fd_e.item(), rel=1e-5)


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_learns_a_finite_decay_on_a_tiny_mlp(name):
    """SGD with momentum (coupled) and AdamW (decoupled): λ per layer moves and stays finite;
    the hyper steps used eq. forwardhyper (no adjoint solve: its residual is NaN)."""
    optimizer, decoupled = OPTIMIZERS[name]
    model = MLP(optimizer)
    cb = LearnedWeightDecay(
        1e-2,
        decoupled=decoupled,
        every_n_steps=2,
        max_overhead=None,
        invariant="implicit",
        hypergradient=ForwardSensitivity(),
    )
    trainer = _trainer([cb], max_epochs=4)
    trainer.fit(model, datamodule=RidgeData(batch_size=5))
    lams = torch.cat(list(cb.learned_weight_decay.values()))
    assert len(lams) == 2 and torch.isfinite(lams).all() and (lams > 0).all()
    assert not torch.allclose(lams, torch.full_like(lams, 1e-2))
    assert cb.sid.hyper_step == trainer.global_step // 2
    assert math.isnan(cb.sid.last["adjoint_residual"])
    assert all(torch.isfinite(z).all() and z.abs().sum() > 0 for z in cb.sensitivity.z)


class _StopAfter(pl.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.should_stop = trainer.current_epoch + 1 >= self.epochs


@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_resume_continues_z(tmp_path, name):
    """z and the moments' tangents are in the checkpoint: a fit resumed half-way ends with the
    uninterrupted fit's z, λ and weights. (The first half is the 12-epoch fit stopped after 6:
    the outer step's bound reads the steps left, so a 6-epoch fit learns other λ.)"""
    optimizer, decoupled = OPTIMIZERS[name]

    def make() -> tuple[LearnedWeightDecay, MLP]:
        cb = LearnedWeightDecay(
            1e-2,
            decoupled=decoupled,
            every_n_steps=2,
            max_overhead=None,
            invariant="implicit",
            hypergradient=ForwardSensitivity(),
        )
        return cb, MLP(optimizer)

    cb, model = make()
    _trainer([cb], max_epochs=12).fit(model, datamodule=RidgeData())
    z_straight, lam_straight = cb.sensitivity.z, cb.decay_values()

    cb, model = make()
    trainer = _trainer([cb, _StopAfter(6)], max_epochs=12)  # the same horizon as straight
    trainer.fit(model, datamodule=RidgeData())
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    cb, model = make()
    _trainer([cb], max_epochs=12).fit(
        model, datamodule=RidgeData(), ckpt_path=tmp_path / "half.ckpt"
    )
    for a, b in zip(z_straight, cb.sensitivity.z, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    for key, value in cb.decay_values().items():
        torch.testing.assert_close(lam_straight[key], value, rtol=1e-12, atol=0)

    plain = LearnedWeightDecay(1e-2, decoupled=decoupled, every_n_steps=2, max_overhead=None)
    with pytest.raises(ConfigurationError, match="hypergradient=ForwardSensitivity"):
        _trainer([plain], max_epochs=13).fit(
            MLP(optimizer), datamodule=RidgeData(), ckpt_path=tmp_path / "half.ckpt"
        )


def test_refuses_an_optimizer_it_cannot_follow():
    """Coupled decay through RMSprop's step is not followed: refused at the first step, naming
    it and the way out; decoupled decay needs no optimizer step and trains."""
    rmsprop = functools.partial(torch.optim.RMSprop, lr=0.01)
    cb = LearnedWeightDecay(1e-2, every_n_steps=2, hypergradient=ForwardSensitivity())
    with pytest.raises(ConfigurationError, match="not RMSprop's"):
        _trainer([cb], max_epochs=1).fit(MLP(rmsprop), datamodule=RidgeData(batch_size=5))
    cb = LearnedWeightDecay(
        1e-2, decoupled=True, every_n_steps=2, max_overhead=None,
        hypergradient=ForwardSensitivity(),
    )  # fmt: skip
    trainer = _trainer([cb], max_epochs=1)
    trainer.fit(MLP(rmsprop), datamodule=RidgeData(batch_size=5))
    assert cb.sid.hyper_step == trainer.global_step // 2 > 0


def test_hypergradient_argument_is_checked():
    with pytest.raises(ConfigurationError, match="ForwardSensitivity"):
        LearnedWeightDecay(1e-2, hypergradient="forward")
