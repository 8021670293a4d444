"""Deep networks with noisy labels through Lightning: does ``LearnedDataWeights`` close the gap?

For each data set (MNIST, Fashion-MNIST; IDX files in ``../shared/data``) and label noise
(40 % *symmetric*: the label replaced by a uniformly random other class; 40 % *pair*-flip: class
c labelled c+1 mod 10), the same small CNN (conv5×5(8)+ReLU+pool, conv5×5(16)+ReLU+pool,
linear 256→10; no BatchNorm, so every method trains the same network) is trained with

* ``plain``     the ordinary training on the noisy labels (``reduction="mean"``);
* ``drop_in``   the same module with ``reduction="none"``, the train set in ``IndexedDataset``
                and ``callbacks=[LearnedDataWeights()]`` — its defaults, nothing tuned here;
* ``drop_in_beta0`` the drop-in with ``outer_betas=(0.0, 0.999)`` written out: its outer
                optimizer without momentum (a row's visits are an epoch apart), the default
                since the two-component flag rule (identical to ``drop_in`` now; kept so the
                earlier runs' commands reproduce);
* ``drop_in_beta09`` the drop-in with the earlier default ``outer_betas=(0.9, 0.999)``;
* ``drop_in_gce`` the drop-in on GCE's per-sample losses (``reduction="none"`` of ``gce``;
                the hyper steps' E is then GCE on the clean validation data);
* ``drop_in_val_mae`` / ``drop_in_val_gce`` the drop-in whose outer objective E is the expected
                0-1 error 1 − p_y of the validation data / GCE (q = 0.7) on it, not its cross
                entropy (``validation_loss=``);
* ``drop_in_mean_loss`` / ``drop_in_expected_error`` the drop-in with ``objective="mean_loss"``
                (E = the validation cross entropy) / ``"expected_error"`` (``ExpectedError``,
                eq. softerr: E = mean 1 − e^{−ℓ} = 1 − p_y, the library's own path);
* ``drop_in_natural`` the drop-in with ``parameterization="natural_sigmoid"``
                (``NaturalSigmoidWeights``, eq. natsig: each logit stepped along ∂Φ/∂ω);
* ``oracle``    plain training on the clean-labelled training examples only (labels known);
* ``ren``       Ren et al. 2018, "Learning to reweight examples": at every step the weights of
                the batch are the clipped negative gradient of the validation loss after a
                one-step look-ahead, normalised to sum 1 (3 passes per step).

Every method may read the same 1,000 clean validation images (``plain`` and ``oracle`` do not).
Recorded: test accuracy at the end of training, wall time (and CPU time of this process: on a
shared machine the steadier of the two) of ``trainer.fit``, and for
``drop_in`` the learned weights split by clean / corrupted (mean, histogram, precision and recall
of the flagged examples, flagged = weight below half its start).
Goal (issue 27): the drop-in recovers ≥ 80 % of the accuracy gap between plain and oracle
(recovered = mean(drop_in − plain) / mean(oracle − plain) over the seeds, ± its delta-method
s.e.) at ≤ 2× the plain wall time.

The recipe, the same for every method: SGD lr 0.05, momentum 0.9, batch 64, gradient norm
clipped at 1 (``--clip``; ``--clip 0`` for none, the recipe of the runs before this version, under
which the oracle's own training oscillates on some seeds: Fashion seed 2 ends at 64.8 % against
77-80 % on the others).

``--imbalance`` adds the imbalanced-classes example: MNIST with two classes (3 and 8)
down-sampled 20×, balanced validation data; ``plain`` vs ``inverse_freq`` (class weights
1/frequency) vs ``per_class`` (``LearnedDataWeights(per="class")``) vs ``drop_in`` (per sample);
balanced test accuracy and the accuracy on the two minority classes.

Outputs: JSON (``--out``, default ``benchmarks/results/noisy_labels/noisy_labels.json``) and a
PNG next to it (test accuracy against wall time for every method and setting, the weight
histogram by clean / corrupted).

Usage (from the repository root)::

    python benchmarks/bench_noisy_labels.py --n-train 4000 --epochs 6 --seeds 0 1
    python benchmarks/bench_noisy_labels.py --quick          # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypertorch_sid import IndexedDataset, LearnedDataWeights, LearnedWeightDecay  # noqa: E402
from hypertorch_sid.core.config import Batches  # noqa: E402
from hypertorch_sid.core.directional import ForwardDifference  # noqa: E402
from hypertorch_sid.core.estimation import EstimatedCurvature  # noqa: E402
from hypertorch_sid.core.objectives import OBJECTIVES, ExpectedError  # noqa: E402
from hypertorch_sid.core.parameterizations import (  # noqa: E402
    SharedLossWeights,
    biased_hinge_basis,
    hinge_basis,
)

#: SharedLossWeights' bases by name (--drop-in-kwargs '{"parameterization": {"basis": ...}}')
BASES = {"hinge": hinge_basis, "biased_hinge": biased_hinge_basis}

NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion": (0.2860, 0.3530)}
FOLDERS = {"mnist": "mnist", "fashion": "fashion-mnist"}
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
MINORITY = (3, 8)  # the imbalance example's down-sampled classes


# ---------------------------------------------------------------------------------- data
def recovered_ratio(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """R = mean(a) / mean(b) for paired per-seed gains a = method − plain and b = oracle − plain
    (the share of the gap recovered), ± its delta-method standard error."""
    r = float(a.mean() / b.mean())
    if len(a) < 2:
        return r, 0.0
    return r, float(np.std(a - r * b, ddof=1) / (abs(b.mean()) * np.sqrt(len(a))))


def ratio_of_means(method: list[float], plain: list[float], oracle: list[float]) -> str:
    """The gap recovered from paired per-seed accuracies, as "R ± s.e. %"."""
    p = np.array(plain)
    r, se = recovered_ratio(np.array(method) - p, np.array(oracle) - p)
    return f"{100 * r:.0f} ± {100 * se:.0f} %"


def mean_se(xs: list[float]) -> str:
    """Paired per-seed differences as "mean ± s.e." (two decimals)."""
    se = float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else 0.0
    return f"{float(np.mean(xs)):+.2f} ± {se:.2f}"


def read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = int.from_bytes(raw[:4], "big") & 0xFF
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(name: str, root: Path) -> dict[str, tuple[Tensor, Tensor]]:
    folder = root / FOLDERS[name]
    missing = [f for pair in FILES.values() for f in pair if not (folder / f).is_file()]
    if missing:
        raise SystemExit(f"bench_noisy_labels: {missing} not found in {folder}; pass --data.")
    mean, std = NORMALISATION[name]
    out = {}
    for split, (images, labels) in FILES.items():
        x = torch.tensor(read_idx(folder / images), dtype=torch.float32)[:, None] / 255.0
        out[split] = ((x - mean) / std, torch.tensor(read_idx(folder / labels), dtype=torch.int64))
    return out


def corrupt(y: Tensor, kind: str, rate: float, gen: torch.Generator) -> Tensor:
    """40 % symmetric (a uniformly random *other* class) or pair-flip (c → c+1 mod 10)."""
    noisy = y.clone()
    hit = torch.rand(len(y), generator=gen) < rate
    if kind == "symmetric":
        shift = torch.randint(1, 10, (len(y),), generator=gen)
        noisy[hit] = (y[hit] + shift[hit]) % 10
    else:
        noisy[hit] = (y[hit] + 1) % 10
    return noisy


def split(arrays: dict, n_train: int, n_val: int, n_test: int, seed: int) -> dict[str, Any]:
    X, y = arrays["train"]
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, va = perm[:n_train], perm[n_train : n_train + n_val]
    Xt, yt = arrays["test"]
    return {"X": X[tr], "y": y[tr], "Xv": X[va], "yv": y[va], "Xt": Xt[:n_test], "yt": yt[:n_test]}


# ---------------------------------------------------------------------------------- model
def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 10),
    )  # fmt: skip


class Classifier(pl.LightningModule):
    """An ordinary classifier; ``reduction="none"`` is the drop-in's one change."""

    #: the learning-rate schedule of every method ("constant" or "cosine": cosine decay to 0
    #: over the fit's optimizer steps); set from ``--schedule``
    schedule = "constant"

    def __init__(self, lr: float, reduction: str = "mean", class_weight: Tensor | None = None):
        super().__init__()
        self.net, self.lr, self.reduction = cnn(), lr, reduction
        self.class_weight = class_weight

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y, weight=self.class_weight, reduction=self.reduction)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.schedule == "constant":
            return opt
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        decay = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, total) / total))
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


