"""Session 58's leftovers of session 57: the step-size probe under manual optimisation with one
optimizer per layer, and a checkpoint's hyperparameters loaded by name.

* **The probe pools every optimizer of the batch.** Where the training optimizers give no
  reading of the step size, the callbacks measure η̂ = ⟨w_before − w_after, g⟩/‖g‖² on the
  update a hyper step follows. Session 57 measured the update of one optimizer, the batch's
  last; now each optimizer that steps in the batch is probed over its own step and the parts
  are pooled, Σ_o ⟨Δw_o, g_o⟩ / Σ_o ‖g_o‖² (SGD per layer, without momentum: Σ_o lr_o ‖g_o‖² /
  Σ_o ‖g_o‖², a closed form).
* **λ outside ``module=`` are matched by name.** A saved state named λ only where ``module=``
  held them; λ given otherwise (the Lightning drop-ins' λ and data weights, a core user's
  tensors) were matched by shape, and same-shaped λ in another order loaded into each other's
  places, silently. Now λ given as ``(name, tensor)`` pairs, or named in the outer optimizer
  (torch's named parameters), are named in the state, and so are the drop-ins'; a load whose
  names differ is refused; states without names (written before) load by position as before.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import LIGHTNING_NOISE
from test_hooks_ddp_resume_s57 import probed  # the η̂ of every hyper step
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

import hypertorch_sid.lightning.callback as callback_module
from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core.outer_step import ShrinkFallRprop

pytestmark = [*LIGHTNING_NOISE]

LRS = (0.1, 0.03, 0.01)  # one optimizer per layer, each its own learning rate
OPTIMIZERS = len(LRS)  # each makes 1/3 of the steps R counts: η̂ per step of R (eq. stepshare)


class PerLayer(pl.LightningModule):
    """A float64 tanh MLP of three layers under manual optimisation, one optimizer per layer
    (``kind``: SGD without momentum, or RMSprop) stepped in turn after one backward. Records,
    per batch and optimizer, ⟨w_before − w_after, g⟩ and ‖g‖² of the tensors it steps, g read
    after its step (the gradient the update used, the decay's λw included)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.automatic_optimization = False
        gen = torch.Generator().manual_seed(5)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=torch.float64) for a, b in ((4, 6), (6, 5), (5, 1))
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        self.kind = kind
        self.parts: list[list[tuple[float, float]]] = []  # per batch: (moved, ‖g‖²) per optimizer

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        h = torch.tanh(self.layers[1](torch.tanh(self.layers[0](x))))
        return 0.5 * ((self.layers[2](h).squeeze(-1) - y) ** 2).mean()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(self.loss(batch))
        parts = []
        for opt, layer in zip(opts, self.layers):
            before = [p.detach().clone() for p in layer.parameters()]
            opt.step()
            params = list(layer.parameters())
            moved = sum(float(((b - p.detach()) * p.grad).sum()) for b, p in zip(before, params))
            parts.append((moved, sum(float(p.grad.pow(2).sum()) for p in params)))
        self.parts.append(parts)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        if self.kind == "sgd":
            return [torch.optim.SGD(m.parameters(), lr=lr) for m, lr in zip(self.layers, LRS)]
        return [torch.optim.RMSprop(m.parameters(), lr=lr) for m, lr in zip(self.layers, LRS)]


def per_layer_loss(module: pl.LightningModule, batch: Any) -> Tensor:
    return PerLayer.loss(module, batch)


def loaders() -> tuple[DataLoader, DataLoader]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(80, 4, generator=gen, dtype=torch.float64)
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(80, generator=gen, dtype=torch.float64)
    train, val = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    return DataLoader(train, batch_size=16), DataLoader(val, batch_size=16)


