"""Operations and host reads per training step: plain training against each drop-in.

On a GPU a small network is launch-bound: a step costs about the number of operations it
dispatches, and every value read back to the host (``float(t)``, ``int(t)``, ``bool(t)``,
``.item()``) waits for the device. Session 49's H200 run found `LearnedDataWeights` at
2.0–2.8× the plain wall time on the noisy-label CNN (the cross term at every training step
took 0.8–1.05 s of a 1.3 s plain fit), against 1.8–1.9× CPU time on a CPU. Counting what a step
dispatches tells, on any machine and without a clock, what a launch-bound device pays for.

For each configuration it trains, with Lightning, a small MLP (20-32-2, batch 64, SGD) and the
noisy-label benchmark's CNN (``benchmarks/bench_noisy_labels.py``: conv 8 and 16 channels, 28×28
inputs, 10 classes, batch 64, SGD with momentum 0.9, gradients clipped at 1, 30 % of the labels
drawn at random), and counts, with a ``TorchDispatchMode``, the aten operations and the host reads
(``aten._local_scalar_dense``, and since session 50 also ``t.tolist()``, ``t.cpu()`` and
``t.numpy()``, which dispatch nothing on a CPU tensor but wait for an accelerator) of every
training step after step ``--from-step``, split into
steps that ran a hyper step (counted in ``on_train_batch_end``) and steps that did not:

* ``plain``         the recipe without a drop-in;
* ``data_weights``  ``LearnedDataWeights()`` (``reduction="none"``, ``IndexedDataset``);
* ``data_weights_hyper_step`` the same with ``cross_term="hyper_step"`` (no cross term per step);
* ``weight_decay``  ``LearnedWeightDecay(1e-4)``.

Run from the repository root::

    python benchmarks/bench_step_ops.py --out benchmarks/results/step_ops/step_ops.json \
        --before benchmarks/results/step_ops/before_s50.json

(``--networks mlp`` or ``--networks cnn`` for one of the two.)

It prints a table and writes the JSON and a bar chart beside it (``.png``).
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark below
from bench_noisy_labels import cnn  # noqa: E402  (the noisy-label benchmark's CNN)

HOST_READ = "_local_scalar_dense"


#: copies to the host that dispatch no aten operation on a CPU tensor but wait for the device on
#: an accelerator (``t.tolist()``, ``t.cpu()``, ``t.numpy()``): counted as host reads too
HOST_COPIES = ("tolist", "cpu", "numpy")
#: callers whose copies are of tensors made on the CPU by design (the hyper steps' samplers draw
#: their indices with a CPU generator): not host reads on any device
CPU_BY_DESIGN = ("sampling.py",)


class Count(TorchDispatchMode):
    """Counts every aten operation dispatched inside it, by name, and (as ``HOST_READ``) every
    host copy of :data:`HOST_COPIES` made from outside :data:`CPU_BY_DESIGN`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> Count:
        for name in HOST_COPIES:
            self._saved[name] = original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(original))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)

    def _counted(self, original: Any) -> Any:
        def copy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith(CPU_BY_DESIGN):
                self.ops[HOST_READ] += 1
            return original(tensor, *args, **kwargs)

        return copy


class PerStep(pl.Callback):
    """Counts each training step (its batch start to its batch end, hyper step included)."""

    def __init__(self, from_step: int) -> None:
        self.from_step = from_step
        self.mode: Count | None = None
        self.steps: list[collections.Counter[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_step >= self.from_step:
            self.mode = Count()
            self.mode.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.steps.append(self.mode.ops)
            self.mode = None


class Net(pl.LightningModule):
    """A classifier of ``network`` ("mlp" or "cnn") with the per-sample losses' ``reduction``."""

    def __init__(self, reduction: str, network: str = "mlp") -> None:
        super().__init__()
        self.network = network
        if network == "mlp":
            self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
        else:
            self.net = cnn()
        self.reduction = reduction

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction=self.reduction)

    def validation_step(self, batch, batch_idx):  # noqa: ANN001
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        if self.network == "mlp":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)  # the benchmark's


#: the networks counted: name → (Trainer's gradient_clip_val, a description for the figure)
NETWORKS = {
    "mlp": (None, "MLP 20-32-2, batch 64"),
    "cnn": (1.0, "noisy-label CNN, batch 64"),
}


def data(network: str) -> tuple[TensorDataset, TensorDataset]:
    """A training set with noisy labels (the data weights have work to do) and a clean
    validation set, drawn from seed 0."""
    torch.manual_seed(0)
    if network == "mlp":
        x = torch.randn(640, 20)
        y = (x[:, 0] > 0).long()
        y[:200] = torch.randint(0, 2, (200,))
        xv = torch.randn(256, 20)
        yv = (xv[:, 0] > 0).long()
    else:
        x, xv = torch.randn(640, 1, 28, 28), torch.randn(256, 1, 28, 28)
        proj = torch.randn(28 * 28, 10)
        y, yv = (x.flatten(1) @ proj).argmax(1), (xv.flatten(1) @ proj).argmax(1)
        y[:192] = torch.randint(0, 10, (192,))
    return TensorDataset(x, y), TensorDataset(xv, yv)


