"""Never a silent wrong answer (issue 29), Lightning half: one test per family of the issue.

Small real trainings (the ridge BilevelModule and ordinary modules of ``lightning_problems``):

3. inputs that contradict each other: a ``training_step`` that drops λ while ``inner_loss``
   keeps it; two weight-decay callbacks on one Trainer;
5. λ past what the training optimizer can take: the cap counts the data's curvature;
6. resume claims: a shuffling train loader resumed from an end-of-epoch checkpoint;
7. messages: a ``validation_loss`` returning a float, a compiled module (fitted), NaN training
   features, an unused layer under ``apply_to="weights"``, NaN validation labels distorting the
   damping.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import lightning_problems as lp
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import LIGHTNING_NOISE, D, Ridge, RidgeData, ridge_data
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    DivergenceError,
    HyperOptimizationCallback,
    LearnedWeightDecay,
)

pytestmark = [
    *LIGHTNING_NOISE,
    pytest.mark.filterwarnings("ignore:.*hyper steps.*barely move.*"),
]

f64 = torch.float64


def _trainer(callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    return lp.trainer(callbacks, **{"limit_val_batches": 0, **kwargs})


class Plain(pl.LightningModule):
    """An ordinary linear regression module for the drop-in (no bias)."""

    def __init__(self, lr: float = 0.1, extra: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, 1, bias=False, dtype=f64)
        torch.nn.init.zeros_(self.lin.weight)
        if extra:  # a layer the training never uses
            self.unused = torch.nn.Linear(D, 3, dtype=f64)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return 0.5 * ((self.lin(x).squeeze(-1) - y) ** 2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


# ====================================================================== 3. contradictions


class DropsLambda(Ridge):
    """training_step trains without the penalty that inner_loss (what SID differentiates) has."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._fit(batch)


def test_training_step_that_ignores_lambda_is_refused():
    model = DropsLambda()
    before = model.log_lam.detach().clone()
    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with pytest.raises(ConfigurationError, match="training_step"):
        _trainer([cb], max_steps=6).fit(model, datamodule=RidgeData())
    assert torch.equal(model.log_lam.detach(), before)


def test_two_weight_decay_callbacks_are_refused():
    class Again(LearnedWeightDecay):  # Lightning refuses two of one type (for their state)
        pass

    callbacks = [LearnedWeightDecay(1e-3), Again(1e-3)]
    with pytest.raises(ConfigurationError, match="2 LearnedWeightDecay"):
        _trainer(callbacks, max_steps=4).fit(Plain(), datamodule=RidgeData())


# ====================================================================== 5. λ past stability


def _fit_with_data_curvature(curvature: float) -> tuple[float, float]:
    """SGD at lr 0.1 (stability limit 2/lr = 20) on ridge data whose curvature is ``curvature``;
    the validation set (targets 0) pushes λ up. Returns (learned λ, ‖w‖) after 8 epochs."""
    X, y, Xv, _ = ridge_data(n=120, n_val=60)
    X = X / torch.linalg.eigvalsh(X.T @ X / len(X)).max().sqrt() * math.sqrt(curvature)
    train = DataLoader(TensorDataset(X, y), batch_size=20)
    val = DataLoader(TensorDataset(Xv, torch.zeros(len(Xv), dtype=f64)), batch_size=30)
    model = Plain(lr=0.1)
    cb = LearnedWeightDecay(
        1.0, granularity="global", every_n_steps=2, adjoint_steps=5,
        outer_optimizer=functools.partial(torch.optim.Adam, lr=1.0),
        max_overhead=None,
    )  # fmt: skip
    _trainer([cb], max_epochs=8).fit(model, train, val)
    return float(cb.decay_values()["lin.weight"]), float(model.lin.weight.norm())


def test_decay_cap_counts_the_data_curvature():
    """Data curvature 12: SGD is stable for λ < 2/lr − 12 = 8, but λ rose to the old cap 10 and
    the weights grew (at curvature 15: from 6 to 2.6e6)."""
    lam, w_norm = _fit_with_data_curvature(12.0)
    assert lam < 8.0, lam
    assert w_norm < 10.0


