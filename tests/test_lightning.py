"""The Lightning layer: BilevelModule, HyperOptimizationCallback (single process, CPU).

Oracles: the core SIDHyperOptimizer replayed by hand on the same batches, the closed-form ridge
hypergradient, an uninterrupted run (for checkpoint resume), a run without the callback (for
"the callback leaves training alone").
"""

from __future__ import annotations

import csv
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
    Batches,
    BilevelModule,
    ConfigurationError,
    EstimatedCurvature,
    FixedDamping,
    HyperOptimizationCallback,
    Recover,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.lightning import CALLBACK_CONFIG

pytestmark = [*LIGHTNING_NOISE]


class Recording(HyperOptimizationCallback):
    """Records (w, λ) right before each hyper step and the hypergradient it computes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.before: list[tuple[list[Tensor], list[Tensor]]] = []
        self.hypergradients: list[list[Tensor]] = []

    def _hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        w = [p.detach().clone() for p in pl_module.inner_parameters()]
        lam = [h.detach().clone() for h in pl_module.hyperparameters()]
        self.before.append((w, lam))
        super()._hyper_step(trainer, pl_module)
        self.hypergradients.append([g.clone() for g in self.last_hypergradient])


def _sampled_batches(X: Tensor, y: Tensor, batch_size: int, seed: int):
    """The callback's documented sampler, re-implemented: permutations of a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(len(X), generator=gen)
        for start in range(0, len(X) - batch_size + 1, batch_size):
            idx = perm[start : start + batch_size]
            yield [X[idx], y[idx]]


# ------------------------------------------------------------------------------ BilevelModule
def test_hyperparameters_are_kept_apart_but_checkpointed():
    model = Ridge()
    hyper = list(model.hyperparameters())
    inner = list(model.inner_parameters())
    assert [n for n, _ in model.named_hyperparameters()] == ["log_lam"]
    assert hyper[0] is model.log_lam
    assert {id(p) for p in inner} == {id(model.lin.weight)}
    assert "log_lam" in model.state_dict()
    model.double()
    assert model.log_lam.dtype == torch.float64 and next(model.hyperparameters()) is model.log_lam


def test_register_hyperparameter_errors():
    class Early(BilevelModule):
        def __init__(self):
            self.register_hyperparameter("lam", 1.0)

    with pytest.raises(ConfigurationError, match="super"):
        Early()
    model = Ridge()
    with pytest.raises(ConfigurationError, match="already registered"):
        model.register_hyperparameter("log_lam", 0.0)
    with pytest.raises(ConfigurationError, match="floating"):
        model.register_hyperparameter("k", torch.tensor([1, 2]))
    with pytest.raises(ConfigurationError, match="attribute"):
        model.register_hyperparameter("lin", 0.0)
    with pytest.raises(ConfigurationError, match="identifier"):
        model.register_hyperparameter("a b", 0.0)


def test_lambda_in_training_optimizer_raises():
    model = Ridge(optimizer="all-parameters")
    with pytest.raises(ConfigurationError, match="inner_parameters"):
        lp.trainer(max_steps=2).fit(model, datamodule=RidgeData())
    cb = HyperOptimizationCallback()
    with pytest.raises(ConfigurationError, match="inner_parameters"):
        lp.trainer([cb], max_steps=2).fit(model, datamodule=RidgeData())
    assert model.log_lam.requires_grad  # given back after the failed fit


def test_callback_needs_validation_data():
    X, y, _, _ = ridge_data()
    cb = HyperOptimizationCallback(every_n_steps=1)
    with pytest.raises(ConfigurationError, match="validation data"):
        lp.trainer([cb], max_steps=2, limit_val_batches=0).fit(
            Ridge(), DataLoader(TensorDataset(X, y), batch_size=20)
        )


