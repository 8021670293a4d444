"""Session 64's unseen recipes for the weight decay: each test fails without its fix, but the
controls (docs/failures.md, "Round 18 of user recipes, weight decay (session 64)"; the recipes:
benchmarks/bench_user_recipes_s64w.py)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.lightning.optimizer_decay import stepping

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_user_recipes_s64w import Lookahead  # noqa: E402

#: hyper steps held off: λ stays at λ₀, so a decay arm must train as the optimizer's own decay
NEVER = 10**6


def _blobs(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Four Gaussian blobs in 2 of 8 features (the rest noise), labels 0–3."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centres = torch.tensor([[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0]])
    x = torch.cat(
        [centres[y] + 0.8 * torch.randn(n, 2, generator=g), torch.randn(n, 6, generator=g)], 1
    )
    return x, y


class Net(pl.LightningModule):
    """A small MLP on the blobs; ``optimizer(params, wd)`` builds its optimizer."""

    def __init__(
        self, optimizer: Any, wd: float = 0.0, criterion: Any = None, linear: bool = False
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = (
            nn.Linear(8, 4)
            if linear
            else nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        )
        self.optimizer, self.wd = optimizer, wd
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return self.criterion(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters(), self.wd)


def _fit(model: pl.LightningModule, callbacks: list, epochs: int = 4) -> list[str]:
    """Fit ``model`` on the blobs; the warnings it gave."""
    x, y = _blobs(256, 0)
    xv, yv = _blobs(128, 1)
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(xv, yv), batch_size=64)
    trainer = pl.Trainer(
        max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        num_sanity_val_steps=0,
    )  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train, val)
    return [str(w.message) for w in caught]


def _weights(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _lookahead_sgd(params: Any, wd: float) -> torch.optim.Optimizer:
    return Lookahead(torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=wd))


class HookedLookahead(torch.optim.Optimizer):
    """A Lookahead that calls ``Optimizer.__init__``: its step runs torch's hooks already."""

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5) -> None:
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.optimizer, self.k, self.alpha = optimizer, k, alpha
        self.param_groups = optimizer.param_groups
        self.slow = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
        self.count = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = self.optimizer.step(closure)
        self.count += 1
        if self.count % self.k == 0:
            for group, slow in zip(self.param_groups, self.slow):
                for p, q in zip(group["params"], slow):
                    q.add_(p - q, alpha=self.alpha)
                    p.copy_(q)
        return loss


def test_a_lookahead_wrapper_trains_with_the_learned_decay() -> None:
    """``lookahead_mnist``: a Lookahead that skips ``Optimizer.__init__`` (as widely copied)
    stepped past torch's step hooks, so the decay was never applied: λ rose to 25 and the
    weights came out as without decay, bit for bit. With λ held at λ₀ the decay arm must train
    as the wrapped SGD's own ``weight_decay=`` does."""
    wd = 0.05
    step = Lookahead.step
    own, none, learned = (Net(_lookahead_sgd, w) for w in (wd, 0.0, 0.0))
    _fit(own, [])
    _fit(none, [])
    _fit(learned, [LearnedWeightDecay(wd, every_n_steps=NEVER)])
    effect = float((_weights(own) - _weights(none)).norm())
    assert effect > 0.1
    assert float((_weights(learned) - _weights(own)).norm()) < 1e-3 * effect
    # only the fit's optimizer object was given torch's wrap: the user's class, and another
    # object of it stepped outside any fit, are as they were
    assert Lookahead.step is step
    layer = nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().backward()
    _lookahead_sgd(layer.parameters(), 0.0).step()


def test_lookaheads_adamw_is_read_for_its_preconditioner() -> None:
    """``lookahead_mnist`` with ``decoupled=True``: "the training's fixed point under
    Lookahead's decoupled decay … this callback reads only for SGD and Adam / AdamW …; here it
    takes P = 1" about a Lookahead over AdamW. The wrapped optimizer is read, ``self.optimizer``
    (this one) as SAM's ``base_optimizer`` was."""
    adamw = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=1e-3, weight_decay=0)
    assert stepping(Lookahead(adamw)) is adamw
    model = Net(lambda p, wd: Lookahead(torch.optim.AdamW(p, lr=1e-2, weight_decay=wd)))
    said = _fit(model, [LearnedWeightDecay(0.01, decoupled=True, every_n_steps=NEVER)], 1)
    assert not [w for w in said if "P = 1" in w], said


def test_control_a_wrapper_whose_step_runs_the_hooks_is_decayed_once() -> None:
    """Control: a Lookahead that calls ``Optimizer.__init__`` was decayed before (its step
    runs the hooks; its inner SGD's step, not the Trainer's optimizer, is left alone): once,
    as its own decay, and its class's step is not wrapped again."""
    wd = 0.05
    HookedLookahead(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    step = HookedLookahead.step  # as torch's Optimizer.__init__ wrapped it

    def make(params: Any, w: float) -> torch.optim.Optimizer:
        return HookedLookahead(torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=w))

    own, learned = Net(make, wd), Net(make, 0.0)
    _fit(own, [])
    _fit(learned, [LearnedWeightDecay(wd, every_n_steps=NEVER)])
    assert HookedLookahead.step is step
    assert float((_weights(learned) - _weights(own)).norm()) < 1e-5


