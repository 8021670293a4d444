"""What learned weight decay costs on each network of the matrix, with and without a budget.

For each network — MLP, CNN+BatchNorm, LSTM, a small Transformer encoder, ResNet-18 and
MobileNetV3-small (torchvision, untrained, small inputs) — three trainings of the same model
(same seed, same batches) run back to back:

* ``plain``       the training alone, with the fixed decay the drop-in replaces (its optimizer's
                  ``weight_decay=1e-4``);
* ``unbudgeted``  with ``LearnedWeightDecay(1e-4)`` and its schedule (a hyper step every 20
                  training steps, k = 3, a curvature estimate every 10 hyper steps), every due
                  hyper step run (``max_overhead=1e6``: a budget that never binds, it only records
                  the shares; what ``max_overhead=None`` runs);
* ``default``     ``LearnedWeightDecay(1e-4)`` as shipped (its budget ``max_overhead=0.5``: hyper
                  steps at most half of the training's own time), or with
                  ``max_overhead=--budget``.

The order of the three rotates from repeat to repeat, so load drift on a shared machine hits all
alike. Reported per network: the cost ratio (fit CPU time with the callback / plain fit CPU
time, per repeat; median and [min, max] over repeats; one thread, so CPU time is the compute
whatever else a shared machine runs; wall-time ratios beside it), the share of the training's
time the callback itself measured (``hyper/overhead``), the hyper steps run, and where a hyper
step's time goes (curvature estimates, the adjoint solve's Hessian–vector products, the ∂₂Φ̂
assembly, the validation batch, the first checks), from timers around those parts of the
callback's core object. Synthetic data (Gaussian inputs with labels of a random teacher; token
sequences), CPU, one thread.

Run from the repository root::

    python benchmarks/bench_network_cost.py --repeats 3          # ~40 min on a shared 2-core CPU
    python benchmarks/bench_network_cost.py --configs plain default   # the defaults' ratios only
    python benchmarks/bench_network_cost.py --quick               # seconds: a smoke test
    python benchmarks/bench_network_cost.py --paired              # the default's choice (below)

``--paired`` trains nothing: it pairs by seed the held-out test loss of the stored
``bench_weight_decay.py`` runs with ``max_overhead=0.5`` (``runs/<setting>_budget0.5*_seed<s>.json``
here, made by the commands stored in them) against the default's stored runs of the same seeds
(``results/weight_decay/runs``), and writes ``budget_default_choice.{json,md}``.

It writes ``benchmarks/results/network_cost/network_cost.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import LearnedWeightDecay

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks below
from bench_step_cost import make_cnn_bn, make_mlp  # noqa: E402  (the same MLP and CNN+BN)

OUT = Path(__file__).resolve().parent / "results" / "network_cost" / "network_cost.json"
CONFIGS = ("plain", "unbudgeted", "default")
#: the fixed decay of the plain training (what ``LearnedWeightDecay(1e-4)`` replaces)
PLAIN_DECAY = 1e-4
#: Lightning's accelerator of every fit (``--accelerator``); on a GPU the ratios are of wall time
#: (the process's CPU time there is launches and waiting, not the compute)
ACCELERATOR = "cpu"


def _synchronize() -> None:
    """Wait for queued GPU work, so a timer read after it counts it (CUDA is asynchronous)."""
    if ACCELERATOR != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------- networks
class Classifier(pl.LightningModule):
    """A user's ordinary classifier: ``body`` on ``x``, cross-entropy, its own optimizer."""

    def __init__(
        self, body: nn.Module, optimizer: Callable[..., torch.optim.Optimizer], decay: float = 0.0
    ) -> None:
        super().__init__()
        self.body, self.make_optimizer, self.decay = body, optimizer, decay

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self.body(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self.body(batch[0]), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.parameters(), self.decay)