def fit_per_layer(kind: str, every_n_steps: int) -> tuple[PerLayer, list[float | None], list[int]]:
    """Two epochs of 4 batches, 3 optimizer steps each; the η̂ of every hyper step and the
    batches (0-based) whose end ran one."""
    model = PerLayer(kind)
    decay = LearnedWeightDecay(
        1e-2, training_loss=per_layer_loss, every_n_steps=every_n_steps, max_overhead=None,
        adjoint_steps=2, seed=3, batch_size=16, val_batch_size=16,
    )  # fmt: skip
    eta = probed(decay)
    ends: list[int] = []
    run = decay._hyper_step

    def counted(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        ends.append(trainer.fit_loop.epoch_loop.total_batch_idx)
        run(trainer, pl_module)

    decay._hyper_step = counted  # type: ignore[method-assign]
    trainer = lightning_problems.trainer([decay], max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, *loaders())
    return model, eta, ends


def pooled(parts: list[tuple[float, float]]) -> float:
    return sum(m for m, _ in parts) / sum(g for _, g in parts)


def test_the_probe_pools_every_sgd_of_the_batch_in_closed_form(monkeypatch):
    """SGD per layer without momentum (lr 0.1, 0.03, 0.01), its reading from the optimizers
    withheld so the probe measures it: each hyper step's η̂ is Σ_o lr_o ‖g_o‖² / Σ_o ‖g_o‖² of
    its batch's gradients (rel 1e-9), per step of R: each optimizer makes a third of the fit's
    steps (eq. stepshare, session 61). Before, the probe measured the batch's last optimizer
    alone: η̂ = 0.01, its learning rate, at every hyper step."""
    monkeypatch.setattr(callback_module, "effective_step_size", lambda optimizers, share=None: None)
    model, eta, ends = fit_per_layer("sgd", every_n_steps=6)  # due at every second batch's end
    assert ends == [1, 3, 5, 7]
    for got, batch in zip(eta, ends):
        grads = [g for _, g in model.parts[batch]]
        closed = sum(lr * g for lr, g in zip(LRS, grads)) / sum(grads) / OPTIMIZERS
        assert got == pytest.approx(closed, rel=1e-9)
        assert got * OPTIMIZERS > 1.5 * LRS[-1]  # no longer the last optimizer's lr
    # the module's own measurement of each update agrees with the closed form (SGD: Δw = lr·g)
    for parts in model.parts:
        for (moved, g), lr in zip(parts, LRS):
            assert moved == pytest.approx(lr * g, rel=1e-9)


def test_the_probe_pools_every_rmsprop_of_the_batch():
    """RMSprop per layer (no reading of its step size: probed): each hyper step's η̂ is the
    batch's pooled update Σ_o ⟨Δw_o, g_o⟩ / Σ_o ‖g_o‖², every optimizer measured over its own
    step (rel 1e-9), per step of R (a third: eq. stepshare), not one optimizer's response; the
    layers' responses differ."""
    model, eta, ends = fit_per_layer("rmsprop", every_n_steps=6)
    assert ends == [1, 3, 5, 7]
    assert eta == pytest.approx([pooled(model.parts[b]) / OPTIMIZERS for b in ends], rel=1e-9)
    for batch in ends:
        responses = [m / g for m, g in model.parts[batch]]
        assert max(responses) > 1.5 * min(responses)
        assert all(abs(e * OPTIMIZERS - responses[-1]) > 1e-3 * e * OPTIMIZERS for e in eta)


def test_a_due_step_inside_the_batch_still_probes_the_whole_batch(monkeypatch):
    """``every_n_steps=4`` with 3 optimizer steps per batch: the hyper step runs at the batch
    ending on step 12 (batch 3, 0-based), whose due step is its last; the batches holding
    steps 4 and 8 (the first and second optimizer's) are probed in full too and the hyper
    step reads the latest, batch 3's pooled η̂."""
    monkeypatch.setattr(callback_module, "effective_step_size", lambda optimizers, share=None: None)
    model, eta, ends = fit_per_layer("sgd", every_n_steps=4)
    assert ends == [3, 7]
    for got, batch in zip(eta, ends):
        assert got == pytest.approx(pooled(model.parts[batch]) / OPTIMIZERS, rel=1e-9)


# ================================================================ λ matched by name (item 3)
F64 = torch.float64


def two_lambdas(order: tuple[str, str], named_by: str) -> SIDHyperOptimizer:
    """A ridge whose λ_a decays w[:2] and λ_b w[2:] (both of shape (1,), held by no module),
    given to the core in ``order`` and named by the caller's ``(name, tensor)`` pairs
    (``named_by="pairs"``), by the outer optimizer's named parameters (``"optimizer"``), or not
    at all (``"none"``)."""
    lam = {"a": torch.zeros(1, dtype=F64, requires_grad=True)}
    lam["b"] = torch.full((1,), 0.5, dtype=F64, requires_grad=True)
    w = torch.zeros(4, dtype=F64, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g, dtype=F64), torch.randn(100, generator=g, dtype=F64)

    def fit(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    def inner(b: Any) -> Tensor:
        decay = torch.cat([lam["a"].exp().expand(2), lam["b"].exp().expand(2)])
        return fit(b) + 0.5 * (decay * w**2).sum()

    pairs = [(n, lam[n]) for n in order]
    tensors = [t for _, t in pairs]
    outer = torch.optim.Adam(pairs if named_by == "optimizer" else tensors, lr=0.1)
    hopt = SIDHyperOptimizer(
        pairs if named_by == "pairs" else tensors, [w], inner, fit, outer,
        config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )  # fmt: skip
    hopt.batches = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 80, 20)]  # type: ignore[attr-defined]
    hopt.val = (x[80:], y[80:])  # type: ignore[attr-defined]
    return hopt


def stepped_state(named_by: str) -> dict[str, Any]:
    saved = two_lambdas(("a", "b"), named_by)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            saved.step(saved.batches, saved.val)  # type: ignore[attr-defined]
    return saved.state_dict()


