"""Recipes no one here wrote that broke a drop-in (session 48; every recipe tried, with its
numbers, is in docs/failures.md, "Unseen recipes (session 48)").

Each test fails without its fix: a GRU over packed sequences padded per batch by a ``collate_fn``
(the common way to batch text) was refused by ``LearnedWeightDecay`` because its batches differ
in length, and ``LearnedDataWeights`` handed that ``collate_fn`` the ``Indexed`` samples, which
failed inside the user's code.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import trainer
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
    indexed_collate,
)
from hypertorch_sid.core.batches import BatchStream

N_TRAIN, N_VAL, CLASSES, VOCAB = 240, 80, 3, 20


def _sequences(n: int, seed: int) -> tuple[list[Tensor], Tensor]:
    """Token sequences of 4–15 tokens; the label is the class token (1–3) planted most often."""
    g = torch.Generator().manual_seed(seed)
    seqs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(4, 16, (1,), generator=g))
        s = torch.randint(4, VOCAB, (length,), generator=g)
        c = int(torch.randint(0, CLASSES, (1,), generator=g))
        s[torch.randperm(length, generator=g)[:2]] = c + 1
        seqs.append(s)
        labels.append(c)
    return seqs, torch.tensor(labels)


class Sequences(Dataset):
    def __init__(self, seqs: list[Tensor], labels: Tensor) -> None:
        self.seqs, self.labels = seqs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.seqs[i], self.labels[i]


def pad_batch(items: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """The user's collate_fn: pad to the batch's longest sequence; (tokens, lengths, labels)."""
    seqs, labels = zip(*items)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(list(seqs), batch_first=True), lengths, torch.stack(labels)


class PackedGRU(pl.LightningModule):
    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        self.per_sample = per_sample
        self.emb = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.rnn = nn.GRU(8, 12, batch_first=True)
        self.head = nn.Linear(12, CLASSES)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)
        return self.head(h[-1])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, lengths, y = batch
        return F.cross_entropy(self(x, lengths), y, reduction="none" if self.per_sample else "mean")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _fit(
    callback: pl.Callback, train_set: Dataset, collate: Any, per_sample: bool, epochs: int = 3
) -> PackedGRU:
    pl.seed_everything(0, verbose=False)
    model = PackedGRU(per_sample)
    train = DataLoader(train_set, batch_size=24, shuffle=True, collate_fn=collate)
    val = DataLoader(Sequences(*_sequences(N_VAL, 1)), batch_size=40, collate_fn=pad_batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short fit: few hyper steps, unconverged solves
        trainer([callback], max_epochs=epochs).fit(model, train, val)
    return model


def test_batches_padded_to_their_own_length_are_taken():
    """Each batch is padded to its longest sequence, so batches differ in shape: the hyper steps
    refused them ("Every minibatch must have the same shape apart from the batch dimension")
    although the training reads them; the model, not the sampler, decides what it can read."""
    cb = LearnedWeightDecay(1e-4, every_n_steps=5, max_overhead=None)
    model = _fit(cb, Sequences(*_sequences(N_TRAIN, 0)), pad_batch, per_sample=False)
    assert len(cb.history) >= 4  # hyper steps ran
    lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
    assert torch.isfinite(lam).all() and (lam > 0).all()
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_the_core_stream_takes_batches_of_varying_shape():
    batches = [torch.zeros(4, 3), torch.zeros(4, 5)]
    stream = BatchStream(batches)
    assert [tuple(b.shape) for b in stream.take(3)] == [(4, 3), (4, 5), (4, 3)]


def _noisy_sequences() -> tuple[Sequences, Tensor]:
    """The training sequences with 30 % of the labels moved to another class; the mask."""
    seqs, labels = _sequences(N_TRAIN, 0)
    g = torch.Generator().manual_seed(5)
    corrupted = torch.zeros(N_TRAIN, dtype=torch.bool)
    corrupted[torch.randperm(N_TRAIN, generator=g)[: int(0.3 * N_TRAIN)]] = True
    shifted = (labels + torch.randint(1, CLASSES, (N_TRAIN,), generator=g)) % CLASSES
    return Sequences(seqs, torch.where(corrupted, shifted, labels)), corrupted


def test_a_collate_fn_written_for_the_bare_samples_is_named_with_the_fix():
    """``DataLoader(IndexedDataset(train_set), collate_fn=pad_batch)``: pad_batch got
    ``Indexed(index, sample)`` pairs and failed inside the user's code at the first batch
    ("object of type 'int' has no len()"); now refused at fit start naming indexed_collate."""
    train_set, _ = _noisy_sequences()
    with pytest.raises(ConfigurationError, match=r"collate_fn \(pad_batch\).*indexed_collate"):
        _fit(LearnedDataWeights(), IndexedDataset(train_set), pad_batch, per_sample=True)


def drops_the_index(samples: list[Any]) -> Any:
    """A collate that reads the pairs but returns the samples alone (the indices lost)."""
    return pad_batch([s[1] for s in samples])


def test_a_collate_fn_that_loses_the_indices_is_named():
    train_set, _ = _noisy_sequences()
    with pytest.raises(ConfigurationError, match=r"indices are lost.*indexed_collate"):
        _fit(LearnedDataWeights(), IndexedDataset(train_set), drops_the_index, per_sample=True)


def test_indexed_collate_learns_the_weights_of_padded_sequences():
    """The fix: indexed_collate(pad_batch) keeps the indices and hands training_step pad_batch's
    batch; the corrupted sequences' weights end below the clean ones'."""
    train_set, corrupted = _noisy_sequences()
    cb = LearnedDataWeights(seed=0)
    _fit(cb, IndexedDataset(train_set), indexed_collate(pad_batch), per_sample=True, epochs=25)
    w = cb.data_weights()
    assert w.shape == (N_TRAIN,) and bool(torch.isfinite(w).all())
    assert float(w[corrupted].mean()) < float(w[~corrupted].mean()) - 0.1


def test_indexed_collate_refuses_samples_without_an_index():
    with pytest.raises(ConfigurationError, match=r"samples without an index"):
        indexed_collate(pad_batch)([(torch.tensor([1, 2]), torch.tensor(0))])


class DigitsMLP(pl.LightningModule):
    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        self.per_sample = per_sample
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none" if self.per_sample else "mean")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


@pytest.mark.parametrize("drop_in", ["decay", "data_weights"])
def test_the_first_cold_adjoint_solve_of_a_fit_is_not_called_unconverged(drop_in):
    """With the drop-ins' k = 3 adjoint steps the first hyper step's solve, from v = 0, was said
    "has not converged … Raise adjoint_steps" on 29 of 32 fits of the session's recipes: the
    next hyper steps continue it (warm start), as they do every later solve, which waits for
    3 unconverged hyper steps in a row before it is said. A one-off core call still says it at
    once (tests/test_silent_wrong.py)."""
    from lightning_problems import digits_split

    from hypertorch_sid.core.errors import ConvergenceWarning

    X, y, Xv, yv = digits_split(400, 200)
    per_sample = drop_in == "data_weights"
    if per_sample:
        train_set: Dataset = IndexedDataset(torch.utils.data.TensorDataset(X, y))
        cb: pl.Callback = LearnedDataWeights(start_step=5, every_n_steps=5)
    else:
        train_set = torch.utils.data.TensorDataset(X, y)
        cb = LearnedWeightDecay(1e-4, every_n_steps=5, max_overhead=None)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(
            DigitsMLP(per_sample),
            DataLoader(train_set, batch_size=32, shuffle=True),
            DataLoader(torch.utils.data.TensorDataset(Xv, yv), batch_size=100),
        )
    assert 2 <= len(cb.history) <= 3  # hyper steps ran, fewer than the patience after the first
    said = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert not [m for m in said if "adjoint solve" in m], said


class TinyViT(pl.LightningModule):
    """A ViT as timm writes one: the class token and the position embedding are tensors of the
    module itself, (1, 1, d) and (1, N, d), added to the patch embeddings."""

    def __init__(self) -> None:
        super().__init__()
        d = 16
        self.patch = nn.Linear(16, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 5, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, 64) digits as 4 patches of 16 pixels
        h = self.patch(x.view(len(x), 4, 16))
        h = torch.cat([self.cls.expand(len(x), -1, -1), h], 1) + self.pos
        return self.head(self.enc(h)[:, 0])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def test_a_vits_class_token_and_position_embedding_are_no_layers_sharing_a_lambda():
    """They were called "2 weight matrices (cls, pos) are owned by the LightningModule itself:
    they share one λ, as under granularity='global'": they are no layers (every layer has its
    own λ), and the fixes named (per_tensor, a module per layer) change nothing that matters."""
    from lightning_problems import digits_split

    X, y, Xv, yv = digits_split(200, 100)
    cb = LearnedWeightDecay(1e-4, every_n_steps=5, max_overhead=None)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=2).fit(
            TinyViT(),
            DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=32, shuffle=True),
            DataLoader(torch.utils.data.TensorDataset(Xv, yv), batch_size=100),
        )
    assert cb.history  # hyper steps ran
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "share one λ" in m], said
    assert cb.slot_names[:3] == ["cls", "pos", "patch"]  # cls and pos: a λ each (session 63)


class CountsAccuracy(DigitsMLP):
    """training_step updates a torchmetrics accuracy; each epoch's end records how many samples
    it counted (before Lightning resets it)."""

    def __init__(self) -> None:
        super().__init__(per_sample=True)
        import torchmetrics

        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        self.counted: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self.net(x)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return F.cross_entropy(logits, y, reduction="none")

    def on_train_epoch_end(self) -> None:
        self.counted.append(int((self.train_acc.tp + self.train_acc.fn).sum()))


def test_a_training_metric_counts_each_training_sample_once_under_data_weights():
    """The data weights' cross term on the training batch runs training_step again at every
    step after the first hyper step: a metric updated there counted 6064 samples in an epoch of
    3000 (MNIST MLP) and the logged training accuracy mixed in the re-run's."""
    from lightning_problems import digits_split

    X, y, Xv, yv = digits_split(320, 100)
    model = CountsAccuracy()
    cb = LearnedDataWeights(start_step=5, every_n_steps=5)
    pl.seed_everything(0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=3).fit(
            model,
            DataLoader(IndexedDataset(torch.utils.data.TensorDataset(X, y)), batch_size=32),
            DataLoader(torch.utils.data.TensorDataset(Xv, yv), batch_size=100),
        )
    assert len(cb.history) >= 4  # hyper steps ran, and the cross term on the training batches
    assert model.counted == [320, 320, 320]