class RowLSTM(nn.Module):
    """pytorch/examples' MNIST LSTM: the image's rows as a sequence, LSTM(28, 64), linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(28, 64, batch_first=True), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.view(x.shape[0], 28, 28))
        return self.head(out[:, -1])


class TokenTransformer(nn.Module):
    """Embedding + 2-layer Transformer encoder (d 32, 2 heads, dropout 0.1), mean-pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(x)).mean(1))


def _resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def _mobilenet() -> nn.Module:
    import torchvision

    return torchvision.models.mobilenet_v3_small(num_classes=10)


def _sgd(lr: float) -> Callable[..., torch.optim.Optimizer]:
    return lambda p, wd=0.0: torch.optim.SGD(p, lr=lr, momentum=0.9, weight_decay=wd)


def _adam(lr: float) -> Callable[..., torch.optim.Optimizer]:
    return lambda p, wd=0.0: torch.optim.Adam(p, lr=lr, weight_decay=wd)


#: name -> (model factory, optimizer, input kind, input shape, batch size, steps)
NETWORKS: dict[str, tuple[Callable[[], nn.Module], Any, str, tuple[int, ...], int, int]] = {
    "MLP": (
        make_mlp,
        _sgd(0.05),
        "image",
        (1, 28, 28),
        64,
        200,
    ),
    "CNN+BN": (make_cnn_bn, _adam(1e-3), "image", (1, 28, 28), 64, 200),
    "LSTM": (RowLSTM, _adam(1e-3), "image", (1, 28, 28), 64, 200),
    "Transformer": (TokenTransformer, _adam(1e-3), "tokens", (16,), 32, 200),
    "ResNet-18": (_resnet18, _sgd(0.05), "image", (3, 16, 16), 16, 100),
    "MobileNetV3-small": (_mobilenet, _adam(1e-3), "image", (3, 32, 32), 16, 100),
}


def synthetic(kind: str, shape: tuple[int, ...], n: int, seed: int) -> TensorDataset:
    """Gaussian images labelled by a random linear teacher (10 classes), or token sequences
    labelled by whether token 3 is more common than token 7."""
    g = torch.Generator().manual_seed(seed)
    if kind == "tokens":
        x = torch.randint(0, 20, (n, *shape), generator=g)
        return TensorDataset(x, ((x == 3).sum(1) > (x == 7).sum(1)).long())
    x = torch.randn(n, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), 10, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (x.flatten(1) @ teacher).argmax(1))


class Data(pl.LightningDataModule):
    def __init__(self, kind: str, shape: tuple[int, ...], batch: int, n_train: int) -> None:
        super().__init__()
        self.train, self.val = synthetic(kind, shape, n_train, 0), synthetic(kind, shape, 512, 1)
        self.batch = batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch, shuffle=True,
                          generator=torch.Generator().manual_seed(0))  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=256)


# ---------------------------------------------------------------------------------- timing
class FitTimer(Callback):
    """Train start (first callback) to train end (last callback): the fit's training time, as
    wall time and as this process's CPU time (one thread: its compute, whatever else the
    machine runs)."""

    def __init__(self, times: dict[str, float], key: str) -> None:
        self.times, self.key = times, key

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.key == "start":
            _synchronize()
            self.times["start"], self.times["cpu_start"] = time.perf_counter(), time.process_time()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.key == "end":
            _synchronize()
            self.times["end"], self.times["cpu_end"] = time.perf_counter(), time.process_time()


class PhaseTimer(Callback):
    """Timers around the parts of a hyper step (after the callback built its core object)."""

    PARTS = {
        "curvature": ("sid.constants", "prepare"),
        "first_checks": ("sid", "_first_checks"),
        "adjoint": ("sid", "_adjoint_solve"),
        "assemble": ("sid", "_assemble"),
        "validation_batch": ("data", "validation_batch"),
        "outer_step": ("sid", "apply"),
    }

    def __init__(self, cb: LearnedWeightDecay) -> None:
        self.cb, self.seconds = cb, dict.fromkeys(self.PARTS, 0.0)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for part, (owner, name) in self.PARTS.items():
            obj: Any = self.cb
            for attr in owner.split("."):
                obj = getattr(obj, attr)
            setattr(obj, name, self._timed(part, getattr(obj, name)))

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        return timed


