"""Session 61: a fit whose optimizers step in turn counts each tensor's own steps (eq. stepshare).

R, the training steps left that the outer step's bound and the decay's shrink count on, is
Lightning's count of every optimizer's steps; a tensor moves only in its own optimizer's. Under
manual optimisation with two optimizers, each stepped once a batch, every tensor's ηR and its
decay's shrink over the rest of the fit were read twice over. The oracles are closed forms: SGD
with momentum μ moves a tensor by lr/(1 − μ) per unit of persistent force per own step, so coupled
decay λ removes 1 − exp(−λ·lr/(1 − μ)·n) of it over its n own steps left (eq. shrinkshare).
"""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay
from hypertorch_sid.core.horizon import effective_step_size
from hypertorch_sid.core.outer_step import shrink_share
from hypertorch_sid.lightning.training_length import StepShares

LAM = 1e-3
GAIN = {"encoder.0": 0.1 / (1 - 0.9), "head": 0.05}  # lr/(1 − μ) of each block's SGD


class Toggled(pl.LightningModule):
    """Two blocks, each by its own SGD, toggled and stepped in turn; the head every
    ``head_every``-th batch."""

    def __init__(self, head_every: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.head_every = head_every
        self.encoder = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.steps = {"encoder.0": 0, "head": 0}

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        enc, head = self.optimizers()
        stepped = [("encoder.0", enc)] + (
            [("head", head)] if batch_idx % self.head_every == 0 else []
        )
        for name, opt in stepped:
            self.toggle_optimizer(opt)
            loss = F.cross_entropy(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.untoggle_optimizer(opt)
            self.steps[name] += 1

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.encoder.parameters(), lr=0.1, momentum=0.9),
            torch.optim.SGD(self.head.parameters(), lr=0.05),
        )


class Watched(LearnedWeightDecay):
    """The drop-in, noting at each hyper step what its outer step is told: R, η, and per slot
    the share S of its weights the decay alone would remove over R (eq. shrinkshare), beside
    each block's own optimizer steps left (counted from the module's steps so far)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.seen: list[dict[str, Any]] = []

    def _observe_horizon(self, trainer: pl.Trainer) -> None:
        outer, got = self.sid.outer_optimizer, {}
        observe, shrink = outer.observe, outer.observe_shrink
        lams = dict(zip(self.problem.decay.slot_names, self.problem.decay.summary().tolist()))

        def told(left: int, eta: float) -> None:
            got.update(R=left, eta=eta)
            observe(left, eta)

        def told_shrink(left: int, readings: dict) -> None:
            names = self.problem.decay.slot_names
            got["S"] = {n: shrink_share(readings[0][k], lams[n], left) for k, n in enumerate(names)}
            shrink(left, readings)

        outer.observe, outer.observe_shrink = told, told_shrink
        try:
            super()._observe_horizon(trainer)
        finally:
            del outer.observe, outer.observe_shrink
        module = trainer.lightning_module
        done = trainer.fit_loop.epoch_loop.total_batch_idx + 1
        batches = trainer.num_training_batches * trainer.max_epochs
        got["own_left"] = {
            n: steps * (batches - done) / done for n, steps in module.steps.items()
        }  # at the pace so far
        got["lam"] = lams
        self.seen.append(got)


def _fit(head_every: int = 1) -> tuple[Watched, Toggled]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    cb = Watched(LAM, training_loss=loss, max_overhead=None, every_n_steps=6)
    module = Toggled(head_every)
    trainer = pl.Trainer(
        max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(
        module,
        DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16),
        DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32),
    )
    return cb, module


def _own_removal(seen: dict[str, Any], name: str) -> float:
    """1 − exp(−λ·gain·n): what decay alone removes of a block over its n own steps left."""
    return -math.expm1(-seen["lam"][name] * GAIN[name] * seen["own_left"][name])


def test_two_optimizers_in_turn_shrink_each_tensor_over_its_own_steps() -> None:
    """Each optimizer steps once a batch: R counts twice each tensor's steps left, and the
    shrink the outer step is told is the one over the tensor's own (before: over R, twice)."""
    cb, _ = _fit()
    with_shrink = [s for s in cb.seen if "S" in s]
    assert with_shrink  # told while λ still descends from λ₀
    for seen in with_shrink:
        assert seen["R"] == 2 * round(seen["own_left"]["encoder.0"])
        for name in GAIN:
            assert math.isclose(seen["S"][name], _own_removal(seen, name), rel_tol=1e-6), seen


def test_two_optimizers_in_turn_tell_eta_per_step_of_r() -> None:
    """ηR, the outer step's horizon (eq. decaytrust's bound), is each tensor's own: η per step
    of R is the optimizers' η pooled by elements, times their share of the steps (one half)."""
    cb, module = _fit()
    sizes = {"encoder.0": sum(p.numel() for p in module.encoder.parameters()),
             "head": sum(p.numel() for p in module.head.parameters())}  # fmt: skip
    for seen in cb.seen:
        own = sum(sizes[n] * GAIN[n] * seen["own_left"][n] for n in GAIN) / sum(sizes.values())
        assert math.isclose(seen["eta"] * seen["R"], own, rel_tol=1e-6), seen


def test_an_optimizer_stepped_every_other_batch_has_its_share() -> None:
    """The head steps every second batch: its share of the steps is a third, the encoder's two
    thirds, and each block's shrink is over its own steps left (R is Lightning's paced count)."""
    cb, module = _fit(head_every=2)
    assert module.steps["encoder.0"] == 2 * module.steps["head"]
    with_shrink = [s for s in cb.seen if "S" in s]
    assert with_shrink
    for seen in with_shrink:
        for name in GAIN:
            assert math.isclose(seen["S"][name], _own_removal(seen, name), rel_tol=0.05), seen


def test_one_optimizer_has_the_whole_share() -> None:
    """One optimizer (or none counted yet): share 1, η as before (the single-optimizer fits
    are unchanged, bitwise); an optimizer not stepped yet among others: 0."""
    shares = StepShares()
    a, b = object(), object()
    assert shares.share(a) == 1.0
    for _ in range(3):
        shares.count(a)
    assert shares.share(a) == 1.0 and shares.share(b) == 0.0
    shares.count(b)
    assert shares.share(a) == 0.75 and shares.share(b) == 0.25
    p = nn.Parameter(torch.ones(4))
    sgd = torch.optim.SGD([p], lr=0.1, momentum=0.5)
    assert effective_step_size([sgd], lambda o: 1.0) == effective_step_size([sgd]) == 0.2
    assert math.isclose(effective_step_size([sgd], lambda o: 0.5), 0.1)
