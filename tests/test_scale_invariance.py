"""Scale-invariant weight groups (BatchNorm after a layer): detection and the ``invariant=`` rule.

Oracles: a group the loss provably does not see the size of (weights normalised before use)
and one it does (a plain linear model); Euler's identities ⟨∇ℓ, w⟩ = 0 and ∇²ℓ·w = −∇ℓ on a
Linear → BatchNorm network in float64 (why the implicit hypergradient of such a group has no
first-order signal); then a small real CNN with BatchNorm in Lightning.
"""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    HoldInvariant,
    InvariantRule,
    LearnedWeightDecay,
    LearnInvariant,
    WeightDecay,
    scale_invariant,
)
from hypertorch_sid.lightning.weight_decay import scale_invariant_slots

f64 = torch.float64


# ====================================================================== core probe
def test_probe_fires_on_a_normalised_group_and_not_on_a_linear_model():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(20, 5, generator=g, dtype=f64), torch.randn(20, generator=g, dtype=f64)
    w = torch.randn(5, generator=g, dtype=f64)
    before = w.clone()

    def normalised() -> torch.Tensor:  # ℓ(w) = mean (X w/‖w‖ − y)²: 0-homogeneous in w
        return ((X @ (w / w.norm()) - y) ** 2).mean()

    def linear() -> torch.Tensor:
        return ((X @ w - y) ** 2).mean()

    assert scale_invariant(normalised, [w])
    assert not scale_invariant(linear, [w])
    assert torch.equal(w, before)  # scaled by ½ and 2 and back: bit for bit


def test_probe_refuses_bad_input():
    with pytest.raises(ConfigurationError, match="at least one tensor"):
        scale_invariant(lambda: torch.zeros(()), [])
    with pytest.raises(ConfigurationError, match="rtol"):
        scale_invariant(lambda: torch.zeros(()), [torch.ones(2)], rtol=0.0)


def test_euler_identities_on_linear_then_batchnorm_float64():
    """ℓ 0-homogeneous in the first layer (BatchNorm follows it, train mode): the gradient is
    orthogonal to w and ∇²ℓ·w = −∇ℓ, so ⟨w, v⟩ of the adjoint sees w only through ∇ℓ.
    BatchNorm's ε = 1e-30 here: with ε the identities hold to about ε/σ² (7e-6 relative at 1e-5)."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 6, dtype=f64)
    bn = nn.BatchNorm1d(6, eps=1e-30, dtype=f64)
    head = nn.Linear(6, 3, dtype=f64)
    x, y = torch.randn(32, 4, dtype=f64), torch.randint(0, 3, (32,))
    params = [lin.weight, lin.bias]

    def loss() -> torch.Tensor:
        return F.cross_entropy(head(torch.tanh(bn(lin(x)))), y)

    g = torch.autograd.grad(loss(), params, create_graph=True)
    dot = sum((gi * p).sum() for gi, p in zip(g, params))
    scale = sum(float(gi.detach().norm() * p.detach().norm()) for gi, p in zip(g, params))
    assert abs(float(dot.detach())) < 1e-12 * scale
    hw = torch.autograd.grad(dot, params)  # ∇(⟨∇ℓ, w⟩) = H w + ∇ℓ
    hw = [h - gi.detach() for h, gi in zip(hw, g)]  # H w
    for h, gi in zip(hw, g):
        torch.testing.assert_close(h, -gi.detach(), rtol=1e-8, atol=1e-12)
    with torch.no_grad():
        assert scale_invariant(loss, params, rtol=1e-9)
        assert not scale_invariant(loss, [head.weight, head.bias])


def test_mask_follows_the_learned_tensors():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    per_layer = WeightDecay(net.named_parameters(), 1e-3, granularity="per_layer")
    assert per_layer.group_names() == ["0", "2"]
    (m,) = per_layer.mask([True, False])
    assert m.tolist() == [1.0, 0.0]
    for elements in ("tied", "untied"):
        d = WeightDecay(net.named_parameters(), 1e-3, "per_element", elements=elements)
        masks = d.mask([False, True])
        assert [mk.shape for mk in masks] == [h.shape for h in d.hyperparameters]
        flat = {e.name: masks[-len(d.entries) + i] for i, e in enumerate(d.entries)}
        assert float(flat["0.weight"].max()) == 0.0 and float(flat["2.bias"].min()) == 1.0
    with pytest.raises(ConfigurationError, match="2 groups"):
        per_layer.mask([True])


def test_rules():
    g, m = [torch.tensor([1.0, 2.0])], [torch.tensor([1.0, 0.0])]
    assert HoldInvariant().adjust(g, m)[0].tolist() == [0.0, 2.0]
    assert LearnInvariant().adjust(g, m)[0].tolist() == [1.0, 2.0]
    assert not LearnInvariant().probes and HoldInvariant().probes
    with pytest.raises(ConfigurationError, match="'implicit', 'held'"):
        LearnedWeightDecay(invariant="frozen")


# ====================================================================== a real CNN + BatchNorm
class CNN(pl.LightningModule):
    """conv → BN → ReLU → pool → conv → BN → ReLU → pool → linear, on 8×8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(8 * 4, 10),
        )  # fmt: skip

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


#: conv1 and conv2 (BatchNorm follows), BN1 (ReLU, pooling and conv2 are positively
#: homogeneous, BN2 normalises again); BN2 and the linear output layer are seen by the loss
INVARIANT = {"net.1": True, "net.2": True, "net.5": True, "net.6": False, "net.10": False}


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(256, 64, generator=g)
    y = (X[:, :10].argmax(1) + (X[:, 10] > 0)) % 10
    return X, y


