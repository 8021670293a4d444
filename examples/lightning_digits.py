"""The main job: learned weight decay on a small neural network, trained with Lightning.

``python examples/lightning_digits.py`` (what ``bash scripts/main.sh`` runs) trains one MLP on
scikit-learn's bundled 8×8 digits (no download) three ways, from the same initial weights and
the same batch order:

1. **no weight decay**;
2. **the grid a user would run**: the optimizer's ``weight_decay=`` at each of a few values, one
   training each, keeping the value with the lowest validation loss;
3. **``LearnedWeightDecay()`` with its defaults** (one λ per layer, learned from the validation
   loss by SID while the model trains): one training; and the same with ``max_overhead=None``
   (every due hyper step, whatever the clock says): this 2-second fit ships its last weights,
   and λ's gain here comes from its last hyper steps, which the default budget runs or not
   depending on the machine (docs/weight_decay_budget.md, "Session 43").

It prints the validation and held-out test loss and accuracy of each and its wall time, writes
them to a JSON file, and draws the λ trajectories and the validation curves (``--figure``). The
training set is small (``--n-train`` images) so that the network overfits and weight decay
matters. Each training logs to a ``CSVLogger`` under ``--logs``: draw any of them with
``python -m hypertorch_sid.plots LOGDIR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.loggers import CSVLogger
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    CurrentWeights,
    LearnedWeightDecay,
    TrainedWeights,
    TrajectoryWeights,
    TrustRprop,
    ValidationCurvature,
)
from hypertorch_sid.plots import lambda_names, plot_training, read_metrics

REPO = Path(__file__).resolve().parents[1]


class MLP(pl.LightningModule):
    """A plain LightningModule: nothing in it knows about hyperparameter tuning."""

    def __init__(self, weight_decay: float = 0.0, hidden: int = 128, lr: float = 0.05):
        super().__init__()
        self.weight_decay, self.lr = weight_decay, lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=self.lr, momentum=0.9, weight_decay=self.weight_decay
        )


def splits(n_train: int, n_val: int, seed: int) -> dict[str, TensorDataset]:
    """Stratified train / validation / held-out test splits of the 1797 digits (pixels / 16)."""
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    idx = list(range(len(y)))
    train, rest = train_test_split(idx, train_size=n_train, stratify=y, random_state=seed)
    val, test = train_test_split(rest, train_size=n_val, stratify=y[rest], random_state=seed)
    return {
        k: TensorDataset(X[i], y[i]) for k, i in (("train", train), ("val", val), ("test", test))
    }


def evaluate(model: MLP, data: TensorDataset) -> tuple[float, float]:
    """Loss and accuracy on a whole split."""
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        logits = model(x)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


def readable_progress_bar(shown: bool) -> list[pl.Callback]:
    """Rich's progress bar (Lightning's default where ``rich`` is installed) prints metrics as
    ``.3f``, which shows a λ of 5e-5 as 0.000: three significant digits instead."""
    try:
        import rich  # noqa: F401
        from pytorch_lightning.callbacks import RichProgressBar
        from pytorch_lightning.callbacks.progress.rich_progress import RichProgressBarTheme
    except ImportError:
        return []
    return [RichProgressBar(theme=RichProgressBarTheme(metrics_format=".3g"))] if shown else []


def train(
    data: dict[str, TensorDataset],
    args: argparse.Namespace,
    name: str,
    weight_decay: float = 0.0,
    callbacks: Sequence[pl.Callback] = (),
    progress_bar: bool = False,
) -> dict:
    """One training from the same initial weights and batch order (seeded); its scores."""
    pl.seed_everything(args.seed, verbose=False)
    model = MLP(weight_decay, hidden=args.hidden, lr=args.lr)
    train_loader = DataLoader(data["train"], batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(data["val"], batch_size=len(data["val"]))
    logger = CSVLogger(args.logs, name=name, version="")
    lightning_log = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    lightning_log.setLevel(logging.WARNING)  # no GPU/TPU lines and tips for each training
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=logger,
        callbacks=[*callbacks, *readable_progress_bar(progress_bar)],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
        num_sanity_val_steps=0,
    )
    if progress_bar:  # the learned run: show the callback's plan of hyper steps
        lightning_log.setLevel(logging.INFO)
    start = time.perf_counter()
    trainer.fit(model, train_loader, val_loader)
    seconds = time.perf_counter() - start
    val_loss, val_acc = evaluate(model, data["val"])
    test_loss, test_acc = evaluate(model, data["test"])
    return {
        "name": name,
        "weight_decay": weight_decay,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "seconds": seconds,
        "log": str(Path(logger.log_dir)),
    }


def draw(runs: dict, out: Path) -> None:
    """λ per layer of the learned run, and the validation loss of the three trainings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lam, ax_val) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    learned = read_metrics(runs["learned"]["log"])
    for name in lambda_names(learned):
        steps, values = learned[f"{name}_mean"]
        ax_lam.plot(steps, values, label=name.removeprefix("hyper/weight_decay/"))
    grid_wd = runs["grid_pick"]["weight_decay"]
    ax_lam.axhline(grid_wd, color="k", ls="--", lw=1, label=f"grid's pick {grid_wd:g}")
    ax_lam.set_yscale("log")
    ax_lam.set(title="learned λ per layer (LearnedWeightDecay)", xlabel="training step")
    ax_lam.legend(fontsize="small")
    for key, label in (
        ("no_wd", "no weight decay"),
        ("grid_pick", f"grid's pick (λ = {grid_wd:g})"),
        ("learned", "learned (one training)"),
        ("learned_every_step", "learned, max_overhead=None"),
    ):
        if key not in runs:
            continue
        steps, values = read_metrics(runs[key]["log"])["val_loss"]
        ax_val.plot(steps, values, marker=".", label=label)
    ax_val.set_yscale("log")
    ax_val.set(title="validation loss (log scale)", xlabel="training step")
    ax_val.legend(fontsize="small")
    fig.savefig(out, dpi=120)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The main job's settings (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-train", type=int, default=300)
    parser.add_argument("--n-val", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--grid", type=float, nargs="+", default=[1e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logs", type=Path, default=REPO / "results" / "tmp" / "main_job_logs")
    # a run writes under results/tmp/ (not tracked): the README's copy in results/ stays as
    # committed (it was made with --out results/lightning_digits.json --figure
    # results/lightning_digits.png)
    written = REPO / "results" / "tmp" / "main_job"
    parser.add_argument("--out", type=Path, default=written / "lightning_digits.json")
    parser.add_argument("--figure", type=Path, default=written / "lightning_digits.png")
    parser.add_argument(
        "--max-overhead",
        type=lambda s: s if s == "default" else None if s == "none" else float(s),
        default="default",
        help="the learned run's compute budget ('none': every due hyper step); default: the "
        "drop-in's own",
    )
    parser.add_argument(
        "--look-ahead",
        choices=("default", "current", "trained", "trajectory", "validation"),
        default="default",
        help="where the learned run's hypergradient reads the validation gradient: at the "
        "current weights (CurrentWeights) or at the trained ones (TrainedWeights; "
        "TrajectoryWeights: its filter along the weights' movement; ValidationCurvature: moved "
        "by the validation curvature); default: the drop-in's own",
    )
    parser.add_argument(
        "--outer-step",
        choices=("default", "trust_rprop"),
        default="default",
        help="the learned run's outer step on log λ: the drop-in's own, or TrustRprop (Rprop "
        "with its rises of λ held to what the remaining training can take)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*exists and is not empty.*")
    data = splits(args.n_train, args.n_val, args.seed)
    print(
        f"digits: {len(data['train'])} train / {len(data['val'])} validation / "
        f"{len(data['test'])} held-out test images; MLP 64-{args.hidden}-{args.hidden}-10, "
        f"SGD({args.lr:g}, momentum 0.9), "
        f"{args.epochs} epochs of batch {args.batch_size}"
    )

    runs = {"no_wd": train(data, args, "no_weight_decay")}
    grid = [train(data, args, f"grid_{wd:g}", weight_decay=wd) for wd in args.grid]
    pick = min(grid, key=lambda r: r["val_loss"])
    runs["grid_pick"] = {**pick, "grid_seconds": sum(r["seconds"] for r in grid)}
    print("LearnedWeightDecay() — the progress bar shows the mean λ (lam) and ‖∇̂f‖ (hg):")
    options = {} if args.max_overhead == "default" else {"max_overhead": args.max_overhead}
    if args.look_ahead != "default":
        look = {
            "current": CurrentWeights,
            "trained": TrainedWeights,
            "trajectory": TrajectoryWeights,
            "validation": ValidationCurvature,
        }[args.look_ahead]
        options["look_ahead"] = look()
    if args.outer_step == "trust_rprop":
        options["outer_optimizer"] = TrustRprop
    runs["learned"] = train(
        data, args, "learned", callbacks=[LearnedWeightDecay(**options)], progress_bar=True
    )
    if options.get("max_overhead", "default") is not None:
        # the same without a budget: every due hyper step, whatever the clock says (a short fit
        # whose last weights ship depends on whether its last hyper steps run)
        unbudgeted = {**options, "max_overhead": None}
        runs["learned_every_step"] = train(
            data, args, "learned_every_step", callbacks=[LearnedWeightDecay(**unbudgeted)]
        )
    logged = read_metrics(runs["learned"]["log"])
    learned_lam = {
        n.removeprefix("hyper/weight_decay/"): logged[f"{n}_mean"][1][-1]
        for n in lambda_names(logged)
    }

    rows = [
        ("no weight decay", runs["no_wd"], runs["no_wd"]["seconds"]),
        (
            f"grid of {len(grid)}, pick λ={pick['weight_decay']:g}",
            pick,
            runs["grid_pick"]["grid_seconds"],
        ),
        (
            "LearnedWeightDecay("
            + ("outer_optimizer=TrustRprop" if args.outer_step == "trust_rprop" else "")
            + ") (1 training)",
            runs["learned"],
            runs["learned"]["seconds"],
        ),
    ]
    if "learned_every_step" in runs:
        every = runs["learned_every_step"]
        rows.append(("  the same, max_overhead=None", every, every["seconds"]))
    lines = [
        f"{'method':36s} {'val loss':>9s} {'val acc':>8s} {'test loss':>10s} {'test acc':>9s}"
        f" {'seconds':>8s}"
    ]
    for label, r, seconds in rows:
        lines.append(
            f"{label:36s} {r['val_loss']:9.4f} {r['val_acc']:8.1%} {r['test_loss']:10.4f} "
            f"{r['test_acc']:9.1%} {seconds:8.1f}"
        )
    lines.append(
        "learned λ per layer at the end: "
        + ", ".join(f"{k} {v:.2g}" for k, v in learned_lam.items())
    )
    lines.append(
        "grid: " + ", ".join(f"λ={r['weight_decay']:g} val {r['val_loss']:.4f}" for r in grid)
    )
    table = "\n".join(lines)
    print("\n" + table)

    result = {
        "command": "python examples/lightning_digits.py",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": runs,
        "grid": grid,
        "learned_lambda_per_layer": learned_lam,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    args.out.with_suffix(".txt").write_text(f"```text\n$ {result['command']}\n{table}\n```\n")
    if args.figure:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        draw(runs, args.figure)
        hyper = args.figure.with_name(args.figure.stem + "_hyper_steps.png")
        if learned_lam:
            title = "LearnedWeightDecay() on the digits MLP"
            plot_training(runs["learned"]["log"], hyper, title=title)
            print(f"wrote {args.out}, {args.figure} and {hyper}; logs in {args.logs}")
        else:  # a fit too short for the default budget's first hyper step (the callback warned)
            print(f"wrote {args.out} and {args.figure} (no hyper step ran in the learned run: no "
                  f"{hyper.name}); logs in {args.logs}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