class GCE(Classifier):
    """The generalised cross entropy of Zhang & Sabuncu 2018, ℓ = (1 − p_y^q)/q (q → 0: CE,
    q = 1: MAE), a robust loss a user would try first: no validation data, no extra pass."""

    def __init__(self, lr: float, q: float = 0.7, reduction: str = "mean") -> None:
        super().__init__(lr, reduction)
        self.q = q

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        p_y = F.softmax(self(x), dim=1).gather(1, y[:, None]).squeeze(1)
        losses = (1 - p_y.clamp_min(1e-7) ** self.q) / self.q
        return losses if self.reduction == "none" else losses.mean()


def look_ahead_weighted_loss(
    net: nn.Module, batch: Any, val: tuple[Tensor, Tensor], lr: float, gen: torch.Generator,
    val_batch: int = 100,
) -> Tensor:  # fmt: skip
    """Ren et al. 2018 (L2RW): Σ ωᵢℓᵢ with ω = normalise(max(−∂E(w − η∇Σεᵢℓᵢ)/∂ε, 0)) at
    ε = 0, E on ``val_batch`` validation examples drawn with ``gen``."""
    x, y = batch
    Xv, yv = val
    params = dict(net.named_parameters())
    eps = torch.zeros(len(y), requires_grad=True, device=x.device)
    losses = F.cross_entropy(functional_call(net, params, (x,)), y, reduction="none")
    grads = torch.autograd.grad((eps * losses).sum(), list(params.values()), create_graph=True)
    ahead = {k: p - lr * g for (k, p), g in zip(params.items(), grads)}
    j = torch.randint(0, len(yv), (val_batch,), generator=gen)
    outer = F.cross_entropy(functional_call(net, ahead, (Xv[j].to(x.device),)), yv[j].to(x.device))
    (g_eps,) = torch.autograd.grad(outer, eps)
    w = torch.clamp(-g_eps, min=0)
    w = w / w.sum() if float(w.sum()) > 0 else w
    return (w.detach() * losses).sum()


