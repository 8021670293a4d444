"""The callbacks under the unified ``lightning`` package (``import lightning as L``), whose
``lightning.pytorch`` holds its own copy of every Lightning class.

Before session 50 the data weights crashed under ``lightning.Trainer`` ("Expected a parent",
from ``pytorch_lightning``'s ``is_overridden`` given a ``lightning.pytorch`` module), a
``max_time`` limit, weight averaging and the rich progress bar went unrecognised (silently: the
budget ignored the time limit, the averaging callbacks averaged λ), and a ``BilevelModule`` could
not be trained at all (``lightning.Trainer`` refuses a ``pytorch_lightning`` module). Each test
fits the same problem under both Trainers and asserts the same numbers, to the bit.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import TOY_C, TOY_D, TOY_X, TOY_Y
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    BilevelModule,
    HyperOptimizationCallback,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.lightning.training_length import _steps_left_in_time

L = pytest.importorskip("lightning.pytorch")
from hypertorch_sid.lightning.unified import BilevelModule as UnifiedBilevelModule  # noqa: E402

NAMESPACES = {"pytorch_lightning": pl, "lightning.pytorch": L}


def _trainer(ns: Any, callbacks: list, **kwargs: Any) -> Any:
    kwargs = {"max_epochs": 3, "logger": False, "enable_checkpointing": False, **kwargs}
    return ns.Trainer(
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def _classifier(ns: Any, reduction: str) -> Any:
    class Classifier(ns.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(TOY_D, 16), torch.nn.Tanh(), torch.nn.Linear(16, TOY_C)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1], reduction=reduction)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier()


def _toy_loaders(indexed: bool) -> tuple[DataLoader, DataLoader]:
    train = TensorDataset(TOY_X[:160], TOY_Y[:160])
    generator = torch.Generator().manual_seed(0)
    return (
        DataLoader(IndexedDataset(train) if indexed else train, 16, True, generator=generator),
        DataLoader(TensorDataset(TOY_X[160:], TOY_Y[160:]), batch_size=40),
    )


def _fit_drop_in(ns: Any, drop_in: str) -> tuple[Tensor, Tensor]:
    if drop_in == "decay":
        callback: Any = LearnedWeightDecay(1e-3, every_n_steps=3, start_step=3, max_overhead=None)
    else:
        callback = LearnedDataWeights(every_n_steps=5, start_step=5)
    module = _classifier(ns, "none" if drop_in == "data_weights" else "mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(ns, [callback]).fit(module, *_toy_loaders(drop_in == "data_weights"))
    if drop_in == "decay":
        learned = torch.stack(list(callback.decay_values().values()))
    else:
        learned = callback.data_weights()
    weights = torch.cat([p.detach().flatten() for p in module.parameters()])
    return learned, weights


@pytest.mark.parametrize("drop_in", ["decay", "data_weights"])
def test_the_drop_ins_learn_the_same_under_either_trainer(drop_in: str) -> None:
    learned, weights = _fit_drop_in(pl, drop_in)
    learned_L, weights_L = _fit_drop_in(L, drop_in)
    moved = learned != 1e-3 if drop_in == "decay" else learned != learned[0]
    assert bool(moved.any())  # the hyperparameters moved: the comparison is not vacuous
    torch.testing.assert_close(learned_L, learned, rtol=0, atol=0)
    torch.testing.assert_close(weights_L, weights, rtol=0, atol=0)


class _RidgeBody:
    """ℓ̂ = ½ mean (Xw − y)² + ½ Σ exp(log_lam) ⊙ w², E = ½ mean (X_val w − y_val)², for either
    namespace's BilevelModule."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 1, bias=False)
        self.register_hyperparameter("log_lam", torch.zeros(8))

    def _fit(self, batch: Any) -> Tensor:
        return 0.5 * ((self.lin(batch[0]).squeeze(-1) - batch[1]) ** 2).mean()

    def inner_loss(self, batch: Any) -> Tensor:
        return self._fit(batch) + 0.5 * (self.log_lam.exp() * self.lin.weight[0] ** 2).sum()

    def outer_loss(self, batch: Any) -> Tensor:
        return self._fit(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


class PytorchLightningRidge(_RidgeBody, BilevelModule):
    pass


class UnifiedRidge(_RidgeBody, UnifiedBilevelModule):
    pass


RIDGES = {"pytorch_lightning": PytorchLightningRidge, "lightning.pytorch": UnifiedRidge}


def _ridge_loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(300, 8, generator=g), torch.randn(300, generator=g)
    train = DataLoader(TensorDataset(X[:200], y[:200]), 32, True, generator=g)
    return train, DataLoader(TensorDataset(X[200:], y[200:]), batch_size=100)


def _fit_ridge(name: str, callbacks: list, **kwargs: Any) -> Any:
    module = RIDGES[name]()
    callbacks = [HyperOptimizationCallback(every_n_steps=3, adjoint_steps=10), *callbacks]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(NAMESPACES[name], callbacks, **kwargs).fit(module, *_ridge_loaders())
    return module


def test_the_unified_bilevel_module_learns_what_the_pytorch_lightning_one_does() -> None:
    assert isinstance(UnifiedRidge(), L.LightningModule)
    lam = _fit_ridge("pytorch_lightning", []).log_lam.detach()
    lam_L = _fit_ridge("lightning.pytorch", []).log_lam.detach()
    assert lam.std() > 0
    torch.testing.assert_close(lam_L, lam, rtol=0, atol=0)


def test_a_lightning_fit_resumed_from_its_checkpoint_repeats_the_uninterrupted_one(
    tmp_path: Any,
) -> None:
    whole = _fit_ridge("lightning.pytorch", [])
    checkpoint = L.callbacks.ModelCheckpoint(tmp_path, save_top_k=-1, every_n_epochs=1)
    _fit_ridge("lightning.pytorch", [checkpoint], max_epochs=1, enable_checkpointing=True)
    resumed = UnifiedRidge()
    callbacks = [HyperOptimizationCallback(every_n_steps=3, adjoint_steps=10)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(L, callbacks)
        trainer.fit(resumed, *_ridge_loaders(), ckpt_path=next(tmp_path.glob("*.ckpt")))
    torch.testing.assert_close(resumed.log_lam.detach(), whole.log_lam.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(NAMESPACES))
def test_checkpoints_written_while_averaging_hold_the_learned_lambda(
    name: str, tmp_path: Any
) -> None:
    """An averaging callback of the fit's own namespace writes its average into checkpoints;
    λ there must be the learned one, not its average (as for pytorch_lightning since session
    43: tests/test_trainer_settings.py)."""
    ns = NAMESPACES[name]

    class LambdaSeen(ns.Callback):
        def __init__(self) -> None:
            self.lam: dict[int, Tensor] = {}

        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            self.lam[trainer.global_step] = module.log_lam.detach().clone()

    seen = LambdaSeen()
    ema = ns.callbacks.EMAWeightAveraging(decay=0.9)
    checkpoint = ns.callbacks.ModelCheckpoint(tmp_path, every_n_train_steps=7, save_top_k=-1)
    _fit_ridge(name, [ema, seen, checkpoint], enable_checkpointing=True)
    files = sorted(tmp_path.glob("*.ckpt"))
    assert len(files) == 3
    for file in files:
        saved = torch.load(file, weights_only=False)
        learned = seen.lam[saved["global_step"]]
        assert bool((learned != 0).all())  # λ has moved: its average would differ
        torch.testing.assert_close(saved["state_dict"]["log_lam"], learned, rtol=0, atol=0)


def test_a_lightning_max_time_limit_is_seen_by_the_budget() -> None:
    trainer = _trainer(L, [], max_time={"minutes": 5})
    timer = next(c for c in trainer.callbacks if type(c).__name__ == "Timer")
    timer.on_train_start(trainer, None)
    time.sleep(0.01)
    left = _steps_left_in_time(trainer, 10)
    assert left is not None and left > 10_000  # 5 minutes left after 10 ms for 10 steps


def test_the_lightning_rich_progress_bar_shows_a_small_lambda_not_0_000() -> None:
    pytest.importorskip("rich")
    bar = L.callbacks.RichProgressBar()
    trainer = L.Trainer(callbacks=[bar, LearnedWeightDecay()], logger=False)
    module = L.LightningModule()
    module.layer = torch.nn.Linear(2, 1)
    next(c for c in trainer.callbacks if isinstance(c, LearnedWeightDecay)).setup(
        trainer, module, "fit"
    )
    assert bar.theme.metrics_format == ".3g"


def test_lightning_cli_of_the_unified_package_configures_the_drop_ins(monkeypatch: Any) -> None:
    """``lightning.pytorch.cli.LightningCLI`` accepts subclasses of its own ``Callback`` only
    ("does not correspond to a subclass of Callback" before session 50)."""
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return _toy_loaders(False)[0]

        def val_dataloader(self) -> DataLoader:
            return _toy_loaders(False)[1]

    class Classifier(type(_classifier(L, "mean"))):  # LightningCLI needs a class
        pass

    decay = {"weight_decay": 1e-3, "every_n_steps": 3, "start_step": 3, "max_overhead": None}
    callbacks = [
        {"class_path": "hypertorch_sid.LearnedWeightDecay", "init_args": decay},
        {"class_path": "hypertorch_sid.LearnedDataWeights", "init_args": {"start_step": 5}},
    ]
    trainer = {"max_epochs": 3, "logger": False, "enable_checkpointing": False}
    monkeypatch.setattr("sys.argv", ["train.py"])
    cli = LightningCLI(
        Classifier,
        Data,
        args={"trainer": {**trainer, "callbacks": callbacks}},
        run=False,
        save_config_callback=None,
    )
    configured = [c for c in cli.trainer.callbacks if isinstance(c, HyperOptimizationCallback)]
    assert [type(c) for c in configured] == [LearnedWeightDecay, LearnedDataWeights]
    assert all(isinstance(c, (L.Callback, pl.Callback)) for c in configured)
    assert (configured[0].initial_weight_decay, configured[1].start_step) == (1e-3, 5)


def _settings(callback: Any) -> dict[str, str]:
    """What a callback was built with, comparable between two instances (addresses dropped)."""
    import re

    def plain(value: Any) -> str:
        if hasattr(value, "__dict__") and not callable(value):
            value = {k: plain(v) for k, v in vars(value).items() if not k.startswith("_")}
        return re.sub(r" at 0x[0-9a-f]+", "", repr(value))

    return {k: plain(v) for k, v in vars(callback).items() if not k.startswith("_")}


CLI_CASES = [
    ("LearnedWeightDecay", {}),
    ("LearnedWeightDecay", {"granularity": "per_element"}),
    ("LearnedWeightDecay", {"max_overhead": None, "outer_lr": 0.1}),
    ("LearnedWeightDecay", {"preset": "stoch_dec"}),
    ("LearnedDataWeights", {}),
    ("LearnedDataWeights", {"per": "class", "num_classes": 3}),
    ("LearnedDataWeights", {"max_overhead": 0.5}),
    ("HyperOptimizationCallback", {}),
]


@pytest.mark.parametrize("name", list(NAMESPACES))
@pytest.mark.parametrize(("drop_in", "init_args"), CLI_CASES)
def test_lightning_cli_builds_the_callback_its_python_call_builds(
    name: str, drop_in: str, init_args: dict, monkeypatch: Any
) -> None:
    """A ``LightningCLI`` passes every parameter's default explicitly, the parent's for the
    ``**kwargs`` a drop-in forwards: before session 50 ``LearnedWeightDecay`` from a CLI config
    ran the plain callback's defaults (a hyper step every 10 steps, no budget, no adjoint steps
    set, Adam at 0.01 instead of TrustRprop at 0.3) and ``LearnedDataWeights`` failed."""
    pytest.importorskip("jsonargparse")
    import importlib

    import hypertorch_sid

    cli_module = importlib.import_module(f"{name}.cli")
    ns = NAMESPACES[name]

    class Classifier(type(_classifier(ns, "mean"))):
        pass

    callbacks = [{"class_path": f"hypertorch_sid.{drop_in}", "init_args": init_args}]
    monkeypatch.setattr("sys.argv", ["train.py"])
    cli = cli_module.LightningCLI(
        Classifier,
        args={"trainer": {"logger": False, "callbacks": callbacks}},
        run=False,
        save_config_callback=None,
    )
    (built,) = [c for c in cli.trainer.callbacks if isinstance(c, HyperOptimizationCallback)]
    assert _settings(built) == _settings(getattr(hypertorch_sid, drop_in)(**init_args))