def configurations() -> dict[str, tuple[str, bool, list[pl.Callback]]]:
    """name → (reduction, indexed training set, callbacks)."""
    return {
        "plain": ("mean", False, []),
        "data_weights": ("none", True, [LearnedDataWeights()]),
        "data_weights_hyper_step": ("none", True, [LearnedDataWeights(cross_term="hyper_step")]),
        "weight_decay": ("mean", False, [LearnedWeightDecay(1e-4)]),
    }


def fit(
    name: str, epochs: int, from_step: int = 0, network: str = "mlp"
) -> tuple[pl.LightningModule, list[pl.Callback], PerStep]:
    """Train ``network`` under configuration ``name``; the module, the drop-ins and the probe."""
    reduction, indexed, callbacks = configurations()[name]
    train, val = data(network)
    module = Net(reduction, network)  # its initial weights from the seed data() set
    probe = PerStep(from_step)
    trainer = pl.Trainer(
        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        gradient_clip_val=NETWORKS[network][0], callbacks=[*callbacks, probe],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            module,
            DataLoader(IndexedDataset(train) if indexed else train, batch_size=64, shuffle=True),
            DataLoader(val, batch_size=64),
        )
    return module, callbacks, probe


def count(name: str, epochs: int, from_step: int, network: str = "mlp") -> dict[str, Any]:
    """Operations and host reads per training step of ``network`` under ``name``."""
    _, _, probe = fit(name, epochs, from_step, network)
    totals = [sum(c.values()) for c in probe.steps]
    typical = statistics.median(totals)
    plain_steps = [c for c, t in zip(probe.steps, totals) if t <= 2 * typical]
    hyper_steps = [c for c, t in zip(probe.steps, totals) if t > 2 * typical]
    ops = collections.Counter()
    for c in plain_steps:
        ops.update(c)
    return {
        "steps": len(probe.steps),
        "steps_with_a_hyper_step": len(hyper_steps),
        "ops_per_step": statistics.median(sum(c.values()) for c in plain_steps),
        "host_reads_per_step": statistics.median(c[HOST_READ] for c in plain_steps),
        "ops_per_hyper_step": (
            statistics.median(sum(c.values()) for c in hyper_steps) if hyper_steps else None
        ),
        "host_reads_per_hyper_step": (
            statistics.median(c[HOST_READ] for c in hyper_steps) if hyper_steps else None
        ),
        "most_common_ops": {k: v / len(plain_steps) for k, v in ops.most_common(25)},
    }


def figure(
    results: dict[str, dict[str, dict[str, Any]]],
    path: Path,
    before: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> None:
    """Bars per configuration and network; with ``before`` (an earlier JSON's results) its
    counts as light bars under this run's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = list(results)
    fig, axes = plt.subplots(len(nets), 4, figsize=(14, 2.6 * len(nets)), squeeze=False)
    for row, net in zip(axes, nets):
        names = list(results[net])
        for ax, key, title in (
            (row[0], "ops_per_step", "ops / training step"),
            (row[1], "host_reads_per_step", "host reads / training step"),
            (row[2], "ops_per_hyper_step", "ops / step with a hyper step"),
            (row[3], "host_reads_per_hyper_step", "host reads / step w. hyper step"),
        ):
            y = range(len(names))
            ax.barh(y, [results[net][n][key] or 0 for n in names], height=0.4, label="now")
            if before is not None and net in before:
                old = [(before[net].get(n) or {}).get(key) or 0 for n in names]
                ax.barh([i + 0.4 for i in y], old, height=0.4, color="0.75", label="before")
            ax.set_yticks([i + 0.2 for i in y] if before else list(y), names, fontsize=7)
            ax.set_title(f"{net}: {title}", fontsize=8)
            ax.invert_yaxis()
            ax.tick_params(labelsize=7)
    if before is not None:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(", ".join(f"{n}: {NETWORKS[n][1]}" for n in nets), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", nargs="+", default=list(configurations()))
    p.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--from-step", type=int, default=60, help="count the steps from this one on")
    p.add_argument("--out", default="benchmarks/results/step_ops/step_ops.json")
    p.add_argument(
        "--before", default=None, help="an earlier run's JSON, drawn beside this run's counts"
    )
    args = p.parse_args()
    results = {
        net: {name: count(name, args.epochs, args.from_step, net) for name in args.configs}
        for net in args.networks
    }
    print(
        "| network | configuration | ops / step | host reads / step "
        "| ops / hyper step | host reads / hyper step (n) |"
    )
    print("|---|---|---:|---:|---:|---|")
    for net, rows in results.items():
        for name, r in rows.items():
            hyper, reads = r["ops_per_hyper_step"], r["host_reads_per_hyper_step"]
            extra = (
                f"{hyper:.0f} | {reads:.0f} ({r['steps_with_a_hyper_step']})" if hyper else "— | —"
            )
            print(
                f"| {net} | {name} | {r['ops_per_step']:.0f} | {r['host_reads_per_step']:.0f} "
                f"| {extra} |"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"torch": torch.__version__, "platform": platform.platform()}
    record = {"args": vars(args), "machine": machine, "results": results}
    out.write_text(json.dumps(record, indent=1))
    before = json.loads(Path(args.before).read_text())["results"] if args.before else None
    figure(results, out.with_suffix(".png"), before)
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