class Reweighted(Classifier):
    """Ren et al. 2018 (L2RW), :func:`look_ahead_weighted_loss` at every step."""

    def __init__(self, lr: float, Xv: Tensor, yv: Tensor, val_batch: int = 100) -> None:
        super().__init__(lr)
        self.Xv, self.yv, self.val_batch = Xv, yv, val_batch
        self.gen = torch.Generator().manual_seed(0)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return look_ahead_weighted_loss(
            self.net, batch, (self.Xv, self.yv), self.lr, self.gen, self.val_batch
        )


def accuracy(net: nn.Module, X: Tensor, y: Tensor) -> Tensor:
    device = next(net.parameters()).device
    with torch.no_grad():
        net.eval()
        pred = torch.cat(
            [net(X[i : i + 1000].to(device)).argmax(1).cpu() for i in range(0, len(y), 1000)]
        )
        net.train()
    return pred == y


#: Lightning's accelerator of every training (``--accelerator``)
ACCELERATOR = "cpu"


def _synchronize() -> None:
    """Wait for queued GPU work, so that a timer read after it counts it (CUDA is asynchronous)."""
    if ACCELERATOR != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def trainer(epochs: int, callbacks: list[Any], clip: float | None = None) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs, accelerator=ACCELERATOR, devices=1, logger=False, callbacks=callbacks,
        gradient_clip_val=clip,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip


#: the methods that run LearnedDataWeights (drop_in_fd / drop_in_fm: directional=
#: "forward_difference" (the default since it was measured) / "forward_mode")
DROP_INS = (
    "drop_in", "drop_in_beta0", "drop_in_beta09", "drop_in_fd", "drop_in_fm", "drop_in_natural",
    "drop_in_gce", "drop_in_val_mae", "drop_in_val_gce", "drop_in_mean_loss",
    "drop_in_expected_error", "per_class", "per_class_mean_loss", "drop_in_decay",
)  # fmt: skip
#: the methods that also learn the weight decay, LearnedWeightDecay(1e-4) with its defaults
#: (``decay``: alone, on the noisy labels; ``drop_in_decay``: beside the data weights)
DECAYS = ("decay", "drop_in_decay")


def soft_error(q: float) -> Any:
    """E on the clean validation batch as GCE's (1 − p_y^q)/q (q = 1: 1 − p_y, the expected
    0-1 error of the softmax; q → 0: cross entropy), for ``validation_loss=``."""

    def loss(module: pl.LightningModule, batch: Any) -> Tensor:
        x, y = batch
        p_y = F.softmax(module(x), dim=1).gather(1, y[:, None]).squeeze(1)
        return ((1 - p_y.clamp_min(1e-7) ** q) / q).mean()

    return loss


