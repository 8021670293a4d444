"""DDP through Lightning (``accelerator="cpu", devices=2, strategy="ddp"``, gloo).

The test runs this file as a script; Lightning's DDP strategy launches the second process itself
(it re-runs the script with ``LOCAL_RANK=1``), each rank writes what it computed to a file, and the
test compares that with a single-process run on the same global batches:

* the training (the inner solver) sees the same global batches: shards of a sequential loader;
* the callback's samplers draw the same global batches on every rank and keep their shard (or,
  for streamed data, read each rank's own stream, which shards itself);
* the adjoint's Jacobian products, Φ̂ and ∇E are averaged across ranks (``strategy.reduce``).

So every hypergradient, and λ, equal the single-process ones up to float rounding, and λ is
bitwise identical on both ranks.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import rank_batches, ridge_data
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hypertorch_sid import Batches, BilevelModule, HyperOptimizationCallback, LearnedWeightDecay
from hypertorch_sid.lightning.training_length import runs_in_new_processes

D, N, N_VAL = 4, 96, 48
PER_RANK_BATCH, PER_RANK_VAL_BATCH, WORLD = 8, 6, 2
SETTINGS = dict(
    every_n_steps=2,
    max_overhead=None,  # equal hypergradients need every due hyper step, not the clock's choice
    adjoint_steps=6,
    step_size="constant",
    eta=0.8,
    alpha=0.3,
    batches=Batches(d2=2),
    outer_lr=0.05,
    seed=11,
)


class Net(BilevelModule):
    """A small tanh network with a per-feature L2 penalty exp(log_lam) on the first layer."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.l1 = torch.nn.Linear(D, 6, dtype=torch.float64)
        self.l2 = torch.nn.Linear(6, 1, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        self.register_hyperparameter("log_lam", torch.full((D,), -2.0, dtype=torch.float64))

    def _fit(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.l2(torch.tanh(self.l1(x))).squeeze(-1) - y) ** 2).mean()

    def inner_loss(self, batch: Any) -> Tensor:
        penalty = 0.5 * (self.log_lam.exp() * self.l1.weight.pow(2)).sum()
        return (
            self._fit(batch) + penalty + 0.5e-2 * sum(p.pow(2).sum() for p in self.l2.parameters())
        )

    def outer_loss(self, batch: Any) -> Tensor:
        return self._fit(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=0.1)


