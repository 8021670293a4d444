"""``LearnedWeightDecay(apply_to="decayed_groups")``: the user's decay / no-decay groups kept.

The usual Transformer recipe builds a decay group (Linear weights) and a no-decay group (biases,
LayerNorm, embeddings and position embeddings, ≥ 2 dims); ``apply_to="weights"`` decayed the
embeddings (session 64: a position embedding's λ reached 296). Under ``"decayed_groups"`` the
callback decays exactly the groups with ``weight_decay`` ≠ 0, sets them to 0 itself, and a
resumed fit decays the same tensors. Oracle: with λ held fixed, the fit is bit for bit the
user's optimizer with its own ``weight_decay`` and no callback.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning_problems as lp
import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning.weight_decay_problem import DECIDED_KEY

DECAYED = {"fc.weight", "head.weight"}
WD = 2.0**-6  # exact in float32: λ₀ held fixed reads back as the optimizer's value


class TinyGPT(pl.LightningModule):
    """Token + position embedding → Linear → ReLU → LayerNorm → mean → Linear head; the GPT
    recipe's two groups (decay: Linear weights; no decay: biases, LayerNorm, embeddings)."""

    def __init__(self, optimizer: str = "sgd", wd: float = WD, lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(12, 8)
        self.pos = nn.Parameter(0.1 * torch.randn(4, 8))
        self.fc = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)
        self.optimizer, self.wd, self.lr = optimizer, wd, lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(torch.relu(self.fc(self.emb(x) + self.pos)))
        return self.head(h.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        named = dict(self.named_parameters())
        groups = [
            {"params": [p for n, p in named.items() if n in DECAYED], "weight_decay": self.wd},
            {"params": [p for n, p in named.items() if n not in DECAYED], "weight_decay": 0.0},
        ]
        if self.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=self.lr)
        return torch.optim.SGD(groups, lr=self.lr, momentum=0.9)


def _loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 12, (96, 4), generator=g)
    y = (x[:, 0] + x[:, 1]) % 3
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16)
    return train, DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)


class WeightDecayRead(pl.Callback):
    """The optimizer's groups' ``weight_decay`` after the first step."""

    def __init__(self) -> None:
        self.after_first: list[float] | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.after_first is None:
            self.after_first = [g["weight_decay"] for g in trainer.optimizers[0].param_groups]


def _fit(model: TinyGPT, callbacks: list[Any], steps: int, ckpt_path: Any = None) -> pl.Trainer:
    trainer = lp.trainer(callbacks, max_steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, *_loaders(), ckpt_path=ckpt_path)
    return trainer


def test_only_the_decay_group_is_learned_and_taken_over():
    """λ slots only for the decay group's tensors (not the embeddings), the groups read
    weight_decay 0 after the first step, λ learned; λ₀ 64× from the group's value is said."""
    cb = LearnedWeightDecay(
        WD / 64, apply_to="decayed_groups", granularity="per_tensor", every_n_steps=2,
        max_overhead=None,
    )  # fmt: skip
    read = WeightDecayRead()
    trainer = lp.trainer([cb, read], max_steps=6)
    with pytest.warns(UserWarning, match=r"weight_decay=0\.000244.*weight_decay=0\.015625"):
        trainer.fit(TinyGPT(), *_loaders())
    assert set(cb.decay_values()) == DECAYED
    assert read.after_first == [0.0, 0.0]
    assert [g["weight_decay"] for g in trainer.optimizers[0].param_groups] == [0.0, 0.0]
    assert any(abs(float(v) / (WD / 64) - 1) > 1e-3 for v in cb.decay_values().values())