def _sgd(params: Any, wd: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.2, momentum=0.9, weight_decay=wd)


def test_a_linear_svm_trains_with_the_learned_decay() -> None:
    """``svm_news``: ``nn.MultiMarginLoss`` (a multi-class SVM's hinge) was refused at the first
    hyper step, "derivative for aten::multi_margin_loss_backward is not implemented … Replace
    that operation, or freeze the parameters": nothing to freeze. The hyper steps now compute it
    by its twice-differentiable form, and λ is learned."""
    model = Net(_sgd, criterion=nn.MultiMarginLoss(), linear=True)
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    said = _fit(model, [cb], 3)
    assert len(cb.history) >= 5
    assert any(abs(float(v.mean()) - 1e-3) > 1e-5 for v in cb.learned_weight_decay.values())
    # a linear hinge has no curvature of its own: α = 1/λ, and the warning that one step moves
    # the trained w far names that cause, not only "start the hyper steps later"
    far = [w for w in said if "far from a fixed point" in w]
    assert far and "α = 1e+03" in far[0] and "hinge" in far[0], far


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_twice_differentiable_margin_loss_is_torchs(p: int, reduction: str) -> None:
    """The form the hyper steps compute has torch's values and gradient (weights, margin and a
    single unbatched row included), and a second derivative."""
    from hypertorch_sid.core.second_order import multi_margin_loss  # new in session 64

    torch.manual_seed(0)
    x = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    y, w = torch.randint(0, 5, (9,)), torch.rand(5, dtype=torch.float64)
    for kw in ({}, {"margin": 0.5, "weight": w}):
        ours = multi_margin_loss(x, y, p=p, reduction=reduction, **kw)
        theirs = F.multi_margin_loss(x, y, p=p, reduction=reduction, **kw)
        torch.testing.assert_close(ours, theirs)
        (g_ours,) = torch.autograd.grad(ours.sum(), x, create_graph=True)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
        torch.testing.assert_close(g_ours, g_theirs)
    (hvp,) = torch.autograd.grad((g_ours * x).sum(), x)  # twice differentiable
    assert torch.isfinite(hvp).all()
    row = x[0].detach()
    torch.testing.assert_close(multi_margin_loss(row, y[:1]), F.multi_margin_loss(row, y[:1]))


class FunctionalHinge(nn.Module):
    def forward(self, out: Tensor, y: Tensor) -> Tensor:
        return F.multi_margin_loss(out, y)


def test_the_functional_margin_loss_trains_under_the_decay() -> None:
    """``F.multi_margin_loss`` called directly (no layer the module holds) was refused with
    "Replace that operation, or freeze the parameters"; the hyper step that meets it is run
    again with it computed twice differentiably, and λ gets finite hypergradients."""
    model = Net(_sgd, criterion=FunctionalHinge())
    decay = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    _fit(model, [decay], 2)
    lam = torch.stack([v.detach().reshape(()) for v in decay.learned_weight_decay.values()])
    assert torch.isfinite(lam).all()
    assert not torch.allclose(lam, torch.full_like(lam, 1e-3))


class CappedBag(pl.LightningModule):
    """``maxnorm_news`` in small: ``nn.Embedding(max_norm=1.0)`` averaged over the tokens, a
    linear head; Adam."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8, padding_idx=0, max_norm=1.0)
        self.head = nn.Linear(8, 4)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.emb(ids).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        ids, y = batch
        return F.cross_entropy(self(ids), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_an_embeddings_max_norm_is_named_as_what_edits_the_weight() -> None:
    """``maxnorm_news``: the rows ``nn.Embedding(max_norm=1.0)`` renorms in each forward were
    said as "a clamp_, a renorm_ or a re-initialisation in a hook or another callback?" — the
    user has none. Now the layer and its ``max_norm=`` are named, with the cap in forward."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (128,), generator=g)
    ids = torch.randint(1, 50, (128, 6), generator=g)
    ids[:, 0] = 10 + y  # a token that tells the class
    data = DataLoader(TensorDataset(ids, y), batch_size=32, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[LearnedWeightDecay(1e-4, every_n_steps=1)], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", num_sanity_val_steps=0,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(CappedBag(), data, data)
    said = [str(w.message) for w in caught if "outside the optimizer" in str(w.message)]
    assert said and "emb (nn.Embedding(max_norm=1))" in said[0], said
    assert "in a hook or another callback" not in said[0]
    assert "F.embedding" in said[0]