@pytest.mark.parametrize("named_by", ["pairs", "optimizer"])
def test_same_shaped_lambdas_outside_a_module_loaded_in_another_order_are_refused(named_by):
    """Two λ of shape (1,) held by no module, saved in the order a, b and loaded into an
    optimizer given b, a: refused, naming both orders, nothing changed. Before: the state named
    no λ outside ``module=``; given by the outer optimizer, each took the other's value
    silently (given as pairs, the core took no pairs). The same order loads (control)."""
    state = stepped_state(named_by)
    assert state["hyperparameter_names"] == ["a", "b"]
    other = two_lambdas(("b", "a"), named_by)
    before = [h.detach().clone() for h in other.hyperparameters]
    with pytest.raises(ConfigurationError, match="in another order"):
        other.load_state_dict(state)
    assert all(torch.equal(h, b) for h, b in zip(other.hyperparameters, before))
    same = two_lambdas(("a", "b"), named_by)
    same.load_state_dict(state)
    assert [float(h) for h in same.hyperparameters] == [float(x) for x in state["hyperparameters"]]


@pytest.mark.parametrize("old", ["no names", "names None"])
def test_a_state_written_before_names_loads_by_position_as_before(old):
    """A state of today's main: λ outside a module unnamed (``[None, None]``), or older, the key
    absent: loads into a named optimizer of the same order, by position, as before."""
    state = stepped_state("none")
    assert state["hyperparameter_names"] == [None, None]
    if old == "no names":
        del state["hyperparameter_names"]
    named = two_lambdas(("a", "b"), "pairs")
    named.load_state_dict(state)
    assert [float(h) for h in named.hyperparameters] == [float(x) for x in state["hyperparameters"]]


def test_lambdas_named_twice_or_mixed_with_tensors_are_refused():
    """A name given twice, or pairs mixed with bare tensors: a clear error naming the fix."""
    a, b = (torch.zeros(1, dtype=F64, requires_grad=True) for _ in range(2))
    w = torch.zeros(2, dtype=F64, requires_grad=True)
    loss = lambda batch: (w**2).sum()  # noqa: E731
    with pytest.raises(ConfigurationError, match=r"names \['a'\] more than once"):
        SIDHyperOptimizer([("a", a), ("a", b)], [w], loss, loss)
    with pytest.raises(ConfigurationError, match="mixes tensors"):
        SIDHyperOptimizer([("a", a), b], [w], loss, loss)


class Toy(pl.LightningModule):
    """A 4-8-1 tanh regression (float64), SGD; ``per_sample`` gives the rows' losses."""

    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8, dtype=F64), torch.nn.Tanh(), torch.nn.Linear(8, 1, dtype=F64)
        )
        self.per_sample = per_sample

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        losses = 0.5 * (self.net(x).squeeze(-1) - y) ** 2
        return losses if self.per_sample else losses.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def toy_fit(callback: Any, per_sample: bool, epochs: int, ckpt: Any = None) -> pl.Trainer:
    train, val = loaders()
    if per_sample:
        train = DataLoader(IndexedDataset(train.dataset), batch_size=16)
    trainer = lightning_problems.trainer([callback], max_epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Toy(per_sample), train, val, ckpt_path=ckpt)
    return trainer


@pytest.mark.parametrize("granularity", ["per_layer", "per_element"])
def test_the_decays_checkpoint_names_its_lambdas_and_one_of_today_loads(tmp_path, granularity):
    """``LearnedWeightDecay``'s λ live in the callback, outside the module: its state names
    them now (per layer the slots' tensor; per element the layers' λ and each tensor's
    deviation). A checkpoint as today's main writes it (the names None) resumes: the resumed
    fit starts from its λ and ends where the uninterrupted one does."""
    kw = dict(granularity=granularity, every_n_steps=2, max_overhead=None, seed=1)
    if granularity == "per_layer":  # a 1-epoch fit continued to 2 is a longer plan: the step
        # that does not size itself by the hyper steps left (ReachRprop, the default, does)
        kw["outer_optimizer"] = functools.partial(ShrinkFallRprop, lr=0.3, step_sizes=(0.01, 2.0))
    first = LearnedWeightDecay(1e-2, **kw)
    trainer = toy_fit(first, False, 1)
    names = first.sid.state_dict()["hyperparameter_names"]
    expected = (
        ["λ[slots]"]
        if granularity == "per_layer"
        else ["λ[layers]", *(f"deviation[net.{i}.{t}]" for i in (0, 2) for t in ("weight", "bias"))]
    )
    assert names == expected
    path = tmp_path / "today.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    (state,) = [v for k, v in ckpt["callbacks"].items() if "LearnedWeightDecay" in k]
    state["sid"]["hyperparameter_names"] = [None] * len(names)  # as today's main writes it
    torch.save(ckpt, path)
    resumed = LearnedWeightDecay(1e-2, **kw)
    toy_fit(resumed, False, 2, ckpt=path)
    straight = LearnedWeightDecay(1e-2, **kw)
    toy_fit(straight, False, 2)
    assert len(resumed.history) == len(straight.history) == 4
    for got, want in zip(resumed.sid.hyperparameters, straight.sid.hyperparameters):
        assert torch.allclose(got, want, rtol=1e-9, atol=0)


def test_the_data_weights_checkpoint_names_its_weights():
    """``LearnedDataWeights``' logits live in the callback: named in its state."""
    weights = LearnedDataWeights(
        every_n_steps=2, start_step=0, max_overhead=None, seed=0, objective="mean_loss"
    )
    toy_fit(weights, True, 1)
    assert weights.sid.state_dict()["hyperparameter_names"] == ["logits"]
