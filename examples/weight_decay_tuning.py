"""Weight-decay tuning: a grid of fixed weight decays (what users do now) vs learned weight decay.

A LightningModule trained with ``Adam(weight_decay=...)`` is tuned two ways:

* **grid**: one training per value of a fixed grid, the best picked by validation loss;
* **learned**: one training with ``LearnedWeightDecay`` (SID hypergradients on the validation
  loss, one weight decay per layer by default) — the module is unchanged, the optimizer's
  ``weight_decay=`` is dropped and the callback is added.

Accuracy and loss are computed with torchmetrics. The script prints a table (validation and test
loss/accuracy, final weight decay, training time) and saves a PNG with the learned λ over training
and the validation loss per epoch of every run.

Usage::

    python examples/weight_decay_tuning.py                        # digits (sklearn), MLP
    python examples/weight_decay_tuning.py --dataset mnist --model cnn
    python examples/weight_decay_tuning.py --quick                # a few seconds (smoke test)

MNIST is read through ``load_mnist`` of ``examples/datasets.py`` (torchvision's MNIST on the local
IDX files in ``<data root>/mnist``: ``--data``, ``$HYPERTORCH_SID_DATA`` or ``../shared/data``
relative to the repository; a normal download otherwise). ``--quick`` saves its plot in a
temporary folder unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torchmetrics import MeanMetric  # noqa: E402
from torchmetrics.classification import MulticlassAccuracy  # noqa: E402

from hypertorch_sid import (
    BackOff,
    LearnedWeightDecay,  # noqa: E402
)
from hypertorch_sid.lightning.callback import CALLBACK_CONFIG


# ---------------------------------------------------------------------------------- data
@dataclass
class Data:
    X_train: Tensor
    y_train: Tensor
    X_val: Tensor
    y_val: Tensor
    X_test: Tensor
    y_test: Tensor
    image_side: int
    n_classes: int = 10


def load_digits_split(seed: int = 0) -> Data:
    """scikit-learn's 8×8 digits (1797 images, 10 classes): 40 % train, 30 % val, 30 % test."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    idx = torch.arange(len(y)).numpy()
    tr, rest = train_test_split(idx, train_size=0.4, stratify=y.numpy(), random_state=seed)
    va, te = train_test_split(rest, train_size=0.5, stratify=y[rest].numpy(), random_state=seed)
    return Data(X[tr], y[tr], X[va], y[va], X[te], y[te], image_side=8)


def load_mnist_split(n_train: int, n_val: int, n_test: int, seed: int = 0) -> Data:
    """MNIST: n_train/n_val disjoint images of the training set, n_test of the test set."""
    from datasets import load_mnist  # examples/datasets.py (this script's folder)

    X, y = load_mnist(train=True)
    X_test, y_test = load_mnist(train=False)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, va = perm[:n_train], perm[n_train : n_train + n_val]
    return Data(X[tr], y[tr], X[va], y[va], X_test[:n_test], y_test[:n_test], image_side=28)


# ------------------------------------------------------------------------------ the user's module
def make_network(kind: str, side: int, n_classes: int, hidden: int) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(side * side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_classes),
        )
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (side // 2) ** 2, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_classes),
    )


class Classifier(pl.LightningModule):
    """An ordinary LightningModule: cross-entropy, Adam with a weight_decay, torchmetrics."""

    def __init__(self, network: nn.Module, lr: float, weight_decay: float, n_classes: int):
        super().__init__()
        self.network, self.lr, self.weight_decay = network, lr, weight_decay
        self.val_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes=n_classes)
        self.val_curve: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_loss.update(F.cross_entropy(logits, y), weight=len(y))
        self.val_acc.update(logits, y)

    def on_validation_epoch_end(self) -> None:
        loss = float(self.val_loss.compute())
        self.log_dict({"val_loss": loss, "val_acc": float(self.val_acc.compute())})
        if not self.trainer.sanity_checking:
            self.val_curve.append(loss)
        self.val_loss.reset()
        self.val_acc.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # with LearnedWeightDecay the grid's weight_decay is 0 and the callback applies λ
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


