"""Per-layer λ for tensors no layer owns (session 63, issue 28).

Tensors registered on the LightningModule itself (or in an ``nn.ParameterList`` /
``ParameterDict``) all shared one λ slot, ``"(root)"`` (or the container's name), as
``granularity="global"`` would: a cosine classifier's class vectors and its learned logit scale
``log_s`` got one λ, whose rise pulled the scale down (docs/failures.md, "Unseen user recipes
(session 62)"). A container is no layer: each tensor it owns is a layer of its own, its slot
named by the tensor. A checkpoint written with the shared slot resumes where each shared slot
held one tensor (only the name changed) and is refused, saying why, where one held several.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import TOY_C, TOY_D, TOY_X, TOY_Y, trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import hypertorch_sid.lightning.weight_decay_problem as wdp
from hypertorch_sid import ConfigurationError, LearnedWeightDecay
from hypertorch_sid.core.decay import WeightDecay

X, Y = TOY_X, TOY_Y


class Toy(pl.LightningModule):
    """Cross entropy on the toy, SGD (no decay of its own: the callback's)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RawMLP(Toy):
    """An MLP of raw parameters: on the module itself, in a ParameterList and a ParameterDict."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w1 = nn.Parameter(0.3 * torch.randn(TOY_D, 16))
        self.b1 = nn.Parameter(torch.zeros(16))
        self.hidden = nn.ParameterList([nn.Parameter(0.3 * torch.randn(16, 16)) for _ in range(2)])
        self.out = nn.ParameterDict({"w": nn.Parameter(0.3 * torch.randn(16, TOY_C))})

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(x @ self.w1 + self.b1)
        for w in self.hidden:
            h = torch.tanh(h @ w)
        return h @ self.out["w"]


class CosineHead(Toy):
    """A trunk layer and a cosine classifier (NormFace): logits = exp(log_s) · cos(h, class)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(TOY_D, 16)
        self.classes = nn.Parameter(torch.randn(TOY_C, 16) / 4)
        self.log_s = nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, x: Tensor) -> Tensor:
        h = F.normalize(torch.tanh(self.trunk(x)), dim=1)
        return self.log_s.exp() * h @ F.normalize(self.classes, dim=1).t()


class Tempered(Toy):
    """A linear layer and one learned temperature on the module: one tensor no layer owns."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(TOY_D, TOY_C)
        self.log_t = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * self.log_t.exp()


def _loaders() -> tuple[DataLoader, DataLoader]:
    return (
        DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16, shuffle=True),
        DataLoader(TensorDataset(X[:60], Y[:60]), batch_size=20),
    )


def _decay(**kw: Any) -> LearnedWeightDecay:
    return LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None, **kw)


def _fit(cb: LearnedWeightDecay, model: pl.LightningModule, epochs: int = 1) -> list[str]:
    """Fit; the warnings' messages."""
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=epochs).fit(model, *_loaders())
    return [str(w.message) for w in caught]


