"""Overhead of the Lightning layer: HyperOptimizationCallback vs a hand-written PyTorch loop.

Four configurations train the same model (a ``BilevelModule``: MLP 784-256-256-10 with a per-layer
weight decay λ = exp(log_lam) in the inner loss ℓ̂ = CE + ½ Σ λ_l ‖W_l‖²) on the same data, with
the same optimizer, the same number of steps and the same hyper-step settings:

(a) ``hand``            a hand-written loop: forward, backward, ``SGD.step()``;
(b) ``lightning``       ``Trainer.fit`` of the same module, no callback;
(c) ``hand+sid``        (a) plus, every N steps, a hand-written hyper step: the core
                        ``SIDHyperOptimizer(inner_steps=0)`` on batches indexed from a private
                        generator, ``hypergradient`` + ``apply`` (k adjoint steps, J = 1, ∇E on
                        one validation batch) — the same work the callback does;
(d) ``lightning+sid``   (b) plus ``HyperOptimizationCallback`` with those settings.

Reported: time per training epoch of each configuration, the time of one hyper step in (c) and (d)
and the ratios

* ``callback_overhead`` = epoch(d) / epoch(c) − 1: Lightning with the callback vs the hand loop
  doing the same inner and adjoint steps (goal ≤ 10 %); it includes Lightning's own per-step cost;
* ``hyper_step_overhead`` = hyper step(d) / hyper step(c) − 1: the callback's own overhead;
* ``lightning_overhead`` = epoch(b) / epoch(a) − 1: Lightning's training loop without callback;
* ``epoch_with_vs_without_callback`` = epoch(d) / epoch(b).

Method: ``torch.set_num_threads`` fixed (default 1); each configuration is built once per round and
runs ``--epochs`` epochs, the first one is discarded (warm-up); rounds interleave the
configurations in rotating order so load changes on a shared machine hit all alike; epoch and
hyper-step times are medians over the timed epochs / steps of all rounds; ratios are medians of
per-round ratios. The script checks first that the hand-written hyper step and the callback compute
the same hypergradient on the same batches.

Run from the repository root::

    python benchmarks/bench_callback_overhead.py          # ~2-3 minutes on 2 CPU cores

It prints a table and writes ``benchmarks/results/callback_overhead/callback_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    Batches,
    BilevelModule,
    HyperOptimizationCallback,
    SIDConfig,
    SIDHyperOptimizer,
)

RESULTS = (
    Path(__file__).resolve().parent / "results" / "callback_overhead" / "callback_overhead.json"
)


# ---------------------------------------------------------------------------------- the model
class Net(BilevelModule):
    """MLP with one weight decay per linear layer: ℓ̂ = CE + ½ Σ_l exp(log_lam_l) ‖W_l‖²."""

    def __init__(self, lr: float = 0.05, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList([nn.Linear(784, 256), nn.Linear(256, 256), nn.Linear(256, 10)])
        self.register_hyperparameter("log_lam", torch.full((3,), -6.0))
        self.lr = lr

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)

    def inner_loss(self, batch: Any) -> Tensor:
        x, y = batch
        lam = self.log_lam.exp()
        penalty = sum(lam[i] * layer.weight.pow(2).sum() for i, layer in enumerate(self.layers))
        return F.cross_entropy(self(x), y) + 0.5 * penalty

    def outer_loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.inner_loss(batch)  # no per-step logging: the same work as the hand loop

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.inner_parameters(), lr=self.lr)


def make_data(n_train: int, n_val: int, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """MNIST-shaped data labelled by a random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(784, 10, generator=g)
    X = torch.randn(n_train + n_val, 784, generator=g)
    y = (X @ teacher).argmax(1)
    return TensorDataset(X[:n_train], y[:n_train]), TensorDataset(X[n_train:], y[n_train:])


# ---------------------------------------------------------------------------------- (a), (c)
def _sampled(ds: TensorDataset, batch_size: int, seed: int) -> Iterator[list[Tensor]]:
    """The hand-written sampler: permutations of a private generator, full batches only."""
    gen = torch.Generator().manual_seed(seed)
    n = len(ds)
    while True:
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n - batch_size + 1, batch_size):
            idx = perm[start : start + batch_size]
            yield [t[idx] for t in ds.tensors]