def test_an_adjoint_solve_whose_residual_grew_is_not_told_to_take_more_steps():
    """A k = 3 adjoint solve of a depthwise-separable CNN (Fashion-MNIST) ended with its residual
    45× above where it started and was said to have gone "only from 48.4 to 2.18e+03", with
    "Raise adjoint_steps (or the adjoint step size, eta)", which would take it further away."""
    from hypertorch_sid.core.solvers import _ADJOINT_FIX, _ADJOINT_HINT
    from hypertorch_sid.core.watch import ResidualWatch, unconverged_message

    watch = ResidualWatch("adjoint solve v_k", _ADJOINT_HINT)
    direction = [torch.full((4,), 0.5)]  # unit norm: each δ_t has norm of its residual
    for step, residual in enumerate([48.4, 900.0, 2180.0]):
        watch.see(step, residual, [residual * d for d in direction])
    said = unconverged_message("adjoint solve v_k", watch, _ADJOINT_FIX)
    assert "grew from 48.4 to 2.18e+03" in said, said
    assert _ADJOINT_FIX not in said and "not a contraction" in said, said
    # a residual that fell too slowly still names the fix
    slow = ResidualWatch("adjoint solve v_k", _ADJOINT_HINT)
    for step, residual in enumerate([1.0, 0.9, 0.8]):
        slow.see(step, residual, [residual * d for d in direction])
    assert _ADJOINT_FIX in unconverged_message("adjoint solve v_k", slow, _ADJOINT_FIX)
