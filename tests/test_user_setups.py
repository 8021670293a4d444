"""The drop-in inside the training set-ups users already have, beyond the optimizer matrix of
``test_networks.py``: learning-rate schedulers (per step and per epoch), Nesterov, RMSprop,
Adagrad, dropout, torchmetrics in ``training_step``, frozen layers, parameter groups with their
own learning rates, gradient accumulation, gradient clipping, bf16 autocast, float64 precision, ``max_steps``, batches reshaped
in ``on_before_batch_transfer``, streamed data (``IterableDataset``, loaders yielding whole batches).

Each run (a digits MLP, or an LSTM or a Transformer encoder on token sequences; seconds) must
finish with hyper steps run, λ finite, positive and inside what the optimizer can train, bounded
hypergradients, finite weights — and leave the user's own state alone: a torchmetrics metric
updated in ``training_step`` counts the training batches only,
not the hyper step's. A fit too short for λ to move says so.
"""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, LearnedWeightDecay

sklearn = pytest.importorskip("sklearn.datasets")
torchmetrics = pytest.importorskip("torchmetrics")
torchvision = pytest.importorskip("torchvision")

BATCH = 32


DATA = digits_split(640, 300, seed=1)


class UserNet(pl.LightningModule):
    """An ordinary classifier; the options are what users' own modules do."""

    def __init__(self, optimizer="sgd", scheduler=None, dropout=0.0, freeze_first=False,
                 groups=False):  # fmt: skip
        super().__init__()
        self.optimizer, self.scheduler, self.groups = optimizer, scheduler, groups
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))  # fmt: skip
        if freeze_first:
            self.net[0].requires_grad_(False)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        self.metric_batches = 0  # training batches, as the user counts them
        self.epoch_metric: list[tuple[int, int]] = []  # (updates, samples) at each epoch's end

    def training_step(self, batch, batch_idx):
        logits = self.net(batch[0])
        loss = F.cross_entropy(logits, batch[1])
        self.train_acc(logits, batch[1])
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.metric_batches += 1

    def on_train_epoch_end(self):
        acc = self.train_acc
        self.epoch_metric.append((acc.update_count, int(acc.tp.sum() + acc.fn.sum())))

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]
        params = trainable
        if self.groups:  # weights at the base lr, biases at their own
            params = [{"params": [p for p in trainable if p.dim() > 1]},
                      {"params": [p for p in trainable if p.dim() == 1], "lr": 0.02}]  # fmt: skip
        opt = {
            "sgd": lambda: torch.optim.SGD(params, lr=0.1),
            "nesterov": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
            "adam": lambda: torch.optim.Adam(params, lr=3e-3),
            "rmsprop": lambda: torch.optim.RMSprop(params, lr=1e-3),
            "adagrad": lambda: torch.optim.Adagrad(params, lr=0.05),
        }[self.optimizer]()
        if self.scheduler == "onecycle":
            total = self.trainer.estimated_stepping_batches
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, opt.param_groups[0]["lr"], total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        if self.scheduler == "cosine":
            return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)]
        return opt


def _trainer(cb, epochs, **trainer_kw):
    """A quiet Trainer with the callback ``cb``."""
    return pl.Trainer(
        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[cb], **trainer_kw,
    )  # fmt: skip


def _digits_loaders(dataset=TensorDataset):
    """The training (shuffled) and validation loaders of DATA, samples made by ``dataset``."""
    X, y, Xv, yv = DATA
    return (
        DataLoader(dataset(X, y), batch_size=BATCH, shuffle=True),
        DataLoader(dataset(Xv, yv), batch_size=100),
    )


