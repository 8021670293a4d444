"""A ``Trainer.fit`` with a HyperOptimizationCallback, run as a subprocess by test_faults_lightning.

The job trains a small BatchNorm network (float64, Adam) whose first layer has a learned
per-feature L2 penalty exp(log_lam); the callback tunes log_lam by SID (Adam outer optimizer,
curvature estimated at the first hyper step and re-estimated every 3 hyper steps). Every hyper
step appends λ (as exact hexadecimal floats) to ``<out>/<tag>.jsonl`` — one file per process, so a
killed process leaves the hyper steps it did behind. ``ModelCheckpoint`` saves every
``CKPT_EVERY`` optimizer steps (``save_last=True``) to ``<out>/ckpt``.

``--kill-after S`` writes ``<out>/marker`` after optimizer step S (after that step's hyper step,
before any checkpoint of that step) and then sleeps: the test kills the process with SIGKILL.
``--resume CKPT`` continues from a checkpoint with ``trainer.fit(ckpt_path=CKPT)``. At the end the
job saves the final weights, λ and the callback's history to ``<out>/<tag>_final.pt``.

Training data are shuffled by a sampler seeded with the epoch (Lightning calls ``set_epoch``), so
the order of the training batches does not depend on the process's global RNG, which Lightning's
checkpoints do not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch import Tensor
from torch.utils.data import DataLoader, Sampler, TensorDataset

from hypertorch_sid import Batches, BilevelModule, EstimatedCurvature, HyperOptimizationCallback

D, HIDDEN, N, N_VAL, BATCH = 6, 8, 80, 40, 16  # 5 optimizer steps per epoch
EPOCHS = 6  # 30 optimizer steps
CKPT_EVERY = 5  # a checkpoint at every epoch end: steps 5, 10, 15, 20, 25, 30
SETTINGS = dict(
    every_n_steps=2,  # hyper steps at 2, 4, ..., 30 (15 of them)
    adjoint_steps=6,
    step_size="decreasing",
    curvature=EstimatedCurvature(batches=2, iters=5, every=3),
    batches=Batches(d2=2),
    outer_lr=0.05,
    batch_size=12,
    val_batch_size=10,
    seed=7,
)


class EpochSeededSampler(Sampler[int]):
    """A permutation of ``range(n)`` drawn from ``seed + epoch`` (``set_epoch`` is Lightning's)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=gen).tolist())

    def __len__(self) -> int:
        return self.n


def kill_at_marker(command: list[str], out: Path, log: Path, timeout: float = 240.0) -> None:
    """Run a job ``command`` (its output to ``log``) and SIGKILL it once it writes ``out/marker``
    (its kill point); fail the calling test where it ends first or does not get there in time."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with open(log, "w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            while not (out / "marker").exists():
                if proc.poll() is not None:
                    pytest.fail(
                        f"the job ended (rc {proc.returncode}) before its kill point:\n"
                        + log.read_text()[-3000:]
                    )
                if time.monotonic() > deadline:
                    pytest.fail(f"the job did not reach the kill point in {timeout:.0f} s")
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def data() -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    y = torch.tanh(X @ w) + 0.2 * torch.randn(N, generator=g, dtype=torch.float64)
    Xv = torch.randn(N_VAL, D, generator=g, dtype=torch.float64)
    yv = torch.tanh(Xv @ w) + 0.2 * torch.randn(N_VAL, generator=g, dtype=torch.float64)
    return X, y, Xv, yv


class Data(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        X, y, Xv, yv = data()
        self.train, self.val = TensorDataset(X, y), TensorDataset(Xv, yv)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=BATCH, sampler=EpochSeededSampler(N, seed=11))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=20)


class Net(BilevelModule):
    """Linear → BatchNorm → tanh → Linear, with ½ Σ exp(log_lam) ⊙ (first layer)² in ℓ̂."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(D, HIDDEN, dtype=torch.float64)
        self.bn = torch.nn.BatchNorm1d(HIDDEN, dtype=torch.float64)
        self.l2 = torch.nn.Linear(HIDDEN, 1, dtype=torch.float64)
        self.register_hyperparameter("log_lam", torch.full((D,), -2.0, dtype=torch.float64))

    def _fit(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * ((self.l2(torch.tanh(self.bn(self.l1(x)))).squeeze(-1) - y) ** 2).mean()

    def inner_loss(self, batch: Any) -> Tensor:
        return self._fit(batch) + 0.5 * (self.log_lam.exp() * self.l1.weight.pow(2)).sum()

    def outer_loss(self, batch: Any) -> Tensor:
        return self._fit(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.inner_parameters(), lr=0.02)


class LambdaLog(Callback):
    """After every hyper step, append {global_step, hyper_step, λ as float.hex} to a JSONL file.

    ``path`` may hold ``{rank}`` (the process's global rank). The first line of a fresh run holds
    the initial λ (``hyper_step`` 0).
    """

    def __init__(self, hyper: HyperOptimizationCallback, path: Path | str) -> None:
        self.hyper, self.path, self.seen = hyper, str(path), -1

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        sid = self.hyper.sid
        if sid is None or sid.hyper_step == self.seen:
            return
        self.seen = sid.hyper_step
        lam = [float.hex(x) for h in sid.hyperparameters for x in h.detach().flatten().tolist()]
        line = {"global_step": trainer.global_step, "hyper_step": sid.hyper_step, "lam": lam}
        with open(self.path.format(rank=trainer.global_rank), "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()


class KillPoint(Callback):
    """After optimizer step ``step``: write the marker file, then wait to be killed."""

    def __init__(self, step: int, marker: Path) -> None:
        self.step, self.marker = step, marker

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.marker.write_text(str(self.step))
            time.sleep(300)  # the test sends SIGKILL long before this ends


def make_trainer(callbacks: list[Callback], **kwargs: Any) -> pl.Trainer:
    """The job's Trainer: ``EPOCHS`` epochs, no validation loop (see ``lightning_problems``)."""
    return lightning_problems.trainer(
        callbacks, **{"max_epochs": EPOCHS, "limit_val_batches": 0, **kwargs}
    )


def run(
    out: Path,
    tag: str,
    kill_after: int | None = None,
    resume: Path | None = None,
    seed: int = SETTINGS["seed"],
) -> None:
    """Fit (or resume) the job; write ``<tag>.jsonl``, checkpoints and ``<tag>_final.pt``.

    ``seed`` is the callback's (its samplers and the randomness inside hyper steps).
    """
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model, dm = Net(), Data()
    hyper = HyperOptimizationCallback(**{**SETTINGS, "seed": seed})
    callbacks: list[Callback] = [hyper, LambdaLog(hyper, out / f"{tag}.jsonl")]
    if kill_after is not None:
        callbacks.append(KillPoint(kill_after, out / "marker"))
    callbacks.append(
        ModelCheckpoint(
            dirpath=out / f"{tag}_ckpt",
            every_n_train_steps=CKPT_EVERY,
            save_top_k=-1,
            save_last=True,
        )
    )
    trainer = make_trainer(callbacks, enable_checkpointing=True, default_root_dir=out)
    trainer.fit(model, datamodule=dm, ckpt_path=resume)
    torch.save(
        {
            "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
            "history": hyper.history,
            "global_step": trainer.global_step,
        },
        out / f"{tag}_final.pt",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--kill-after", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    args = parser.parse_args()
    run(args.out, args.tag, args.kill_after, args.resume)
