"""LearnedWeightDecay: drop-in learned weight decay for an ordinary LightningModule.

Oracles: the optimizers' own ``weight_decay`` (training dynamics for a fixed λ), the closed-form
ridge hypergradient, hand-computed penalties, an uninterrupted run (for resume).
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import LIGHTNING_NOISE, D, RidgeData
from torch import Tensor

from hypertorch_sid import Batches, ConfigurationError, LearnedWeightDecay, ProximalGradientMap

pytestmark = [*LIGHTNING_NOISE]

REPO = Path(__file__).resolve().parents[1]
NEVER = 10**9  # every_n_steps that keeps λ fixed


class MLP(pl.LightningModule):
    """An ordinary module: a user's training_step and configure_optimizers, nothing bilevel."""

    def __init__(
        self, optimizer: Any = None, hidden: int = 8, groups: bool = False, schedule: bool = False
    ):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(D, hidden, dtype=torch.float64),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, 1, dtype=torch.float64),
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        self.optimizer = optimizer or functools.partial(torch.optim.SGD, lr=0.05)
        self.groups, self.schedule = groups, schedule
        self.muted_calls = 0
        self.real_losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = 0.5 * ((self.net(x).squeeze(-1) - y) ** 2).mean()
        if "log" in self.__dict__:  # the callback muted self.log for its own evaluations
            self.muted_calls += 1
        else:
            self.real_losses.append(float(loss.detach()))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        if self.groups:
            weights = [p for p in self.parameters() if p.dim() > 1]
            biases = [p for p in self.parameters() if p.dim() == 1]
            opt = self.optimizer([{"params": weights}, {"params": biases}])
        else:
            opt = self.optimizer(self.parameters())
        if not self.schedule:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _trainer(callbacks: list[Any] | None = None, **kwargs: Any) -> pl.Trainer:
    return lightning_problems.trainer(callbacks, **{"limit_val_batches": 0, **kwargs})


def _fit(model: pl.LightningModule, callbacks: list[Any] | None = None, **kwargs: Any) -> None:
    _trainer(callbacks, **{"max_epochs": 3, **kwargs}).fit(model, datamodule=RidgeData())


# ------------------------------------------------------------------------------ training dynamics
OPTIMIZERS = {
    "sgd_momentum": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    "adam": functools.partial(torch.optim.Adam, lr=0.01),
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize(
    "granularity", ["global", "per_group", "per_layer", "per_tensor", "per_element"]
)
def test_coupled_decay_trains_like_the_optimizers_weight_decay(opt, granularity):
    c = 0.03
    reference = MLP(functools.partial(OPTIMIZERS[opt], weight_decay=c), groups=True)
    _fit(reference)
    model = MLP(OPTIMIZERS[opt], groups=True)
    _fit(model, [LearnedWeightDecay(c, granularity=granularity, every_n_steps=NEVER)])
    for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)


MORE_COUPLED = {
    "sgd_nesterov": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True),
    "rmsprop_centered": functools.partial(
        torch.optim.RMSprop, lr=0.01, centered=True, momentum=0.5
    ),
    "adagrad": functools.partial(torch.optim.Adagrad, lr=0.05, lr_decay=0.01),
    "nadam": functools.partial(torch.optim.NAdam, lr=0.01),
    "radam": functools.partial(torch.optim.RAdam, lr=0.01),
    "adamax": functools.partial(torch.optim.Adamax, lr=0.01),
    "adadelta": functools.partial(torch.optim.Adadelta, lr=1.0),
    "asgd": functools.partial(torch.optim.ASGD, lr=0.05),
    "adam_amsgrad": functools.partial(torch.optim.Adam, lr=0.01, amsgrad=True),
}
DECOUPLING = {
    "adam": functools.partial(torch.optim.Adam, lr=0.01, decoupled_weight_decay=True),
    "nadam": functools.partial(torch.optim.NAdam, lr=0.01, decoupled_weight_decay=True),
    "radam": functools.partial(torch.optim.RAdam, lr=0.01, decoupled_weight_decay=True),
    "adamw_amsgrad": functools.partial(torch.optim.AdamW, lr=0.01, amsgrad=True),
}


