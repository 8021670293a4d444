"""What the drop-in costs on recipes no one here wrote: pytorch/examples' two MNIST scripts.

Issue 28's "user set-ups": the CNN of ``pytorch/examples/mnist/main.py`` (two convolutions,
dropout 0.25 / 0.5, 9216→128→10, ``log_softmax`` + ``nll_loss``, Adadelta lr 1.0) and the LSTM
of ``pytorch/examples/mnist_rnn/main.py`` (LSTM(28, 64) over the image's rows, BatchNorm1d,
dropout, 64→32→10, Adadelta lr 0.1), each with its ``StepLR(step_size=1, gamma=0.7)`` per
epoch, wrapped in a ``LightningModule`` as a user would (a validation step every epoch), on
2,000 MNIST training images (the scripts' normalisation), batch 64, 8 epochs. The models are
re-typed here from those scripts (a user's code, not the library's).

Per recipe and repeat, two fits:

* ``plain``    the recipe with the optimizer's own ``weight_decay=1e-4`` (what the user had);
* ``default``  the same recipe without it and with ``LearnedWeightDecay(1e-4)``, every default
               (its budget ``max_overhead=0.5``).

The cost is the process's CPU time from the fit's train start to its train end (one thread), the
default's over the same repeat's plain one; also the held-out test loss and accuracy of both
(10,000 test images, after the fit, outside the timer) and the learned λ per layer.

Usage (from the repository root; ``--data``: the folder of MNIST's four IDX ``*.gz`` files)::

    python benchmarks/bench_user_recipes.py --data ../shared/data/mnist --repeats 5 \
        --out benchmarks/results/user_recipes/user_recipes.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_decay import load_mnist_arrays  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "user_recipes" / "user_recipes.json"
PLAIN_DECAY = 1e-4


class ExamplesCNN(nn.Module):
    """pytorch/examples/mnist/main.py's ``Net``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(torch.flatten(self.dropout1(x), 1))))
        return F.log_softmax(self.fc2(x), dim=1)


class ExamplesLSTM(nn.Module):
    """pytorch/examples/mnist_rnn/main.py's ``Net``."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(64)
        self.dropout1, self.dropout2 = nn.Dropout2d(0.25), nn.Dropout2d(0.5)
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.batchnorm(self.rnn(x.reshape(-1, 28, 28))[0][:, -1, :])
        out = self.dropout2(F.relu(self.fc1(self.dropout1(out))))
        return F.log_softmax(self.fc2(out), dim=1)


#: recipe → (network, Adadelta's lr), as in the two scripts
RECIPES = {"cnn": (ExamplesCNN, 1.0), "lstm": (ExamplesLSTM, 0.1)}


class Recipe(pl.LightningModule):
    """The scripts' train / test loops as a LightningModule: nll_loss of log_softmax outputs,
    Adadelta, StepLR(1, 0.7) per epoch."""

    def __init__(self, net: nn.Module, lr: float, decay: float) -> None:
        super().__init__()
        self.net, self.lr, self.decay = net, lr, decay

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.nll_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.nll_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adadelta(self.parameters(), lr=self.lr, weight_decay=self.decay)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


class FitClock(Callback):
    """The process's CPU time from train start to train end (one thread: its compute)."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall


def split(data: Path, seed: int, n_train: int, n_val: int) -> dict[str, TensorDataset]:
    """2,000 training and 1,000 validation images drawn from MNIST's training set, and its
    10,000 test images, normalised as the scripts do."""
    arrays = load_mnist_arrays(data)

    def tensors(images: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor(images, dtype=torch.float32).div(255).sub(0.1307).div(0.3081)
        return x.unsqueeze(1), torch.tensor(labels, dtype=torch.long)

    x, y = tensors(*arrays["train"])
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, va = perm[:n_train], perm[n_train : n_train + n_val]
    return {
        "train": TensorDataset(x[tr], y[tr]),
        "val": TensorDataset(x[va], y[va]),
        "test": TensorDataset(*tensors(*arrays["test"])),
    }


def held_out(net: nn.Module, test: TensorDataset) -> tuple[float, float]:
    net.eval()
    with torch.no_grad():
        out = torch.cat([net(x) for x, _ in DataLoader(test, batch_size=1000)])
    y = test.tensors[1]
    return float(F.nll_loss(out, y)), float((out.argmax(1) == y).float().mean())


def run_one(recipe: str, config: str, repeat: int, data: dict[str, TensorDataset],
            epochs: int) -> dict[str, Any]:  # fmt: skip
    make, lr = RECIPES[recipe]
    pl.seed_everything(repeat, verbose=False)
    model = Recipe(make(), lr, PLAIN_DECAY if config == "plain" else 0.0)
    clock = FitClock()
    callbacks: list[Callback] = [clock]
    cb = None
    if config == "default":
        cb = LearnedWeightDecay(1e-4)
        callbacks.insert(0, cb)  # the clock's train end runs last
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=callbacks,
    )  # fmt: skip
    loader = DataLoader(data["train"], batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(repeat))  # fmt: skip
    trainer.fit(model, loader, DataLoader(data["val"], batch_size=1000))
    test_loss, test_acc = held_out(model.net, data["test"])
    record: dict[str, Any] = {
        "recipe": recipe, "config": config, "repeat": repeat, "steps": trainer.global_step,
        "fit_cpu_s": clock.cpu, "fit_wall_s": clock.wall, "load": os.getloadavg()[0],
        "test_loss": test_loss, "test_acc": test_acc,
    }  # fmt: skip
    if cb is not None:
        record["lam"] = {k: float(v.mean()) for k, v in cb.decay_values().items()}
        record["overhead_measured"] = cb.budget.overhead
        record["hyper_steps"] = int(getattr(cb.budget, "hyper_steps", 0))
        record["hyper_steps_due"] = trainer.global_step // cb.every_n_steps
    return record


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for recipe in dict.fromkeys(r["recipe"] for r in records):
        rows = {(r["config"], r["repeat"]): r for r in records if r["recipe"] == recipe}
        repeats = sorted({k[1] for k in rows})
        ratios = [rows["default", n]["fit_cpu_s"] / rows["plain", n]["fit_cpu_s"] for n in repeats]
        diffs = [rows["default", n]["test_loss"] - rows["plain", n]["test_loss"] for n in repeats]
        out[recipe] = {
            "cpu_ratio": {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "each": ratios,
            },  # fmt: skip
            "plain_fit_cpu_s": statistics.median(rows["plain", n]["fit_cpu_s"] for n in repeats),
            "test_loss": {
                c: statistics.mean(rows[c, n]["test_loss"] for n in repeats)
                for c in ("plain", "default")
            },  # fmt: skip
            "test_acc": {
                c: statistics.mean(rows[c, n]["test_acc"] for n in repeats)
                for c in ("plain", "default")
            },  # fmt: skip
            "test_loss_default_minus_plain": {
                "mean": statistics.mean(diffs),
                "se": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
                "each": diffs,
            },
            "lam_end": [rows["default", n].get("lam") for n in repeats],
            "overhead_measured": [rows["default", n].get("overhead_measured") for n in repeats],
            "hyper_steps": [rows["default", n].get("hyper_steps") for n in repeats],
            "hyper_steps_due": rows["default", repeats[0]].get("hyper_steps_due"),
            "load": [rows[c, n]["load"] for c in ("plain", "default") for n in repeats],
        }
    return out


