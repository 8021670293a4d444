"""Careless users, session 57: states loaded into hyperparameters of another order, λ₀ applied
as the user wrote it, the class gauge left unheld, fits that trained nothing, validation rows
that are training rows under another TensorDataset.

Each case failed before its fix (silently wrong); the controls passed before and after. See
docs/failures.md, "Session 57: careless inputs".
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import TOY_X, TOY_Y, ToyClassifier, toy_val, trainer
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core import FeasibleSet, SampleWeights

X, Y = TOY_X, TOY_Y
f64 = torch.float64


def _fit(
    cb: Any, model: pl.LightningModule, train: Any, ckpt_path: Any = None, **kw: Any
) -> pl.Trainer:
    kw.setdefault("max_epochs", 2)
    fitter = trainer([cb], **kw)
    fitter.fit(model, train, toy_val(), ckpt_path=ckpt_path)
    return fitter


def _said(caught: list[Any], text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


# ---------------------------------------------------------------- (a) states in another order
class _TwoLambdas(torch.nn.Module):
    """w and two λ of the same shape, registered in ``order``."""

    def __init__(self, order: tuple[str, str]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4, dtype=f64))
        for name in order:
            setattr(self, name, torch.nn.Parameter(torch.zeros(2, dtype=f64)))


def _two_lambda_ridge(order: tuple[str, str]) -> SIDHyperOptimizer:
    """λ_a decays w[:2], λ_b w[2:]; the hyperparameter list follows the module's order."""
    m = _TwoLambdas(order)
    g = torch.Generator().manual_seed(0)
    Xd, yd = torch.randn(100, 4, generator=g, dtype=f64), torch.randn(100, generator=g, dtype=f64)

    def fit(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ m.w - b[1]) ** 2).mean()

    def inner(b: Any) -> Tensor:
        lam = torch.cat([m.a.exp(), m.b.exp()])
        return fit(b) + 0.5 * (lam * m.w**2).sum()

    hyper = [getattr(m, n) for n in order]
    hopt = SIDHyperOptimizer(
        hyper, [m.w], inner, fit, torch.optim.Adam(hyper, lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3), module=m,
    )  # fmt: skip
    hopt.batches = [(Xd[i : i + 20], yd[i : i + 20]) for i in range(0, 80, 20)]  # type: ignore[attr-defined]
    hopt.val = (Xd[80:], yd[80:])  # type: ignore[attr-defined]
    return hopt