def _fit(model_kw=None, trainer_kw=None, callback_kw=None, epochs=6, seed=0):
    pl.seed_everything(seed, verbose=False)
    model = UserNet(**(model_kw or {}))
    # every due hyper step (max_overhead=None): these fits are too short for the default budget
    cb = LearnedWeightDecay(
        1e-3, **{"every_n_steps": 5, "max_overhead": None, **(callback_kw or {})}
    )
    trainer = _trainer(cb, epochs, **(trainer_kw or {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, *_digits_loaders())
    return model, cb, trainer, [str(w.message) for w in caught]


def _assert_healthy(model, cb):
    assert cb.history, "no hyper step ran"
    lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
    assert torch.isfinite(lam).all() and (lam > 0).all()
    assert float(lam.max()) <= max(cb.problem.stability.bounds()) * (1 + 1e-6)
    retries = [h["hyper/retries"] for h in cb.history]  # recovered divergences, never hidden
    assert all(r in (0.0, 1.0, 2.0) for r in retries), retries  # Recover(2): at most 2 per step
    norms = [h["hyper/hypergradient_norm"] for h in cb.history]
    assert all(math.isfinite(n) and n < 1e3 for n in norms), norms
    assert all(torch.isfinite(p).all() for p in model.parameters())


SETUPS = {
    "onecycle_per_step": dict(model_kw=dict(scheduler="onecycle")),
    "cosine_per_epoch_adam": dict(model_kw=dict(optimizer="adam", scheduler="cosine")),
    "nesterov": dict(model_kw=dict(optimizer="nesterov")),
    "rmsprop": dict(model_kw=dict(optimizer="rmsprop")),
    "adagrad": dict(model_kw=dict(optimizer="adagrad")),
    "dropout": dict(model_kw=dict(dropout=0.3)),
    "frozen_first_layer": dict(model_kw=dict(freeze_first=True)),
    "groups_with_own_lr": dict(
        model_kw=dict(groups=True), callback_kw=dict(granularity="per_group")
    ),  # fmt: skip
    "accumulate_grad_batches": dict(trainer_kw=dict(accumulate_grad_batches=2)),
    "gradient_clipping": dict(trainer_kw=dict(gradient_clip_val=0.5)),
    "bf16_autocast": dict(trainer_kw=dict(precision="bf16-mixed")),
    "max_steps": dict(trainer_kw=dict(max_steps=60), epochs=-1),
    # Lightning converts each batch to float64; the callback's own batches must be converted too
    "float64_precision": dict(trainer_kw=dict(precision="64-true")),
    "per_element_adam": dict(
        model_kw=dict(optimizer="adam"), callback_kw=dict(granularity="per_element")
    ),  # fmt: skip
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_drop_in_in_the_users_own_training_setup(setup):
    for seed in (0, 1):
        model, cb, trainer, _ = _fit(seed=seed, **SETUPS[setup])
        _assert_healthy(model, cb)
        if setup == "frozen_first_layer":  # frozen tensors are neither decayed nor inner
            assert not any(name.startswith("net.0.") for name in cb.decay_values())
            assert all(p.requires_grad for p in cb.problem._inner)
        if setup == "groups_with_own_lr":  # one λ per group, each bounded by its own lr
            assert len(cb.slot_names) == 2
            assert cb.problem.stability.bounds()[-1] == pytest.approx(1 / 0.02)


class DictBatches(torch.utils.data.Dataset):
    """Samples as dicts, as many datasets give them."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        return {"image": self.X[i], "label": self.y[i]}


class HookedNet(UserNet):
    """Turns the loader's dict batches into ``(x, y)`` in ``on_before_batch_transfer``."""

    hook_calls = 0

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.hook_calls += 1
        return batch["image"], batch["label"]


def test_the_callbacks_batches_go_through_the_users_batch_hooks():
    """Lightning hands ``training_step`` each batch after the precision's conversion and the
    module's ``on_before_batch_transfer``: the hyper step's minibatches must get the same (here
    ``training_step`` cannot read the raw dict batch at all)."""
    X, y, Xv, yv = DATA
    pl.seed_everything(0, verbose=False)
    model = HookedNet()
    cb = LearnedWeightDecay(1e-3, every_n_steps=5, max_overhead=None)
    trainer = _trainer(cb, 2, num_sanity_val_steps=0)
    trainer.fit(model, *_digits_loaders(DictBatches))
    _assert_healthy(model, cb)
    loop_batches = 2 * (math.ceil(len(y) / BATCH) + math.ceil(len(yv) / 100))
    assert model.hook_calls > loop_batches  # the hyper steps' batches went through it too


class AugmentingNet(UserNet):
    """Augments its batches on the device only while training, as users write it."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[bool, int]] = []  # (trainer.training, batch size) per batch

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.seen.append((self.trainer.training, len(batch[1])))
        if self.trainer.training:
            return batch[0] + 0.1 * torch.randn_like(batch[0]), batch[1]
        return batch


def test_validation_batches_of_the_hyper_step_are_not_augmented():
    """The hyper step's validation batches are prepared as Lightning's validation loop prepares
    them (``self.trainer.training`` False), its training batches as the training's."""
    X, y, Xv, yv = DATA
    pl.seed_everything(0, verbose=False)
    model = AugmentingNet()
    cb = LearnedWeightDecay(1e-3, every_n_steps=5, max_overhead=None)
    trainer = _trainer(cb, 2)
    trainer.fit(model, *_digits_loaders())
    _assert_healthy(model, cb)
    sizes = {size for _, size in model.seen}
    assert sizes == {BATCH, 100}
    assert all(training == (size == BATCH) for training, size in model.seen)
    loop_batches = 2 * (math.ceil(len(y) / BATCH) + math.ceil(len(yv) / 100)) + 2  # + sanity
    assert len(model.seen) > loop_batches  # the hyper steps' batches were among them


class Shuffled(torch.utils.data.IterableDataset):
    """A stream of samples in a new seeded order on every pass, as streaming datasets give."""

    def __init__(self, X, y):
        self.X, self.y, self.passes = X, y, 0

    def __iter__(self):
        self.passes += 1
        order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(self.passes))
        return iter((self.X[i], self.y[i]) for i in order.tolist())


@pytest.mark.parametrize("kind", ["iterable", "pre_batched"])
def test_drop_in_on_streamed_data(kind):
    """Data without random access — an ``IterableDataset``, or a loader whose dataset yields
    whole batches (``batch_size=None``) — is read through the loader itself."""
    X, y, Xv, yv = DATA
    if kind == "iterable":
        train = DataLoader(Shuffled(X, y), batch_size=BATCH)
        val = DataLoader(Shuffled(Xv, yv), batch_size=100)
    else:  # rows of batches: batch i holds samples i, i + n, i + 2n, ...
        n = math.ceil(len(y) / BATCH)
        batches = [(X[i::n], y[i::n]) for i in range(n)]
        train = DataLoader(batches, batch_size=None, shuffle=True)
        val = DataLoader([(Xv[i::3], yv[i::3]) for i in range(3)], batch_size=None)
    pl.seed_everything(0, verbose=False)
    model = UserNet()
    cb = LearnedWeightDecay(1e-3, every_n_steps=5, max_overhead=None)
    trainer = _trainer(cb, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train, val)
    assert not any("barely move" in str(w.message) for w in caught)  # the length is unknown
    _assert_healthy(model, cb)
    assert len(cb.history) == trainer.global_step // 5
    assert cb.data.train.sampler.global_batch == (BATCH if kind == "iterable" else len(y[::n]))
    lam = next(iter(cb.decay_values().values()))
    assert not torch.allclose(lam, torch.full_like(lam, 1e-3))  # λ was learned
    with pytest.raises(ConfigurationError, match="val='full'.*streamed validation dataloader"):
        _trainer(LearnedWeightDecay(1e-3, val="full", max_overhead=None), 1).fit(
            UserNet(), train, val
        )


class Ordered(torch.utils.data.IterableDataset):
    """A stream in one fixed shuffled order, the same on every pass."""

    def __init__(self, X, y):
        self.X, self.y = X, y
        self.order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0)).tolist()

    def __iter__(self):
        return iter((self.X[i], self.y[i]) for i in self.order)