def test_callback_needs_a_bilevel_module():
    class Plain(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(D, 1, dtype=torch.float64)

        def training_step(self, batch, batch_idx):
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigurationError, match="LearnedWeightDecay"):
        lp.trainer([HyperOptimizationCallback()], max_steps=2).fit(Plain(), datamodule=RidgeData())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(every_n_steps=0), "every_n_steps"),
        (dict(every_n_steps=1.5), "every_n_steps"),
        (dict(adjoint_steps=0), "adjoint_steps"),
        (dict(val="all"), "val"),
        (lambda: dict(batches=Batches(d2=0)), "d2_batches"),
        (lambda: dict(batches=Batches(d2="half")), "d2_batches"),
        (dict(step_size="fast"), "step_size"),
        (dict(preset="quick"), "preset"),
        (dict(outer_lr=-1.0), "outer_lr"),
        (dict(outer_lr=float("nan")), "outer_lr"),
        (dict(alpha=0.0), "alpha"),
        (dict(q=1.0), "q"),
        (dict(sigma2=-1.0), "sigma2"),
        (dict(hvp="central"), "hvp"),
        (dict(mode="test"), "mode"),
        (dict(on_divergence="ignore"), "on_divergence"),
        (dict(batch_size=0), "batch_size"),
        (dict(seed=-1), "seed"),
        (dict(outer_optimizer="adam"), "outer_optimizer"),
    ],
)
def test_callback_argument_errors(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        HyperOptimizationCallback(**(kwargs() if callable(kwargs) else kwargs))


# ------------------------------------------------------------------------------ agreement with the core
def test_callback_hypergradient_equals_core_on_same_batches():
    """Replay every hyper step with a hand-built SIDHyperOptimizer(inner_steps=0) on the same
    batches (the sampler re-implemented here) and the same (w, λ): equal up to rounding."""
    settings = dict(
        adjoint_steps=12, step_size="constant", eta=0.7, alpha=0.3, batches=Batches(d2=2)
    )
    cb = Recording(every_n_steps=4, seed=5, **settings)
    dm = RidgeData(batch_size=20, val_batch_size=30)
    model = Ridge()
    lp.trainer([cb], max_epochs=3).fit(model, datamodule=dm)
    assert len(cb.hypergradients) == 18 // 4 == 4

    ref = Ridge()
    w, log_lam = ref.lin.weight, ref.log_lam
    sid = SIDHyperOptimizer(
        [log_lam],
        [w],
        ref.inner_loss,
        ref.outer_loss,
        None,
        module=ref,
        config=SIDConfig(inner_steps=0, **settings),
    )
    train = _sampled_batches(dm.X, dm.y, 20, seed=5)
    val = _sampled_batches(dm.Xv, dm.yv, 30, seed=6)  # the val sampler uses seed + 1
    for (w_before, lam_before), expected in zip(cb.before, cb.hypergradients):
        with torch.no_grad():
            w.copy_(w_before[0])
            log_lam.copy_(lam_before[0])
        got = sid.hypergradient(train, next(val))
        torch.testing.assert_close(expected[0], got[0], rtol=1e-10, atol=1e-13)
    # and the outer steps used them: λ moved by Adam(lr=0.01) from its start
    assert not torch.equal(cb.before[-1][1][0], cb.before[0][1][0])


def _closed_form_ridge(model: Ridge, dm: RidgeData) -> Tensor:
    """∇ over log λ of E(w(λ)) for ridge: −λ ⊙ w ⊙ (XᵀX/n + diag λ)⁻¹ ∇E(w), at w = w(λ)."""
    X, y, Xv, yv = dm.X, dm.y, dm.Xv, dm.yv
    lam = model.log_lam.detach().exp()
    A = X.T @ X / len(X) + torch.diag(lam)
    w = torch.linalg.solve(A, X.T @ y / len(X))
    grad_E = Xv.T @ (Xv @ w - yv) / len(Xv)
    return -lam * w * torch.linalg.solve(A, grad_E)


@pytest.mark.parametrize(
    "settings, rtol",
    [
        # the paper's "Batch": GD adjoint on the whole training set, exact ∂₂Φ, all of val
        (dict(preset="batch", adjoint_steps=400, batches=Batches(d2="full"), val="full"), 1e-7),
        (
            dict(
                preset="batch",
                adjoint_steps=400,
                batches=Batches(d2="full"),
                val="full",
                val_batch_size=15,
            ),
            1e-7,
        ),
        # stochastic adjoint (decreasing steps, Thm 4.2) with the exact ∂₂Φ term
        # (minibatches of 10 of the 120 training points; 1000 steps give ~0.4 % error here)
        (
            dict(
                step_size="decreasing",
                adjoint_steps=1500,
                batch_size=10,
                batches=Batches(d2="full"),
                val="full",
            ),
            2e-2,
        ),
    ],
)
def test_hypergradient_matches_closed_form_ridge_at_convergence(settings, rtol):
    dm = RidgeData(batch_size=120)  # full-batch GD training: w converges to w(λ)
    model = Ridge(lr=0.5)
    steps = 300
    cb = HyperOptimizationCallback(every_n_steps=steps, outer_lr=1e-12, seed=3, **settings)
    lam_before = model.log_lam.detach().clone()
    lp.trainer([cb], max_steps=steps, limit_val_batches=0).fit(model, datamodule=dm)
    with torch.no_grad():
        model.log_lam.copy_(lam_before)  # the oracle at the λ the hypergradient was taken
    expected = _closed_form_ridge(model, dm)
    torch.testing.assert_close(cb.last_hypergradient[0], expected, rtol=rtol, atol=1e-9)


def test_callback_curvature_estimate_on_the_full_batch():
    """EstimatedCurvature(batches='full') through the callback: it builds the full training batch
    (120 samples) and every Lanczos product reads all of it."""
    dm = RidgeData(batch_size=20)
    cb = HyperOptimizationCallback(
        every_n_steps=3,
        outer_lr=0.05,
        seed=3,
        curvature=EstimatedCurvature(batches="full", iters=10, every=10),
    )
    lp.trainer([cb], max_steps=6, limit_val_batches=0).fit(Ridge(), datamodule=dm)
    cost = cb.sid.cost
    assert cost.curvature_products > 0
    assert cost.curvature_samples == 120 * cost.curvature_products
    assert all(torch.isfinite(g).all() for g in cb.last_hypergradient)


# ------------------------------------------------------------------------------ Lightning machinery
def _resume_run(tmp_path, split: int | None) -> tuple[list[dict[str, float]], Tensor, Tensor]:
    def make():
        cb = HyperOptimizationCallback(every_n_steps=3, adjoint_steps=8, outer_lr=0.05, seed=2)
        return cb, Ridge()

    dm = RidgeData(batch_size=20)
    if split is None:
        cb, model = make()
        lp.trainer([cb], max_epochs=4).fit(model, datamodule=dm)
    else:
        cb, model = make()
        trainer = lp.trainer([cb], max_epochs=split)
        trainer.fit(model, datamodule=dm)
        ckpt = tmp_path / "half.ckpt"
        trainer.save_checkpoint(ckpt)
        cb, model = make()  # fresh objects: everything must come from the checkpoint
        lp.trainer([cb], max_epochs=4).fit(
            model, datamodule=RidgeData(batch_size=20), ckpt_path=ckpt
        )
    return cb.history, model.log_lam.detach().clone(), model.lin.weight.detach().clone()


def test_checkpoint_resume_reproduces_lambda_trajectory(tmp_path):
    history, lam, w = _resume_run(tmp_path, None)
    history2, lam2, w2 = _resume_run(tmp_path, 2)
    assert len(history) == len(history2) == 4 * 6 // 3
    for h1, h2 in zip(history, history2):
        assert h1.keys() == h2.keys()
        for key in h1:
            assert h1[key] == pytest.approx(h2[key], rel=1e-12, abs=1e-15), key
    torch.testing.assert_close(lam, lam2, rtol=1e-12, atol=0)
    torch.testing.assert_close(w, w2, rtol=1e-12, atol=0)
    ckpt = torch.load(tmp_path / "half.ckpt", weights_only=False)
    state = ckpt["callbacks"]["HyperOptimizationCallback"]
    assert {"sid", "train_sampler", "val_sampler"} <= state.keys()
    assert state["sid"]["v"] is not None and state["sid"]["outer_optimizer"]["state"]
    assert "log_lam" in ckpt["state_dict"]


def test_loggers_and_progress_bar_receive_hyper_metrics(tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    cb = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    trainer = lp.trainer(
        [cb], max_steps=12, logger=CSVLogger(tmp_path, name="run"), log_every_n_steps=50
    )
    trainer.fit(Ridge(), datamodule=RidgeData())
    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    hyper_rows = [r for r in rows if r.get("hyper/outer_loss")]
    assert len(hyper_rows) == 6  # one per hyper step although log_every_n_steps=50
    for key in [
        "hyper/outer_loss",
        "hyper/hypergradient_norm",
        "hyper/adjoint_residual",
        "hyper/adjoint_eta",
        "hyper/alpha",
        "hyper/outer_lr",
        "hyper/train_samples",
        "hyper/val_samples",
        "hyper/log_lam_mean",
        "hyper/log_lam_min",
        "hyper/log_lam_max",
    ]:
        assert all(math.isfinite(float(r[key])) for r in hyper_rows), key
    assert [int(r["step"]) for r in hyper_rows] == [2, 4, 6, 8, 10, 12]
    samples = [float(r["hyper/train_samples"]) for r in hyper_rows]
    assert samples == sorted(samples) and samples[0] > 0
    assert "lam" in trainer.progress_bar_metrics
    assert trainer.progress_bar_metrics["lam"] == pytest.approx(
        float(trainer.lightning_module.log_lam.detach().mean()), rel=1e-6
    )
    assert float(trainer.callback_metrics["hyper/outer_loss"]) == pytest.approx(
        float(hyper_rows[-1]["hyper/outer_loss"]), rel=1e-6
    )


def test_lambda_requires_grad_restored_and_no_training_gradient():
    seen: list[bool] = []

    class Spy(Ridge):
        def training_step(self, batch, batch_idx):
            seen.append(self.log_lam.requires_grad)
            return super().training_step(batch, batch_idx)

    model = Spy()
    lp.trainer([HyperOptimizationCallback(every_n_steps=2, adjoint_steps=3)], max_steps=4).fit(
        model, datamodule=RidgeData()
    )
    assert seen == [False] * 4  # the training backward never touches λ
    assert model.log_lam.requires_grad and model.log_lam.grad is None


class DropoutNet(BilevelModule):
    """Dropout and BatchNorm: the hyper steps must leave the training's RNG and buffers alone."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, 8, dtype=torch.float64),
            torch.nn.BatchNorm1d(8, dtype=torch.float64),
            torch.nn.Tanh(),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(8, 1, dtype=torch.float64),
        )
        self.register_hyperparameter("log_lam", torch.tensor(-2.0, dtype=torch.float64))

    def inner_loss(self, batch):
        x, y = batch
        fit = 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()
        return fit + 0.5 * self.log_lam.exp() * sum(p.pow(2).sum() for p in self.inner_parameters())

    def outer_loss(self, batch):
        x, y = batch
        return 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.inner_parameters(), lr=0.05)


def test_hyper_steps_leave_training_alone_when_lambda_is_frozen():
    """With an outer learning rate of 0 the run equals a run without the callback: the adjoint
    solve does not move w, BatchNorm statistics or the training's random stream (dropout)."""

    def run(with_callback: bool):
        pl.seed_everything(7)
        model = DropoutNet()
        cbs = []
        if with_callback:
            sgd0 = functools.partial(torch.optim.SGD, lr=0.0)
            cbs = [
                HyperOptimizationCallback(every_n_steps=2, adjoint_steps=4, outer_optimizer=sgd0)
            ]
        lp.trainer(cbs, max_epochs=2).fit(model, datamodule=RidgeData())
        return model.state_dict()

    a, b = run(False), run(True)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_divergence_can_be_skipped():
    # α far above 2/L: the adjoint iteration explodes, λ must stay put with on_divergence="skip"
    # (no recovery retries here: the default Recover policy would damp the map back to a contraction)
    from hypertorch_sid import RaiseOnDivergence

    cb = HyperOptimizationCallback(
        every_n_steps=2, adjoint_steps=60, alpha=50.0, step_size="constant", on_divergence="skip",
        config=CALLBACK_CONFIG.replace(on_divergence=RaiseOnDivergence()),
    )  # fmt: skip
    model = Ridge()
    before = model.log_lam.detach().clone()
    with pytest.warns(UserWarning, match="skipped"):
        lp.trainer([cb], max_steps=4).fit(model, datamodule=RidgeData())
    assert torch.equal(model.log_lam.detach(), before) and cb.history == []


# ------------------------------------------------------------------------------ LightningCLI
def test_lightning_cli_configures_the_callback(tmp_path, monkeypatch):
    from pytorch_lightning.cli import LightningCLI

    monkeypatch.setattr("sys.argv", ["train.py"])

    args = {
        "trainer": {
            "max_steps": 4,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "default_root_dir": str(tmp_path),
            "callbacks": [
                {
                    "class_path": "hypertorch_sid.HyperOptimizationCallback",
                    "init_args": {
                        "every_n_steps": 2,
                        "adjoint_steps": 7,
                        "config": {
                            "batches": {"d2": "full"},
                            "damping": {
                                "class_path": "hypertorch_sid.FixedDamping",
                                "init_args": {"value": 0.0},
                            },
                        },
                        "val": "full",
                        "preset": "stoch_dec",
                        "outer_optimizer": {
                            "class_path": "torch.optim.SGD",
                            "init_args": {"lr": 0.5},
                        },
                    },
                }
            ],
        },
        "model": {"lr": 0.2},
    }
    cli = LightningCLI(Ridge, RidgeData, args=args, run=False, save_config_callback=None)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, HyperOptimizationCallback)]
    assert cb.config.damping == FixedDamping(0.0)
    assert cb.config.on_divergence == Recover(retries=2)  # the callback's defaults are kept
    assert (cb.every_n_steps, cb.adjoint_steps, cb.config.batches.d2, cb.val, cb.preset) == (
        2,
        7,
        "full",
        "full",
        "stoch_dec",
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert isinstance(cb.sid.outer_optimizer, torch.optim.SGD)
    assert cb.sid.outer_optimizer.param_groups[0]["lr"] == 0.5
    assert len(cb.history) == 2 and cb.sid.adjoint_steps == 7