@pytest.mark.parametrize("opt", list(MORE_COUPLED))
def test_coupled_decay_trains_like_every_torch_optimizers_weight_decay(opt):
    """A fixed λ is the optimizer's own ``weight_decay=λ``, whatever torch optimizer it is."""
    c = 0.03
    reference = MLP(functools.partial(MORE_COUPLED[opt], weight_decay=c), groups=True)
    _fit(reference)
    model = MLP(MORE_COUPLED[opt], groups=True)
    _fit(model, [LearnedWeightDecay(c, every_n_steps=NEVER)])
    for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("opt", list(DECOUPLING))
def test_decoupled_decay_trains_like_every_decoupling_optimizer(opt):
    """``decoupled=True`` is Adam/NAdam/RAdam's ``decoupled_weight_decay=True`` too; the
    coupled default on such an optimizer warns, naming the fix."""
    c = 0.05
    reference = MLP(functools.partial(DECOUPLING[opt], weight_decay=c))
    _fit(reference)
    model = MLP(functools.partial(DECOUPLING[opt], weight_decay=0.0))
    _fit(model, [LearnedWeightDecay(c, decoupled=True, every_n_steps=NEVER)])
    for a, b in zip(reference.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    coupled = MLP(functools.partial(DECOUPLING[opt], weight_decay=0.0))
    with pytest.warns(UserWarning, match=r"decoupled=True"):
        _fit(coupled, [LearnedWeightDecay(c, every_n_steps=NEVER)])


def test_a_decoupling_optimizers_own_decay_is_refused_naming_decoupled():
    model = MLP(functools.partial(torch.optim.Adam, lr=0.01, weight_decay=0.01,
                                  decoupled_weight_decay=True))  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"Adam's decoupled decay.*decoupled=True"):
        _fit(model, [LearnedWeightDecay(1e-3)])


def test_coupled_decay_with_projection_is_bitwise_the_optimizers():
    """λ stored as is (projection): the same floating-point operations as SGD's weight_decay."""
    c = 0.03
    reference = MLP(functools.partial(torch.optim.SGD, lr=0.05, weight_decay=c))
    _fit(reference)
    model = MLP()
    _fit(model, [LearnedWeightDecay(c, parameterization="projection", every_n_steps=NEVER)])
    for a, b in zip(reference.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    # and without the decay the run differs (the comparison can fail)
    plain = MLP()
    _fit(plain)
    assert not torch.equal(plain.net[0].weight, model.net[0].weight)


@pytest.mark.parametrize("granularity", ["global", "per_element"])
def test_decoupled_decay_trains_like_adamw(granularity):
    """Also under a learning-rate schedule: the decay reads the group's current lr."""
    c = 0.05
    reference = MLP(functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=c), schedule=True)
    _fit(reference)
    model = MLP(functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0), schedule=True)
    cb = LearnedWeightDecay(c, granularity=granularity, decoupled=True, every_n_steps=NEVER)
    _fit(model, [cb])
    for a, b in zip(reference.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_optimizer_weight_decay_must_be_removed():
    model = MLP(functools.partial(torch.optim.AdamW, lr=0.01))  # AdamW's default decay is 0.01
    with pytest.raises(ConfigurationError, match="weight_decay=0") as err:
        _fit(model, [LearnedWeightDecay(1e-3, decoupled=True)])
    assert "apply_to='weights'" not in str(err.value)  # one group: nothing to say about groups
    assert "apply_to='decayed_groups'" in str(err.value)  # the optimizer kept as it is


def test_decay_groups_are_pointed_to_apply_to_weights():
    """The common set-up: decay on the weights' group, none on the biases' group."""
    model = MLP(functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.05), groups=True)
    with pytest.raises(ConfigurationError, match="apply_to='weights'"):
        _fit(model, [LearnedWeightDecay(1e-3, decoupled=True)])