@pytest.mark.parametrize("optimizer, decoupled", [("sgd", False), ("adamw", True)])
def test_fixed_lambda_is_the_users_optimizer_bit_for_bit(optimizer, decoupled):
    """No hyper step (λ = λ₀ = the group's value): the fit equals the user's unchanged
    optimizer without the callback, bit for bit. Decaying the no-decay group (embeddings), or
    the decay group twice, or not at all, would move the weights off it."""
    plain = TinyGPT(optimizer)
    _fit(plain, [], 6)
    ours = TinyGPT(optimizer)
    cb = LearnedWeightDecay(
        WD, apply_to="decayed_groups", decoupled=decoupled, parameterization="projection",
        every_n_steps=100, max_overhead=None,
    )  # fmt: skip
    _fit(ours, [cb], 6)
    for (name, a), b in zip(plain.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name


def test_resume_keeps_the_decided_tensors(tmp_path):
    """Resumed mid-fit: the same λ slots, from the checkpoint's record; also where the
    optimizers no longer say which groups decayed (weight_decay 0 in every group, as a loaded
    optimizer state carries): without the record that is refused as no group decaying."""
    settings = dict(apply_to="decayed_groups", every_n_steps=2, max_overhead=None)
    cb = LearnedWeightDecay(WD, **settings)
    trainer = _fit(TinyGPT(), [cb], 4)
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)
    stored = [s for s in torch.load(path, weights_only=False)["callbacks"].values()]
    assert [sorted(s[DECIDED_KEY]) for s in stored] == [sorted(DECAYED)]
    slots = list(cb.learned_weight_decay)
    for wd in (WD, 0.0):  # 0.0: the groups carry no decay any more
        resumed = LearnedWeightDecay(WD, **settings)
        trainer = _fit(TinyGPT(wd=wd), [resumed], 8, ckpt_path=path)
        assert list(resumed.learned_weight_decay) == slots
        assert set(resumed.decay_values()) == DECAYED
        assert [g["weight_decay"] for g in trainer.optimizers[0].param_groups] == [0.0, 0.0]
    with pytest.raises(ConfigurationError, match="no parameter group.*weight_decay ≠ 0"):
        _fit(TinyGPT(wd=0.0), [LearnedWeightDecay(WD, **settings)], 4)


def test_no_group_decaying_is_refused_naming_apply_to_all():
    with pytest.raises(ConfigurationError, match=r"no group to decay.*apply_to='all'"):
        _fit(TinyGPT(wd=0.0), [LearnedWeightDecay(WD, apply_to="decayed_groups")], 2)


@pytest.mark.parametrize("apply_to", ["all", "weights"])
def test_the_refusal_of_a_decaying_optimizer_points_to_decayed_groups(apply_to):
    with pytest.raises(ConfigurationError, match=r"already applies.*apply_to='decayed_groups'"):
        _fit(TinyGPT(), [LearnedWeightDecay(WD, apply_to=apply_to)], 2)


class TwoOptimizers(TinyGPT):
    """Manual optimisation with two optimizers, each with a decay and a no-decay group."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizers = self.optimizers()
        self.manual_backward(super().training_step(batch, batch_idx))
        for opt in optimizers:
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        def sgd(prefixes: tuple[str, ...]) -> torch.optim.Optimizer:
            named = {n: p for n, p in self.named_parameters() if n.startswith(prefixes)}
            return torch.optim.SGD(
                [
                    {"params": [p for n, p in named.items() if n in DECAYED], "weight_decay": WD},
                    {"params": [p for n, p in named.items() if n not in DECAYED]},
                ],
                lr=self.lr,
            )

        return [sgd(("emb", "pos", "fc", "ln")), sgd(("head",))]


def test_several_optimizers_fixed_lambda_bit_for_bit():
    plain = TwoOptimizers()
    _fit(plain, [], 6)
    ours = TwoOptimizers()
    cb = LearnedWeightDecay(
        WD, apply_to="decayed_groups", parameterization="projection", every_n_steps=100,
        max_overhead=None, training_loss=lambda module, batch: TinyGPT.training_step(module, batch, 0),
    )  # fmt: skip
    trainer = _fit(ours, [cb], 6)
    assert set(cb.decay_values()) == DECAYED
    assert [g["weight_decay"] for o in trainer.optimizers for g in o.param_groups] == [0.0] * 4
    for (name, a), b in zip(plain.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("key", ["decayed_tensors", "hyperparameter_slots"])
def test_a_checkpoints_name_list_that_is_none_is_refused_naming_it(key: str) -> None:
    """A truncated or foreign checkpoint whose list of names is no list of strings is refused
    naming the key, not loaded half."""
    with pytest.raises(ConfigurationError, match=f"checkpoint's {key} must be a list of"):
        LearnedWeightDecay().load_state_dict({key: "fc.weight"})
