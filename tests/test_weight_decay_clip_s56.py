"""LearnedWeightDecay applies its decay where the optimizer's own ``weight_decay=`` acts: inside
``optimizer.step()``, after Lightning's gradient clipping (session 56). Added in
``on_before_optimizer_step``, before the clip, the clip saw ``g + λw`` and a fit with
``gradient_clip_val`` was not the user's recipe. Oracle: with λ held (no hyper step), the fit
equals the plain fit with the optimizer's ``weight_decay=λ`` and the same clip.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import LIGHTNING_NOISE, D, RidgeData
from pytorch_lightning.plugins.precision import MixedPrecision
from torch import Tensor
from torch.optim.optimizer import _global_optimizer_pre_hooks

from hypertorch_sid import ConfigurationError, LearnedWeightDecay

pytestmark = [*LIGHTNING_NOISE]

HELD = dict(every_n_steps=10**9, start_step=10**9, max_overhead=None)  # λ fixed
SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
ADAMW = functools.partial(torch.optim.AdamW, lr=0.01)
LAM = 0.3  # large enough that λw moves the clipped gradient


class Net(pl.LightningModule):
    """A user's MLP; ``norms`` records the gradient norm its ``on_before_optimizer_step`` sees
    (gradient-norm logging)."""

    def __init__(self, optimizer: Any, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, 8, dtype=dtype), torch.nn.Tanh(), torch.nn.Linear(8, 1, dtype=dtype)
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=dtype))
        self.optimizer = optimizer
        self.norms: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.net(x.to(self.net[0].weight.dtype)).squeeze(-1) - y) ** 2).mean()

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(float(torch.cat([g.flatten() for g in grads]).norm()))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())


def _fit(model: pl.LightningModule, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    trainer = lightning_problems.trainer(
        callbacks, **{"limit_val_batches": 0, "max_epochs": 3, **kwargs}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=RidgeData())
    return trainer


def _assert_same(a: pl.LightningModule, b: pl.LightningModule, atol: float = 1e-12) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=name)


def _own_and_learned(
    optimizer: Any, decoupled: bool = False, lam: float = LAM, **trainer_kw: Any
) -> tuple[Net, Net]:
    """The plain fit with the optimizer's ``weight_decay=lam``, and the fit with
    ``LearnedWeightDecay(lam)`` (λ held) in its place, under the same Trainer settings."""
    own = Net(functools.partial(optimizer, weight_decay=lam))
    _fit(own, [], **trainer_kw)
    learned = Net(functools.partial(optimizer, weight_decay=0.0))
    _fit(learned, [LearnedWeightDecay(lam, decoupled=decoupled, **HELD)], **trainer_kw)
    return own, learned


@pytest.mark.parametrize("algorithm, clip", [("norm", 0.05), ("value", 0.01)])
def test_a_clipped_fit_is_the_optimizers_own_decay(algorithm, clip):
    """SGD (momentum 0.9), λ = 0.3 held, ``gradient_clip_val`` by norm and by value: the fit is
    SGD(weight_decay=λ)'s with the same clip (before: the clip saw λw; weights off by 1e-2)."""
    clipping = dict(gradient_clip_val=clip, gradient_clip_algorithm=algorithm)
    own, learned = _own_and_learned(SGD, **clipping)
    _assert_same(own, learned)
    unclipped = Net(functools.partial(SGD, weight_decay=LAM))  # the clip binds in this fit
    _fit(unclipped, [])
    assert (unclipped.net[0].weight - own.net[0].weight).abs().max() > 1e-3
    assert own.norms == pytest.approx(learned.norms, rel=1e-12)


def test_a_clipped_fit_is_adamws_own_decoupled_decay():
    own, learned = _own_and_learned(ADAMW, decoupled=True, gradient_clip_val=0.05)
    _assert_same(own, learned)


def test_gradient_norm_logging_sees_the_data_gradient():
    """A module logging its gradient norm in ``on_before_optimizer_step`` (Lightning's
    advice) reads the data gradient, as under the optimizer's own decay (before: ‖g + λw‖)."""
    own, learned = _own_and_learned(SGD)
    _assert_same(own, learned)
    assert len(learned.norms) == 18 and own.norms == pytest.approx(learned.norms, rel=1e-12)


def test_accumulated_clipped_steps_decay_once_per_optimizer_step():
    own, learned = _own_and_learned(SGD, accumulate_grad_batches=2, gradient_clip_val=0.05)
    _assert_same(own, learned)


class Skipping(Net):
    """float16 autocast under a GradScaler; the loss is inf at steps 2 and 5 (the scaler skips
    them)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx in (2, 5) else loss


def _scaled() -> dict[str, Any]:
    return dict(plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))])


@pytest.mark.parametrize("decoupled", [False, True])
def test_a_grad_scaler_with_clipping_and_skipped_steps_is_the_optimizers_own(decoupled):
    """Unscaled, clipped, two steps skipped: the decay acts (and skips) as the optimizer's."""
    optimizer, lam = (ADAMW, 0.3) if decoupled else (SGD, LAM)
    fits = []
    for wd, callbacks in ((lam, []), (0.0, [LearnedWeightDecay(lam, decoupled=decoupled, **HELD)])):
        model = Skipping(functools.partial(optimizer, weight_decay=wd), dtype=torch.float32)
        _fit(model, callbacks, gradient_clip_val=0.05, **_scaled())
        fits.append(model)
    _assert_same(*fits, atol=1e-6)
    assert sum(n != n or n == float("inf") for n in fits[1].norms) >= 6  # ≥ 2 per epoch skipped


