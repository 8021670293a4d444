"""Bad input to the Lightning layer (issue 5), beyond what test_lightning.py already covers.

Each case gets a clear :class:`ConfigurationError` (or :class:`DivergenceError`) before λ or w
change, or a documented guarantee (BatchNorm statistics, module modes and the training's random
stream untouched by hyper steps) checked directly around every hyper step.
"""

from __future__ import annotations

import math
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import LIGHTNING_NOISE, f64, loaders, ridge_data
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hypertorch_sid import (
    BackOff,
    Batches,
    BilevelModule,
    ConfigurationError,
    DivergenceError,
    EstimatedCurvature,
    HyperOptimizationCallback,
    LearnedWeightDecay,
)
from hypertorch_sid.lightning.callback import CALLBACK_CONFIG

pytestmark = [*LIGHTNING_NOISE]

D = 4


def _tensors(n: int = 48, n_val: int = 24, nan_in_val: bool = False) -> tuple[Tensor, ...]:
    X, y, Xv, yv = ridge_data(n, n_val, d=D, seed=0, noise=0.3)
    if nan_in_val:
        Xv[3, 1] = math.nan
    return X, y, Xv, yv


def _loaders(batch_size: int = 12, **kwargs: Any) -> tuple[DataLoader, DataLoader]:
    return loaders(_tensors(**kwargs), batch_size)


class Ridge(lightning_problems.Ridge):
    """The shared ridge problem on D features from w = 0.1, log_lam = −1; λ may get another
    dtype than w."""

    def __init__(self, lam_dtype: torch.dtype = f64) -> None:
        super().__init__(d=D, log_lam=-1.0, w0=0.1, lam_dtype=lam_dtype)


class Plain(pl.LightningModule):
    """An ordinary module (for LearnedWeightDecay)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, 1, dtype=f64)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.lin(x).squeeze(-1) - y) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    return lightning_problems.trainer(
        callbacks, **{"max_steps": 6, "limit_val_batches": 0, **kwargs}
    )


def _snapshot(model: pl.LightningModule) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model: pl.LightningModule, before: dict[str, Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# ====================================================================== t, k and friends < 1
NEGATIVE = [
    (dict(every_n_steps=-1), "every_n_steps"),
    (dict(adjoint_steps=-3), "adjoint_steps"),
    (dict(start_step=-1), "start_step"),
    (lambda: dict(curvature=EstimatedCurvature(every=-2)), "every"),
    (dict(val_batch_size=-5), "val_batch_size"),
    (lambda: dict(curvature=EstimatedCurvature(iters=0)), "iters"),
    (lambda: dict(config=CALLBACK_CONFIG.replace(on_divergence=BackOff(-1))), "retries"),
]


@pytest.mark.parametrize("kwargs, match", NEGATIVE)
@pytest.mark.parametrize("callback", [HyperOptimizationCallback, LearnedWeightDecay])
def test_negative_step_counts_are_refused(callback, kwargs, match):
    with pytest.raises(ConfigurationError, match=rf"{match} must be an integer ≥"):
        callback(**(kwargs() if callable(kwargs) else kwargs))  # a bad strategy refuses itself


def test_learned_weight_decay_refuses_zero_adjoint_steps():
    with pytest.raises(ConfigurationError, match="adjoint_steps must be an integer ≥ 1"):
        LearnedWeightDecay(0.01, adjoint_steps=0)


# ====================================================================== data
def test_learned_weight_decay_without_validation_data():
    train, _ = _loaders()
    model = Plain()
    before = _snapshot(model)
    with pytest.raises(ConfigurationError, match="needs validation data"):
        _trainer([LearnedWeightDecay(0.01, every_n_steps=1)]).fit(model, train)
    assert _unchanged(model, before)  # refused at on_train_start, before any training step


class Bag(Plain):
    """A bag of feature ids (the features' signs) through an embedding layer."""

    def __init__(self, layer: str) -> None:
        super().__init__()
        n, dim = 2 * D, 1
        self.emb = {
            "bag": lambda: torch.nn.EmbeddingBag(n, dim, mode="sum", dtype=f64),
            "sparse": lambda: torch.nn.Embedding(n, dim, sparse=True, dtype=f64),
            "dense": lambda: torch.nn.Embedding(n, dim, dtype=f64),
        }[layer]()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        ids = torch.arange(D) * 2 + (x > 0).long()  # (batch, D)
        bag = self.emb(ids).squeeze(-1) if isinstance(self.emb, torch.nn.EmbeddingBag) else (
            self.emb(ids).sum(1).squeeze(-1))  # fmt: skip
        return 0.5 * ((self.lin(x).squeeze(-1) + bag - y) ** 2).mean()


@pytest.mark.parametrize(
    "layer, match",
    [
        ("bag", r"emb \(EmbeddingBag\): torch has no second derivative.*nn.Embedding followed by"),
        ("sparse", r"emb \(Embedding\(sparse=True\)\) gets sparse gradients.*sparse=False"),
    ],
)
def test_embeddings_without_second_derivatives_are_refused_by_name(layer, match):
    train, val = _loaders()
    model = Bag(layer)
    before = _snapshot(model)
    with pytest.raises(ConfigurationError, match=match):
        _trainer([LearnedWeightDecay(0.01, every_n_steps=2, max_overhead=None)]).fit(
            model, train, val
        )
    assert _unchanged(model, before)  # refused before any training step
    cb = LearnedWeightDecay(0.01, every_n_steps=2, max_overhead=None)  # the fix the messages name
    _trainer([cb]).fit(Bag("dense"), train, val)
    assert "emb.weight" in cb.decay_values() and cb.history


class Stream(IterableDataset):
    def __init__(self, X: Tensor, y: Tensor) -> None:
        self.X, self.y = X, y

    def __iter__(self):
        return iter(zip(self.X, self.y))


def test_training_data_without_random_access_is_read_through_the_loader():
    """A stream is accepted (read by iterating the loader); what needs the data set's size or
    random access is refused with what to do, before any training step."""
    X, y, Xv, yv = _tensors()
    train = DataLoader(Stream(X, y), batch_size=12)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=12)
    cb = HyperOptimizationCallback(every_n_steps=2)
    _trainer([cb]).fit(Ridge(), train, val)
    assert cb.history and all(math.isfinite(h["hyper/hypergradient_norm"]) for h in cb.history)
    for settings, match in [
        (dict(preset="batch"), "preset='batch' sizes its solves by the training set's size"),
        (dict(batches=Batches(d2="full")), "whole training set at once"),
    ]:
        model = Ridge()
        before = _snapshot(model)
        with pytest.raises(ConfigurationError, match=match):
            _trainer([HyperOptimizationCallback(every_n_steps=2, **settings)]).fit(
                model, train, val
            )
        assert _unchanged(model, before)