def markdown(summary: dict[str, Any], command: str) -> str:
    lines = [
        f"Command: `{command}` (1 thread, CPU)",
        "",
        "| recipe | plain fit (CPU s) | default × plain, median [min, max] | callback's measured "
        "share | test loss: plain / default (default − plain ± s.e.) | test accuracy: plain / "
        "default | hyper steps run (of due) | λ at the end (mean over repeats and layers) | load "
        "(1-min) |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    for recipe, s in summary.items():
        r, d = s["cpu_ratio"], s["test_loss_default_minus_plain"]
        shares = [x for x in s["overhead_measured"] if x is not None]
        lams = [v for lam in s["lam_end"] if lam for v in lam.values()]
        se = f" ± {d['se']:.4f}" if d["se"] is not None else ""
        lines.append(
            f"| {recipe} | {s['plain_fit_cpu_s']:.1f} | {r['median']:.2f} [{r['min']:.2f}, "
            f"{r['max']:.2f}] | {statistics.median(shares):.2f} | {s['test_loss']['plain']:.4f} / "
            f"{s['test_loss']['default']:.4f} ({d['mean']:+.4f}{se}) | "
            f"{s['test_acc']['plain']:.4f} / {s['test_acc']['default']:.4f} | "
            f"{','.join(str(h) for h in s['hyper_steps'])} (of {s['hyper_steps_due']}) | "
            f"{statistics.mean(lams):.2g} | {min(s['load']):.1f}–{max(s['load']):.1f} |"
        )
    return "\n".join(lines) + "\n"


def figure(summary: dict[str, Any], path: Path) -> None:
    """Each recipe's default × plain CPU time per repeat, against the budget's 1.5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    for i, s in enumerate(summary.values()):
        each = s["cpu_ratio"]["each"]
        ax.scatter([i] * len(each), each, color="C0", alpha=0.6)
        ax.hlines(s["cpu_ratio"]["median"], i - 0.2, i + 0.2, color="C0")
    ax.axhline(1.5, color="C3", ls="--", label="max_overhead=0.5 (1.5×)")
    ax.set_xticks(range(len(summary)), [f"pytorch/examples {r}" for r in summary])
    ax.set_ylabel("CPU time, default ÷ plain")
    ax.set_ylim(0.9, 2.0)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(records: list[dict[str, Any]], command: str, threads: int, out: Path) -> None:
    """The JSON, its Markdown table and its figure beside it."""
    summary = summarise(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": command, "machine": platform.platform(), "torch": torch.__version__,
        "threads": threads, "records": records, "summary": summary,
    }, indent=1))  # fmt: skip
    md = markdown(summary, command)
    out.with_suffix(".md").write_text(md)
    figure(summary, out.with_suffix(".png"))
    print(md)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data/mnist"))
    p.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["cnn", "lstm"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--replot", action="store_true", help="train nothing: rewrite --out's table "
                   "and figure from its records")  # fmt: skip
    args = p.parse_args(argv)
    if args.replot:
        stored = json.loads(args.out.read_text())
        for r in stored["records"]:  # a count of refusals, not of hyper steps (first run only)
            r.pop("hyper_steps_skipped", None)
            if r["config"] == "default":
                r.setdefault("hyper_steps_due", r["steps"] // 20)
        write(stored["records"], stored["command"], stored["threads"], args.out)
        return
    torch.set_num_threads(args.threads)
    data = split(args.data, 0, args.n_train, 1000)
    records = []
    for recipe in args.recipes:
        for n in range(args.repeats):
            for config in ("plain", "default") if n % 2 == 0 else ("default", "plain"):
                rec = run_one(recipe, config, n, data, args.epochs)
                records.append(rec)
                print(f"{recipe:5s} r{n} {config:8s} {rec['fit_cpu_s']:6.1f}s CPU  test loss "
                      f"{rec['test_loss']:.4f}", flush=True)  # fmt: skip
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    write(records, command, args.threads, args.out)


if __name__ == "__main__":
    main()
