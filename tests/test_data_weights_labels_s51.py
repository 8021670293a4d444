"""Labels read before collation, and the class gauge under DDP (session 51, issue 27).

Under a ``collate_fn`` of the user's the drop-in cannot tell the labels in the collated batch
(EmbeddingBag's ``(tokens, offsets, y)`` holds integer offsets at ``[1]``), but each sample
still names them: ``indexed_collate`` reads them one sample at a time (``sample_label``: the
``y`` of an ``(x, y)`` pair, or a dict sample's one label key, an integer) and carries them
beside the indices, so ``gauge="auto"`` holds each class (the 20 Newsgroups recipe lost to
plain training without them) and the label checks run. Under DDP every rank records the labels
of every rank's rows, so the class gauge shifts the same rows on every rank."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning_problems import end_ddp_worker, trainer
from lightning_utilities.core.apply_func import apply_to_collection
from test_data_weights_lightning import NOISY, Classifier, Data, callback, fit
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hypertorch_sid import IndexedDataset, indexed_collate
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.indexing import Indexed, LabelledIndexed, sample_label


@dataclasses.dataclass
class Record:
    x: Tensor
    target: int


@pytest.mark.parametrize(
    ("sample", "label"),
    [
        ((torch.zeros(3), 2), 2),
        ((torch.zeros(3), torch.tensor(1)), 1),
        ([torch.zeros(3), np.int64(4)], 4),
        ({"x": torch.zeros(3), "label": torch.tensor(5)}, 5),
        (Record(torch.zeros(3), 6), 6),
        ((torch.zeros(3), torch.tensor([1])), 1),  # shape (1,): one integer (session 52)
        ((torch.zeros(3), torch.tensor([[1]])), None),  # shape (1, 1): not a label's shape
        ((torch.zeros(3), 1.0), None),  # a float target
        ((torch.zeros(3), True), 1),  # a bool is the binary class 1 (session 53)
        ((torch.zeros(3), torch.tensor(False)), 0),
        ((torch.zeros(3), np.bool_(True)), 1),
        ((torch.zeros(3), torch.tensor([0.0, 1.0])), None),  # one-hot
        ((torch.zeros(3), 1, 0.5), None),  # (x, y, w): which one?
        ({"x": torch.zeros(3), "y": 1, "label": 1}, None),  # two label keys
        ({"x": torch.zeros(3)}, None),
        (torch.zeros(3), None),
        (("some text", "sports"), None),
    ],
)
def test_sample_label_reads_one_integer_by_one_rule(sample, label):
    assert sample_label(sample) == label


def bag_collate(samples):
    """EmbeddingBag's layout: the inputs, each sample's offset (integers at [1]), the labels."""
    x = torch.stack([s[0] for s in samples])
    offsets = torch.arange(len(samples)) * 7
    return x, offsets, torch.stack([torch.as_tensor(s[1]) for s in samples])


def test_indexed_collate_carries_the_samples_labels_and_leaves_the_batch_as_fn_made_it():
    ds = IndexedDataset(TensorDataset(torch.randn(4, 2), torch.tensor([2, 0, 1, 2])))
    batch = indexed_collate(bag_collate)([ds[3], ds[1], ds[0]])
    assert isinstance(batch, LabelledIndexed) and isinstance(batch, Indexed)
    assert batch.index.tolist() == [3, 1, 0] and batch.labels.tolist() == [2, 0, 2]
    x, offsets, y = batch.data  # fn's batch, unchanged
    assert offsets.tolist() == [0, 7, 14] and y.tolist() == [2, 0, 2]
    moved = apply_to_collection(batch, Tensor, lambda t: t.clone())  # as to the device
    assert isinstance(moved, LabelledIndexed) and moved.labels.tolist() == [2, 0, 2]
    # one sample without a label to read: no labels carried, a plain Indexed batch as before
    mixed = IndexedDataset([(torch.zeros(2), 1), (torch.zeros(2), 1.5)])
    plain = indexed_collate(lambda s: s)([mixed[0], mixed[1]])
    assert type(plain) is Indexed


class BagClassifier(Classifier):
    """A user's module over ``bag_collate``'s batches; it keeps what its step received."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.received.append(batch)
        x, _offsets, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")


class BagData(Data):
    """``Data``'s noisy blobs through a ``collate_fn`` of the user's, no ``target=``."""

    def __init__(self, dataset: Dataset | None = None, collate=bag_collate) -> None:
        super().__init__()
        self.dataset, self.collate = dataset, collate

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.Xv, self.yv), batch_size=60, collate_fn=bag_collate)

    def train_dataloader(self) -> DataLoader:
        data = IndexedDataset(self.dataset or TensorDataset(self.X, self.y))
        gen = torch.Generator().manual_seed(0)
        return DataLoader(
            data,
            batch_size=24,
            shuffle=True,
            generator=gen,
            collate_fn=indexed_collate(self.collate),
        )


def test_labels_read_before_a_users_collate_fn_choose_the_class_gauge():
    """The EmbeddingBag-style recipe with every default: the class gauge (it stayed "batch"),
    every visited row's label recorded as the samples give it (not the offsets at [1]), no
    warning that labels are missing, and the user's step got ``bag_collate``'s batch."""
    cb, data, model = callback(), BagData(), BagClassifier()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(cb, 2, model=model, data=data)
    assert cb.weights is not None and cb.weights.gauge == "class"
    recorded = cb.problem._labels
    assert recorded is not None and torch.equal(recorded, data.y)  # two epochs: every row
    assert not [w for w in said if "collate_fn of yours" in str(w.message)]
    assert all(type(b) is tuple and len(b) == 3 for b in model.received)
    misfit = cb.flagged("split_misfit")  # the label evidence reads them: the rows the
    assert misfit.numel() and (cb.problem._last_loss[misfit] > math.log(2)).all()  # net denies
    w = cb.data_weights()
    assert w[:NOISY].mean() < w[NOISY:].mean() - 0.1