def train(method: str, d: dict[str, Any], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One training; returns test accuracy, wall time and (drop-in) the learned weights."""
    torch.manual_seed(seed)
    X, y, clean = d["X"], d["y_noisy"], d["clean"]
    gen = torch.Generator().manual_seed(seed)
    callbacks: list[Any] = []
    class_weight = None
    if method == "oracle":
        X, y = X[clean], y[clean]
    if method == "inverse_freq":
        counts = torch.bincount(y, minlength=10).float()
        class_weight = counts.sum() / (10 * counts)
    data: Any = TensorDataset(X, y)
    if method == "ren":
        model: Classifier = Reweighted(args.ren_lr or args.lr, d["Xv"], d["yv"])
    elif method == "gce":
        model = GCE(args.lr, args.gce_q)
    elif method in DROP_INS:
        model = (
            GCE(args.lr, args.gce_q, reduction="none")
            if method == "drop_in_gce"
            else Classifier(args.lr, reduction="none")
        )
        per = "class" if method.startswith("per_class") else "sample"
        kwargs = dict(args.drop_in_kwargs)
        betas = {"drop_in_beta0": (0.0, 0.999), "drop_in_beta09": (0.9, 0.999)}
        if method in betas:
            kwargs["outer_betas"] = betas[method]
        if method in ("drop_in_val_mae", "drop_in_val_gce"):  # the outer objective E
            kwargs.setdefault("validation_loss", soft_error(1.0 if "mae" in method else 0.7))
            kwargs.setdefault("objective", "mean_loss")  # E is that scalar itself, as screened
        if method in ("drop_in_mean_loss", "drop_in_expected_error"):  # E (eq. softerr)
            kwargs["objective"] = method.removeprefix("drop_in_")
        if method == "per_class_mean_loss":  # per class, E = the validation cross entropy
            kwargs["objective"] = "mean_loss"
        if isinstance(kwargs.get("objective"), dict):  # JSON: ExpectedError's fields, or
            fields = kwargs["objective"]  # {"margin_error": {"tau": 1}}: that objective's
            named = [k for k in fields if k in OBJECTIVES]
            kwargs["objective"] = (
                OBJECTIVES[named[0]](**fields[named[0]]) if named else ExpectedError(**fields)
            )
        if method == "drop_in_natural":  # eq. natsig: the logits stepped along ∂Φ/∂ω
            kwargs.setdefault("parameterization", "natural_sigmoid")
        if isinstance(kwargs.get("parameterization"), dict):  # JSON: SharedLossWeights' fields
            shared = dict(kwargs["parameterization"])
            shared["basis"] = BASES[shared.get("basis", "hinge")]
            kwargs["parameterization"] = SharedLossWeights(**shared)
        if method in ("drop_in_fd", "drop_in_fm"):  # the cross term's u (eq. fdcross / a JVP)
            kwargs.setdefault(
                "directional", {"drop_in_fd": "forward_difference"}.get(method, "forward_mode")
            )
        if isinstance(kwargs.get("directional"), dict):  # JSON: ForwardDifference's fields
            kwargs["directional"] = ForwardDifference(**kwargs["directional"])
        if isinstance(kwargs.get("curvature"), dict):  # JSON: EstimatedCurvature's fields
            kwargs["curvature"] = EstimatedCurvature(**kwargs["curvature"])
        if isinstance(kwargs.get("batches"), dict):  # JSON: Batches' fields, e.g. {"d2": 4}
            kwargs["batches"] = Batches(**kwargs["batches"])
        cb = LearnedDataWeights(
            per=per, num_classes=10 if per == "class" else None, seed=seed, **kwargs
        )
        callbacks.append(cb)
        timers = time_phases(cb)
        data = IndexedDataset(data) if per == "sample" else data
    else:
        model = Classifier(args.lr, class_weight=class_weight)
    if method in DECAYS:
        callbacks.append(LearnedWeightDecay(1e-4, seed=seed))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, generator=gen)
    val = DataLoader(TensorDataset(d["Xv"], d["yv"]), batch_size=args.batch)
    _synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weights = next((c for c in callbacks if isinstance(c, LearnedDataWeights)), None)
        tracer = [Trace(d, weights)] if args.trace else []
        fit = trainer(args.epochs, callbacks + tracer, args.clip)
        fit.fit(model, loader, val if callbacks else None)
    _synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    correct = accuracy(model.net, d["Xt"], d["yt"])
    rec: dict[str, Any] = {"test_acc": float(correct.float().mean()), "wall_s": wall, "cpu_s": cpu}
    minority = torch.isin(d["yt"], torch.tensor(MINORITY))
    rec["minority_acc"] = float(correct[minority].float().mean())
    if method in DECAYS:
        lams = callbacks[-1].decay_values()
        rec["weight_decay"] = {k: float(v.mean()) for k, v in lams.items()}
        rec["decay_hyper_steps"] = len(callbacks[-1].history)
        callbacks = callbacks[:-1]
    if callbacks:
        w = callbacks[0].data_weights()
        rec["weights"] = [round(float(v), 4) for v in w]
        if method.startswith("drop_in"):
            rec.update(weight_stats(w, clean, callbacks[0].flagged()))
            misfit = weight_stats(w, clean, callbacks[0].flagged("split_misfit"))  # the option
            rec.update({f"misfit_{k}": misfit[k] for k in ("flag_precision", "flag_recall")})
        rec["hyper_steps"] = len(callbacks[0].history)
        shared = callbacks[0].weights.hyperparameters[1:] if callbacks[0].weights else []
        if shared:  # a shared term's parameters (SharedLossWeights: θ)
            rec["shared_params"] = [round(float(v), 4) for t in shared for v in t.reshape(-1)]
        rec["phase_s"] = {k: round(v, 3) for k, v in timers.items()}
    if args.trace:
        rec["trace"] = tracer[0].rows
        with torch.no_grad():  # each training example's loss under its true label (hardness)
            device = next(model.net.parameters()).device
            rec["true_label_loss"] = F.cross_entropy(
                model.net(d["X"].to(device)), d["y"].to(device), reduction="none"
            ).tolist()
        if method.startswith("drop_in"):
            rec["flagged"] = callbacks[0].flagged().tolist()
    return rec


class Trace(pl.Callback):
    """``--trace``: after every epoch the test accuracy and (drop-in) the mean weight of the
    clean and corrupted examples and the flags' precision / recall (the time it adds is inside
    the fit's wall time: use it for the diagnosis, not for the cost)."""

    def __init__(self, d: dict[str, Any], cb: LearnedDataWeights | None) -> None:
        self.d, self.cb, self.rows = d, cb, []

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        acc = accuracy(module.net, self.d["Xt"], self.d["yt"]).float().mean()
        row = {
            "epoch": trainer.current_epoch + 1,
            "step": trainer.global_step,
            "test_acc": float(acc),
        }
        w = self.cb.data_weights() if self.cb is not None else torch.empty(0)
        if len(w) == len(self.d["clean"]):
            row.update(weight_stats(w, self.d["clean"], self.cb.flagged()))
        self.rows.append(row)


def time_phases(cb: LearnedDataWeights) -> dict[str, float]:
    """Wall and CPU seconds spent in the hyper steps and in the training batches' cross term."""
    timers = {"hyper_steps": 0.0, "cross_term": 0.0, "hyper_steps_cpu": 0.0, "cross_term_cpu": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                timers[name] += time.perf_counter() - t
                timers[name + "_cpu"] += time.process_time() - c

        return run

    cb._hyper_step = timed("hyper_steps", cb._hyper_step)  # type: ignore[method-assign]
    cb._training_cross_term = timed("cross_term", cb._training_cross_term)  # type: ignore[method-assign]
    return timers


def weight_stats(w: Tensor, clean: Tensor, flagged: Tensor) -> dict[str, float]:
    corrupted = ~clean
    is_flagged = torch.zeros(len(w), dtype=torch.bool)
    is_flagged[flagged] = True
    tp = int((is_flagged & corrupted).sum())
    return {
        "weight_clean_mean": float(w[clean].mean()),
        "weight_corrupted_mean": float(w[corrupted].mean()) if corrupted.any() else math.nan,
        "flag_precision": tp / max(int(is_flagged.sum()), 1),
        "flag_recall": tp / max(int(corrupted.sum()), 1),
    }


# ---------------------------------------------------------------------------------- settings
def noisy_setting(arrays: dict, kind: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    d = split(arrays, args.n_train, args.n_val, args.n_test, seed)
    d["y_noisy"] = corrupt(d["y"], kind, args.rate, torch.Generator().manual_seed(100 + seed))
    d["clean"] = d["y_noisy"] == d["y"]
    return d


def imbalanced_setting(arrays: dict, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Two classes down-sampled 20× in the training set; balanced validation (and test)."""
    d = split(arrays, args.n_train, 0, args.n_test, seed)
    keep = torch.ones(len(d["y"]), dtype=torch.bool)
    gen = torch.Generator().manual_seed(200 + seed)
    for c in MINORITY:
        idx = torch.nonzero(d["y"] == c).flatten()
        drop = idx[torch.randperm(len(idx), generator=gen)[len(idx) // 20 :]]
        keep[drop] = False
    X, y = arrays["train"]
    rest = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[args.n_train :]
    per = args.n_val // 10
    val = torch.cat([rest[y[rest] == c][:per] for c in range(10)])
    return {
        "X": d["X"][keep], "y": d["y"][keep], "y_noisy": d["y"][keep],
        "clean": torch.ones(int(keep.sum()), dtype=torch.bool),
        "Xv": X[val], "yv": y[val], "Xt": d["Xt"], "yt": d["yt"],
    }  # fmt: skip


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method, recs in runs.items():
        acc = [r["test_acc"] for r in recs]
        wall = [r["wall_s"] for r in recs]
        out[method] = {
            "test_acc_mean": float(np.mean(acc)), "test_acc_std": float(np.std(acc)),
            "wall_s_mean": float(np.mean(wall)),
            "minority_acc_mean": float(np.mean([r["minority_acc"] for r in recs])),
        }  # fmt: skip
        if all("cpu_s" in r for r in recs):
            out[method]["cpu_s_mean"] = float(np.mean([r["cpu_s"] for r in recs]))
    if {"plain", "oracle", "drop_in"} <= set(out):
        gap = out["oracle"]["test_acc_mean"] - out["plain"]["test_acc_mean"]
        gain = out["drop_in"]["test_acc_mean"] - out["plain"]["test_acc_mean"]
        out["gap_recovered"] = gain / gap if gap > 0 else math.nan
        out["drop_in_time_ratio"] = out["drop_in"]["wall_s_mean"] / out["plain"]["wall_s_mean"]
        if "ren" in out:
            out["ren_gap_recovered"] = (
                (out["ren"]["test_acc_mean"] - out["plain"]["test_acc_mean"]) / gap
                if gap > 0
                else math.nan
            )
            out["ren_time_ratio"] = out["ren"]["wall_s_mean"] / out["plain"]["wall_s_mean"]
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7), squeeze=False)
    colors = {
        "plain": "gray", "oracle": "black", "drop_in": "tab:green", "ren": "tab:orange",
        "inverse_freq": "tab:blue", "per_class": "tab:purple", "gce": "tab:cyan",
        "drop_in_beta0": "tab:olive", "drop_in_beta09": "tab:brown",
    }  # fmt: skip
    for col, name in enumerate(names):
        res = results["settings"][name]
        ax = axes[0, col]
        for method, recs in res["runs"].items():
            ax.scatter([r["wall_s"] for r in recs], [100 * (1 - r["test_acc"]) for r in recs],
                       color=colors.get(method, "red"), label=method)  # fmt: skip
        ax.set_xlabel("wall time of fit (s)")
        ax.set_ylabel("test error (%)")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[1, col]
        drop = res["runs"].get("drop_in")
        if drop and "weights" in drop[0] and "clean" in res:
            w = np.array(drop[0]["weights"])
            clean = np.array(res["clean"], dtype=bool)
            bins = np.linspace(0, 1, 31)
            ax.hist(w[clean], bins=bins, alpha=0.6, label="clean", color="tab:green")
            if (~clean).any():
                ax.hist(w[~clean], bins=bins, alpha=0.6, label="corrupted", color="tab:red")
            ax.set_xlabel("learned weight σ(x) (seed of the first run)")
            ax.set_ylabel("examples")
            ax.legend(fontsize=7)
        else:
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: dict[str, Any]) -> str:
    """The markdown table: test accuracy (%) mean ± std over seeds, the gap recovered (a ratio
    of means over the seeds ± its s.e., and the range of the per-seed values), wall and CPU time
    × plain (per-seed ratios of back-to-back runs, mean and range), the flags' precision /
    recall."""

    def acc(recs: list[dict[str, Any]]) -> str:
        a = 100 * np.array([r["test_acc"] for r in recs])
        return f"{a.mean():.1f} ± {a.std():.1f}"

    def ratios(res: dict[str, Any], method: str, key: str) -> str:
        r = [m[key] / p[key] for m, p in zip(res[method], res["plain"])]
        return f"{np.mean(r):.2f} ({min(r):.2f}–{max(r):.2f})"

    def recovered(res: dict[str, Any], method: str) -> str:
        """R = mean(m − p) / mean(o − p) over the seeds (paired), ± its delta-method s.e."""
        acc = {m: np.array([r["test_acc"] for r in res[m]]) for m in ("plain", "oracle", method)}
        a, b = acc[method] - acc["plain"], acc["oracle"] - acc["plain"]
        r, se = recovered_ratio(a, b)
        per_seed = a / b
        return (
            f"{100 * r:.0f} ± {100 * se:.0f} % "
            f"({100 * min(per_seed):.0f} to {100 * max(per_seed):.0f})"
        )

    methods = ["plain", "drop_in", "oracle", "gce", "ren"]
    drop = ["drop_in"]
    for arm in ("drop_in_beta0", "drop_in_beta09"):
        if all(arm in s["runs"] for s in results["settings"].values()):
            methods.insert(2, arm)
            drop.append(arm)
    rows = [*drop, "gce", "ren"]
    head = ["setting", *methods, *(f"gap recovered: {m}" for m in rows),
            *(f"wall ×plain: {m}" for m in rows), *(f"CPU ×plain: {m}" for m in drop),
            *(f"precision / recall: {m}" for m in drop)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, setting in results["settings"].items():
        res = setting["runs"]
        if not set(methods) <= set(res):
            continue
        cells = [name, *(acc(res[m]) for m in methods)]
        cells += [recovered(res, m) for m in rows]
        cells += [ratios(res, m, "wall_s") for m in rows]
        cells += [ratios(res, m, "cpu_s") for m in drop]
        for m in drop:
            pr = [(r["flag_precision"], r["flag_recall"]) for r in res[m]]
            cells += [f"{np.mean([p for p, _ in pr]):.2f} / {np.mean([r for _, r in pr]):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_trace(results: dict[str, Any], path: Path) -> None:
    """``--trace`` runs: test accuracy per epoch (every method) and the drop-in's mean weights
    and flag precision / recall per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in results["settings"].items() if "trace" in r["runs"]["plain"][0]]
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.5), squeeze=False)
    for col, name in enumerate(names):
        runs = results["settings"][name]["runs"]
        ax = axes[0, col]
        for method, recs in runs.items():
            t = recs[0]["trace"]
            ax.plot([r["epoch"] for r in t], [100 * r["test_acc"] for r in t], "o-", label=method)
        ax.set(xlabel="epoch", ylabel="test accuracy (%)", title=name)
        ax.legend(fontsize=7)
        ax = axes[1, col]
        t = [r for r in runs["drop_in"][0]["trace"] if "flag_recall" in r]
        for key, style in (("weight_clean_mean", "g-"), ("weight_corrupted_mean", "r-"),
                           ("flag_precision", "k--"), ("flag_recall", "b--")):  # fmt: skip
            ax.plot([r["epoch"] for r in t], [r[key] for r in t], style, label=key)
        ax.set(xlabel="epoch (weights move from step 100)", ylim=(0, 1))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=REPO / ".." / "shared" / "data")
    p.add_argument("--datasets", nargs="+", default=["mnist", "fashion"])
    p.add_argument("--noise", nargs="*", default=["symmetric", "pair"])
    p.add_argument(
        "--methods", nargs="+", default=["plain", "drop_in", "oracle", "gce", "ren"],
        help="of plain drop_in drop_in_beta0 drop_in_beta09 oracle gce ren",
    )  # fmt: skip
    p.add_argument("--rate", type=float, default=0.4)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-val", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--schedule", choices=["constant", "cosine"], default="constant",
        help="learning-rate schedule of every method (cosine: decay to 0 over the fit)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared CPU)")
    p.add_argument(
        "--clip", type=float, default=1.0,
        help="clip every method's gradient norm at this value (Trainer(gradient_clip_val=)); "
        "default 1: without it the oracle's training is unstable on some seeds at lr 0.05 "
        "(Fashion seed 2: 44-71 %% between epochs); 0 or a negative value: no clipping",
    )  # fmt: skip
    p.add_argument("--ren-lr", type=float, default=None, help="lr of method ren (default --lr)")
    p.add_argument("--gce-q", type=float, default=0.7, help="q of the GCE loss (method gce)")
    p.add_argument(
        "--drop-in-kwargs", type=json.loads, default={},
        help='JSON keyword arguments for LearnedDataWeights (default: none, its defaults)',
    )  # fmt: skip
    p.add_argument("--trace", action="store_true", help="per-epoch test accuracy and weights")
    p.add_argument("--imbalance", action="store_true", help="add the imbalanced-classes example")
    p.add_argument(
        "--imbalance-methods", nargs="+", default=["plain", "inverse_freq", "per_class", "drop_in"],
        help="the imbalance example's methods (also per_class_mean_loss, drop_in_mean_loss: "
        'objective="mean_loss", the default before ExpectedError(q=0.5))',
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    p.add_argument(
        "--accelerator", default="cpu", help="Lightning accelerator of every training (cpu, gpu)"
    )
    p.add_argument(
        "--out", type=Path,
        default=REPO / "benchmarks" / "results" / "noisy_labels" / "noisy_labels.json",
    )  # fmt: skip
    p.add_argument(
        "--combine", type=Path, nargs="+",
        help="merge the settings of these JSON files (runs split by data set) into --out",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.clip is not None and args.clip <= 0:
        args.clip = None
    if args.quick:
        args.n_train, args.n_val, args.n_test, args.epochs, args.seeds = 600, 200, 500, 1, [0]
        args.datasets, args.noise = args.datasets[:1], args.noise[:1]
    return args


def combine(paths: list[Path], out: Path) -> dict[str, Any]:
    """One result file (and figure) from runs split by data set; a later file's methods replace
    an earlier file's on the same setting (e.g. plain and drop-in rerun back to back with other
    drop-in defaults; every accuracy is deterministic given the seed, the times are per run)."""
    parts = [json.loads(p.read_text()) for p in paths]
    results = {**parts[0], "command": [p["command"] for p in parts], "settings": {}}
    for part in parts:
        for name, setting in part["settings"].items():
            if name in results["settings"]:
                runs = {**results["settings"][name]["runs"], **setting["runs"]}
                setting = {**setting, "runs": runs, "summary": summarise(runs)}
            results["settings"][name] = setting
    out.write_text(json.dumps(results))
    out.with_suffix(".md").write_text(table(results))
    plot(results, out.with_suffix(".png"))
    if any("trace" in r["runs"]["plain"][0] for r in results["settings"].values()):
        plot_trace(results, out.with_name(out.stem + "_trace.png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.combine:
        return combine(args.combine, args.out)
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    torch.set_num_threads(args.threads)
    Classifier.schedule = args.schedule
    results: dict[str, Any] = {
        "command": "python benchmarks/bench_noisy_labels.py " + " ".join(argv or sys.argv[1:]),
        "machine": {"platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    # the CPU kernels torch chose (AVX2 / AVX512 round differently)
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "settings": {},
    }  # fmt: skip
    settings = [(ds, kind) for ds in args.datasets for kind in args.noise]
    if args.imbalance:
        settings.append(("mnist", "imbalance"))
    cache: dict[str, Any] = {}
    for ds, kind in settings:
        arrays = cache.setdefault(ds, load(ds, args.data))
        name = f"{ds}_{kind}" if kind == "imbalance" else f"{ds}_{kind}{int(100 * args.rate)}"
        methods = args.imbalance_methods if kind == "imbalance" else args.methods
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        first_clean = None
        for seed in args.seeds:
            d = (
                imbalanced_setting(arrays, args, seed)
                if kind == "imbalance"
                else noisy_setting(arrays, kind, args, seed)
            )
            if first_clean is None:
                first_clean = d["clean"]
            for method in methods:
                rec = train(method, d, args, seed)
                if seed != args.seeds[0]:
                    rec.pop("weights", None)
                runs[method].append(rec)
                print(f"{name} seed {seed} {method:13s} acc {rec['test_acc']:.4f} "
                      f"minority {rec['minority_acc']:.3f} wall {rec['wall_s']:.1f}s"
                      + (f" w clean {rec['weight_clean_mean']:.3f} corrupted "
                         f"{rec['weight_corrupted_mean']:.3f} P {rec['flag_precision']:.2f} "
                         f"R {rec['flag_recall']:.2f}" if "flag_precision" in rec else "")
                      + (f" cpu {rec['cpu_s']:.1f}s phases {rec['phase_s']}" if "phase_s" in rec
                         else f" cpu {rec['cpu_s']:.1f}s"),
                      flush=True)  # fmt: skip
        results["settings"][name] = {
            "runs": runs,
            "summary": summarise(runs),
            "clean": [bool(c) for c in first_clean] if first_clean is not None else None,
        }
        print(name, json.dumps(results["settings"][name]["summary"], indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results))
    plot(results, args.out.with_suffix(".png"))
    if args.trace and "plain" in args.methods and "drop_in" in args.methods:
        plot_trace(results, args.out.with_name(args.out.stem + "_trace.png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
