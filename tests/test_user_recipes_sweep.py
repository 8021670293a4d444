"""Recipes no one here wrote, tried as a careless user would (session 41's sweep of the drop-in;
the table of every case and its outcome is in docs/failures.md, "Unseen recipes").

``test_user_setups.py`` covers the optimizer matrix, OneCycle/cosine, dropout, frozen layers,
groups, accumulation, clipping, precisions and streams. Here: the other schedulers (one
monitoring ``val_loss``), Lightning's validation and batch-limit switches, SWA, EMA and
checkpoints, a ``training_step`` returning a dict, label smoothing, tied weights,
LayerNorm/GroupNorm, dict batches, float16 on the CPU — each must run healthy and end no worse
than the same training without decay — and what must refuse or warn by name: tensors frozen
during the fit, several optimizers under manual optimisation, a training loop that reads only
some batches of a non-shuffling loader (``overfit_batches``), a ``BilevelModule`` fitted with no
callback, initial values the drop-in cannot take.
"""

from __future__ import annotations

import re
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import ModelCheckpoint, StochasticWeightAveraging
from test_user_setups import DATA, UserNet, _assert_healthy, _digits_loaders, _trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    BilevelModule,
    ConfigurationError,
    HyperOptimizationCallback,
    LearnedWeightDecay,
)

pytest.importorskip("sklearn.datasets")


class RecipeNet(UserNet):
    """:class:`UserNet` with what else users write: other schedulers, a dict returned by
    ``training_step``, label smoothing, a normalisation layer, weights tied across layers."""

    def __init__(self, scheduler=None, returns="tensor", smoothing=0.0, norm=None, tie=False):
        super().__init__(scheduler=scheduler)
        self.returns, self.smoothing = returns, smoothing
        layers = {"layer": nn.LayerNorm(64), "group": nn.GroupNorm(4, 64)}
        if norm is not None:
            self.net.insert(1, layers[norm])
        if tie:  # one tensor in two layers (both 64×64)
            self.net[-3].weight = self.net[0].weight

    def training_step(self, batch, batch_idx):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        loss = F.cross_entropy(self.net(x), y, label_smoothing=self.smoothing)
        return {"loss": loss} if self.returns == "dict" else loss

    def validation_step(self, batch, batch_idx):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler
        if self.scheduler == "plateau":  # needs the logged val_loss
            plateau = sched.ReduceLROnPlateau(opt, patience=0, factor=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}
        if self.scheduler == "warmup_cosine":  # per step
            warm = sched.LinearLR(opt, 0.1, 1.0, total_iters=20)
            both = sched.SequentialLR(opt, [warm, sched.CosineAnnealingLR(opt, 100)], [20])
            return {"optimizer": opt, "lr_scheduler": {"scheduler": both, "interval": "step"}}
        per_epoch = {
            "step": lambda: sched.StepLR(opt, 2, 0.3),
            "lambda": lambda: sched.LambdaLR(opt, lambda epoch: 0.7**epoch),
        }
        return ([opt], [per_epoch[self.scheduler]()]) if self.scheduler else opt


class EMA(pl.Callback):
    """An exponential moving average of the weights, kept beside the training."""

    def on_train_batch_end(self, trainer, module, *args):
        params = [p.detach() for p in module.parameters()]
        self.avg = getattr(self, "avg", None) or [p.clone() for p in params]
        torch._foreach_lerp_(self.avg, params, 0.1)


def _dict_loaders():
    X, y, Xv, yv = DATA
    as_dicts = lambda X, y: [{"x": a, "y": b} for a, b in zip(X, y)]  # noqa: E731
    return (
        DataLoader(as_dicts(X, y), batch_size=32, shuffle=True),
        DataLoader(as_dicts(Xv, yv), batch_size=100),
    )


def _loaders(batch_size=32, val_batch_size=100, val_shuffle=False):
    X, y, Xv, yv = DATA
    return (
        DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=True),
        DataLoader(TensorDataset(Xv, yv), batch_size=val_batch_size, shuffle=val_shuffle),
    )