def test_resume_on_streamed_data_reproduces_the_straight_fit(tmp_path):
    """The callback's place in the stream is checkpointed: a run killed after 2 epochs and
    resumed gives the λ of an uninterrupted one."""
    X, y, Xv, yv = DATA

    def fit(epochs, ckpt=None, save=None):
        pl.seed_everything(0, verbose=False)
        model, cb = UserNet(), LearnedWeightDecay(1e-3, every_n_steps=3, max_overhead=None)
        trainer = _trainer(cb, epochs)
        loaders = (DataLoader(Ordered(X, y), batch_size=BATCH),
                   DataLoader(Ordered(Xv, yv), batch_size=100))  # fmt: skip
        trainer.fit(model, *loaders, ckpt_path=ckpt)
        if save:
            trainer.save_checkpoint(save)
        return cb

    straight = fit(4).decay_values()
    fit(2, save=tmp_path / "half.ckpt")
    resumed = fit(4, ckpt=tmp_path / "half.ckpt").decay_values()
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], rtol=1e-6, atol=0)


class MobileBlock(UserNet):
    """MobileNetV3's block on the 8×8 digits: depthwise conv, hardswish and a squeeze-excitation
    gated by ``nn.Hardsigmoid`` (whose backward torch cannot differentiate)."""

    def __init__(self):
        super().__init__(optimizer="nesterov")
        se = torchvision.ops.SqueezeExcitation(16, 8, scale_activation=nn.Hardsigmoid)
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16),
            nn.Hardswish(), nn.Conv2d(16, 16, 3, padding=1, groups=16), se, nn.Flatten(),
            nn.Linear(16 * 64, 10),
        )  # fmt: skip