# ------------------------------------------------------------------------------ what is learned
@pytest.mark.parametrize(
    "granularity, apply_to, expected",
    [
        ("global", "all", [()] * 1),
        ("per_group", "all", [()] * 2),
        ("per_layer", "all", [()] * 2),
        ("per_tensor", "all", [()] * 4),
        ("per_tensor", "weights", [()] * 2),
        # per element, tied to the layer: ρ of the 2 layers, then s in optimizer group order
        ("per_element", "all", [(2,), (8, D), (1, 8), (8,), (1,)]),
        ("per_element", "weights", [(2,), (8, D), (1, 8)]),
    ],
)
def test_granularities(granularity, apply_to, expected):
    model = MLP(groups=True)
    cb = LearnedWeightDecay(
        0.01, granularity=granularity, apply_to=apply_to, every_n_steps=2, max_overhead=None
    )
    _fit(model, [cb], max_steps=4)
    values = cb.decay_values()
    if granularity == "per_element":
        assert [tuple(r.shape) for r in cb.rho] == expected
    else:
        assert len(cb.rho) == 1 and cb.rho[0].shape == (len(expected),)
    assert len(values) == (4 if apply_to == "all" else 2)
    assert all(torch.all(v > 0) for v in values.values())
    if granularity == "per_layer":  # one λ shared by a layer's weight and bias
        assert torch.equal(values["net.0.weight"], values["net.0.bias"])
        assert not torch.equal(values["net.0.weight"], values["net.2.weight"])
    if granularity == "per_group":  # the weights' group and the biases' group
        assert torch.equal(values["net.0.weight"], values["net.2.weight"])


def _closed_form(model: MLP, dm: RidgeData, lam: Tensor) -> Tensor:
    """Ridge: d E(w(λ)) / dλ_i = −w_i [(XᵀX/n + diag λ)⁻¹ ∇E(w)]_i at w = w(λ)."""
    X, y, Xv, yv = dm.X, dm.y, dm.Xv, dm.yv
    A = X.T @ X / len(X) + torch.diag(lam)
    w = torch.linalg.solve(A, X.T @ y / len(X))
    grad_E = Xv.T @ (Xv @ w - yv) / len(Xv)
    return -w * torch.linalg.solve(A, grad_E)


class Linear(MLP):
    def __init__(self):
        super().__init__(functools.partial(torch.optim.SGD, lr=0.5))
        self.net = torch.nn.Linear(D, 1, bias=False, dtype=torch.float64)
        torch.nn.init.zeros_(self.net.weight)


@pytest.mark.parametrize(
    "granularity, parameterization, proximal, elements",
    [
        ("global", "log", False, "layer_then_shrunk"),  # elements= is read per element only
        ("per_element", "log", False, "untied"),
        ("per_element", "projection", False, "untied"),
        ("global", "log", True, "layer_then_shrunk"),
        ("per_element", "log", True, "untied"),
        ("per_element", "log", False, "tied"),
        ("per_element", "projection", False, "tied"),
    ],
)
def test_hypergradient_matches_closed_form_ridge(granularity, parameterization, proximal, elements):
    """ℓ̂ = training_step's loss + ½ Σ λ w²: at convergence the hypergradient is the ridge one,
    with the GD map of ℓ̂ or the proximal map of the loss and the penalty. Tied per element
    (λ_e = λ_layer exp(s_e), s = 0): the layer's entry is Σ_e ∂f/∂λ_e (· λ_e for log) and each
    s_e's is λ_e ∂f/∂λ_e (the prior's gradient s_e/(σ²n) is 0 at s = 0)."""
    c, steps = 0.1, 300
    dm = RidgeData(batch_size=120)
    model = Linear()
    cb = LearnedWeightDecay(
        c,
        granularity=granularity,
        parameterization=parameterization,
        proximal=proximal,
        elements=elements,
        every_n_steps=steps,
        preset="batch",
        adjoint_steps=400,
        batches=Batches(d2="full"),
        val="full",
        outer_lr=1e-12,
        max_overhead=None,
    )
    _trainer([cb], max_steps=steps).fit(model, datamodule=dm)
    lam = torch.full((D,), c, dtype=torch.float64)
    d_lam = _closed_form(model, dm, lam)  # ∂f/∂λ_i
    if elements == "tied":
        d_layer = d_lam.sum() * (c if parameterization == "log" else 1.0)
        torch.testing.assert_close(
            cb.last_hypergradient[0], d_layer.reshape(1), rtol=1e-7, atol=1e-12
        )
        d_s = (d_lam * lam).reshape(1, D)  # ∂f/∂s_e = λ_e ∂f/∂λ_e
        torch.testing.assert_close(cb.last_hypergradient[1], d_s, rtol=1e-7, atol=1e-12)
        return
    if parameterization == "log":
        d_lam = d_lam * lam  # ∂f/∂ρ_i with λ = exp(ρ)
    expected = d_lam.sum().reshape(1) if granularity == "global" else d_lam.reshape(1, D)
    torch.testing.assert_close(cb.last_hypergradient[0], expected, rtol=1e-7, atol=1e-12)
    assert isinstance(cb.sid.phi, ProximalGradientMap) is proximal