# name: (RecipeNet kwargs, Trainer kwargs, loaders, extra callbacks)
WORKS = {
    "reduce_on_plateau_val_loss": (dict(scheduler="plateau"), {}, _loaders, ()),
    "step_lr": (dict(scheduler="step"), {}, _loaders, ()),
    "lambda_lr": (dict(scheduler="lambda"), {}, _loaders, ()),
    "warmup_cosine_sequential": (dict(scheduler="warmup_cosine"), {}, _loaders, ()),
    "accumulate_with_step_scheduler": (
        dict(scheduler="warmup_cosine"),
        dict(accumulate_grad_batches=2),
        _loaders,
        (),
    ),  # fmt: skip
    "swa": (
        {},
        {},
        _loaders,
        (lambda: StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=3),),
    ),
    "ema_callback": ({}, {}, _loaders, (EMA,)),
    "val_check_interval_half": ({}, dict(val_check_interval=0.5), _loaders, ()),
    "check_val_every_2_epochs": ({}, dict(check_val_every_n_epoch=2), _loaders, ()),
    "validation_off_loader_given": ({}, dict(limit_val_batches=0), _loaders, ()),
    "shuffled_validation_loader": ({}, {}, lambda: _loaders(val_shuffle=True), ()),
    "partial_last_batch": ({}, {}, lambda: _loaders(batch_size=30), ()),
    "training_step_returns_dict": (dict(returns="dict"), {}, _loaders, ()),
    "label_smoothing": (dict(smoothing=0.1), {}, _loaders, ()),
    "layer_norm": (dict(norm="layer"), {}, _loaders, ()),
    "group_norm": (dict(norm="group"), {}, _loaders, ()),
    "tied_weights": (dict(tie=True), {}, _loaders, ()),
    "dict_batches": ({}, {}, _dict_loaders, ()),
    "float16_on_cpu": ({}, dict(precision="16-true"), _loaders, ()),
}


def _val_loss(model):
    X, y, Xv, yv = DATA
    model.eval()
    with torch.no_grad():
        return float(F.cross_entropy(model.net(Xv.to(model.dtype)), yv))


def _fit(model_kw, trainer_kw, make_loaders, extra, decay=True, epochs=3, **decay_kw):
    pl.seed_everything(0, verbose=False)
    model = RecipeNet(**model_kw)
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None, **decay_kw)
    callbacks = [cb] if decay else []
    trainer = pl.Trainer(
        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks + [make() for make in extra],
        **trainer_kw,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, *make_loaders())
    return model, cb


@pytest.mark.parametrize("recipe", list(WORKS))
def test_recipe_runs_healthy_and_no_worse_than_no_decay(recipe):
    """Hyper steps ran, λ finite and inside what the optimizer can train, weights finite, and
    the validation loss within noise of the same fit without decay (λ falls where decay does
    not pay: these fits are short). A linear layer followed by LayerNorm/GroupNorm is
    scale-invariant: under the old default (``invariant="implicit"``) its λ rose to 0.2–0.7 and
    the validation loss ended at 0.91–1.69 against 0.46 without decay, with no warning."""
    model, cb = _fit(*WORKS[recipe])
    _assert_healthy(model, cb)
    if recipe in ("layer_norm", "group_norm"):  # Linear → norm: scale-invariant, λ held
        assert cb.invariant_groups == {"net.0": True, "net.1": False, "net.4": False,
                                       "net.6": False}  # fmt: skip
        assert float(cb.decay_values()["net.0.weight"]) == pytest.approx(1e-3)
    plain, _ = _fit(*WORKS[recipe], decay=False)
    assert _val_loss(model) <= _val_loss(plain) + 0.05


def test_best_checkpoint_reloads_and_resumes_with_lambda(tmp_path):
    """ModelCheckpoint(save_top_k=2) on val_loss: the best file holds the callback's state, the
    module reloads from it, and a new fit resumed from it continues λ where it was."""
    pl.seed_everything(0, verbose=False)
    best = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    trainer = pl.Trainer(
        max_epochs=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[cb, best],
    )  # fmt: skip
    trainer.fit(RecipeNet(), *_loaders())
    assert "LearnedWeightDecay" in torch.load(best.best_model_path, weights_only=False)["callbacks"]
    RecipeNet.load_from_checkpoint(best.best_model_path)
    lam = cb.decay_values()
    resumed = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(resumed, 5).fit(RecipeNet(), *_loaders(), ckpt_path=best.best_model_path)
    # a short continuation, said in its own steps (it said "runs 100 optimizer steps, so only 5")
    short = [str(w.message) for w in caught if "barely move" in str(w.message)]
    assert len(short) == 1 and re.search(
        r"runs (\d+) more optimizer steps \(from step (\d+) to 100\), so only", short[0]
    )
    assert resumed.history and len(resumed.history) > len(cb.history)
    assert resumed.history[: len(cb.history)] == cb.history
    assert all(torch.isfinite(v).all() for v in resumed.decay_values().values())
    assert resumed.decay_values().keys() == lam.keys()