def test_several_train_loaders_in_one_batch_are_refused_with_what_to_do():
    train, val = _loaders()

    class TwoLoaders(Ridge):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return super().training_step(batch["a"], batch_idx)

    with pytest.raises(ConfigurationError, match=r"got dict. Several loaders.*ConcatDataset"):
        _trainer([HyperOptimizationCallback(every_n_steps=2)]).fit(
            TwoLoaders(), {"a": train, "b": train}, val
        )


def test_validation_loader_without_automatic_batching_cannot_be_read_whole_or_rebatched():
    X, y, Xv, yv = _tensors()
    train = DataLoader(TensorDataset(X, y), batch_size=12)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=None)  # its dataset yields the batches
    for settings, match in [
        (dict(val="full"), "val='full' reads the whole validation set by index"),
        (
            dict(val_batch_size=6),
            "yields whole batches.*cannot re-batch it to val_batch_size=6: drop val_batch_size=",
        ),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            _trainer([HyperOptimizationCallback(every_n_steps=2, **settings)]).fit(
                Ridge(), train, val
            )


def test_validation_batch_larger_than_the_validation_set_is_refused():
    train, val = _loaders()
    cb = HyperOptimizationCallback(every_n_steps=2, val_batch_size=25)  # 24 validation points
    with pytest.raises(ConfigurationError, match="larger than the data set"):
        _trainer([cb]).fit(Ridge(), train, val)


def test_loader_batch_larger_than_its_data_set_reads_the_whole_set():
    """A DataLoader's ``batch_size`` above its data set's size yields the whole set as one batch
    (a common ``batch_size=1000`` for evaluation over 500 samples): the samplers do as it does —
    it was refused as "larger than the data set" — and the hyper steps read every sample."""
    X, y, Xv, yv = _tensors(120, 60)
    train = DataLoader(TensorDataset(X, y), batch_size=500)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=1000)
    cb = HyperOptimizationCallback(every_n_steps=1, adjoint_steps=2, max_overhead=None)
    _trainer([cb], max_epochs=3).fit(Ridge(), train, val)
    assert cb.sid is not None and cb.sid.hyper_step == 3
    assert cb.history[-1]["hyper/val_samples"] == 3 * 60
    assert cb.history[-1]["hyper/train_samples"] % 120 == 0


@pytest.mark.parametrize("on_divergence", ["raise", "skip"])
def test_nan_in_validation_data_never_reaches_lambda(on_divergence):
    train, val = _loaders(nan_in_val=True)
    cb = HyperOptimizationCallback(
        every_n_steps=2, adjoint_steps=3, val="full", on_divergence=on_divergence
    )
    model = Ridge()
    lam = model.log_lam.detach().clone()
    if on_divergence == "raise":
        with pytest.raises(DivergenceError, match="outer gradient"):
            _trainer([cb]).fit(model, train, val)
    else:
        with pytest.warns(UserWarning, match="skipped, λ unchanged"):
            _trainer([cb]).fit(model, train, val)
        assert cb.history == []
    assert torch.equal(model.log_lam.detach(), lam)
    assert cb.sid.outer_optimizer.state_dict()["state"] == {}  # Adam's moments untouched


