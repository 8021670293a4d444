"""What a performance-minded GPU user's Trainer does to the drop-ins, tried on the CPU (session 42;
the table of every setting and its outcome is in docs/failures.md, "GPU users' settings").

Each setting is applied, as a careless user would write it, to the three ways in:

* ``LearnedWeightDecay`` on a small CNN with BatchNorm (test_gpu.py's): λ moved, finite;
* ``LearnedDataWeights`` on the noisy-label toy of test_data_weights_recipes.py: the corrupted
  examples' weights end below the clean ones', finite;
* ``BilevelModule`` + ``HyperOptimizationCallback`` on a ridge regression: λ moved, finite.

Each either works so, or is refused with a ``ConfigurationError`` naming the cause and the fix
(``REFUSED``). Beside the table: a mid-epoch resume from a step checkpoint, Lightning's weight
averaging leaving a ``BilevelModule``'s λ as learned, and the module passed to ``fit`` compiled.
Compiled cases use ``backend="aot_eager"`` (AOTAutograd, where double backward fails, without
inductor's code generation: seconds, not tens of seconds).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import (
    EMAWeightAveraging,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from pytorch_lightning.plugins.precision import MixedPrecision
from test_data_weights_recipes import Classifier, assert_separates, loader, val_loader
from test_gpu import SmallCNN, image_loaders
from torch import Tensor, nn
from torch._dynamo.utils import counters
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    BilevelModule,
    ConfigurationError,
    HyperOptimizationCallback,
    LearnedDataWeights,
    LearnedWeightDecay,
)

DROP_INS = ("weight_decay", "data_weights", "bilevel")


# ---------------------------------------------------------------------------- the models
class Checkpointed(nn.Module):
    """Activation checkpointing as users write it: the first layer as usual, the rest of the
    network through ``torch.utils.checkpoint.checkpoint`` (its input requires grad)."""

    def __init__(self, net: nn.Sequential, reentrant: bool) -> None:
        super().__init__()
        self.first, self.rest, self.reentrant = net[0], net[1:], reentrant

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.rest, self.first(x), use_reentrant=self.reentrant)


class ChannelsLast(nn.Module):
    """The network and its input in ``channels_last`` memory format."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net.to(memory_format=torch.channels_last)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)


def _compiled(net: nn.Module) -> nn.Module:
    return torch.compile(net, backend="aot_eager")


def _module_compile(net: nn.Module) -> nn.Module:
    net.compile(backend="aot_eager")  # nn.Module.compile: in place, no wrapper
    return net


WRAPS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "torch_compile": _compiled,
    "module_compile": _module_compile,
    "checkpoint_reentrant": lambda net: Checkpointed(net, reentrant=True),
    "checkpoint_non_reentrant": lambda net: Checkpointed(net, reentrant=False),
    "channels_last": ChannelsLast,
}