def test_decoupled_penalty_uses_the_adam_preconditioner():
    """Decoupled λ enters ℓ̂ as the effective L2 coefficient λ (√v̂ + ε) (the AdamW fixed point)."""
    model = MLP(functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0, eps=1e-3))
    cb = LearnedWeightDecay(0.05, decoupled=True, granularity="per_tensor", every_n_steps=3)
    trainer = _trainer([cb], max_steps=3)
    trainer.fit(model, datamodule=RidgeData())
    cb.problem.before_hyper_step(trainer, model)
    opt = trainer.optimizers[0]
    lam = cb.decay_values()
    expected = 0.0
    for name, p in model.named_parameters():
        state = opt.state[p]
        v_hat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
        expected += 0.5 * (lam[name] * (v_hat.sqrt() + 1e-3) * p.detach() ** 2).sum()
    scales = cb.problem._scales
    torch.testing.assert_close(
        cb.problem.decay.penalty(scales).detach(), expected, rtol=1e-12, atol=0
    )
    # coupled decay: the plain ½ Σ λ w²
    plain = sum(0.5 * lam[n] * p.detach().pow(2).sum() for n, p in model.named_parameters())
    torch.testing.assert_close(cb.problem.decay.penalty().detach(), plain, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "parameterization, outer",
    [
        ("log", functools.partial(torch.optim.Adam, lr=1.0)),
        ("projection", functools.partial(torch.optim.SGD, lr=1e4)),
    ],
)
def test_lambda_stays_positive(parameterization, outer):
    """E = −‖w‖² rewards λ → 0 (less shrinkage); the projected step overshoots below 0."""

    def minus_norm(module, batch):
        return -sum(p.pow(2).sum() for p in module.parameters())

    cb = LearnedWeightDecay(
        0.05,
        granularity="per_tensor",
        parameterization=parameterization,
        every_n_steps=2,
        adjoint_steps=5,
        outer_optimizer=outer,
        validation_loss=minus_norm,
        max_overhead=None,
    )
    _trainer([cb], max_steps=8).fit(MLP(), datamodule=RidgeData())
    values = torch.stack(list(cb.decay_values().values()))
    assert len(cb.history) == 4
    if parameterization == "projection":
        assert values.min() == 0  # projected onto λ ≥ 0
    else:
        assert values.min() > 0 and values.max() < 0.05


def test_training_step_logging_is_muted_inside_hyper_steps():
    model = MLP()
    trainer = _trainer([LearnedWeightDecay(0.01, every_n_steps=1, adjoint_steps=2)], max_steps=5)
    trainer.fit(model, datamodule=RidgeData())
    assert model.muted_calls > 0 and len(model.real_losses) == 5
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(model.real_losses[-1])