def hand_loop(
    train: TensorDataset, val: TensorDataset, args: argparse.Namespace, with_sid: bool
) -> dict[str, Any]:
    model = Net(lr=args.lr)
    opt = torch.optim.SGD(model.inner_parameters(), lr=args.lr)
    loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    sid = None
    if with_sid:
        sid = SIDHyperOptimizer(
            list(model.hyperparameters()),
            list(model.inner_parameters()),
            model.inner_loss,
            model.outer_loss,
            torch.optim.Adam(model.hyperparameters(), lr=args.outer_lr),
            module=model,
            config=SIDConfig(inner_steps=0, **sid_settings(args)),
        )
        train_stream = _sampled(train, args.batch_size, args.seed)
        val_stream = _sampled(val, args.batch_size, args.seed + 1)
    for h in model.hyperparameters():
        h.requires_grad_(False)  # as in the callback: no ∂ℓ̂/∂λ in the training backward
    epochs, hyper, step = [], [], 0
    hypergradients = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        for batch in loader:
            opt.zero_grad()
            model.inner_loss(batch).backward()
            opt.step()
            step += 1
            if sid is not None and step % args.every_n_steps == 0:
                t0 = time.perf_counter()
                for h in model.hyperparameters():
                    h.requires_grad_(True)
                hg = sid.hypergradient(train_stream, next(val_stream))
                sid.apply(hg)
                for h in model.hyperparameters():
                    h.requires_grad_(False)
                hyper.append(time.perf_counter() - t0)
                hypergradients.append([g.clone() for g in hg])
        epochs.append(time.perf_counter() - start)
    return {"epochs": epochs, "hyper_steps": hyper, "hypergradients": hypergradients}


def sid_settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        adjoint_steps=args.adjoint_steps,
        step_size="constant",
        eta=1.0,
        alpha=args.alpha,
        batches=Batches(d2=1),
    )


# ---------------------------------------------------------------------------------- (b), (d)
class Timer(Callback):
    """Epoch times, and the time of every hyper step of a HyperOptimizationCallback."""

    def __init__(self, hyper: HyperOptimizationCallback | None) -> None:
        self.epochs: list[float] = []
        self.hyper_steps: list[float] = []
        self.hypergradients: list[list[Tensor]] = []
        if hyper is not None:
            step: Callable[..., None] = hyper._hyper_step

            def timed(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
                t0 = time.perf_counter()
                step(trainer, pl_module)
                self.hyper_steps.append(time.perf_counter() - t0)
                self.hypergradients.append([g.clone() for g in hyper.last_hypergradient])

            hyper._hyper_step = timed  # type: ignore[method-assign]

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs.append(time.perf_counter() - self._start)


def lightning_run(
    train: TensorDataset, val: TensorDataset, args: argparse.Namespace, with_sid: bool
) -> dict[str, Any]:
    model = Net(lr=args.lr)
    hyper = None
    if with_sid:
        hyper = HyperOptimizationCallback(
            every_n_steps=args.every_n_steps,
            outer_lr=args.outer_lr,
            seed=args.seed,
            log_to_loggers=False,
            **sid_settings(args),
        )
    timer = Timer(hyper)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        callbacks=[timer] + ([hyper] if hyper is not None else []),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    trainer.fit(model, loader, DataLoader(val, batch_size=args.batch_size))
    return {
        "epochs": timer.epochs,
        "hyper_steps": timer.hyper_steps,
        "hypergradients": timer.hypergradients,
    }


CONFIGS: dict[str, Callable[..., dict[str, Any]]] = {
    "hand": lambda tr, va, a: hand_loop(tr, va, a, False),
    "lightning": lambda tr, va, a: lightning_run(tr, va, a, False),
    "hand+sid": lambda tr, va, a: hand_loop(tr, va, a, True),
    "lightning+sid": lambda tr, va, a: lightning_run(tr, va, a, True),
}


# ---------------------------------------------------------------------------------- main
def check_same_hypergradients(train: TensorDataset, val: TensorDataset, args: Any) -> float:
    """The two hyper-optimizing configurations compute the same hypergradients (same batches)."""
    a = CONFIGS["hand+sid"](train, val, args)["hypergradients"]
    b = CONFIGS["lightning+sid"](train, val, args)["hypergradients"]
    assert len(a) == len(b) > 0, (len(a), len(b))
    err = max(
        float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))
        for ga, gb in zip(a, b)
        for x, y in zip(ga, gb)
    )
    assert err < 1e-4, f"hand loop and callback disagree: relative error {err:.2e}"
    return err