class Ridge(BilevelModule):
    """Ridge regression with one learned log-λ per feature, its network named ``net``."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net: nn.Module = nn.Sequential(nn.Linear(d, 1, bias=False), nn.Identity())
        self.register_hyperparameter("log_lam", torch.zeros(d))

    def _weight(self) -> Tensor:
        return next(p for p in self.net.parameters())[0]

    def inner_loss(self, batch: Any) -> Tensor:
        x, y = batch
        fit = 0.5 * ((self.net(x.to(self.log_lam.dtype)).squeeze(-1) - y) ** 2).mean()
        return fit + 0.5 * (self.log_lam.exp() * self._weight() ** 2).sum()

    def outer_loss(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


def ridge_loaders() -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(600, 8, generator=gen), torch.randn(600, generator=gen)
    y = y + X[:, :2].sum(1)  # two useful features, six of noise
    return (
        DataLoader(TensorDataset(X[:400], y[:400]), batch_size=32, shuffle=True, generator=gen),
        DataLoader(TensorDataset(X[400:], y[400:]), batch_size=200),
    )


class EMA(pl.Callback):
    """An exponential moving average of the weights, kept beside the training."""

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        params = [p.detach() for p in module.parameters()]
        self.avg = getattr(self, "avg", None) or [p.clone() for p in params]
        torch._foreach_lerp_(self.avg, params, 0.1)


# ---------------------------------------------------------------------------- the settings
@contextlib.contextmanager
def matmul_precision(value: str) -> Iterator[None]:
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@contextlib.contextmanager
def cudnn_benchmark() -> Iterator[None]:
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = old


# name: Trainer kwargs, extra callbacks (made per fit), the network's wrap, a global context
SETTINGS: dict[str, dict[str, Any]] = {
    "bf16_mixed": dict(trainer=dict(precision="bf16-mixed")),
    "16_mixed": dict(trainer=dict(precision="16-mixed")),  # on the CPU Lightning runs bf16
    # what "16-mixed" is on a GPU: float16 autocast and a GradScaler (here on the CPU)
    "16_mixed_grad_scaler": dict(trainer=lambda: dict(plugins=[fp16_with_scaler()])),
    "64_true": dict(trainer=dict(precision="64-true")),
    "bf16_true": dict(trainer=dict(precision="bf16-true")),
    "torch_compile": dict(wrap="torch_compile"),
    "module_compile": dict(wrap="module_compile"),
    "checkpoint_reentrant": dict(wrap="checkpoint_reentrant"),
    "checkpoint_non_reentrant": dict(wrap="checkpoint_non_reentrant"),
    "channels_last": dict(wrap="channels_last"),
    "cudnn_benchmark": dict(context=cudnn_benchmark),
    "benchmark_nondeterministic": dict(trainer=dict(benchmark=True, deterministic=False)),
    "swa": dict(callbacks=(lambda: StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2),)),
    "ema_callback": dict(callbacks=(EMA,)),
    "ema_weight_averaging": dict(callbacks=(lambda: EMAWeightAveraging(decay=0.9),)),
    "accumulate_4": dict(trainer=dict(accumulate_grad_batches=4)),
    "clip_bf16_mixed": dict(trainer=dict(gradient_clip_val=0.5, precision="bf16-mixed")),
    "max_time": dict(trainer=dict(max_time={"minutes": 5})),
    "val_check_interval_quarter": dict(trainer=dict(val_check_interval=0.25)),
    "matmul_precision_medium": dict(context=lambda: matmul_precision("medium")),
}


def fp16_with_scaler() -> MixedPrecision:
    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))


#: the settings refused, and what the message must say
REFUSED = {"checkpoint_reentrant": r"use_reentrant=True.*set use_reentrant=False"}


def _trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        deterministic=True,
    )  # fmt: skip
    return pl.Trainer(callbacks=callbacks, **{**settings, **kwargs})


def _run(drop_in: str, setting: str, **extra_trainer: Any) -> tuple[Any, Any]:
    """Fit ``drop_in`` under ``setting``; returns (callback, model)."""
    spec = SETTINGS[setting]
    pl.seed_everything(0, verbose=False)
    wrap = WRAPS.get(spec.get("wrap", ""), lambda net: net)
    if drop_in == "weight_decay":
        model: Any = SmallCNN()
        cb: Any = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        loaders, epochs = image_loaders(), 3
    elif drop_in == "data_weights":
        model = Classifier()
        cb = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
        loaders, epochs = (loader(), val_loader()), 15
    else:
        model = Ridge()
        cb = HyperOptimizationCallback(every_n_steps=5, adjoint_steps=20, outer_lr=0.05)
        loaders, epochs = ridge_loaders(), 3
    model.net = wrap(model.net)
    callbacks = [cb] + [make() for make in spec.get("callbacks", ())]
    settings = spec.get("trainer", {})
    trainer_kw = {"max_epochs": epochs, **(settings() if callable(settings) else settings)}
    trainer_kw.update(extra_trainer)
    ckpt_path = trainer_kw.pop("ckpt_path", None)
    context = spec.get("context", contextlib.nullcontext)
    with context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(callbacks, **trainer_kw).fit(model, *loaders, ckpt_path=ckpt_path)
    return cb, model


def assert_learned(drop_in: str, cb: Any, model: Any) -> None:
    if drop_in == "data_weights":
        assert_separates(cb)
        return
    assert cb.history, "no hyper step ran"
    if drop_in == "weight_decay":
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()]).float()
        assert bool(torch.isfinite(lam).all()) and bool((lam > 0).all())
        assert not torch.allclose(lam, torch.full_like(lam, 1e-3)), "λ never moved"
    else:
        log_lam = model.log_lam.detach().float()
        assert bool(torch.isfinite(log_lam).all()) and bool((log_lam != 0).any())
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("drop_in", DROP_INS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_setting(setting: str, drop_in: str) -> None:
    """Each setting either learns (λ moved, finite; the corrupted examples' weights below the
    clean ones') or is refused naming the cause and the fix."""
    if setting in REFUSED:
        with pytest.raises(ConfigurationError, match=REFUSED[setting]):
            _run(drop_in, setting)
        return
    compiled = "compile" in SETTINGS[setting].get("wrap", "")
    if compiled:
        torch._dynamo.reset()
        counters.clear()
    cb, model = _run(drop_in, setting)
    assert_learned(drop_in, cb, model)
    if compiled:  # the training ran compiled graphs; the hyper steps ran the module eagerly
        assert counters["stats"]["unique_graphs"] > 0


STEPS_PER_EPOCH = {"weight_decay": 16, "data_weights": 10, "bilevel": 13}


@pytest.mark.parametrize("drop_in", DROP_INS)
def test_resume_mid_epoch_from_a_step_checkpoint(drop_in: str, tmp_path: Any) -> None:
    """``ModelCheckpoint(every_n_train_steps=7)`` saves mid-epoch; a new fit resumed from such
    a file starts from its λ (weights) and hyper-step history and keeps learning."""
    SETTINGS["step_checkpoints"] = dict(
        callbacks=(lambda: ModelCheckpoint(tmp_path, every_n_train_steps=7, save_top_k=-1),),
        trainer=dict(enable_checkpointing=True),
    )
    try:
        _run(drop_in, "step_checkpoints")
        mid = next(
            f
            for f in sorted(tmp_path.glob("*.ckpt"), key=lambda f: f.stat().st_mtime)
            if (saved := torch.load(f, weights_only=False))["global_step"] > 14
            and saved["global_step"] % STEPS_PER_EPOCH[drop_in]
        )
        state = next(v for k, v in saved["callbacks"].items() if "step" not in k.lower())
        resumed, model = _run(drop_in, "step_checkpoints", ckpt_path=str(mid))
    finally:
        del SETTINGS["step_checkpoints"]
    assert state["history"] and len(resumed.history) > len(state["history"])
    assert resumed.history[: len(state["history"])] == state["history"]
    assert_learned(drop_in, resumed, model)


class LastLambda(pl.Callback):
    """λ of the module as the training's last step left it (before any ``on_train_end``)."""

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        self.value = module.log_lam.detach().clone()


@pytest.mark.parametrize(
    "averaging",
    [EMAWeightAveraging, lambda: StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)],
    ids=["ema_weight_averaging", "swa"],
)
def test_weight_averaging_leaves_a_bilevel_modules_lambda_as_learned(averaging: Any) -> None:
    """Lightning's averaging callbacks copy their average into every parameter of the module at
    the end of the fit, a ``BilevelModule``'s λ included: with EMAWeightAveraging's default
    decay (0.999) a log λ learned to -0.35 came back as -0.007 — silently. λ ends as learned;
    the weights keep the average."""
    last = LastLambda()
    SETTINGS["averaging"] = dict(callbacks=(averaging, lambda: last))
    try:
        cb, model = _run("bilevel", "averaging")
    finally:
        del SETTINGS["averaging"]
    assert_learned("bilevel", cb, model)
    torch.testing.assert_close(model.log_lam.detach(), last.value, rtol=0, atol=0)
    assert float(last.value.abs().max()) > 0.1