def test_drop_in_on_a_mobilenet_v3_block():
    pl.seed_everything(0, verbose=False)
    model = MobileBlock()
    cb = LearnedWeightDecay(1e-3, every_n_steps=5, max_overhead=None)
    trainer = _trainer(cb, 3)
    trainer.fit(model, *_digits_loaders())
    _assert_healthy(model, cb)


def test_hyper_steps_leave_the_users_metrics_alone():
    """``training_step`` is evaluated on the hyper step's own minibatches; a torchmetrics metric
    updated there must still hold only the training's batches (it counted 58 in an epoch of 32)."""
    model, cb, trainer, _ = _fit(epochs=2)
    assert len(cb.history) >= 4  # hyper steps ran, each calling training_step several times
    per_epoch = math.ceil(len(DATA[1]) / BATCH)
    # at each epoch's end, before Lightning computes and resets it: one update per training
    # batch, and its confusion counts hold exactly the epoch's samples
    assert model.epoch_metric == [(per_epoch, len(DATA[1]))] * 2
    assert model.metric_batches == 2 * per_epoch


def test_a_fit_too_short_for_lambda_to_move_says_so():
    """8 optimizer steps per epoch × 2 epochs, a hyper step every 20: none would run."""
    pl.seed_everything(0, verbose=False)
    model = UserNet()
    cb = LearnedWeightDecay(1e-3)  # the drop-in's default every_n_steps = 20
    trainer = _trainer(cb, 2)
    with pytest.warns(UserWarning, match=r"runs 40 optimizer steps, so only 2 hyper steps.*"
                      r"every_n_steps=20.*barely move.*every_n_steps=2 for 20 hyper"):  # fmt: skip
        trainer.fit(model, *_digits_loaders())


def test_the_short_fit_warning_does_not_suggest_what_is_already_set():
    *_, messages = _fit(epochs=1, callback_kw=dict(every_n_steps=1))  # 20 steps, 20 hyper steps
    assert not any("barely move" in m for m in messages)
    *_, messages = _fit(epochs=1, trainer_kw=dict(max_steps=5), callback_kw=dict(every_n_steps=1))
    (message,) = [m for m in messages if "barely move" in m]
    assert "only 5 hyper steps" in message and "Train longer (more optimizer steps)." in message
    assert "pass every_n_steps" not in message


def test_a_fit_long_enough_does_not_warn():
    *_, messages = _fit(epochs=6)  # 120 steps, a hyper step every 5: 24
    assert not any("barely move" in m for m in messages)


class SequenceNet(pl.LightningModule):
    """Embedding + LSTM or Transformer encoder (LayerNorm, dropout or none): is token 3 or 7 more
    common? Without dropout the attention runs on a fused kernel, which the hyper step must avoid
    (it has no second derivative)."""

    def __init__(self, body: str, optimizer: str):
        super().__init__()
        self.body_kind, self.optimizer = body, optimizer
        self.emb = nn.Embedding(20, 16)
        if body == "lstm":
            self.body = nn.LSTM(16, 16, batch_first=True)
        else:  # without dropout attention runs on a fused kernel (no second derivative)
            dropout = 0.0 if body == "transformer_no_dropout" else 0.1
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = self.body(self.emb(x))
        return self.head((h[0] if self.body_kind == "lstm" else h).mean(1))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        if self.optimizer == "adamw":
            return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.0)
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize(
    "body,optimizer,decoupled",
    [
        ("lstm", "momentum", False),
        ("transformer", "adamw", True),
        ("transformer_no_dropout", "adamw", True),
    ],
)
def test_drop_in_on_sequence_models(body, optimizer, decoupled):
    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, 20, (600, 10), generator=g)
    y = ((X == 3).sum(1) > (X == 7).sum(1)).long()
    pl.seed_everything(0, verbose=False)
    model = SequenceNet(body, optimizer)
    cb = LearnedWeightDecay(1e-3, decoupled=decoupled, every_n_steps=5, max_overhead=None)
    trainer = _trainer(cb, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            model,
            DataLoader(TensorDataset(X[:400], y[:400]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[400:], y[400:]), batch_size=200),
        )
    _assert_healthy(model, cb)
    assert len(cb.slot_names) >= 3  # per layer: embedding, body layers, head