def test_manual_optimization_needs_training_loss():
    class Manual(MLP):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    with pytest.raises(ConfigurationError, match="training_loss"):
        _fit(Manual(), [LearnedWeightDecay(0.01, max_overhead=None)])

    def loss(module, batch):
        x, y = batch
        return 0.5 * ((module.net(x).squeeze(-1) - y) ** 2).mean()

    model = Manual()
    cb = LearnedWeightDecay(
        0.01, training_loss=loss, every_n_steps=2, adjoint_steps=2, max_overhead=None
    )
    _fit(model, [cb], max_steps=4)
    assert len(cb.history) == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(weight_decay=0.0), "weight_decay"),
        (dict(weight_decay=-1.0, parameterization="projection"), "weight_decay"),
        (dict(weight_decay=float("inf")), "weight_decay"),
        (dict(granularity="per_neuron"), "granularity"),
        (dict(parameterization="softplus"), "parameterization"),
        (dict(apply_to="biases"), "apply_to"),
        (dict(training_loss="mse"), "training_loss"),
        (dict(decoupled="yes"), "decoupled"),
        (dict(proximal=1), "proximal must be True or False"),
        (dict(every_n_steps=0), "every_n_steps"),
    ],
)
def test_argument_errors(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        LearnedWeightDecay(**kwargs)


@pytest.mark.parametrize("decoupled", [False, True])
def test_resume_reproduces_learned_decay(tmp_path, decoupled):
    """A fit planned for 4 epochs, resumed from its epoch-2 checkpoint (a killed run), ends where
    the straight fit does. (Decoupled: AdamW with an lr schedule — the restored optimizer's groups
    must be used.) The default outer step (``ReachRprop``) sizes its steps by the hyper steps the
    fit has left, so the resumed fit must plan the same length as the straight one."""

    def make():
        cb = LearnedWeightDecay(
            0.02,
            granularity="per_layer",
            decoupled=decoupled,
            every_n_steps=2,
            adjoint_steps=4,
            outer_lr=0.1,
            max_overhead=None,
        )
        if not decoupled:
            return cb, MLP()
        adamw = functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0)
        return cb, MLP(adamw, schedule=True)

    cb, model = make()
    every_epoch = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, filename="{epoch}"
    )
    _fit(model, [cb, every_epoch], max_epochs=4, enable_checkpointing=True)
    straight, w_straight = cb.decay_values(), model.state_dict()

    cb, model = make()
    _trainer([cb], max_epochs=4).fit(
        model, datamodule=RidgeData(), ckpt_path=tmp_path / "epoch=1.ckpt"
    )
    resumed = cb.decay_values()
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(straight[key], resumed[key], rtol=1e-12, atol=0)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(w_straight[key], value, rtol=1e-12, atol=0)
    assert not torch.allclose(straight["net.0.weight"], torch.tensor(0.02, dtype=torch.float64))


def test_lightning_cli_configures_learned_weight_decay(monkeypatch):
    from pytorch_lightning.cli import LightningCLI

    monkeypatch.setattr("sys.argv", ["train.py"])
    args = {
        "trainer": {
            "max_steps": 2,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "callbacks": [
                {
                    "class_path": "hypertorch_sid.LearnedWeightDecay",
                    "init_args": {
                        "weight_decay": 0.01,
                        "granularity": "per_tensor",
                        "decoupled": False,
                        "every_n_steps": 3,
                        "adjoint_steps": 4,
                        "val": "full",
                    },
                }
            ],
        },
    }
    cli = LightningCLI(MLP, RidgeData, args=args, run=False, save_config_callback=None)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, LearnedWeightDecay)]
    assert (cb.weight_decay, cb.granularity, cb.every_n_steps, cb.adjoint_steps, cb.val) == (
        0.01,
        "per_tensor",
        3,
        4,
        "full",
    )