# ---------------------------------------------------------------------- refused or said


class Freezer(pl.Callback):
    """Freezes the first layer at the start of epoch ``at`` (a backbone frozen mid-training)."""

    def __init__(self, at):
        self.at = at

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == self.at:
            module.net[0].requires_grad_(False)


@pytest.mark.parametrize("at", [0, 1])
def test_tensors_frozen_during_the_fit_are_named(at):
    """Frozen after a hyper step ran, autograd failed inside the next ("One of the
    differentiated Tensors does not require grad"); frozen before the first step, the layer
    was blamed as one the training never uses."""
    pl.seed_everything(0, verbose=False)
    trainer = _trainer(LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None), 3)
    trainer.callbacks.append(Freezer(at))
    match = r"net\.0\.weight, net\.0\.bias stopped requiring gradients during the fit.*before trainer\.fit"
    with pytest.raises(ConfigurationError, match=match):
        trainer.fit(UserNet(), *_digits_loaders())


class GAN(pl.LightningModule):
    """Two optimizers under manual optimisation: the discriminator steps first, so at its
    first step the generator has no gradient yet."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Linear(8, 64)
        self.D = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        fake = self.G(torch.randn(len(batch[0]), 8))
        loss_d = F.softplus(-self.D(batch[0])).mean() + F.softplus(self.D(fake.detach())).mean()
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()
        opt_g.zero_grad()
        self.manual_backward(F.softplus(-self.D(fake)).mean())
        opt_g.step()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.Adam(self.G.parameters(), 1e-3), torch.optim.Adam(self.D.parameters())


def test_several_optimizers_under_manual_optimization():
    """Each optimizer's tensors are checked at its own first step (the generator was blamed as
    a layer the training never uses), and the user is told what the hypergradient assumes."""
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(
        1e-3, every_n_steps=4, max_overhead=None,
        training_loss=lambda m, b: F.softplus(-m.D(b[0])).mean(),
    )  # fmt: skip
    with pytest.warns(UserWarning, match="manual optimization with 2 optimizers.*GAN"):
        _trainer(cb, 1).fit(GAN(), *_digits_loaders())
    assert cb.history


def _overfit_fit(shuffle, **trainer_kw):
    X, y, Xv, yv = DATA
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    train = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=shuffle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(cb, 3, **trainer_kw).fit(UserNet(), train, _digits_loaders()[1])
    return cb


@pytest.mark.parametrize(
    "shuffle, trainer_kw, n_train",
    [
        (True, dict(overfit_batches=2), 64),  # Lightning turns shuffling off
        (False, dict(limit_train_batches=3), 96),
        (True, dict(limit_train_batches=3), 640),  # a new random 3 batches every epoch
    ],
)
def test_hyper_steps_draw_the_samples_the_training_reads(shuffle, trainer_kw, n_train):
    """With ``overfit_batches=2`` the training reads its first 2 batches (64 samples) every
    epoch, but the hyper steps drew from all 640: λ was tuned for a training on samples it
    never sees, with no word."""
    cb = _overfit_fit(shuffle, **trainer_kw)
    assert cb.data.n_train == n_train and cb.history
    X = DATA[0]
    batch = next(cb.data.train)
    rows = (batch[0][:, None, :] == X[None, :, :]).all(-1).nonzero()[:, 1]
    assert len(rows) == len(batch[0]) and int(rows.max()) < n_train


class BareBilevel(BilevelModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(64, 10)
        self.register_hyperparameter("log_lam", torch.tensor(-3.0))

    def inner_loss(self, batch):
        decay = 0.5 * self.log_lam.exp() * self.net.weight.pow(2).sum()
        return F.cross_entropy(self.net(batch[0]), batch[1]) + decay

    def outer_loss(self, batch):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


def test_bilevel_module_fitted_without_the_callback_says_lambda_stays():
    with pytest.warns(UserWarning, match=r"no HyperOptimizationCallback.*\(log_lam\) stay"):
        _trainer(pl.Callback(), 1).fit(BareBilevel(), *_digits_loaders())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(HyperOptimizationCallback(every_n_steps=5), 1).fit(
            BareBilevel(), *_digits_loaders()
        )
    assert not any("no HyperOptimizationCallback" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "value, fix",
    [
        (0, "start small.*parameterization='projection'"),
        (torch.tensor(1e-3), r"pass a Python float \(weight_decay=0\.001\)"),
        ({"net.0": 1e-3}, "one starting value for every λ"),
        (-1e-3, "the initial λ"),
    ],
)
def test_initial_values_the_drop_in_cannot_take_say_what_to_pass(value, fix):
    with pytest.raises(ConfigurationError, match=f"weight_decay must be .*{fix}"):
        LearnedWeightDecay(value)


def test_invariance_probe_does_not_flag_a_plain_layer_near_initialisation():
    """At the first hyper step (step 3) a digits MLP's loss is ≈ log 10 whatever its middle
    layer's size: scaling that layer by 2 moved the loss by < 10⁻³ of its value and the probe
    called it scale-invariant, so ``invariant="held"`` froze its λ (and a resumed fit, probed
    later, did not: the resume no longer reproduced the straight fit). The probe now compares
    the scalings' change with a random move of the same size."""
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(1e-3, every_n_steps=3, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(cb, 1, max_steps=4).fit(UserNet(), *_digits_loaders())
    assert cb.invariant_groups == {"net.0": False, "net.3": False, "net.5": False}


class AdamWDefault(UserNet):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)  # weight_decay=0.01 left on