def run_one(network: str, config: str, repeat: int, budget: float | None, steps: int | None,
            n_train: int) -> dict[str, Any]:  # fmt: skip
    """One fit of ``network`` in ``config``; ``budget``: the default's ``max_overhead`` (None:
    the shipped default's)."""
    make, optimizer, kind, shape, batch, default_steps = NETWORKS[network]
    steps = steps or default_steps
    pl.seed_everything(repeat, verbose=False)
    model = Classifier(make(), optimizer, PLAIN_DECAY if config == "plain" else 0.0)
    times: dict[str, float] = {}
    callbacks: list[Callback] = [FitTimer(times, "start")]
    cb = None
    if config != "plain":
        given = {"max_overhead": 1e6 if config == "unbudgeted" else budget}
        cb = LearnedWeightDecay(1e-4, **{k: v for k, v in given.items() if v is not None})
        phases = PhaseTimer(cb)
        callbacks += [cb, phases]
    callbacks.append(FitTimer(times, "end"))
    trainer = pl.Trainer(
        max_steps=steps, max_epochs=-1, accelerator=ACCELERATOR, devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(model, datamodule=Data(kind, shape, batch, n_train))
    record: dict[str, Any] = {
        "network": network, "config": config, "repeat": repeat, "steps": trainer.global_step,
        "fit_s": times["end"] - times["start"], "fit_cpu_s": times["cpu_end"] - times["cpu_start"],
        "load": os.getloadavg()[0],  # the machine's 1-minute load as the fit ended
        "accelerator": ACCELERATOR,
    }  # fmt: skip
    if cb is not None:
        assert cb.sid is not None
        record.update(
            hyper_steps_due=sum(
                1 for s in range(1, trainer.global_step + 1) if s % cb.every_n_steps == 0
            ),
            budget=cb.budget.state_dict(),
            overhead=cb.budget.overhead,
            cost=cb.sid.cost.as_dict(),
            phases=phases.seconds,
            lam=[float(v.mean()) for v in cb.decay_values().values()],
        )
    return record


# ---------------------------------------------------------------------------------- summary
def summarise(records: list[dict[str, Any]], budget: float | None) -> dict[str, Any]:
    """Per network and config: cost ratios over repeats (each against that repeat's plain)."""
    out: dict[str, Any] = {}
    for network in dict.fromkeys(r["network"] for r in records):
        rows = [r for r in records if r["network"] == network]
        key = "fit_cpu_s" if rows[0].get("accelerator", "cpu") == "cpu" else "fit_s"
        plain = {r["repeat"]: r[key] for r in rows if r["config"] == "plain"}
        plain_wall = {r["repeat"]: r["fit_s"] for r in rows if r["config"] == "plain"}
        entry: dict[str, Any] = {"plain_s": statistics.median(plain.values())}
        loads = [r["load"] for r in rows if "load" in r]
        if loads:
            entry["load"] = f"{min(loads):.1f}–{max(loads):.1f}"
        for config in CONFIGS[1:]:
            runs = [r for r in rows if r["config"] == config and r["repeat"] in plain]
            if not runs:
                continue
            ratios = [r[key] / plain[r["repeat"]] for r in runs]
            wall = [r["fit_s"] / plain_wall[r["repeat"]] for r in runs]
            hyper = sum(sum(r["phases"].values()) for r in runs)
            entry[config] = {
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "ratios": ratios,
                "wall_ratio_median": statistics.median(wall),
                "wall_ratios": wall,
                "overhead_median": statistics.median(r["overhead"] for r in runs),
                "hyper_steps": [r["budget"]["hyper_steps"] for r in runs],
                "hyper_steps_due": [r.get("hyper_steps_due") for r in runs],
                "curvature_products": [r["cost"].get("curvature_products") for r in runs],
                "adjoint_products": [r["cost"].get("jacobian_vector_products") for r in runs],
                # the training steps' own cost with the callback over the plain fit's (CPU time,
                # the budget's clock on the CPU): above 1 is cost no share the callback
                # measures accounts for
                "training_vs_plain": statistics.median(
                    r["budget"]["spent_training"] / plain[r["repeat"]] for r in runs
                ),
                "phase_share": {
                    p: sum(r["phases"][p] for r in runs) / hyper if hyper else 0.0
                    for p in PhaseTimer.PARTS
                },
                # one product's cost as the budget measured it (its clock, as spent_training)
                "hvp_s": statistics.median(
                    r["budget"].get("product_cost")
                    or r["phases"]["adjoint"] / max(r["cost"]["jacobian_vector_products"], 1)
                    for r in runs
                ),
                "step_s": statistics.median(
                    r["budget"]["spent_training"] / max(r["steps"], 1) for r in runs
                ),
            }
        out[network] = entry
    return out


def _label(budget: float | None) -> str:
    return "defaults" if budget is None else f"max_overhead={budget:g}"


def markdown(summary: dict[str, Any], budget: float | None) -> str:
    lines = [
        "| network | plain fit (s: CPU time on a CPU, wall on a GPU) | no budget: × plain | "
        f"{_label(budget)}: × plain | "
        "hyper steps run of due (no budget / default) | curvature products (no budget / default) "
        "| share measured by the callback (no budget / default) | "
        "training steps' time ÷ plain fit (no budget / default) | "
        "hyper-step time: curvature / adjoint / ∂₂Φ̂ / val batch / first checks (no budget) | "
        "one HVP ÷ one training step | wall-time ratios, median (no budget / default) | "
        "load (1-min) |",
        "|---|---:|---|---|---|---|---|---|---|---:|---|---|",
    ]
    for network, e in summary.items():
        d, b = e.get("unbudgeted"), e.get("default")

        def ratio(x: dict[str, Any] | None) -> str:
            if x is None:
                return "—"
            return f"{x['ratio_median']:.2f} [{x['ratio_min']:.2f}, {x['ratio_max']:.2f}]"

        def ran(x: dict[str, Any] | None) -> str:
            if x is None:
                return "—"
            due = x.get("hyper_steps_due") or [None]
            return ",".join(str(s) for s in x["hyper_steps"]) + (
                f" of {due[0]}" if due[0] is not None else ""
            )

        steps = " / ".join(ran(x) for x in (d, b))
        curvature = " / ".join(
            ",".join(str(c) for c in x.get("curvature_products", [])) if x else "—" for x in (d, b)
        )
        slow = " / ".join(
            f"{x['training_vs_plain']:.2f}" if x and "training_vs_plain" in x else "—"
            for x in (d, b)
        )
        share = " / ".join(f"{x['overhead_median']:.2f}" if x else "—" for x in (d, b))
        phases = "—"
        hvp = "—"
        if d is None:  # no unbudgeted runs: the default's phases
            d_phases = b
        else:
            d_phases = d
        if d_phases is not None:
            p = d_phases["phase_share"]
            phases = " / ".join(
                f"{p[k]:.0%}"
                for k in ("curvature", "adjoint", "assemble", "validation_batch", "first_checks")
            )
            hvp = f"{d_phases['hvp_s'] / d_phases['step_s']:.1f}" if d_phases["step_s"] else "—"
        lines.append(
            f"| {network} | {e['plain_s']:.1f} | {ratio(d)} | {ratio(b)} | {steps} | "
            f"{curvature} | {share} | {slow} | "
            f"{phases} | {hvp} | "
            + " / ".join(f"{x['wall_ratio_median']:.2f}" if x else "—" for x in (d, b))
            + f" | {e.get('load', '—')} |"
        )
    return "\n".join(lines) + "\n"


def figure(summary: dict[str, Any], budget: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.38
    for i, (config, label) in enumerate(
        (("unbudgeted", "no budget (max_overhead=None)"), ("default", _label(budget)))
    ):
        xs, med, lo, hi = [], [], [], []
        for j, n in enumerate(names):
            x = summary[n].get(config)
            if x is None:
                continue
            xs.append(j + (i - 0.5) * width)
            med.append(x["ratio_median"])
            lo.append(x["ratio_median"] - x["ratio_min"])
            hi.append(x["ratio_max"] - x["ratio_median"])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=label)
    ceiling = 1 + (0.5 if budget is None else budget)
    ax.axhline(ceiling, color="k", ls="--", lw=1, label=f"{ceiling:.1f}× plain")
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("fit CPU time / plain fit CPU time")
    ax.set_title("Learned weight decay: cost per network (median, [min, max] over repeats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


WEIGHT_DECAY_RUNS = OUT.parent.parent / "weight_decay" / "runs"
#: the stored default (and grid) runs of each seed of bench_weight_decay.py
DEFAULT_RUNS = {
    **{s: "weight_decay_rerun_seed{}.json" for s in (0, 1, 2)},
    **{s: "weight_decay_heldout_seed{}.json" for s in (3, 4, 5)},
    **{s: "weight_decay_heldout2_seed{}.json" for s in (6, 7, 8)},
}


def paired(budget: float = 0.5, runs: Path | None = None) -> dict[str, Any]:
    """Held-out test loss with ``max_overhead=budget`` against the default, paired by seed: the
    budget's runs in ``runs/`` against the stored default runs, or — with ``runs`` — both arms
    from that folder (``<setting>_budget<budget>_seed<s>.json``, ``<setting>_default_seed<s>.json``:
    one version of the code)."""
    from bench_weight_decay import paired_difference

    out: dict[str, Any] = {}
    for setting in ("mnist_mlp", "mnist_cnn", "digits_mlp", "fashion_mlp", "fashion_cnn"):
        rows = []
        for seed, name in DEFAULT_RUNS.items():
            if runs is not None:
                mine = sorted(runs.glob(f"{setting}_budget{budget}_seed{seed}.json"))
                default = runs / f"{setting}_default_seed{seed}.json"
            else:
                mine = sorted(OUT.parent.glob(f"runs/{setting}_budget{budget}*_seed{seed}.json"))
                default = WEIGHT_DECAY_RUNS / name.format(seed)
            if not mine or not default.exists():
                continue
            run = json.loads(mine[0].read_text())
            new = run["settings"][setting]["runs"]["learned_per_layer"]
            base = json.loads(default.read_text())
            old = base["settings"][setting]["runs"]["learned_per_layer"]
            rows.append({
                "seed": seed, "default": old["test_loss"], "budget": new["test_loss"],
                "hyper_steps_default": old["sid_cost"]["hypergradients"],
                "hyper_steps_budget": new["sid_cost"]["hypergradients"],
                "share_budget": new["budget"]["overhead"], "command": run["command"],
            })  # fmt: skip
        if not rows:  # this setting's runs were not made
            continue
        diff = paired_difference([r["budget"] for r in rows], [r["default"] for r in rows])
        out[setting] = {"seeds": rows, "budget_minus_default": diff}
    return out


def paired_markdown(result: dict[str, Any], budget: float) -> str:
    lines = [
        f"| setting | seeds | test loss, default | test loss, max_overhead={budget} | "
        "budget − default, mean ± s.e. [95 %] | hyper steps (default → budget) | "
        "hyper-step share measured |",
        "|---|---:|---|---|---|---|---|",
    ]
    for setting, e in result.items():
        rows, d = e["seeds"], e["budget_minus_default"]
        if not rows:
            continue
        lines.append(
            f"| {setting} | {len(rows)} | "
            f"{statistics.mean(r['default'] for r in rows):.4f} | "
            f"{statistics.mean(r['budget'] for r in rows):.4f} | "
            f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['low']:+.4f}, {d['high']:+.4f}] | "
            f"{rows[0]['hyper_steps_default']} → "
            f"{min(r['hyper_steps_budget'] for r in rows)}–"
            f"{max(r['hyper_steps_budget'] for r in rows)} | "
            f"{min(r['share_budget'] for r in rows):.2f}–"
            f"{max(r['share_budget'] for r in rows):.2f} |"
        )
    return "\n".join(lines) + "\n"