def test_a_state_loaded_into_hyperparameters_of_another_order_is_refused():
    """Before: λ of equal shapes given in another order (a module whose hyperparameters are
    declared in another order) took each other's saved values, silently. Now the state names
    them (where ``module=`` holds them) and such a load is refused, naming both orders."""
    saved = _two_lambda_ridge(("a", "b"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            saved.step(saved.batches, saved.val)  # type: ignore[attr-defined]
    state = saved.state_dict()
    assert state["hyperparameter_names"] == ["a", "b"]
    other = _two_lambda_ridge(("b", "a"))
    before = [h.detach().clone() for h in other.hyperparameters]
    with pytest.raises(ConfigurationError, match="in another order"):
        other.load_state_dict(state)
    assert all(torch.equal(h, b) for h, b in zip(other.hyperparameters, before))
    same = _two_lambda_ridge(("a", "b"))  # control: the same order loads
    same.load_state_dict(state)
    assert torch.equal(same.hyperparameters[0], saved.hyperparameters[0])


class _Layers(pl.LightningModule):
    """Two 16×16 layers between an input and an output layer, declared a-then-b or b-then-a
    (the same names: the weights load either way)."""

    def __init__(self, b_first: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.i, self.o = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)
        if b_first:
            self.b, self.a = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        else:
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        h = torch.tanh(self.b(torch.tanh(self.a(torch.tanh(self.i(batch[0]))))))
        return F.cross_entropy(self.o(h), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_decay_resumed_into_layers_declared_in_another_order_is_refused(tmp_path):
    """Before: the per-layer λ are one slot vector in ``named_parameters()`` order; a model
    declaring the same layers in another order loaded its weights by name and its λ by
    position: layer a read layer b's λ, silently. Now the checkpoint names the slots."""
    train = DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        fitter = _fit(cb, _Layers(), train)
        fitter.save_checkpoint(tmp_path / "ab.ckpt")
        resumed = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        with pytest.raises(ConfigurationError, match="declared in another order"):
            _fit(resumed, _Layers(b_first=True), train, max_epochs=3,
                 ckpt_path=tmp_path / "ab.ckpt")  # fmt: skip
        control = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        _fit(control, _Layers(), train, max_epochs=3, ckpt_path=tmp_path / "ab.ckpt")


# ---------------------------------------------------------------- (b) λ₀ as written
class _OwnDecay(ToyClassifier):
    def __init__(self, decay: float) -> None:
        super().__init__()
        self.decay = decay

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.decay)


@pytest.mark.parametrize("decay", [0.05, 3e-4])
def test_a_held_initial_decay_trains_as_the_optimizers_own(decay):
    """Before: ``LearnedWeightDecay(x)`` applied exp(log x) in float32 (0.05 → 0.049999997),
    so with λ held its weights were not ``SGD(weight_decay=x)``'s (6e-8 apart after 3 epochs,
    more in a chaotic fit). Now a slot still at ρ₀ applies x itself: bit for bit."""
    train = lambda: DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ToyClassifier()
        _fit(LearnedWeightDecay(decay, start_step=10**6, max_overhead=None), model, train(),
             max_epochs=3)  # fmt: skip
        own = _OwnDecay(decay)
        trainer([], max_epochs=3).fit(own, train(), toy_val())
    for p, q in zip(model.parameters(), own.parameters()):
        assert torch.equal(p, q)


# ---------------------------------------------------------------- (c) the class gauge
@pytest.mark.parametrize("projected", [True, False])
def test_a_class_gauge_left_unheld_is_said(projected):
    """``weights.use_class_gauge(labels)`` under ``SIDHyperOptimizer`` without
    ``FeasibleSet(project=weights.projection)``. Before: class 0's mean logit drifted to −0.59
    in 3 steps (the gauge asked for silently not held). With the projection: nothing said."""
    torch.manual_seed(0)
    n = 40
    Xs = torch.randn(n, 3)
    y = (Xs[:, 0] > 0).long()
    y[:8] = 1 - y[:8]
    model = torch.nn.Linear(3, 2)
    weights = SampleWeights(n)
    weights.use_class_gauge(lambda: y)
    batches = [(torch.arange(i, i + 10), (Xs[i : i + 10], y[i : i + 10])) for i in range(0, n, 10)]

    def inner(b: Any) -> Tensor:
        index, (xb, yb) = b
        return weights.weighted_mean(F.cross_entropy(model(xb), yb, reduction="none"), index)

    feasible = FeasibleSet(project=weights.projection) if projected else FeasibleSet()
    hopt = SIDHyperOptimizer(
        weights.hyperparameters, model.parameters(), inner,
        lambda b: F.cross_entropy(model(b[0]), b[1]),
        torch.optim.Adam(weights.hyperparameters, lr=0.5),
        config=SIDConfig(inner_steps=3, adjoint_steps=3, feasible_set=feasible),
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            hopt.step(batches, (Xs, y))
    assert len(_said(caught, "the gauge is held by weights.projection")) == (0 if projected else 1)


# ---------------------------------------------------------------- fits that trained nothing
@pytest.mark.parametrize(
    "make, loader, settings",
    [
        (
            lambda: LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None),
            lambda: DataLoader(
                IndexedDataset(TensorDataset(X[60:70], Y[60:70])), batch_size=16, drop_last=True
            ),
            {},
        ),
        (
            lambda: LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None),
            lambda: DataLoader(TensorDataset(X[60:], Y[60:]), batch_size=16),
            {"limit_train_batches": 0},
        ),
    ],
    ids=["drop_last-over-a-tiny-set", "limit_train_batches-0"],
)
def test_a_fit_whose_training_loader_gave_no_batch_is_said(make, loader, settings):
    """Before: Lightning logged "No training batches" and the read-outs gave λ₀ or an empty
    tensor of data weights, without a word from the callback."""
    cb = make()
    model = ToyClassifier("none" if isinstance(cb, LearnedDataWeights) else "mean")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(cb, model, loader(), **settings)
    assert len(_said(caught, "this fit ran no training step")) == 1


# ---------------------------------------------------------------- validation rows = training rows
@pytest.mark.parametrize(
    "rows, shared",
    [(torch.arange(30, 200), 30), (torch.arange(199, 29, -1), 30), (torch.arange(60, 200), 0)],
    ids=["overlapping-slices", "overlapping-index-split", "control-disjoint"],
)
def test_validation_rows_a_training_tensordataset_holds_too_are_said(rows, shared):
    """``TensorDataset(X[30:])`` for training and ``TensorDataset(X[:60])`` for validation
    (an off-by-one split; or an index split): two data sets of other content. Before: not
    compared, half the validation rows were training rows without a word (λ 2e-5 where held-out
    data gave 5e-5)."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    train = DataLoader(TensorDataset(X[rows], Y[rows]), batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(cb, ToyClassifier(), train, max_epochs=1)
    said = _said(caught, "validation examples are training examples too")
    assert said == ([] if shared == 0 else said[:1]) and len(said) == (shared > 0)
    if shared:
        assert said[0].startswith(f"LearnedWeightDecay: {shared} of the 60")


# ---------------------------------------------------------------- constructor values
def test_a_whole_float_class_count_is_named_as_the_integer_to_pass():
    """``num_classes=3.0`` (read from a config, or ``y.max() + 1.0``). Before: "needs
    num_classes ≥ 2, got 3.0", which 3.0 seems to meet."""
    with pytest.raises(
        ConfigurationError, match=r"an integer ≥ 2 .* got 3.0: pass num_classes=3\."
    ):
        LearnedDataWeights(per="class", num_classes=3.0)


@pytest.mark.parametrize("drop_in", [LearnedWeightDecay, LearnedDataWeights])
def test_a_budget_written_as_a_percentage_is_said(drop_in):
    """``max_overhead=50`` meant as 50 %. Before: taken as 50× the training's compute (no
    budget in effect), without a word. Now said, naming max_overhead=0.5; 2 (200 %) is not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drop_in(max_overhead=50)
        drop_in(max_overhead=2)
    said = _said(caught, "it is a fraction")
    assert said and all("Pass max_overhead=0.5 if you meant 50 %" in s for s in said)


# ---------------------------------------------------------------- the core: validation = training
@pytest.mark.parametrize(
    "val, said",
    [("first-batch", True), ("overlapping-slice", True), ("held-out", False)],
)
def test_a_validation_batch_of_training_rows_is_said_by_the_core(val, said):
    """``hopt.step(batches, batches[0])``, or validation rows sliced so that they overlap the
    training slices. Before: λ tuned on the fit to training rows, without a word; held-out
    rows (``X[160:]``) say nothing."""
    g = torch.Generator().manual_seed(0)
    Xd, yd = torch.randn(200, 5, generator=g, dtype=f64), torch.randn(200, generator=g, dtype=f64)
    batches = [(Xd[i : i + 20], yd[i : i + 20]) for i in range(0, 160, 20)]
    val_batch = {
        "first-batch": batches[0],
        "overlapping-slice": (Xd[140:], yd[140:]),
        "held-out": (Xd[160:], yd[160:]),
    }[val]
    w = torch.zeros(5, dtype=f64, requires_grad=True)
    log_lam = torch.zeros(5, dtype=f64, requires_grad=True)

    def fit(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    hopt = SIDHyperOptimizer(
        [log_lam], [w], lambda b: fit(b) + 0.5 * (log_lam.exp() * w**2).sum(), fit,
        torch.optim.Adam([log_lam], lr=0.1), config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hopt.step(batches, val_batch)
        hopt.step(batches, val_batch)
    assert len(_said(caught, "validation batch shares memory")) == int(said)
