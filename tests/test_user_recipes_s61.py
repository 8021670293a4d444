"""Session 61's unseen recipes: each test fails without its fix, but the controls (docs/failures.md,
"Unseen user recipes (session 61)"; the recipes: benchmarks/bench_user_recipes_s61.py)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import three_class_sets
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    SIDConfig,
    SIDHyperOptimizer,
)


class Checkpointed(pl.LightningModule):
    """A hidden block under activation checkpointing: ``checkpoint(block, h)`` (the reentrant
    default a user leaves), ``use_reentrant=False``, or none; per-sample losses on request."""

    def __init__(self, mode: str, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mode, self.per_sample = mode, per_sample
        self.stem = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        if self.mode == "reentrant":
            with warnings.catch_warnings():  # torch's "pass use_reentrant explicitly"
                warnings.simplefilter("ignore")
                h = checkpoint(self.block, h)
        elif self.mode == "non_reentrant":
            h = checkpoint(self.block, h, use_reentrant=False)
        else:
            h = self.block(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _trainer(cb: Any, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


def _fit(cb: Any, model: pl.LightningModule, per_sample: bool, **kw: Any) -> list[str]:
    train, val = three_class_sets()
    data = IndexedDataset(train) if per_sample else train
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(cb, **kw).fit(
            model, DataLoader(data, batch_size=16, shuffle=True), DataLoader(val, batch_size=32)
        )
    return [str(w.message) for w in caught]


REENTRANT_FIX = re.escape("Pass use_reentrant=False to every checkpoint(...) call")


def test_a_reentrant_checkpoint_is_refused_by_the_learned_decay_naming_the_fix() -> None:
    """``checkpoint(block, h)`` (reentrant) inside ``forward`` with ``LearnedWeightDecay()``'s
    defaults. Before: a raw "RuntimeError: When use_reentrant=True, torch.utils.checkpoint is
    incompatible with .grad() ..." from the budget's timing of one Hessian–vector product (it
    ran outside the hypergradient, which said such errors)."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4)
    with pytest.raises(ConfigurationError, match=REENTRANT_FIX) as err:
        _fit(cb, Checkpointed("reentrant"), per_sample=False)
    assert "torch.utils.checkpoint" in str(err.value) and "default" in str(err.value)
    lam = [float(v.mean()) for v in cb.learned_weight_decay.values()]
    assert lam == pytest.approx([1e-3] * len(lam))  # refused before λ was written


def test_a_reentrant_checkpoint_is_refused_by_the_data_weights_naming_the_fix() -> None:
    """The same with ``LearnedDataWeights()``. Before: "the inner loss is not twice
    differentiable: ... Replace that operation", while the operation is differentiable twice
    once checkpointed with ``use_reentrant=False``."""
    cb = LearnedDataWeights(every_n_steps=4, start_step=4)
    with pytest.raises(ConfigurationError, match=REENTRANT_FIX) as err:
        _fit(cb, Checkpointed("reentrant", per_sample=True), per_sample=True)
    assert "not twice differentiable" not in str(err.value)


