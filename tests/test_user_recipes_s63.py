"""Session 63's unseen recipes: each test fails without its fix, but the controls (docs/failures.md,
"Round 17 of user recipes (session 63)"; the recipes: benchmarks/bench_user_recipes_s63.py)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import blobs as _blobs
from lightning_problems import noisy_four_classes as _noisy
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.lightning.evidence import CONTRAST_QUANTILE, RowEvidence
from hypertorch_sid.lightning.no_signal import WarnAtEnd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_user_recipes_s63 import supcon_loss  # noqa: E402


class SupConNet(pl.LightningModule):
    """The ``supcon`` recipe in small: a trunk, a classifier head and a projection head; each
    row's loss its cross entropy plus ½ · its supervised contrastive loss over the batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head, self.proj = nn.Linear(32, 4), nn.Linear(32, 8)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        h = self.trunk(x)
        ce = F.cross_entropy(self.head(h), y, reduction="none")
        return ce + 0.5 * supcon_loss(F.normalize(self.proj(h), dim=1), y, 0.1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _flags(cb: LearnedDataWeights) -> tuple[Tensor, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flags = cb.flagged()
    return flags, [str(w.message) for w in caught]


# -------------------------------------------------------- a loss with more than −log p
def test_a_loss_with_a_contrastive_term_is_not_said_to_contradict_every_row() -> None:
    """``supcon`` (session 63): cross entropy plus a supervised contrastive term per row keeps
    every row's loss above log 2, fitted or not. Before: ``flagged()`` warned "the network
    predicted another class than the label for 100% of the 176 examples with low weights but
    also for 100% of the 304 it keeps … the flags may be mostly hard clean examples" on flags
    of precision 0.78 (recall 0.93); the recipe's own run: 100 % / 99 % on flags of precision
    0.71. Now such losses (every clean validation loss above log 2) are read on the validation
    scale, as targets without class labels are: no warning, and the flags as they were."""
    x, y = _blobs(480, 0)
    xv, yv = _blobs(128, 1)
    y_noisy, bad = _noisy(y)
    cb = LearnedDataWeights(every_n_steps=4)
    trainer = pl.Trainer(
        max_epochs=6, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            SupConNet(),
            DataLoader(IndexedDataset(TensorDataset(x, y_noisy)), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(xv, yv), batch_size=64),
        )
    flags, said = _flags(cb)
    assert not any("another class than the label" in s for s in said), said
    assert len(flags) > 100 and float(bad[flags].float().mean()) > 0.7  # they are wrong labels


class Record(RowEvidence):
    """The evidence on a record set by hand: per sample, integer class labels."""

    def __init__(self, last_loss: Tensor, val_losses: Tensor | None) -> None:
        self.per, self._labels = "sample", torch.zeros(len(last_loss), dtype=torch.long)
        self._last_loss, self._val_losses = last_loss, val_losses


def _cross_entropy_like() -> tuple[Tensor, Tensor]:
    """Last-visit losses of 40 wrong labels (3.0, the network predicts another class) and 160
    fitted rows (0.05), and 60 clean validation losses (0.02–0.5)."""
    loss = torch.cat([torch.full((40,), 3.0), torch.full((160,), 0.05)])
    return loss, torch.linspace(0.02, 0.5, 60)


def test_an_offset_loss_is_read_on_the_validation_scale_naming_why() -> None:
    """The same record with every loss 2 higher (another term per row, constant here): before,
    every row was above log 2 and exact flags of the 40 wrong labels were said to be "no
    evidence" (a contrast of 0.00); now they pass, and flags of which half are fitted rows are
    doubted on the validation scale, saying why the labels were not read."""
    loss, val = _cross_entropy_like()
    record = Record(loss + 2.0, val + 2.0)
    assert record.flag_contrast(torch.arange(40)) is None
    half = torch.cat([torch.arange(20), torch.arange(40, 60)])
    said = record.flag_contrast(half)
    assert said is not None and "do not read as −log p of the class labels" in said
    tau = float((val + 2.0).quantile(CONTRAST_QUANTILE))
    assert f"{tau:.3g}" in said
    assert record.misfits(torch.arange(60)).tolist() == list(range(40))  # above τ, not log 2


def test_control_a_cross_entropy_keeps_its_log2_check() -> None:
    """Control: with validation losses below log 2 (a cross entropy), the contrast is still
    ``_no_contrast``'s on log 2, as before."""
    loss, val = _cross_entropy_like()
    record = Record(loss, val)
    assert record.flag_contrast(torch.arange(40)) is None
    said = record.flag_contrast(torch.cat([torch.arange(20), torch.arange(40, 60)]))
    assert said is not None and "another class than the label" in said
    assert record.misfits(torch.arange(60)).tolist() == list(range(40))


# -------------------------------------------------------- stochastic depth
class SkipBlocks(pl.LightningModule):
    """The ``stoch_depth`` recipe in small: three residual blocks, each skipped at random in
    training (a Python branch on ``torch.rand``, probability ½ here); ``unused``: a layer the
    training never calls (the refusal's case)."""

    def __init__(self, per_sample: bool, unused: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)  # the first training step skips blocks 0–2 (refused before)
        self.per_sample = per_sample
        self.stem, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.unused = nn.Linear(16, 16) if unused else None

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.stem(x))
        for block in self.blocks:
            if not self.training:
                h = F.relu(h + block(h))
            elif torch.rand(()) < 0.5:
                h = F.relu(h + 2 * block(h))
        return self.out(h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self(batch[0]), batch[1], reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _skip_fit(cb: Any, unused: bool = False) -> None:
    x, y = _blobs(256, 3)
    per_sample = isinstance(cb, LearnedDataWeights)
    train = TensorDataset(x[:192], y[:192])
    trainer = pl.Trainer(
        max_epochs=4, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            SkipBlocks(per_sample, unused),
            DataLoader(IndexedDataset(train) if per_sample else train, batch_size=32, shuffle=True),
            DataLoader(TensorDataset(x[192:], y[192:]), batch_size=64),
        )


def test_blocks_skipped_at_random_train_with_the_learned_decay() -> None:
    """``stoch_depth`` (session 63), seed 1: the first step skipped block 0, so its tensors had
    no gradient there. Before: "LearnedWeightDecay: blocks.0.weight, blocks.0.bias, ... got no
    gradient from the training loss ... a layer the training never uses", at step 1 (59 % of
    the recipe's draws: 4 blocks kept with probability 0.8 each). Then the core's first check
    ("the training loss does not depend on blocks.1.weight") and its Hessian products
    ("element 4 of tensors does not require grad") refused a block skipped in a hyper step's
    draw. Now a tensor must get a gradient at one of the steps before the first hyper step,
    the core's check draws ℓ̂ again before it refuses, and a skipped block adds 0 to the
    products."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, start_step=4, max_overhead=None)
    _skip_fit(cb)
    assert len(cb.history) == 6  # 24 steps, a hyper step every 4 from step 4
    assert all(float(v.mean()) != 1e-3 for v in cb.learned_weight_decay.values())


def test_blocks_skipped_at_random_train_with_the_data_weights() -> None:
    """The same under ``LearnedDataWeights``: before, "the training loss does not depend on
    blocks.1.weight, blocks.1.bias: either a layer the training never uses ..." at the first
    hyper step, then (past that check) a RuntimeError inside the curvature estimate."""
    # learned to the end: this toy's weights read no signal, which the default (session 64's
    # ResetWeights) would reset after 4 of its 6 hyper steps
    cb = LearnedDataWeights(every_n_steps=4, start_step=4, max_overhead=None, no_signal=WarnAtEnd())
    _skip_fit(cb)
    assert len(cb.history) == 6
    assert float(cb.data_weights().std()) > 0


def test_control_a_layer_never_called_is_still_refused_before_a_hyper_step_writes() -> None:
    """Control: a layer ``forward`` never calls is refused by both drop-ins at their first
    hyper step, named, before λ or a weight is written (the decay: its own message, not the
    core's). Before, the decay refused it at step 1 naming the blocks that step skipped with
    it ("blocks.0.weight, blocks.0.bias, blocks.1.weight, blocks.1.bias, unused.weight ...")."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, start_step=4, max_overhead=None)
    with pytest.raises(ConfigurationError, match=r"unused\.weight, unused\.bias got no gradient"):
        _skip_fit(cb, unused=True)
    assert not cb.history
    dw = LearnedDataWeights(every_n_steps=4, start_step=4, max_overhead=None)
    with pytest.raises(
        ConfigurationError, match=r"does not depend on unused\.weight, unused\.bias"
    ):
        _skip_fit(dw, unused=True)
    assert not dw.history


def test_a_gradient_off_the_graph_adds_nothing_to_a_product() -> None:
    """``core.autodiff.grad``: a first derivative given as zeros (a tensor this draw did not
    read) is no output torch can differentiate; it is left out of the product (before:
    "element 1 of tensors does not require grad and does not have a grad_fn")."""
    from hypertorch_sid.core.autodiff import grad

    w, skipped = torch.randn(3, requires_grad=True), torch.randn(2, requires_grad=True)
    g = grad((w**3).sum(), [w, skipped], create_graph=True)
    assert not g[1].requires_grad
    v = [torch.ones(3), torch.ones(2)]
    hv = grad(g, [w, skipped], grad_outputs=v)
    torch.testing.assert_close(hv[0], 6 * w.detach())
    assert torch.equal(hv[1], torch.zeros(2))


# -------------------------------------------------------- SAM
def test_sams_base_sgd_decay_is_modelled_by_the_data_weights() -> None:
    """``sam_fmnist`` (session 63): SAM (the user's ``torch.optim.Optimizer`` wrapping a base
    SGD over the same parameter groups) with ``weight_decay=5e-4``. Before: "SAM (group 0):
    weight_decay=0.0005 keeps its own weight decay, whose fixed point this callback does not
    know (not an SGD/Adam-family torch optimizer): the hypergradient takes ℓ̂ without it …
    use SGD, Adam or AdamW" — the decay is its base SGD's, coupled. Now the base optimizer
    (``optimizer_decay.stepping``) decides how the decay acts, and it is modelled."""
    from bench_user_recipes_s63 import SAM

    from hypertorch_sid.lightning.optimizer_decay import OptimizerDecay

    net = nn.Linear(4, 2)
    sam = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, weight_decay=5e-4)
    decay = OptimizerDecay([sam], list(net.parameters()), net)
    assert decay.modelled == ["SAM (group 0): weight_decay=0.0005, coupled"]
    assert not decay.unknown
    w = torch.cat([p.detach().flatten() for p in net.parameters()])
    torch.testing.assert_close(decay.penalty(), 0.5 * 5e-4 * w.pow(2).sum())


def test_control_an_optimizer_without_a_base_keeps_its_unknown_decay_said() -> None:
    """Control: a wrapper whose ``base_optimizer`` holds other groups (no SAM: it does not step
    these tensors), and an optimizer of unknown semantics, stay unknown as before."""
    from hypertorch_sid.lightning.optimizer_decay import OptimizerDecay

    net = nn.Linear(4, 2)
    odd = torch.optim.Rprop(net.parameters(), lr=0.01)
    odd.param_groups[0]["weight_decay"] = 1e-3
    odd.base_optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)  # type: ignore[attr-defined]
    decay = OptimizerDecay([odd], list(net.parameters()), net)
    assert decay.unknown == ["Rprop (group 0): weight_decay=0.001"] and not decay


# -------------------------------------------------------- a VAE's negative ELBO
def _vae_fit(cb: LearnedDataWeights) -> None:
    from bench_user_recipes_s63 import VAE

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(160, 1, 28, 28, generator=g) < 0.2).float()  # binary "images", normalised
    x = (x - 0.1307) / 0.3081  # as the recipe's (the VAE reads them back into [0, 1])
    train, val = TensorDataset(x[:128], torch.zeros(128)), TensorDataset(x[128:], torch.zeros(32))
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            VAE(0.0, per_sample=True),
            DataLoader(IndexedDataset(train), batch_size=32, shuffle=True),
            DataLoader(val, batch_size=32),
        )


def test_a_vaes_elbo_is_refused_by_the_default_objective_naming_it_and_the_fix() -> None:
    """``vae_mnist`` (session 63): the negative ELBO per image (~90–200 nats) under
    ``LearnedDataWeights()``. Before: "ExpectedError(q=0.5) reads each validation loss as −log p
    of the right answer … A loss that is not a log-likelihood of labels, e.g. a squared or
    absolute error of a regression, needs objective='mean_loss'" — a class the user never
    named, and no word of the autoencoder. Now it says whose objective that is and names the
    reconstruction error / ELBO."""
    with pytest.raises(ConfigurationError, match="default objective") as err:
        _vae_fit(LearnedDataWeights(every_n_steps=2, start_step=2, max_overhead=None))
    assert "ELBO" in str(err.value) and "objective='mean_loss'" in str(err.value)


def test_control_the_vae_trains_with_the_named_objective() -> None:
    """Control: with ``objective="mean_loss"`` (the fix the refusal names) the VAE's data
    weights run their hyper steps."""
    cb = LearnedDataWeights(objective="mean_loss", every_n_steps=2, start_step=2, max_overhead=None)
    _vae_fit(cb)
    assert len(cb.history) == 4 and float(cb.data_weights().std()) > 0