def _fit(invariant):
    X, y = _data()
    pl.seed_everything(0, verbose=False)
    model = CNN()
    cb = LearnedWeightDecay(1e-3, invariant=invariant, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(callbacks=[cb], max_epochs=2).fit(
            model,
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    return model, cb


def test_probe_on_a_cnn_leaves_the_module_as_it_was():
    X, y = _data()
    torch.manual_seed(0)
    model = CNN()
    decay = WeightDecay(model.named_parameters(), 1e-3, granularity="per_layer")

    class Problem:
        def __init__(self):
            self.decay = decay

        def data_loss(self, module, batch, which):
            return module.training_step(batch, 0)

    model.eval()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    weights = {k: v.clone() for k, v in model.named_parameters()}
    found = scale_invariant_slots(Problem(), model, (X[:64], y[:64]))
    assert found == INVARIANT
    assert not model.training  # flags back
    for k, v in model.named_buffers():
        assert torch.equal(v, buffers[k]), k  # running statistics untouched
    for k, v in model.named_parameters():
        assert torch.equal(v, weights[k]), k


class _Counted:
    """A problem whose training loss records the batch sizes it was called on; ``refuse``: a
    training_step that fails on any batch but the full one (a time-first sequence batch whose
    dim 0 is not its samples')."""

    def __init__(self, decay, refuse=False):
        self.decay, self.sizes, self.refuse = decay, [], refuse

    def data_loss(self, module, batch, which):
        self.sizes.append(len(batch[0]))
        if self.refuse and len(batch[0]) != 64:
            raise RuntimeError("shape mismatch")
        return module.training_step(batch, 0)


@pytest.mark.parametrize("refuse", [False, True])
def test_probe_reads_a_few_samples_and_one_base_loss(refuse):
    """The probe reads the first PROBE_SAMPLES samples (falls back to the whole batch where
    they cannot be cut off), one base loss for every slot; the answer is the full batch's."""
    from hypertorch_sid.lightning.invariance import PROBE_SAMPLES

    X, y = _data()
    torch.manual_seed(0)
    model = CNN()
    problem = _Counted(WeightDecay(model.named_parameters(), 1e-3, granularity="per_layer"), refuse)
    assert scale_invariant_slots(problem, model, (X[:64], y[:64])) == INVARIANT
    probed = problem.sizes[1:] if refuse else problem.sizes  # refused: the 16-sample try
    assert set(probed) == ({64} if refuse else {PROBE_SAMPLES})
    # base once, then per slot: 2 scalings (+ 2 random moves where both pass), early exit
    invariant, plain = sum(INVARIANT.values()), len(INVARIANT) - sum(INVARIANT.values())
    assert len(probed) <= 1 + 4 * invariant + 2 * plain


def test_held_rule_keeps_invariant_layers_and_learns_the_others():
    _, cb = _fit("held")
    assert cb.invariant_groups == INVARIANT
    lam = {k.rpartition(".")[0]: float(v.mean()) for k, v in cb.decay_values().items()}
    assert cb.sid is not None and cb.sid.hyper_step >= 3
    for layer, invariant in INVARIANT.items():
        if invariant:
            assert lam[layer] == pytest.approx(1e-3, rel=1e-6), layer
        else:
            assert lam[layer] != pytest.approx(1e-3, rel=1e-3), layer


def test_default_rule_does_not_probe():
    _, cb = _fit("implicit")
    assert cb.invariant_groups is None
    moved = [float(v.mean()) for v in cb.decay_values().values()]
    assert all(v != pytest.approx(1e-3, rel=1e-3) for v in moved)
    assert all(math.isfinite(v) and v > 0 for v in moved)


# ====================================================================== the floor: min_weight_decay
def test_floor_on_every_granularity_and_the_upper_bound_wins():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    for granularity, elements in (("global", "tied"), ("per_layer", "tied"),
                                  ("per_element", "tied"), ("per_element", "untied")):  # fmt: skip
        d = WeightDecay(net.named_parameters(), 1e-5, granularity, elements=elements)
        d.floor(1e-3)
        assert float(d.summary().min()) == pytest.approx(1e-3, rel=1e-6), granularity
        d.floor(1.0)
        d.project([0.5] * len(d.entries))  # the stability cap below the floor: the cap wins
        assert float(d.summary().max()) == pytest.approx(0.5, rel=1e-6), granularity
    for bad in (-1e-4, float("nan"), True, "1e-4"):
        with pytest.raises(ConfigurationError, match="min_weight_decay"):
            LearnedWeightDecay(1e-4, min_weight_decay=bad)


class PushDown(InvariantRule):
    """A rule that replaces every hypergradient by +1: the outer step lowers every λ."""

    probes = False

    def adjust(self, hypergrad, invariant):
        return [torch.ones_like(g) for g in hypergrad]


def _fit_down(**kwargs):
    X, y = _data()
    pl.seed_everything(0, verbose=False)
    cb = LearnedWeightDecay(
        1e-3, invariant=PushDown(), every_n_steps=4, max_overhead=None, **kwargs
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(callbacks=[cb], max_epochs=2).fit(
            CNN(),
            DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64),
        )
    assert cb.sid is not None and cb.sid.hyper_step >= 3
    return torch.stack([v.mean() for v in cb.decay_values().values()])


def test_floor_holds_in_a_fit_where_lambda_falls():
    """Pushed down at every hyper step, λ falls below half its initial value; with
    min_weight_decay at the initial value it stays there."""
    assert float(_fit_down().max()) < 0.5e-3
    floored = _fit_down(min_weight_decay=1e-3)
    torch.testing.assert_close(floored, torch.full_like(floored, 1e-3), rtol=1e-6, atol=0)
    with pytest.raises(ConfigurationError, match="min_weight_decay"):
        LearnedWeightDecay(1e-4, min_weight_decay=1e-3)  # the floor above the initial λ