class PlainNet(pl.LightningModule):
    """An ordinary LightningModule for LearnedWeightDecay."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.l1 = torch.nn.Linear(D, 6, dtype=torch.float64)
        self.l2 = torch.nn.Linear(6, 1, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = 0.5 * ((self.l2(torch.tanh(self.l1(x))).squeeze(-1) - y) ** 2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)


class Data(pl.LightningDataModule):
    """Sequential global batches of 16; under DDP rank r gets rows [8r, 8r + 8) of each one.

    (Lightning's own DistributedSampler always shuffles training data; this keeps the test's
    single-process reference on exactly the same global batches.) The datasets are the whole
    sets on every rank, as with a DistributedSampler.
    """

    def __init__(self) -> None:
        super().__init__()
        X, y, Xv, yv = ridge_data(N, N_VAL, d=D, seed=0, noise=0.3)
        self.train, self.val = TensorDataset(X, y), TensorDataset(Xv, yv)

    def train_dataloader(self) -> DataLoader:
        world, rank = self.trainer.world_size, self.trainer.global_rank
        batches = rank_batches(N, PER_RANK_BATCH * WORLD, world, rank)
        return DataLoader(self.train, batch_sampler=batches)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=PER_RANK_VAL_BATCH)


class ShardedStream(IterableDataset):
    """A stream that shards itself, as streaming datasets do: of each block of ``block`` rows in
    order, rank r yields its contiguous part (the same rows as :class:`Data`'s batch sampler)."""

    def __init__(self, data: TensorDataset, block: int, rank: int, world: int) -> None:
        self.data, self.block, self.rank, self.world = data, block, rank, world

    def __iter__(self) -> Iterator[Any]:
        size = self.block // self.world
        for start in range(0, len(self.data) - self.block + 1, self.block):
            for i in range(start + self.rank * size, start + (self.rank + 1) * size):
                yield self.data[i]


class StreamData(Data):
    """:class:`Data` as streams: the callback reads them through the loaders themselves."""

    def _stream(self, data: TensorDataset, per_rank_batch: int) -> DataLoader:
        world, rank = self.trainer.world_size, self.trainer.global_rank
        block = per_rank_batch * WORLD
        return DataLoader(ShardedStream(data, block, rank, world), batch_size=block // world)

    def train_dataloader(self) -> DataLoader:
        return self._stream(self.train, PER_RANK_BATCH)

    def val_dataloader(self) -> DataLoader:
        return self._stream(self.val, PER_RANK_VAL_BATCH)


def _record(cb: HyperOptimizationCallback) -> None:
    """Keep every hypergradient the callback computes."""
    cb.hypergradients = []
    step = cb._hyper_step

    def recording(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step(trainer, pl_module)
        cb.hypergradients.append([g.clone() for g in cb.last_hypergradient])

    cb._hyper_step = recording


def run(kind: str, devices: int) -> dict[str, Any]:
    """Fit ``kind`` ("bilevel", "weight_decay", or "stream": weight decay on streamed data) on
    ``devices`` CPU processes; return results."""
    sizes = dict(
        batch_size=PER_RANK_BATCH * WORLD // devices,
        val_batch_size=PER_RANK_VAL_BATCH * WORLD // devices,
    )
    if kind == "bilevel":
        model: pl.LightningModule = Net()
        cb: HyperOptimizationCallback = HyperOptimizationCallback(**SETTINGS, **sizes)
    else:
        model = PlainNet()
        cb = LearnedWeightDecay(1e-2, granularity="per_element", **SETTINGS, **sizes)
    _record(cb)
    trainer = lightning_problems.trainer(
        [cb],
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(model, datamodule=StreamData() if kind == "stream" else Data())
    lam = [h.detach().clone() for h in cb.sid.hyperparameters]
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "hypergradients": cb.hypergradients,
        "lambda": lam,
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "history": cb.history,
    }


KINDS = ("bilevel", "weight_decay", "stream")


def _worker(out: Path) -> None:
    torch.set_num_threads(1)
    for kind in KINDS:
        result = run(kind, devices=WORLD)
        torch.save(result, out / f"{kind}_rank{result['rank']}.pt")
    lightning_problems.end_ddp_worker()


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")
def test_ddp_hypergradient_equals_single_process_on_global_batches(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    torch.set_num_threads(1)
    for kind in KINDS:
        r0 = torch.load(tmp_path / f"{kind}_rank0.pt", weights_only=False)
        r1 = torch.load(tmp_path / f"{kind}_rank1.pt", weights_only=False)
        assert (r0["world_size"], r1["rank"]) == (2, 1)
        # λ, w and every hypergradient bitwise identical on the two ranks
        for a, b in zip(r0["lambda"], r1["lambda"]):
            assert torch.equal(a, b)
        for key in r0["weights"]:
            assert torch.equal(r0["weights"][key], r1["weights"][key]), key
        assert len(r0["hypergradients"]) == 6
        single = run(kind, devices=1)
        assert len(single["hypergradients"]) == 6
        for got, expected in zip(r0["hypergradients"], single["hypergradients"]):
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)
        for g, e in zip(r0["lambda"], single["lambda"]):
            torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12)
        # and λ moved: the test would not notice a callback that does nothing otherwise
        assert any(h["hyper/hypergradient_norm"] > 0 for h in r0["history"])
        assert not torch.allclose(
            r0["lambda"][0], torch.full_like(r0["lambda"][0], r0["lambda"][0].flatten()[0])
        )


@pytest.mark.parametrize(
    "strategy, spawned", [("ddp_spawn", True), ("ddp_fork", True), ("ddp", False), ("auto", False)]
)
def test_strategies_that_fit_in_new_processes_are_told_apart(strategy, spawned):
    """Under ``ddp_spawn``/``ddp_fork`` the callback's state (LearnedWeightDecay's λ) stays in the
    started processes, so on_fit_start warns; ``ddp`` keeps rank 0 in the calling process."""
    devices = 1 if strategy == "auto" else 2
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False)
    assert runs_in_new_processes(trainer) is spawned


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True, help="folder for per-rank results")
    _worker(parser.parse_args().worker)