def median(xs: list[float]) -> float | None:
    """Median, or None (JSON null) for an empty list (no hyper steps in that configuration)."""
    return statistics.median(xs) if xs else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up")
    p.add_argument("--n-train", type=int, default=4096)
    p.add_argument("--n-val", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--every-n-steps", type=int, default=8)
    p.add_argument("--adjoint-steps", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--outer-lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in ("pytorch_lightning", "lightning_fabric", "hypertorch_sid"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    train, val = make_data(args.n_train, args.n_val, args.seed)

    started = time.perf_counter()
    agreement = check_same_hypergradients(
        train, val, argparse.Namespace(**{**vars(args), "epochs": 1})
    )
    names = list(CONFIGS)
    per_round: list[dict[str, dict[str, float]]] = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        results = {}
        for name in order:
            out = CONFIGS[name](train, val, args)
            results[name] = {
                "epoch": median(out["epochs"][1:]),
                "hyper_step": median(out["hyper_steps"][1:]),
                "hyper_steps_per_epoch": len(out["hyper_steps"]) / args.epochs,
            }
        per_round.append(results)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {results[n]['epoch']:.3f} s/epoch" for n in names)
        )

    def summary(name: str, key: str) -> float | None:
        return median([x for rr in per_round if (x := rr[name][key]) is not None])

    def ratio(num: Callable[[dict[str, Any]], float], den: Callable[[dict[str, Any]], float]):
        return median([num(rr) / den(rr) for rr in per_round])

    times = {
        n: {"epoch_s": summary(n, "epoch"), "hyper_step_s": summary(n, "hyper_step")} for n in names
    }
    ratios = {
        "callback_overhead": ratio(
            lambda rr: rr["lightning+sid"]["epoch"], lambda rr: rr["hand+sid"]["epoch"]
        )
        - 1,
        "hyper_step_overhead": ratio(
            lambda rr: rr["lightning+sid"]["hyper_step"], lambda rr: rr["hand+sid"]["hyper_step"]
        )
        - 1,
        "lightning_overhead": ratio(
            lambda rr: rr["lightning"]["epoch"], lambda rr: rr["hand"]["epoch"]
        )
        - 1,
        "added_cost_of_sid_lightning_vs_hand": ratio(
            lambda rr: rr["lightning+sid"]["epoch"] - rr["lightning"]["epoch"],
            lambda rr: rr["hand+sid"]["epoch"] - rr["hand"]["epoch"],
        ),
        "epoch_with_vs_without_callback": ratio(
            lambda rr: rr["lightning+sid"]["epoch"], lambda rr: rr["lightning"]["epoch"]
        ),
    }
    steps_per_epoch = args.n_train // args.batch_size + (args.n_train % args.batch_size > 0)
    result = {
        "benchmark": "callback_overhead",
        "settings": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
        "model": "MLP 784-256-256-10, per-layer weight decay, float32",
        "steps_per_epoch": steps_per_epoch,
        "hyper_steps_per_epoch": steps_per_epoch / args.every_n_steps,
        "hypergradient_agreement_rel_err": agreement,
        "times": times,
        "ratios": ratios,
        "rounds": per_round,
        "wall_s": time.perf_counter() - started,
        "environment": {
            "torch": torch.__version__,
            "pytorch_lightning": pl.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))

    print(f"\n{'configuration':<16}{'s / epoch':>12}{'s / hyper step':>17}")
    for n in names:
        hs = times[n]["hyper_step_s"]
        hs_text = f"{hs:>17.4f}" if hs is not None else f"{'-':>17}"
        print(f"{n:<16}{times[n]['epoch_s']:>12.4f}{hs_text}")
    print()
    for k, v in ratios.items():
        print(f"{k:<40}{v:>9.3f}")
    print(f"\nhypergradients of hand loop and callback agree to {agreement:.1e} (relative)")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