class Manual(Net):
    """Manual optimisation, two optimizers (one per layer), each step clipped by the user."""

    def __init__(self, wd: float) -> None:
        super().__init__(None)
        self.automatic_optimization = False
        self.wd = wd

    def training_step(self, batch: Any, batch_idx: int) -> None:
        loss = super().training_step(batch, batch_idx)
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            self.clip_gradients(opt, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
            opt.step()

    def configure_optimizers(self) -> Any:
        return [SGD(layer.parameters(), weight_decay=self.wd) for layer in self.net[::2]]


def test_manual_optimisation_with_two_clipped_optimizers_is_the_optimizers_own():
    own = Manual(LAM)
    _fit(own, [])
    learned = Manual(0.0)
    loss = lambda module, batch: Net.training_step(module, batch, 0)  # noqa: E731
    _fit(learned, [LearnedWeightDecay(LAM, training_loss=loss, **HELD)])
    _assert_same(own, learned)


class Recreate(pl.Callback):
    """A warm restart at epoch 1: the optimizers created anew."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            trainer.strategy.setup_optimizers(trainer)


def test_optimizers_created_anew_get_the_decay_from_their_first_step():
    own = Net(functools.partial(SGD, weight_decay=LAM))
    _fit(own, [Recreate()], gradient_clip_val=0.05)
    learned = Net(SGD)
    _fit(learned, [LearnedWeightDecay(LAM, **HELD), Recreate()], gradient_clip_val=0.05)
    _assert_same(own, learned)


class Penalised(Net):
    """The decay written into the loss (LBFGS has no ``weight_decay=``)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        penalty = sum((p**2).sum() for p in self.parameters())
        return super().training_step(batch, batch_idx) + 0.5 * LAM * penalty


def test_lbfgs_gets_the_decay_at_every_closure_evaluation():
    """LBFGS evaluates the closure several times per step; each gradient gets λw (no line
    search, no tolerance: the loss value, which lacks ½λ‖w‖², is not read)."""
    lbfgs = functools.partial(
        torch.optim.LBFGS, lr=0.2, max_iter=4, tolerance_grad=0, tolerance_change=0
    )
    own = Penalised(lbfgs)
    _fit(own, [], max_epochs=1)
    learned = Net(lbfgs)
    _fit(learned, [LearnedWeightDecay(LAM, **HELD)], max_epochs=1)
    _assert_same(own, learned, atol=1e-10)


def test_the_step_hook_is_gone_after_a_fit_and_after_a_failed_one():
    before = len(_global_optimizer_pre_hooks)
    _fit(Net(SGD), [LearnedWeightDecay(LAM, **HELD)])
    assert len(_global_optimizer_pre_hooks) == before

    class Fails(Net):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            if self.global_step == 3:
                raise ConfigurationError("stop")
            return super().training_step(batch, batch_idx)

    with pytest.raises(ConfigurationError, match="stop"):
        _fit(Fails(SGD), [LearnedWeightDecay(LAM, **HELD)])
    assert len(_global_optimizer_pre_hooks) == before
    # the fit's own optimizer stepped after the fit is not decayed
    model = Net(functools.partial(torch.optim.SGD, lr=0.05))
    optimizer = _fit(model, [LearnedWeightDecay(LAM, **HELD)]).optimizers[0]
    start = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), start))


def test_tensors_thawed_mid_fit_are_said_to_get_no_decay_at_all():
    """``BackboneFinetuning`` adds the thawed backbone as a new group, which takes the
    optimizer's default ``weight_decay`` (0 once the decay moved to the callback): the warning
    says they get no decay at all, with the fixed-decay advice (session 56 measured a fixed
    1e-4 or 1e-2 on such a group against none: no difference beyond noise)."""
    from pytorch_lightning.callbacks import BackboneFinetuning

    class WithBackbone(Net):
        def __init__(self) -> None:
            super().__init__(functools.partial(torch.optim.SGD, lr=0.05))
            self.backbone = self.net[0]

        def configure_optimizers(self) -> Any:
            return self.optimizer([p for p in self.parameters() if p.requires_grad])

    model = WithBackbone()
    finetune = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.0)
    cb = LearnedWeightDecay(0.01, every_n_steps=2, max_overhead=None)
    trainer = lightning_problems.trainer([cb, finetune], limit_val_batches=0, max_epochs=2)
    with pytest.warns(UserWarning, match=r"no decay at all.*finetune_function"):
        trainer.fit(model, datamodule=RidgeData())
    assert trainer.optimizers[0].param_groups[-1]["weight_decay"] == 0
    assert not any(name.startswith("net.0.") for name in cb.decay_values())
