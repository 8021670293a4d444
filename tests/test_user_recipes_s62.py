"""Session 62's unseen recipes: each test fails without its fix, but the controls (docs/failures.md,
"Unseen user recipes (session 62)"; the recipes: benchmarks/bench_user_recipes_s62.py)."""

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

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_user_recipes_s62 import ctc_logsumexp  # noqa: E402

#: columns a toy strip is read in, digits per strip, classes (blank 0)
T, L, C = 6, 2, 4


def _trainer(cb: Any) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip


def _fit(cb: Any, model: pl.LightningModule, train: TensorDataset, val: TensorDataset) -> None:
    data = IndexedDataset(train) if isinstance(cb, LearnedDataWeights) else train
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(cb).fit(
            model, DataLoader(data, batch_size=16, shuffle=True), DataLoader(val, batch_size=32)
        )


class Reader(pl.LightningModule):
    """A toy sequence reader: 8 features → T columns of C classes, the CTC loss of L labels per
    row: torch's ``F.ctc_loss``, or ``ctc_logsumexp`` (``lse``, the fix the refusal names)."""

    def __init__(self, lse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lse = lse
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, T * C))

    def losses(self, batch: Any) -> Tensor:
        x, y = batch
        log_p = self.net(x).view(-1, T, C).log_softmax(-1).transpose(0, 1)
        if self.lse:
            return ctc_logsumexp(log_p, y)
        n = len(y)
        lengths = torch.full((n,), T, dtype=torch.long), torch.full((n,), L, dtype=torch.long)
        return F.ctc_loss(log_p, y, *lengths, reduction="none")

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.losses(batch).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.losses(batch).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _sequences() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    y = torch.stack([(x[:, 0] > 0).long() + 1, (x[:, 1] > 0).long() + 2], 1)
    return TensorDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])


def test_the_ctc_loss_is_refused_naming_it_and_its_twice_differentiable_form() -> None:
    """``F.ctc_loss`` under ``LearnedWeightDecay``: torch has no derivative of its backward.
    Before: "the inner loss is not twice differentiable: derivative for
    aten::_ctc_loss_backward is not implemented … Replace that operation, or freeze the
    parameters whose gradient passes through it" — every weight's gradient passes through the
    loss, and nothing said what to replace it with."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4)
    with pytest.raises(ConfigurationError, match="torch's CTC loss") as err:
        _fit(cb, Reader(lse=False), *_sequences())
    said = str(err.value)
    assert "logsumexp" in said and "freezing is no way out" in said
    assert "freeze the parameters whose gradient" not in said


def test_control_the_logsumexp_ctc_is_torchs_and_trains_with_both_drop_ins() -> None:
    """Control: the fix the message names has ``F.ctc_loss``'s values and gradient (a repeated
    label, which needs a blank between, included), and both drop-ins run their hyper steps
    through it."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(T, 5, C, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(1, C, (5, L), generator=g)
    y[0] = 2  # a repeated label
    lengths = torch.full((5,), T, dtype=torch.long), torch.full((5,), L, dtype=torch.long)
    ours = ctc_logsumexp(z.log_softmax(-1), y)
    theirs = F.ctc_loss(z.log_softmax(-1), y, *lengths, reduction="none")
    torch.testing.assert_close(ours, theirs)
    (g_ours,) = torch.autograd.grad(ours.sum(), z)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), z)
    torch.testing.assert_close(g_ours, g_theirs)
    decay = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    _fit(decay, Reader(lse=True), *_sequences())
    assert len(decay.history) == 6
    assert all(float(v.mean()) != 1e-3 for v in decay.learned_weight_decay.values())


class HardestK(pl.LightningModule):
    """Online hard example mining: the hardest 3/4 of each batch train (``topk``), or every
    row's loss with the others' times 0 (``masked``, the per-row form)."""

    def __init__(self, masked: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.masked = masked
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, reduction="none")
        k = 3 * len(loss) // 4
        if self.masked:
            return loss * (loss.detach() >= loss.detach().topk(k).values[-1])
        return loss.topk(k).values

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _classes() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return TensorDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])


def test_a_per_batch_selection_of_rows_is_refused_naming_the_mask_that_keeps_their_place() -> None:
    """``loss.topk(k).values`` (the hardest k of each batch) under ``LearnedDataWeights``.
    Before: "… leave examples that must not train out of the training set
    (IndexedDataset(Subset(train_set, kept)))": no fixed subset is left out here, the rows
    are chosen anew in every batch."""
    with pytest.raises(ConfigurationError, match=r"12 per-sample losses for a batch of 16") as err:
        _fit(LearnedDataWeights(every_n_steps=4, start_step=4), HardestK(False), *_classes())
    assert "losses * keep" in str(err.value) and "topk" in str(err.value)


def test_control_the_masked_hardest_rows_train_with_the_data_weights() -> None:
    """Control: the form the message names (every row's loss, the easy ones times 0) runs the
    data weights' hyper steps and moves the weights."""
    cb = LearnedDataWeights(every_n_steps=4, start_step=4)
    _fit(cb, HardestK(True), *_classes())
    assert len(cb.history) == 6 and float(cb.data_weights().std()) > 0


class Uncertain(pl.LightningModule):
    """Two tasks weighted by learned uncertainties (Kendall et al.): exp(−s_t)·ce_t + s_t per
    row; s starts at −1, so a well-fitted row's loss is negative from the start."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3 + 2))
        self.log_vars = nn.Parameter(torch.full((2,), -1.0))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[:, :3]

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out = self.net(x)
        ce = torch.stack(
            [F.cross_entropy(out[:, :3], y, reduction="none"),
             F.cross_entropy(out[:, 3:], (y > 0).long(), reduction="none")], 1,
        )  # fmt: skip
        return (torch.exp(-self.log_vars) * ce + self.log_vars).sum(1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _first_task_loss(module: nn.Module, batch: Any) -> Tensor:
    return F.cross_entropy(module(batch[0]), batch[1], reduction="none")


def test_a_loss_with_learned_offsets_is_refused_naming_the_validation_loss_to_pass() -> None:
    """The uncertainty-weighted loss under ``LearnedDataWeights()``: its validation losses
    (``training_step``'s) go negative. Before: "ExpectedError reads each validation loss as
    −log p … Use objective='mean_loss' for such a loss (e.g. a Gaussian negative
    log-likelihood)": a class the user never named, and no word of the validation losses being
    training_step's or of ``validation_loss=``, which keeps the default objective."""
    with pytest.raises(ConfigurationError, match="negative one") as err:
        _fit(LearnedDataWeights(every_n_steps=4, start_step=4), Uncertain(), *_classes())
    said = str(err.value)
    assert "LearnedDataWeights' default objective" in said and "validation_loss=" in said
    assert "objective='mean_loss'" in said and "exp(−s)·ℓ + s" in said


@pytest.mark.parametrize("fix", ["validation_loss", "mean_loss"])
def test_control_both_named_fixes_train_the_uncertainty_weighted_loss(fix: str) -> None:
    """Control: each setting the message names runs the hyper steps and moves the weights."""
    kw: dict[str, Any] = (
        {"validation_loss": _first_task_loss} if fix == "validation_loss"
        else {"objective": "mean_loss"}
    )  # fmt: skip
    cb = LearnedDataWeights(every_n_steps=4, start_step=4, **kw)
    _fit(cb, Uncertain(), *_classes())
    assert len(cb.history) == 6 and float(cb.data_weights().std()) > 0
