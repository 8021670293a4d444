"""Session 50's unseen recipes: each test fails without its fix (docs/failures.md, "Unseen recipes
(session 50)"; the recipes: benchmarks/bench_user_recipes_s50.py)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from hypertorch_sid import ConfigurationError, IndexedDataset, LearnedDataWeights, indexed_collate

N_TRAIN, N_VAL, CLASSES, VOCAB = 240, 60, 3, 30


def _documents(n: int, seed: int) -> tuple[list[Tensor], Tensor]:
    """Token documents of 3–12 tokens; the class token (1–3) planted twice."""
    g = torch.Generator().manual_seed(seed)
    docs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(3, 13, (1,), generator=g))
        d = torch.randint(4, VOCAB, (length,), generator=g)
        c = int(torch.randint(0, CLASSES, (1,), generator=g))
        d[torch.randperm(length, generator=g)[:2]] = c + 1
        docs.append(d)
        labels.append(c)
    return docs, torch.tensor(labels)


class Documents(Dataset):
    def __init__(self, docs: list[Tensor], labels: Tensor) -> None:
        self.docs, self.labels = docs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.docs[i], self.labels[i]


def bag_collate(samples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """EmbeddingBag's input: the tokens end to end, each document's offset, then the labels."""
    docs = [d for d, _ in samples]
    offsets = torch.tensor([0] + [len(d) for d in docs[:-1]]).cumsum(0)
    return torch.cat(docs), offsets, torch.stack([y for _, y in samples])


class MeanBag(pl.LightningModule):
    """A mean bag of embeddings over (tokens, offsets): the index_add form of EmbeddingBag."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, tokens: Tensor, offsets: Tensor) -> Tensor:
        sizes = torch.diff(offsets, append=torch.tensor([len(tokens)]))
        doc = torch.repeat_interleave(torch.arange(len(offsets)), sizes)
        bag = torch.zeros(len(offsets), 8).index_add(0, doc, self.emb(tokens))
        return self.head(bag / sizes.unsqueeze(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, offsets, y = batch
        return F.cross_entropy(self(tokens, offsets), y, reduction="none")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def test_a_collate_fns_second_item_is_not_taken_for_the_labels():
    """(tokens, offsets, y) from the user's collate_fn: the label checks read batch[1], the
    offsets, which change with the shuffle, and stopped the fit at the second epoch with
    "example 116 had label 68 on an earlier visit and has label 3 now: the training set's
    indices are not stable" although they are. Under a collate_fn of the user's the batch's
    layout is the user's: no label is guessed by position (``target=`` names them, or
    ``indexed_collate`` reads them from the (doc, y) samples before collation, session 51)."""
    docs, labels = _documents(N_TRAIN, 0)
    noisy = labels.clone()
    noisy[:80] = (noisy[:80] + 1) % CLASSES
    train = DataLoader(
        IndexedDataset(Documents(docs, noisy)),
        batch_size=24,
        shuffle=True,
        collate_fn=indexed_collate(bag_collate),
    )
    val = DataLoader(Documents(*_documents(N_VAL, 1)), batch_size=30, collate_fn=bag_collate)
    for cb in (LearnedDataWeights(), LearnedDataWeights(target=lambda batch: batch[-1])):
        pl.seed_everything(0, verbose=False)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")  # a short fit: few hyper steps, unconverged solves
            pl.Trainer(
                max_epochs=15, callbacks=[cb], logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
            ).fit(MeanBag(), train, val)  # fmt: skip
        # the (doc, y) samples name their labels: read before collation, nothing to warn
        told = [w for w in said if "collate_fn of yours" in str(w.message)]
        assert not told
        torch.testing.assert_close(cb.problem._labels, noisy)
        w = cb.data_weights()
        assert torch.isfinite(w).all()
        assert w[:80].mean() < w[80:].mean() - 0.1  # the flipped labels weigh less


def test_an_embedding_bag_with_offsets_is_told_the_twice_differentiable_form_of_its_input():
    """``EmbeddingBag(tokens, offsets)`` (20 Newsgroups, flat tokens per batch) is refused,
    torch having no second derivative for it; the fix named, "nn.Embedding followed by .sum(1)
    or .mean(1)", needs a (B, L) input, which a flat input with offsets is not. The message now
    gives the offsets form too, and that form (MeanBag above) equals EmbeddingBag's."""
    from hypertorch_sid.core.second_order import check_second_derivatives

    bag = nn.EmbeddingBag(VOCAB, 8, mode="mean")
    with pytest.raises(ConfigurationError, match=r"offsets.*index_add.*repeat_interleave"):
        check_second_derivatives(bag, list(bag.parameters()))
    model = MeanBag()
    model.emb.weight.data.copy_(bag.weight.data)
    tokens, offsets, _ = bag_collate([(d, y) for d, y in zip(*_documents(5, 2))])
    expected = model.head(bag(tokens, offsets))
    torch.testing.assert_close(model(tokens, offsets), expected)
