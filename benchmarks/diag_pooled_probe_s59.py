"""The pooled step-size probe on a real manual-optimisation fit (session 59).

Session 58 made the step-size probe read every optimizer that steps in a batch (pooled,
Σ⟨Δw, g⟩/Σ‖g‖², ``PooledStepSizeProbe``) where session 57 read the batch's last one only. This
fit is the case it was built for: an MNIST MLP (784-256-10, 4,000 training images, 1,000
validation, the 10,000 test images) under manual optimisation with two optimizers whose step
size the callback cannot read from their state — RMSprop on the body (lr 1e-3) and Adagrad on
the head (lr 0.05) — and ``LearnedWeightDecay(1e-4, training_loss=...)``; the user's own recipe
is the same fit with ``weight_decay=1e-4`` in both optimizers. (SGD and Adam are read from
their state, ``effective_step_size``, and the probe does not act: with SGD on the body and Adam
on the head every hyper step's probe reading was None.) Per seed it records the η̂ the probe gave
each hyper step, λ at the end and the held-out test loss and accuracy of the last weights.

Run it on today's code and on the code before the pooled probe (git 5476aff6^) for the
before/after::

    python benchmarks/diag_pooled_probe_s59.py --data ../shared/data --seeds 0 1 2 --out R/now.json

(``R=benchmarks/results/weight_decay/runs/s59_pooled``.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import statistics
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist(root: Path) -> dict[str, TensorDataset]:
    arrays = {s: (idx(root / a), idx(root / b)) for s, (a, b) in FILES.items()}
    x, y = arrays["train"]
    x = torch.tensor(x[:5000].reshape(5000, -1), dtype=torch.float32) / 255.0
    y = torch.tensor(y[:5000], dtype=torch.long)
    xt, yt = arrays["test"]
    xt = torch.tensor(xt.reshape(len(xt), -1), dtype=torch.float32) / 255.0
    return {
        "train": TensorDataset(x[:4000], y[:4000]),
        "val": TensorDataset(x[4000:], y[4000:]),
        "test": TensorDataset(xt, torch.tensor(yt, dtype=torch.long)),
    }


class TwoOptimizers(pl.LightningModule):
    """An MLP whose body and head are stepped by their own optimizers (manual optimisation)."""

    def __init__(self, weight_decay: float) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.body = torch.nn.Linear(784, 256)
        self.head = torch.nn.Linear(256, 10)
        self.weight_decay = weight_decay

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.body(x)))

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        body, head = self.optimizers()
        body.zero_grad()
        head.zero_grad()
        self.manual_backward(self.loss(batch))
        body.step()
        head.step()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        wd = self.weight_decay
        return [
            torch.optim.RMSprop(self.body.parameters(), lr=1e-3, weight_decay=wd),
            torch.optim.Adagrad(self.head.parameters(), lr=0.05, weight_decay=wd),
        ]


def training_loss(module: pl.LightningModule, batch: Any) -> Tensor:
    return TwoOptimizers.loss(module, batch)


def probed(cb: LearnedWeightDecay) -> list[float | None]:
    """η̂ per hyper step, read as the hyper step takes it."""
    seen: list[float | None] = []
    observe = cb._observe_horizon

    def recording(trainer: pl.Trainer) -> None:
        seen.append(getattr(cb, "_step_size", None))
        observe(trainer)

    cb._observe_horizon = recording  # type: ignore[method-assign]
    return seen


@torch.no_grad()
def test_scores(model: TwoOptimizers, test: TensorDataset) -> tuple[float, float]:
    x, y = test.tensors
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


def run(data: dict[str, TensorDataset], arm: str, seed: int, epochs: int) -> dict[str, Any]:
    pl.seed_everything(seed, verbose=False)
    model = TwoOptimizers(1e-4 if arm == "own" else 0.0)
    callbacks, eta = [], []
    if arm == "learned":
        cb = LearnedWeightDecay(1e-4, training_loss=training_loss, seed=seed)
        eta, callbacks = probed(cb), [cb]
    trainer = pl.Trainer(
        max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    train = DataLoader(data["train"], batch_size=64, shuffle=True)
    trainer.fit(model, train, DataLoader(data["val"], batch_size=500))
    loss, acc = test_scores(model, data["test"])
    out: dict[str, Any] = {"arm": arm, "seed": seed, "test_loss": loss, "test_acc": acc}
    if arm == "learned":
        lam = callbacks[0].learned_weight_decay
        out["lambda_end"] = {k: float(v) for k, v in lam.items()}
        out["eta_probed"] = [None if e is None else float(e) for e in eta]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--arms", nargs="+", default=["own", "learned"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    data = mnist(args.data / "mnist")
    runs = [run(data, arm, s, args.epochs) for s in args.seeds for arm in args.arms]
    for r in runs:
        print(json.dumps(r)[:400])
    summary = {
        arm: statistics.fmean(r["test_loss"] for r in runs if r["arm"] == arm) for arm in args.arms
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs, "mean_test_loss": summary}, indent=1))
    print("mean test loss", summary)


if __name__ == "__main__":
    main()