def _commit() -> str | None:
    """The repository's commit (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=OUT.parents[2], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="max_overhead of the 'default' runs (default: the shipped default's)",
    )
    p.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=list(CONFIGS),
        help="which trainings to run (plain is each ratio's denominator)",
    )
    p.add_argument("--steps", type=int, default=None, help="override every network's steps")
    p.add_argument("--n-train", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--accelerator",
        default="cpu",
        help="Lightning accelerator of every fit (cpu, gpu); on a GPU the ratios are of wall time",
    )
    p.add_argument("--quick", action="store_true", help="1 repeat, 40 steps: a smoke test")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--paired",
        action="store_true",
        help="train nothing: the stored budget runs' test loss against the default's",
    )
    p.add_argument(
        "--paired-runs",
        type=Path,
        default=None,
        help="with --paired: a folder holding both arms' runs (one code version); the table is "
        "written beside them",
    )
    args = p.parse_args(argv)
    if args.paired:
        budget = 0.5 if args.budget is None else args.budget
        result = paired(budget, args.paired_runs)
        folder = OUT.parent if args.paired_runs is None else args.paired_runs
        path = folder / "budget_default_choice.json"
        path.write_text(json.dumps(result, indent=1))
        table = paired_markdown(result, budget)
        command = "python benchmarks/bench_network_cost.py " + " ".join(sys.argv[1:])
        path.with_suffix(".md").write_text(
            f"Made by `{command}` from the stored runs (each run's command in the JSON).\n\n"
            + table
        )
        print(table)
        return
    if args.quick:
        args.repeats, args.steps, args.n_train = 1, args.steps or 40, 256
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    torch.set_num_threads(args.threads)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    records: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    for network in args.networks:
        for repeat in range(args.repeats):
            configs = [c for c in CONFIGS if c in args.configs]
            k = repeat % len(configs)
            order = configs[k:] + configs[:k]  # rotating order
            for config in order:
                r = run_one(network, config, repeat, args.budget, args.steps, args.n_train)
                records.append(r)
                print(f"{network:18s} r{repeat} {config:8s} {r['fit_cpu_s']:7.1f}s CPU "
                      f"overhead {r.get('overhead', float('nan')):.2f}", flush=True)  # fmt: skip
            summary = summarise(records, args.budget)
            result = {
                "benchmark": "network_cost",
                "command": "python benchmarks/bench_network_cost.py " + " ".join(sys.argv[1:]),
                "commit": _commit(),
                "budget": args.budget, "threads": args.threads, "repeats": args.repeats,
                "environment": {"platform": platform.platform(), "torch": torch.__version__,
                                "pytorch_lightning": pl.__version__,
                                "accelerator": args.accelerator,
                                "gpu": torch.cuda.get_device_name(0)
                                if torch.cuda.is_available() else None},
                "wall_s": time.time() - started, "summary": summary, "records": records,
            }  # fmt: skip
            args.out.write_text(json.dumps(result, indent=1))  # after every repeat: partial
    table = markdown(summary, args.budget)
    args.out.with_suffix(".md").write_text(
        f"Command: `{result['command']}` ({args.threads} thread, "
        f"{result['environment']['gpu'] or platform.processor() or 'CPU'},"
        f" {result['wall_s'] / 60:.0f} min)\n\n{table}"
    )
    figure(summary, args.budget, args.out.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