def test_decay_cap_when_the_estimate_reaches_the_stability_limit():
    """Data curvature 18 (room 2 below the limit 20): the minibatch estimate overshoots the limit
    (L̂ ≈ 26 ≥ 20), which left the plain cap 1/lr = 10 in force: λ rose and the weights grew to
    1.3e6 with no warning. Now λ stays inside the room, and the user is told."""
    with pytest.warns(UserWarning, match="stability limit"):
        lam, w_norm = _fit_with_data_curvature(18.0)
    assert lam < 2.0, lam  # 2/lr − 18: the true room
    assert w_norm < 10.0


# ====================================================================== 6. resume


class Shuffled(RidgeData):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.X, self.y), batch_size=self.batch_size, shuffle=True)


def _fit_shuffled(tmp_path, stop: int | None) -> Tensor:
    pl.seed_everything(7, verbose=False)
    model = Ridge()
    cb = HyperOptimizationCallback(every_n_steps=3, adjoint_steps=5)
    ckpt = None
    if stop is not None:
        first = _trainer([cb], max_epochs=stop)
        first.fit(model, datamodule=Shuffled())
        ckpt = tmp_path / "stop.ckpt"
        first.save_checkpoint(ckpt)
        pl.seed_everything(123, verbose=False)  # a fresh process: another global RNG state
        model = Ridge()
        cb = HyperOptimizationCallback(every_n_steps=3, adjoint_steps=5)
    _trainer([cb], max_epochs=4).fit(model, datamodule=Shuffled(), ckpt_path=ckpt)
    return model.log_lam.detach().clone()


def test_resume_with_a_shuffling_loader_reproduces_the_trajectory(tmp_path):
    straight = _fit_shuffled(tmp_path, None)
    resumed = _fit_shuffled(tmp_path, 2)
    torch.testing.assert_close(resumed, straight, rtol=1e-12, atol=0)


# ====================================================================== 7. messages


def test_validation_loss_returning_a_float_names_validation_loss():
    cb = LearnedWeightDecay(
        1e-3, every_n_steps=2, validation_loss=lambda m, b: 1.0, max_overhead=None
    )
    with pytest.raises(ConfigurationError, match="validation_loss"):
        _trainer([cb], max_steps=4).fit(Plain(), datamodule=RidgeData())


def test_compiled_module_is_fitted():
    """Refused until session 42; the hyper steps now run compiled code eagerly (compiled graphs
    have no double backward; tests/test_gpu_user_recipes.py checks the drop-ins)."""
    model = Ridge()
    compiled = torch.compile(model, backend="aot_eager")
    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    _trainer([cb], max_steps=4).fit(compiled, datamodule=RidgeData())
    assert len(cb.history) == 2 and bool(torch.isfinite(model.log_lam).all())
    assert bool((model.log_lam != math.log(0.1)).any())


def test_nan_in_training_features_is_named():
    X, y, Xv, yv = ridge_data()
    X[7, 2] = math.nan
    train = DataLoader(TensorDataset(X, y), batch_size=20)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=30)
    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with pytest.raises((DivergenceError, ConfigurationError), match="training data") as err:
        _trainer([cb], max_steps=12).fit(Ridge(), train, val)
    assert "lower its learning rate" not in str(err.value)


def test_unused_layer_under_apply_to_weights_is_named():
    cb = LearnedWeightDecay(1e-3, apply_to="weights", every_n_steps=2, adjoint_steps=3)
    with pytest.raises(ConfigurationError, match=r"unused\.weight") as err:
        _trainer([cb], max_steps=4).fit(Plain(extra=True), datamodule=RidgeData())
    assert "inner_parameters" not in str(err.value)  # no such argument in the drop-in


def test_nan_validation_labels_leave_the_damping_alone():
    """Skipped steps warned, but the damping ratcheted from 0 to 1130 on a convex model."""
    X, y, Xv, yv = ridge_data()
    yv[3] = math.nan
    train = DataLoader(TensorDataset(X, y), batch_size=20)
    val = DataLoader(TensorDataset(Xv, yv), batch_size=60)
    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5, val="full")
    with pytest.warns(UserWarning, match="skipped"):
        _trainer([cb], max_steps=12).fit(Ridge(), train, val)
    assert cb.sid.delta == 0.0