# ------------------------------------------------------------------------------ the example
def test_weight_decay_example_quick(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import weight_decay_tuning
    finally:
        sys.path.pop(0)
    out = tmp_path / "wd.png"
    rows = weight_decay_tuning.main(["--quick", "--dataset", "digits", "--out", str(out)])
    assert out.is_file() and out.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "learned" in printed and "grid" in printed
    learned = [r for r in rows if r["method"].startswith("learned")]
    grid = [r for r in rows if r["method"].startswith("grid")]
    assert learned and len(grid) >= 2
    for r in rows:
        assert math.isfinite(r["val_loss"]) and 0 <= r["test_acc"] <= 1


# ------------------------------------------------------------------ tensors added during training
@pytest.mark.parametrize("granularity", ["per_layer", "per_element"])
def test_a_new_fit_that_decays_more_tensors_keeps_the_learned_values(granularity):
    from hypertorch_sid.core.decay import WeightDecay

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    head = [(n, p) for n, p in net.named_parameters() if n.startswith("1.")]
    old = WeightDecay(head, 0.01, granularity)
    with torch.no_grad():
        for h in old.hyperparameters:
            h.add_(torch.arange(h.numel(), dtype=h.dtype).reshape(h.shape) / 10)
    new = WeightDecay(list(net.named_parameters()), 0.01, granularity)
    carried = new.carry_from(old)
    assert carried == (1 if granularity == "per_layer" else 2)
    before, after = old.values(), new.values()
    for name in ("1.weight", "1.bias"):
        torch.testing.assert_close(after[name], before[name])
    for name in ("0.weight", "0.bias"):  # the new tensors start at the initial λ
        torch.testing.assert_close(after[name], torch.full_like(after[name], 0.01))
    assert new.carry_from(WeightDecay(head, 0.01, "global")) == 0  # another granularity


def test_tensors_unfrozen_during_the_fit_are_named():
    """BackboneFinetuning unfreezes the backbone into a new parameter group mid-fit: those
    tensors get no learned decay and no place in the hypergradient, and the fit says so once."""
    from pytorch_lightning.callbacks import BackboneFinetuning

    class WithBackbone(MLP):
        def __init__(self):
            super().__init__()
            self.backbone = self.net[0]

    model = WithBackbone()
    finetune = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.0)
    cb = LearnedWeightDecay(0.01, every_n_steps=2, max_overhead=None)
    with pytest.warns(UserWarning, match=r"now train 2 tensors the fit did not start with "
                      r"\(net.0.weight, net.0.bias; e.g. BackboneFinetuning"):  # fmt: skip
        _fit(model, [cb, finetune], max_epochs=3)
    assert not any(name.startswith("net.0.") for name in cb.decay_values())


def test_a_group_thawed_mid_fit_can_keep_a_fixed_decay_as_the_warning_says():
    """The new-tensors warning's advice for a mid-fit thaw (a fixed decay on the group
    BackboneFinetuning adds) works: the fit runs with it, λ stays finite, and the thawed
    tensors stay out of the learned decay."""
    from pytorch_lightning.callbacks import BackboneFinetuning

    class DecayedThaw(BackboneFinetuning):
        def finetune_function(self, pl_module, epoch, optimizer):
            before = len(optimizer.param_groups)
            super().finetune_function(pl_module, epoch, optimizer)
            if len(optimizer.param_groups) > before:
                optimizer.param_groups[-1]["weight_decay"] = 1e-4

    class WithBackbone(MLP):
        def __init__(self):
            super().__init__()
            self.backbone = self.net[0]

        def configure_optimizers(self):
            return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)

    model = WithBackbone()
    finetune = DecayedThaw(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.0)
    cb = LearnedWeightDecay(0.01, every_n_steps=2, max_overhead=None)
    advice = r'in its finetune_function .*param_groups\[-1\]\["weight_decay"\] = 1e-4'
    with pytest.warns(UserWarning, match=advice):
        _fit(model, [cb, finetune], max_epochs=3)
    groups = model.trainer.optimizers[0].param_groups
    assert len(groups) == 2 and groups[-1]["weight_decay"] == 1e-4
    assert not any(name.startswith("net.0.") for name in cb.decay_values())
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in cb.decay_values().values())