def test_adamw_with_its_default_decay_left_on_names_both_fixes():
    """Refused (never decayed twice); the message also says how to keep AdamW's decoupled
    decay, which coupled decay (the drop-in's default) is not."""
    match = r"AdamW \(group 0\) already applies weight_decay=0\.01.*decoupled=True"
    with pytest.raises(ConfigurationError, match=match):
        _trainer(LearnedWeightDecay(1e-3), 1).fit(AdamWDefault(), *_digits_loaders())


@pytest.mark.parametrize(
    "decay_kw", [dict(apply_to="weights"), dict(granularity="per_tensor")], ids=str
)
def test_a_normalised_layer_is_held_whatever_its_slots_hold(decay_kw):
    """Linear → LayerNorm is invariant to the scale of (W, b) together. A slot with only W
    (``apply_to="weights"``), or W and b in slots of their own (per tensor), was probed alone,
    found not invariant, and W's λ rose (to 0.62 with the validation loss at 1.33 against 0.24
    without decay, 6 epochs): the probe scales the slot's layers whole."""
    model, cb = _fit(dict(norm="layer"), {}, _loaders, (), **decay_kw)
    _assert_healthy(model, cb)
    assert float(cb.decay_values()["net.0.weight"]) == pytest.approx(1e-3)
    plain, _ = _fit(dict(norm="layer"), {}, _loaders, (), decay=False)
    assert _val_loss(model) <= _val_loss(plain) + 0.05


class IndexedValidation(UserNet):
    """Validation batches carry an index the training batches do not have."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))


def test_validation_batches_training_step_cannot_read_are_named():
    """E is ℓ on validation batches: a 3-part validation batch failed inside the user's
    ``training_step`` with "too many values to unpack" and nothing else."""
    X, y, Xv, yv = DATA
    val = DataLoader(TensorDataset(Xv, yv, torch.arange(len(yv))), batch_size=100)
    match = r"training loss on validation batches.*too many values.*validation_loss="
    with pytest.raises(ConfigurationError, match=match):
        _trainer(LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None), 1).fit(
            IndexedValidation(), _digits_loaders()[0], val
        )


class SkipsSomeBatches(UserNet):
    def training_step(self, batch, batch_idx):
        return None if batch[1][0] == 0 else super().training_step(batch, batch_idx)


def test_training_step_returning_none_says_why_the_hyper_step_needs_a_loss():
    pl.seed_everything(0, verbose=False)
    with pytest.raises(ConfigurationError, match="returned NoneType.*Lightning skips a batch"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer(LearnedWeightDecay(1e-3, every_n_steps=2, max_overhead=None), 2).fit(
                SkipsSomeBatches(), *_digits_loaders()
            )


class TrainsLambdaToo(BareBilevel):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # λ among them


def test_lambda_in_the_training_optimizer_is_named():
    """Refused as before, but by name (was "hyperparameter 0")."""
    with pytest.raises(
        ConfigurationError,
        match=r"hyperparameter 'log_lam' is also in.*inner_parameters\(\), not self\.parameters\(\)",
    ):
        _trainer(HyperOptimizationCallback(every_n_steps=5), 1).fit(
            TrainsLambdaToo(), *_digits_loaders()
        )