# ====================================================================== λ and the optimizers
def test_hyperparameter_of_another_dtype_than_the_model():
    train, val = _loaders()
    model = Ridge(lam_dtype=torch.float32)  # w is float64
    before = _snapshot(model)
    with pytest.raises(ConfigurationError, match=r"different dtypes.*use one dtype"):
        _trainer([HyperOptimizationCallback(every_n_steps=2)]).fit(model, train, val)
    assert _unchanged(model, before)
    assert model.log_lam.requires_grad  # given back after the failed fit


def test_outer_optimizer_factory_that_also_takes_the_weights():
    train, val = _loaders()
    model = Ridge()

    def greedy(params):  # a user mistake: the outer optimizer over λ *and* w
        return torch.optim.SGD(list(params) + list(model.lin.parameters()), lr=0.1)

    before = _snapshot(model)
    with pytest.raises(ConfigurationError, match="outer_optimizer holds inner parameters"):
        _trainer([HyperOptimizationCallback(every_n_steps=2, outer_optimizer=greedy)]).fit(
            model, train, val
        )
    assert _unchanged(model, before)


def test_lambda_in_a_second_parameter_group_of_the_training_optimizer():
    class TwoGroups(Ridge):
        def configure_optimizers(self):
            return torch.optim.SGD(
                [{"params": list(self.inner_parameters())}, {"params": [self.log_lam], "lr": 0.01}],
                lr=0.1,
            )

    train, val = _loaders()
    model = TwoGroups()
    before = _snapshot(model)
    with pytest.raises(ConfigurationError, match="also in the training optimizer"):
        _trainer([HyperOptimizationCallback(every_n_steps=2)]).fit(model, train, val)
    assert _unchanged(model, before)


# ====================================================================== BatchNorm and dropout
class BNDropout(BilevelModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, 8, dtype=f64),
            torch.nn.BatchNorm1d(8, dtype=f64),
            torch.nn.Tanh(),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(8, 1, dtype=f64),
        )
        self.register_hyperparameter("log_lam", torch.tensor(-2.0, dtype=f64))
        #: set by the Spy during hyper steps: (loss, BatchNorm.training, Dropout.training)
        self.probe: list[tuple[str, bool, bool]] | None = None

    def _fit(self, batch: Any, which: str) -> Tensor:
        if self.probe is not None:
            self.probe.append((which, self.net[1].training, self.net[3].training))
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def inner_loss(self, batch: Any) -> Tensor:
        penalty = sum(p.pow(2).sum() for p in self.inner_parameters())
        return self._fit(batch, "inner") + 0.5 * self.log_lam.exp() * penalty

    def outer_loss(self, batch: Any) -> Tensor:
        return self._fit(batch, "outer")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.05)


class Spy(HyperOptimizationCallback):
    """Around every hyper step: buffers, module modes, the global RNG and λ, before and after;
    inside it: the modes every ℓ̂ and E evaluation ran in (the module's probe)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.around: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
        self.inside: list[tuple[str, bool, bool]] = []

    @staticmethod
    def _state(pl_module: pl.LightningModule) -> tuple[Any, ...]:
        return (
            {k: b.clone() for k, b in pl_module.named_buffers()},
            [m.training for m in pl_module.modules()],
            torch.get_rng_state(),
            pl_module.log_lam.detach().clone(),
        )

    def _hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        before = self._state(pl_module)
        pl_module.probe = self.inside
        try:
            super()._hyper_step(trainer, pl_module)
        finally:
            pl_module.probe = None
        self.around.append((before, self._state(pl_module)))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_hyper_steps_keep_batchnorm_statistics_modes_and_training_rng(mode):
    """With λ moving (outer lr 0.05): every hyper step leaves the BatchNorm running statistics
    and batch counter, every module's train/eval flag and the global RNG (the training's dropout
    stream) exactly as they were; its Jacobian products all run in ``mode``."""
    train, val = _loaders()
    cb = Spy(every_n_steps=2, adjoint_steps=4, batches=Batches(d2=2), outer_lr=0.05, mode=mode)
    pl.seed_everything(3, verbose=False)
    _trainer([cb], max_steps=8).fit(BNDropout(), train, val)
    assert len(cb.around) == 4
    for (buffers, modes, rng, lam), (buffers2, modes2, rng2, lam2) in cb.around:
        assert buffers.keys() == buffers2.keys() and "net.1.num_batches_tracked" in buffers
        for key in buffers:
            assert torch.equal(buffers[key], buffers2[key]), key
        assert modes == modes2 and all(modes)  # Lightning trains in train mode
        assert torch.equal(rng, rng2)
        assert not torch.equal(lam, lam2)  # the hyper step did move λ
    # every ℓ̂ of the Jacobian products (adjoint, ∂₂Φ̂, curvature estimate) in ``mode``; E, the
    # validation objective, in eval mode (as at test time)
    inner = {(bn, drop) for which, bn, drop in cb.inside if which == "inner"}
    outer = {(bn, drop) for which, bn, drop in cb.inside if which == "outer"}
    assert inner == {(mode == "train", mode == "train")}
    assert outer == {(False, False)}
    assert sum(which == "inner" for which, _, _ in cb.inside) >= 4 * (4 + 2)  # k + J per step