@torch.no_grad()
def evaluate(model: nn.Module, X: Tensor, y: Tensor, n_classes: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) with torchmetrics."""
    model.eval()
    loss, acc = MeanMetric(), MulticlassAccuracy(num_classes=n_classes)
    for xb, yb in DataLoader(TensorDataset(X, y), batch_size=1024):
        logits = model(xb)
        loss.update(F.cross_entropy(logits, yb), weight=len(yb))
        acc.update(logits, yb)
    return float(loss.compute()), float(acc.compute())


# ---------------------------------------------------------------------------------- runs
def train_once(
    data: Data,
    args: argparse.Namespace,
    weight_decay: float,
    callback: LearnedWeightDecay | None = None,
) -> tuple[Classifier, float]:
    pl.seed_everything(args.seed, verbose=False)
    net = make_network(args.model, data.image_side, data.n_classes, args.hidden)
    model = Classifier(net, args.lr, weight_decay, data.n_classes)
    gen = torch.Generator().manual_seed(args.seed)
    train = DataLoader(
        TensorDataset(data.X_train, data.y_train),
        batch_size=args.batch_size,
        shuffle=True,
        generator=gen,
    )
    val = DataLoader(TensorDataset(data.X_val, data.y_val), batch_size=args.batch_size)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        callbacks=[callback] if callback is not None else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(model, train, val)
    return model, time.perf_counter() - start


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if args.dataset == "digits":
        data = load_digits_split(args.seed)
    else:
        data = load_mnist_split(args.mnist_train, args.mnist_val, args.mnist_test, args.seed)
    rows: list[dict[str, Any]] = []
    curves: dict[str, Any] = {"grid": {}, "learned": None, "lambda": None}

    def report(method: str, model: Classifier, wd: float, seconds: float) -> None:
        val_loss, val_acc = evaluate(model, data.X_val, data.y_val, data.n_classes)
        test_loss, test_acc = evaluate(model, data.X_test, data.y_test, data.n_classes)
        rows.append(
            dict(
                method=method,
                weight_decay=wd,
                val_loss=val_loss,
                val_acc=val_acc,
                test_loss=test_loss,
                test_acc=test_acc,
                seconds=seconds,
            )
        )

    for wd in args.grid:
        model, seconds = train_once(data, args, wd)
        report(f"grid wd={wd:g}", model, wd, seconds)
        curves["grid"][wd] = model.val_curve

    cb = LearnedWeightDecay(
        args.init,
        granularity=args.granularity,
        every_n_steps=args.every_n_steps,
        adjoint_steps=args.adjoint_steps,
        outer_optimizer=functools.partial(torch.optim.Adam, lr=args.outer_lr),
        val="batch",
        on_divergence="skip",
        config=CALLBACK_CONFIG.replace(on_divergence=BackOff(2)),
        seed=args.seed,
    )
    model, seconds = train_once(data, args, 0.0, cb)
    decays = torch.cat([v.flatten() for v in cb.decay_values().values()])
    report(f"learned ({args.granularity})", model, float(decays.mean()), seconds)
    curves["learned"] = model.val_curve
    curves["lambda"] = cb.history
    curves["steps_per_epoch"] = math.ceil(len(data.y_train) / args.batch_size)
    return rows, curves


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    best = min((r for r in rows if r["method"].startswith("grid")), key=lambda r: r["val_loss"])
    print(f"\n{args.dataset} / {args.model}, {args.epochs} epochs per training")
    header = f"{'method':<24}{'wd (mean)':>11}{'val loss':>10}{'val acc':>9}"
    header += f"{'test loss':>11}{'test acc':>10}{'time (s)':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        mark = "  <- best of grid" if r is best else ""
        print(
            f"{r['method']:<24}{r['weight_decay']:>11.2e}{r['val_loss']:>10.4f}{r['val_acc']:>9.4f}"
            f"{r['test_loss']:>11.4f}{r['test_acc']:>10.4f}{r['seconds']:>10.1f}{mark}"
        )
    grid_time = sum(r["seconds"] for r in rows if r["method"].startswith("grid"))
    learned = rows[-1]
    print(
        f"\ngrid search: {len(args.grid)} trainings, {grid_time:.1f} s in all; learned weight "
        f"decay: 1 training, {learned['seconds']:.1f} s"
    )


def plot(curves: dict[str, Any], out: str, args: argparse.Namespace) -> None:
    fig, (ax_l, ax_v) = plt.subplots(1, 2, figsize=(11, 4))
    hist = curves["lambda"] or []
    spe = curves["steps_per_epoch"]
    if hist:
        x = [h["global_step"] / spe for h in hist]
        ax_l.plot(x, [h["hyper/weight_decay_mean"] for h in hist], label="learned λ (mean)")
        ax_l.fill_between(
            x,
            [h["hyper/weight_decay_min"] for h in hist],
            [h["hyper/weight_decay_max"] for h in hist],
            alpha=0.3,
            label="learned λ (min–max)",
        )
    for wd in curves["grid"]:
        if wd > 0:
            ax_l.axhline(wd, ls="--", lw=0.8, color="gray")
    ax_l.set_yscale("log")
    ax_l.set_xlabel("epoch")
    ax_l.set_ylabel("weight decay λ")
    ax_l.set_title("learned weight decay (dashed: grid values)")
    ax_l.legend()
    for wd, curve in curves["grid"].items():
        ax_v.plot(range(1, len(curve) + 1), curve, ls="--", label=f"grid wd={wd:g}")
    learned = curves["learned"] or []
    ax_v.plot(range(1, len(learned) + 1), learned, lw=2.5, color="black", label="learned")
    ax_v.set_xlabel("epoch")
    ax_v.set_ylabel("validation loss")
    ax_v.set_title(f"{args.dataset} / {args.model}")
    ax_v.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"plot saved to {out}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", choices=["digits", "mnist"], default="digits")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--quick", action="store_true", help="tiny run (seconds), for smoke tests")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--grid", type=float, nargs="+", default=None, help="fixed weight decays")
    p.add_argument("--init", type=float, default=1e-4, help="initial learned weight decay")
    p.add_argument(
        "--granularity",
        default="per_layer",
        choices=["global", "per_group", "per_layer", "per_tensor", "per_element"],
    )
    p.add_argument("--every-n-steps", type=int, default=5)
    p.add_argument("--adjoint-steps", type=int, default=20)
    p.add_argument("--outer-lr", type=float, default=0.1)
    p.add_argument("--mnist-train", type=int, default=10000)
    p.add_argument("--mnist-val", type=int, default=5000)
    p.add_argument("--mnist-test", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--out",
        default=None,
        help="PNG file for the plot (default weight_decay_tuning.png; --quick: a temporary folder)",
    )
    p.add_argument("--data", default=None, help="data root holding mnist/ (see above)")
    args = p.parse_args(argv)
    if args.out is None:
        folder = tempfile.mkdtemp(prefix="hypertorch_sid_quick_") if args.quick else "."
        args.out = os.path.join(folder, "weight_decay_tuning.png")
    if args.data is not None:
        os.environ["HYPERTORCH_SID_DATA"] = os.path.abspath(os.path.expanduser(args.data))
    if args.quick:
        args.epochs = args.epochs or 3
        args.grid = args.grid or [0.0, 1e-3]
        args.every_n_steps, args.adjoint_steps = 4, 5
        args.mnist_train, args.mnist_val, args.mnist_test = 1000, 500, 1000
    args.epochs = args.epochs or 30
    args.grid = args.grid or [0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    for name in ("pytorch_lightning", "lightning_fabric", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.WARNING)
    rows, curves = run(args)
    print_table(rows, args)
    plot(curves, args.out, args)
    return rows


if __name__ == "__main__":
    main()