def _as_before_session_63(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer of a tensor as versions before session 63 had it: its name less the last
    component, ``"(root)"`` for the module's own tensors (what their checkpoints hold)."""
    monkeypatch.setattr(
        wdp, "layer_of", lambda module: lambda name: name.rpartition(".")[0] or "(root)"
    )


def test_a_raw_parameter_mlp_gets_one_lambda_per_tensor_named_by_it():
    """w1, b1, hidden.0, hidden.1 and out.w shared the slots "(root)", "hidden" and "out"."""
    cb = _decay()
    said = _fit(cb, RawMLP())
    names = ["w1", "b1", "hidden.0", "hidden.1", "out.w"]
    assert cb.slot_names == names
    assert sorted(cb.learned_weight_decay) == sorted(names)
    assert cb.history  # hyper steps ran, and moved the five λ apart
    assert len({round(float(v), 12) for v in cb.learned_weight_decay.values()}) > 1
    assert sorted(cb.decay_values()) == sorted(names)
    assert not [m for m in said if "share one λ" in m]


def test_the_core_gives_a_top_level_tensor_its_own_layer():
    """Without Lightning: a module of raw tensors beside a Linear, per layer and per element."""
    net = nn.Module()
    net.w = nn.Parameter(torch.ones(3, 2))
    net.b = nn.Parameter(torch.ones(2))
    net.lin = nn.Linear(2, 2)
    decay = WeightDecay(net.named_parameters(), 1e-3, granularity="per_layer")
    assert decay.slot_names == ["w", "b", "lin"]
    per_element = WeightDecay(net.named_parameters(), 1e-3, granularity="per_element")
    assert per_element.layer_names == ["w", "b", "lin"]


@pytest.mark.parametrize(
    "granularity, slots",
    [
        ("global", ["all"]),
        ("per_group", ["optimizer0/group0"]),
        ("per_tensor", ["w1", "b1", "hidden.0", "hidden.1", "out.w"]),
    ],
)
def test_other_granularities_are_unchanged(granularity, slots):
    decay = WeightDecay(
        [(n, p, "optimizer0/group0") for n, p in RawMLP().named_parameters()],
        1e-3,
        granularity=granularity,
    )
    assert decay.slot_names == slots


def test_a_cosine_heads_scale_gets_its_own_lambda_and_the_class_vectors_are_held():
    """The class vectors' loss does not see their scale (F.normalize): on a slot of their own
    the invariance probe holds their λ; the logit scale's λ is learned. Shared ("(root)"), both
    were probed together, not invariant, and one λ learned for both."""
    cb = _decay()
    _fit(cb, CosineHead(), epochs=2)
    assert cb.slot_names == ["classes", "log_s", "trunk"]  # the module's own tensors first
    assert cb.invariant_groups == {"classes": True, "log_s": False, "trunk": False}
    lam = {k: float(v) for k, v in cb.learned_weight_decay.items()}
    assert lam["classes"] == pytest.approx(1e-3, rel=1e-6)  # held
    assert abs(math.log(lam["log_s"] / 1e-3)) > 0.01  # learned


def _fit_and_save(model: pl.LightningModule, path: Any) -> tuple[LearnedWeightDecay, str]:
    cb = _decay()
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = trainer([cb], max_epochs=1)
        tr.fit(model, *_loaders())
        tr.save_checkpoint(str(path))
    return cb, str(path)


def _resume(model: pl.LightningModule, path: str) -> tuple[LearnedWeightDecay, pl.LightningModule]:
    cb = _decay()
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=2).fit(model, *_loaders(), ckpt_path=path)
    return cb, model


def test_an_old_checkpoint_whose_shared_slot_held_several_tensors_is_refused(tmp_path, monkeypatch):
    """classes and log_s shared "(root)": 2 slots saved, 3 here; read slot by slot, log_s would
    get trunk's λ, or the load fail on the shapes. Refused, naming the split and the way on."""
    with monkeypatch.context() as m:
        _as_before_session_63(m)
        old, path = _fit_and_save(CosineHead(), tmp_path / "old.ckpt")
    assert old.slot_names == ["(root)", "trunk"]
    with pytest.raises(ConfigurationError) as err:
        _resume(CosineHead(), path)
    said = str(err.value)
    assert "written by an earlier version" in said
    assert "'(root)' → classes, log_s" in said
    assert "start a new fit" in said


def test_an_old_checkpoint_whose_shared_slot_held_one_tensor_resumes_as_a_new_one(
    tmp_path, monkeypatch
):
    """log_t alone was "(root)": the same λ slot by slot, renamed. The resumed fit is the one
    resumed from this version's checkpoint, bit for bit, and reads back under the new name."""
    with monkeypatch.context() as m:
        _as_before_session_63(m)
        old, old_path = _fit_and_save(Tempered(), tmp_path / "old.ckpt")
    assert old.slot_names == ["(root)", "net"]
    new, new_path = _fit_and_save(Tempered(), tmp_path / "new.ckpt")
    assert new.slot_names == ["log_t", "net"]
    assert torch.equal(old.rho[0], new.rho[0])  # the same fit, another name
    from_old, m_old = _resume(Tempered(), old_path)
    from_new, m_new = _resume(Tempered(), new_path)
    assert from_old.sid.hyper_step == from_new.sid.hyper_step > old.sid.hyper_step
    assert torch.equal(from_old.rho[0], from_new.rho[0])
    for a, b in zip(m_old.parameters(), m_new.parameters()):
        assert torch.equal(a, b)
    assert sorted(from_old.learned_weight_decay) == ["log_t", "net"]
    assert from_old.effective_weight_decay == from_new.effective_weight_decay
    assert sorted(from_old.effective_weight_decay) == ["log_t", "net"]