class ForwardCNN(SmallCNN):
    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])


class ForwardClassifier(Classifier):
    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.loss(self(batch[0]), batch[1])


@pytest.mark.parametrize("drop_in", ["weight_decay", "data_weights"])
def test_the_module_passed_to_fit_compiled(drop_in: str) -> None:
    """``trainer.fit(torch.compile(model))`` (Lightning compiles ``forward``): was refused; the
    training runs compiled, the hyper steps eagerly (BilevelModule: test_silent_wrong_lightning)."""
    torch._dynamo.reset()
    counters.clear()
    pl.seed_everything(0, verbose=False)
    if drop_in == "weight_decay":
        model: Any = ForwardCNN()
        cb: Any = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        loaders, epochs = image_loaders(), 3
    else:
        model = ForwardClassifier()
        cb = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
        loaders, epochs = (loader(), val_loader()), 15
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="aot_eager")
        _trainer([cb], max_epochs=epochs).fit(compiled, *loaders)
    assert counters["stats"]["unique_graphs"] > 0
    assert_learned(drop_in, cb, model)


class FusedAdamCNN(SmallCNN):
    """The CNN trained by ``Adam(fused=True)``, which unscales a GradScaler's gradients inside
    its own step."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2, fused=self.fused)


def _weight_norm(fused: bool, lam: float | None) -> float:
    pl.seed_everything(0, verbose=False)
    model = FusedAdamCNN(fused)
    callbacks: list[Any] = []
    if lam is not None:  # λ held (no hyper step): only the decay the training applies counts
        callbacks.append(LearnedWeightDecay(lam, every_n_steps=10**6, start_step=10**6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(callbacks, max_epochs=3, plugins=[fp16_with_scaler()])
        trainer.fit(model, *image_loaders())
    weights = [p.detach() for name, p in model.named_parameters() if "weight" in name]
    return float(sum((w**2).sum() for w in weights)) ** 0.5


def test_a_fused_optimizer_under_a_grad_scaler_gets_the_whole_decay() -> None:
    """float16 mixed precision's GradScaler with ``Adam(fused=True)``: the gradients the decay is
    added to are still scaled (the optimizer unscales them in its step). λ w was added
    unscaled, so divided by the scale (65536): the weights ended as without decay (‖w‖ 3.541
    against 3.103 with the unfused Adam) — silently, and the hyper steps assumed the decay."""
    plain, fused = _weight_norm(False, 0.05), _weight_norm(True, 0.05)
    assert fused == pytest.approx(plain, rel=2e-3)
    assert fused < _weight_norm(True, None) - 0.2


@pytest.mark.parametrize(
    "callback_kw, trainer_kw",
    [({}, dict(precision="bf16-mixed")), (dict(directional="forward_mode"), {})],
    ids=["bf16_mixed_falls_back_to_forward_mode", "forward_mode"],
)
def test_data_weights_forward_mode_cross_term_through_a_compiled_network(
    callback_kw: dict[str, Any], trainer_kw: dict[str, Any]
) -> None:
    """The training's cross term by a dual-number pass (chosen, or the fallback under autocast)
    runs through the compiled network inside the training step, outside the hyper steps."""
    torch._dynamo.reset()
    counters.clear()
    pl.seed_everything(0, verbose=False)
    model = Classifier()
    model.net = torch.compile(model.net, backend="aot_eager")
    cb = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0, **callback_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([cb], max_epochs=15, **trainer_kw).fit(model, loader(), val_loader())
    assert counters["stats"]["unique_graphs"] > 0
    assert_separates(cb)


class NaNLossCNN(SmallCNN):
    """A CNN whose loss is NaN at every step: float16's GradScaler skips every optimizer step."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return super().training_step(batch, batch_idx) * float("nan")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.1, weight_decay=0.0)


def test_decoupled_decay_skips_with_the_steps_the_grad_scaler_skips() -> None:
    """Decoupled decay shrinks w itself (w ← (1 − lr λ) w), so it must not shrink on a step the
    GradScaler skips (inf/NaN gradients: the optimizer does not step). Every step skipped: the
    weights end exactly as they started (before: shrunk by (1 − 0.1·0.05) per step)."""
    pl.seed_everything(0, verbose=False)
    model = NaNLossCNN()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cb = LearnedWeightDecay(0.05, decoupled=True, every_n_steps=100, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer([cb], max_steps=4, plugins=[fp16_with_scaler()]).fit(model, *image_loaders())
    for k, v in model.state_dict().items():
        if v.is_floating_point() and "running" not in k:
            assert torch.equal(v, start[k]), k