def test_target_still_wins_over_the_labels_read_from_the_samples():
    cb = callback(target=lambda batch: batch[2] % 2)
    data = BagData()
    fit(cb, 2, model=BagClassifier(), data=data)
    assert torch.equal(cb.problem._labels, data.y % 2)


class IndexedValidation(BagData):
    """The validation set through the same ``indexed_collate(bag_collate)``."""

    def val_dataloader(self) -> DataLoader:
        data = IndexedDataset(TensorDataset(self.Xv, self.yv))
        return DataLoader(data, batch_size=60, collate_fn=indexed_collate(bag_collate))


def test_validation_batches_count_their_classes_from_the_labels_read_before_collation():
    """The per-class counts that validation_shortfall reads (none before: no label read)."""
    cb, data = callback(), IndexedValidation()
    fit(cb, 2, model=BagClassifier(), data=data)
    counts, batches = cb.problem._val_counts, cb.problem._val_batches
    assert counts is not None and batches > 0
    assert torch.equal(counts, torch.bincount(data.yv) * batches)  # the whole set per batch


class Weighted(Dataset):
    """(x, y, w) samples: three entries, so no label is read from them."""

    def __init__(self, X: Tensor, y: Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, float]:
        return self.X[i], self.y[i], 1.0


def drop_third(samples):
    return bag_collate([(x, y) for x, y, _ in samples])


def test_samples_without_a_readable_label_keep_the_batch_gauge_and_the_warning():
    data = BagData(collate=drop_third)
    data.dataset = Weighted(data.X, data.y)
    cb = callback()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(cb, 2, model=BagClassifier(), data=data)
    assert cb.weights is not None and cb.weights.gauge == "batch"
    assert cb.problem._labels is None
    told = [str(w.message) for w in said if "collate_fn of yours" in str(w.message)]
    assert told and "target=" in told[0] and "sample_label" in told[0]


class Relabelled(Dataset):
    """Labels drawn anew at every read: a weight would not belong to one example."""

    def __init__(self, X: Tensor) -> None:
        self.X, self.gen = X, torch.Generator().manual_seed(1)

    def __len__(self) -> int:
        return len(self.X)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.X[i], torch.randint(0, 3, (), generator=self.gen)


def test_the_label_check_runs_on_labels_read_before_collation():
    data = BagData()
    data.dataset = Relabelled(data.X)
    with pytest.raises(ConfigurationError, match="had label"):
        fit(callback(), 3, model=BagClassifier(), data=data)


DDP_GAUGES = ("class", "auto")


def _ddp_worker(out: Path, gauges: tuple[str, ...] = DDP_GAUGES) -> None:
    """Fit the drop-in on 2 CPU processes (Lightning's DDP) with each of ``DDP_GAUGES``, one fit
    after the other in one process group (one launch of the two ranks); each rank saves its
    weights, the gauge held and its record of the rows' labels."""
    torch.set_num_threads(1)
    for gauge in gauges:
        cb = callback(val_batch_size=30, gauge=gauge)
        t = trainer([cb], devices=2, strategy="ddp", max_epochs=4)
        t.fit(Classifier(), datamodule=Data())
        record = {"w": cb.data_weights(), "gauge": cb.weights.gauge, "labels": cb.problem._labels}
        torch.save(record, out / f"{gauge}_rank{t.global_rank}.pt")
    end_ddp_worker()


def _ddp_fit(out: Path, gauge: str) -> tuple[dict, dict]:
    """Both ranks' records of one DDP fit with ``gauge`` (session 52's centring test uses it)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out), "--gauge", gauge]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return tuple(torch.load(out / f"{gauge}_rank{r}.pt") for r in (0, 1))


@pytest.fixture(scope="module")
def ddp_records(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """gauge → both ranks' records from the DDP fits of ``_ddp_worker`` (in a subprocess)."""
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {g: tuple(torch.load(out / f"{g}_rank{r}.pt") for r in (0, 1)) for g in DDP_GAUGES}


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.parametrize("gauge", DDP_GAUGES)
def test_ddp_ranks_hold_the_class_gauge_identically(gauge, ddp_records):
    """Under DDP every rank records the labels of every rank's rows, so the class gauge shifts
    the same rows on every rank: identical weights (each rank recording only its own rows'
    labels shifted them by other class means), and "auto" chooses the class gauge there too."""
    r0, r1 = ddp_records[gauge]
    assert r0["gauge"] == r1["gauge"] == "class"
    assert torch.equal(r0["w"], r1["w"])
    assert torch.equal(r0["labels"], r1["labels"])
    assert torch.equal(r0["labels"], Data().y)  # every row's label, on each rank
    assert r0["w"][:NOISY].mean() < r0["w"][NOISY:].mean() - 0.1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True, help="folder for per-rank results")
    parser.add_argument("--gauge", help="one gauge only (default: each of DDP_GAUGES)")
    args = parser.parse_args()
    _ddp_worker(args.worker, (args.gauge,) if args.gauge else DDP_GAUGES)