def _core(mode: str, steps: int = 0) -> tuple[SIDHyperOptimizer, Any, Any]:
    """The checkpointed module's ℓ̂ with a learned log λ per tensor, as a core optimizer."""
    model = Checkpointed(mode)
    params = list(model.parameters())
    log_lam = torch.full((len(params),), -3.0, requires_grad=True)
    train, val = three_class_sets()

    def inner_loss(batch: Any) -> Tensor:
        x, y = batch
        decay = sum(0.5 * log_lam[i].exp() * p.pow(2).sum() for i, p in enumerate(params))
        return F.cross_entropy(model(x), y) + decay

    def outer_loss(batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    hopt = SIDHyperOptimizer(
        [log_lam], params, inner_loss, outer_loss, torch.optim.SGD([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=steps, adjoint_steps=5, alpha=0.1),
    )  # fmt: skip
    return hopt, DataLoader(train, batch_size=32, shuffle=True), val.tensors


def test_the_core_says_a_reentrant_checkpoint_and_its_fix() -> None:
    """The core's hypergradient through a reentrant checkpoint: before, the generic "not twice
    differentiable ... Replace that operation"."""
    hopt, train, val = _core("reentrant")
    with pytest.raises(ConfigurationError, match=REENTRANT_FIX):
        torch.manual_seed(0)
        hopt.hypergradient(train, val)


def test_control_a_non_reentrant_checkpoint_gives_the_hypergradient_of_the_plain_model() -> None:
    """Control (passes before the fix too): ``use_reentrant=False`` is twice differentiable and
    its hypergradient is the un-checkpointed model's (the products are recomputed, not
    approximated)."""
    got = []
    for mode in ("non_reentrant", "plain"):
        hopt, train, val = _core(mode)
        torch.manual_seed(0)
        got.append(hopt.hypergradient(train, val)[0])
    assert got[0].abs().sum() > 0
    torch.testing.assert_close(got[0], got[1], rtol=1e-5, atol=1e-7)


def test_control_a_non_reentrant_checkpoint_trains_with_both_drop_ins() -> None:
    """Control: the recipe as torch recommends (``use_reentrant=False``) runs its hyper steps."""
    cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
    _fit(cb, Checkpointed("non_reentrant"), per_sample=False)
    assert len(cb.history) == 6
    assert all(float(v.mean()) != 1e-3 for v in cb.learned_weight_decay.values())
    dw = LearnedDataWeights(every_n_steps=4, start_step=4)
    _fit(dw, Checkpointed("non_reentrant", per_sample=True), per_sample=True)
    assert len(dw.history) == 6 and float(dw.data_weights().std()) > 0


@pytest.fixture
def deterministic_restored() -> Iterator[None]:
    """``Trainer(deterministic=True)`` switches torch's deterministic algorithms on for the
    process: put the setting back after the test."""
    on, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    torch.use_deterministic_algorithms(on, warn_only=warn_only)


NOT_REPEATABLE = "deterministic algorithms are on"


def test_a_deterministic_fit_whose_budget_reads_the_clock_is_said(
    deterministic_restored: None,
) -> None:
    """``Trainer(deterministic=True)`` asks for a repeatable fit; the default budget decides by
    the clock which hyper steps run (two fits of the same seed of the ``deterministic`` recipe
    ended apart). Before: nothing said."""
    said = _fit(
        LearnedWeightDecay(1e-3, every_n_steps=4), Checkpointed("plain"), False, deterministic=True
    )
    hits = [m for m in said if NOT_REPEATABLE in m]
    assert len(hits) == 1 and "max_overhead=None" in hits[0] and "max_overhead=0.5" in hits[0]


def test_control_max_overhead_none_is_repeatable_and_not_said(
    deterministic_restored: None,
) -> None:
    """Control: the setting the warning names ends two deterministic fits bitwise equal and
    is not warned about; nor is a fit without deterministic algorithms."""
    ends = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Checkpointed("plain")
        cb = LearnedWeightDecay(1e-3, every_n_steps=4, max_overhead=None)
        said = _fit(cb, model, False, deterministic=True)
        assert not any(NOT_REPEATABLE in m for m in said) and len(cb.history) == 6
        ends.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*ends))
    torch.use_deterministic_algorithms(False)
    said = _fit(LearnedWeightDecay(1e-3, every_n_steps=4), Checkpointed("plain"), False)
    assert not any(NOT_REPEATABLE in m for m in said)


class SparseBag(pl.LightningModule):
    """The ``sparse_emb`` recipe in small: a sparse embedding (mean of the words) and a head,
    ``SparseAdam`` + ``Adam`` under manual optimization."""

    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.per_sample = per_sample
        self.emb = nn.Embedding(20, 4, padding_idx=0, sparse=True)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.emb(tokens).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, y = batch
        loss = F.cross_entropy(self(tokens), y, reduction="none")
        sparse, dense = self.optimizers()
        sparse.zero_grad()
        dense.zero_grad()
        self.manual_backward(loss.mean())
        sparse.step()
        dense.step()
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        tokens, y = batch
        self.log("val_loss", F.cross_entropy(self(tokens), y))

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SparseAdam(list(self.emb.parameters()), lr=1e-2),
            torch.optim.Adam(self.head.parameters(), lr=1e-2),
        ]


@pytest.mark.parametrize("drop_in", ["decay", "data_weights"])
def test_a_sparse_embedding_under_manual_optimization_is_refused_for_the_embedding(
    drop_in: str,
) -> None:
    """Both drop-ins refuse a sparse embedding whatever else is changed, so that is said first.
    Before: "with manual optimization ... pass training_loss=" (the decay) or "use automatic
    optimisation" (the data weights), whose advice, followed, led to the embedding's
    refusal."""
    g = torch.Generator().manual_seed(0)
    tokens, y = torch.randint(1, 20, (64, 5), generator=g), torch.randint(0, 3, (64,), generator=g)
    data = TensorDataset(tokens, y)
    per_sample = drop_in == "data_weights"
    cb = LearnedDataWeights() if per_sample else LearnedWeightDecay(1e-4)
    train = IndexedDataset(data) if per_sample else data
    with pytest.raises(ConfigurationError, match=r"emb \(Embedding\(sparse=True\)\)") as err:
        _trainer(cb).fit(
            SparseBag(per_sample), DataLoader(train, batch_size=16), DataLoader(data, batch_size=32)
        )
    assert "sparse=False" in str(err.value)
