"""Session 62's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer and Lightning habits,
on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300 validation, 2000 test
images; the CTC recipe: strips of three MNIST digits, 2000 / 300 / 2000 strips), trained per
seed in four arms as in session 61: ``own`` (the recipe with its own ``weight_decay``, clean
data) against ``decay`` (``LearnedWeightDecay(<own>)``, every other default, the optimizer's
decay removed, as README.md says); ``plain`` (the recipe on training data with 30 % symmetric
label noise, a clean validation set) against ``dw`` (``LearnedDataWeights()``, every default,
per-sample losses, ``IndexedDataset``). New here, habits no earlier round tried:

* ``kendall_mt``  Fashion-MNIST, a trunk, a fine head (10 classes) and a coarse head (4
  groups), the two losses weighted by learned uncertainties (Kendall, Gal & Cipolla 2018: two
  ``log_vars`` parameters, ``exp(−s)·ce + s`` per task and image), Adam, own 1e-4 (on every
  parameter, ``log_vars`` included, as ``self.parameters()`` gives); scored on the fine head;
* ``ohem``  MNIST MLP with online hard example mining: each batch's hardest 70 % of the images
  train (``loss.topk(k)``), SGD momentum, own 5e-4; ``dw`` is the user's per-sample version of
  that (``loss.topk(k).values``), ``dw_masked`` the per-row form the refusal asks for (every
  row's loss, the easy rows' times 0);
* ``qat_mlp``  MNIST MLP trained quantization-aware: ``torch.ao.quantization.FakeQuantize`` on
  every weight (int8, symmetric) and activation (uint8), moving-average observers updated by
  each forward and frozen (``disable_observer``) from epoch 6 on, SGD momentum, own 5e-4;
* ``grad_central``  Fashion-MNIST MLP with gradient centralization in the module's own
  ``on_before_optimizer_step`` (each weight matrix's gradient less its row mean), SGD
  momentum, own 5e-4;
* ``cosine_head``  Fashion-MNIST MLP with a cosine classifier (NormFace: features and class
  vectors L2-normalised, a learned logit scale ``exp(log_s)``), SGD momentum, own 5e-4;
* ``ctc_strip``  strips of three MNIST digits (28 × 84), a small CNN read column by column,
  ``F.ctc_loss`` (``reduction="none"``), Adam, own 1e-4; scored by the test CTC loss and the
  share of strips read exactly (greedy decoding); the noisy arms move each digit of 30 % of
  the strips.

Extra arms: ``dw_masked`` (``ohem``); ``dw_mean`` and ``dw_val`` (``kendall_mt``:
``objective="mean_loss"``, and the fine head's cross entropy as ``validation_loss=``, the two
fixes its refusal names); ``own_lse``, ``decay_lse``, ``plain_lse``, ``dw_lse`` (``ctc_strip``:
the CTC loss by :func:`ctc_logsumexp`, the fix its refusal names; the drop-ins compared with
the ``_lse`` own and plain arms).
Fit lengths: 10 epochs (320 steps; the CTC recipe 10 epochs of 32 strips a batch, 630 steps).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s62.py \
        --data ../shared/data --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s62/records.json``);
``--table`` prints the table (with CPU-time ratios and the flags' precision / recall).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver, disable_observer
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s61 as s61  # noqa: E402
from recipe_harness import (  # noqa: E402
    RecipeModule,
    images,
    package_logs,
    recipe_loader,
    scored_record,
    tensors,
    test_loss,
    timed_fit,
    trainer,
)

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = ("kendall_mt", "ohem", "qat_mlp", "grad_central", "cosine_head", "ctc_strip")
#: the share of training labels moved to another class (symmetric noise)
NOISE = 0.3
#: digits per CTC strip, and the strip's columns after the CNN (84 / 4)
DIGITS, COLUMNS = 3, 21
OUT = Path("benchmarks/results/user_recipes/s62/records.json")

# ----------------------------------------------------------------------------- data


def symmetric_noise(y: Tensor, classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """30 % of the labels (rows of ``y``, each row's entries together) moved to another class,
    uniformly; the labels and the mask of the moved rows."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < NOISE
    shift = torch.randint(1, classes, y.shape, generator=g)
    moved = torch.where(bad.view(-1, *[1] * (y.dim() - 1)), (y + shift) % classes, y)
    return moved, bad


def strips(data: TensorDataset) -> TensorDataset:
    """Consecutive triples of digits side by side: (1, 28, 84) images and (3,) labels."""
    x, y = data.tensors
    n = len(x) // DIGITS
    x = x[: n * DIGITS].view(n, DIGITS, 1, 28, 28).permute(0, 2, 3, 1, 4).reshape(n, 1, 28, 84)
    return TensorDataset(x, y[: n * DIGITS].view(n, DIGITS))


# ----------------------------------------------------------------------------- recipes


class KendallMT(s61.MultiTask):
    """The multitask net of session 61, its two losses weighted by learned uncertainties:
    ``exp(−s_t)·ce_t + s_t`` per task and image (``log_vars`` = s); Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample, total_steps=0)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def training_step(self, batch, batch_idx):
        x, y, c = batch
        fine, coarse = self.losses(x, y, c)
        precision = torch.exp(-self.log_vars)
        loss = precision[0] * fine + self.log_vars[0] + precision[1] * coarse + self.log_vars[1]
        self.log("train_fine", fine.mean())
        return self.reduce(loss)

    def validation_step(self, batch, batch_idx):
        x, y, c = batch
        fine, _ = self.losses(x, y, c)
        self.log("val_loss", fine.mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class OHEM(s57.MLP):
    """Online hard example mining: each batch's hardest 70 % of the images train.
    ``masked``: every row's loss, the easy rows' times 0 (the per-row form); else the kept
    rows' losses (``topk``), their mean when not per sample."""

    KEEP = 0.7

    def __init__(self, wd, per_sample, masked: bool = False):
        super().__init__(wd, per_sample)
        self.masked = masked

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        k = max(1, int(self.KEEP * len(loss)))
        self.log("train_loss", loss.mean())
        if self.masked:
            keep = loss.detach() >= loss.detach().topk(k).values[-1]
            return loss * keep if self.per_sample else (loss * keep).sum() / k
        hard = loss.topk(k).values
        return hard if self.per_sample else hard.mean()


class QATMLP(RecipeModule):
    """784 → 256 → 128 → 10, every weight and activation fake-quantized (int8 / uint8), the
    observers frozen from epoch 6 on."""

    FREEZE_AT = 6

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.layers = nn.ModuleList([nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)])
        self.fq_w = nn.ModuleList([self._weight_fq() for _ in self.layers])
        self.fq_a = nn.ModuleList([self._act_fq() for _ in self.layers[:-1]])

    @staticmethod
    def _weight_fq() -> FakeQuantize:
        return FakeQuantize(
            observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
            dtype=torch.qint8, qscheme=torch.per_tensor_symmetric,
        )  # fmt: skip

    @staticmethod
    def _act_fq() -> FakeQuantize:
        return FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)

    def forward(self, x):
        h = x.flatten(1)
        for i, layer in enumerate(self.layers):
            h = F.linear(h, self.fq_w[i](layer.weight), layer.bias)
            if i < len(self.fq_a):
                h = self.fq_a[i](F.relu(h))
        return h

    def on_train_epoch_start(self):
        if self.current_epoch == self.FREEZE_AT:
            self.apply(disable_observer)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class GradCentral(s57.MLP):
    """Gradient centralization: each weight matrix's gradient less its mean over the inputs, in
    the module's ``on_before_optimizer_step``."""

    def on_before_optimizer_step(self, optimizer):
        for p in self.parameters():
            if p.grad is not None and p.dim() > 1:
                p.grad.sub_(p.grad.mean(dim=tuple(range(1, p.dim())), keepdim=True))


class CosineHead(RecipeModule):
    """An MLP trunk and a cosine classifier: logits = exp(log_s) · cos(feature, class vector)."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU()
        )
        self.classes = nn.Parameter(torch.randn(10, 128) / math.sqrt(128))
        self.log_s = nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, x):
        h = F.normalize(self.trunk(x), dim=1)
        return self.log_s.exp() * h @ F.normalize(self.classes, dim=1).t()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


def fine_head_loss(module: nn.Module, batch) -> Tensor:
    """The fine head's cross entropy per validation image (``dw_val``)."""
    return F.cross_entropy(module(batch[0]), batch[1], reduction="none")


def ctc_logsumexp(log_p: Tensor, targets: Tensor) -> Tensor:
    """The CTC loss per sequence by its forward recursion over the alignment lattice in
    ``torch.logsumexp`` (twice differentiable, unlike ``F.ctc_loss``): ``log_p`` (T, B, C) with
    blank 0, ``targets`` (B, L) of classes ≥ 1, every input of length T, every target L."""
    n, length = targets.shape
    ext = torch.zeros(n, 2 * length + 1, dtype=torch.long)
    ext[:, 1::2] = targets  # blank, t1, blank, t2, ..., blank
    skip = torch.zeros_like(ext, dtype=torch.bool)
    skip[:, 3::2] = targets[:, 1:] != targets[:, :-1]  # a label may follow the previous one
    never = torch.tensor(-1e30)  # log 0, finite: no NaN in the gradients
    alpha = torch.where(torch.arange(ext.shape[1]) < 2, log_p[0].gather(1, ext), never)
    for t in range(1, len(log_p)):
        one = F.pad(alpha[:, :-1], (1, 0), value=-1e30)
        two = torch.where(skip, F.pad(alpha[:, :-2], (2, 0), value=-1e30), never)
        alpha = torch.logsumexp(torch.stack([alpha, one, two]), 0) + log_p[t].gather(1, ext)
    return -torch.logsumexp(alpha[:, -2:], 1)


class StripCTC(RecipeModule):
    """Two conv blocks, each of the 21 columns read by a small MLP into 11 classes (blank 0,
    digits 1–10); ``F.ctc_loss`` per strip (``lse``: :func:`ctc_logsumexp`, the fix the
    refusal names); Adam."""

    def __init__(self, wd, per_sample, lse: bool = False):
        super().__init__(wd, per_sample)
        self.lse = lse
        self.conv = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.read = nn.Sequential(nn.Linear(32 * 7, 64), nn.ReLU(), nn.Linear(64, 11))

    def forward(self, x):
        h = self.conv(x)  # (B, 32, 7, 21)
        return self.read(h.permute(0, 3, 1, 2).flatten(2))  # (B, 21, 11)

    def per_sample_loss(self, out, y):
        log_p = out.log_softmax(-1).transpose(0, 1)  # (T, B, C)
        if self.lse:
            return ctc_logsumexp(log_p, y + 1)
        n = len(y)
        lengths = torch.full((n,), COLUMNS, dtype=torch.long)
        targets = torch.full((n,), DIGITS, dtype=torch.long)
        return F.ctc_loss(log_p, y + 1, lengths, targets, reduction="none")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


def greedy_read(out: Tensor) -> list[list[int]]:
    """The digits a strip's columns read (best class per column, repeats merged, blanks out)."""
    reads = []
    for best in out.argmax(-1).tolist():
        digits, last = [], 0
        for c in best:
            if c != last and c != 0:
                digits.append(c - 1)
            last = c
        reads.append(digits)
    return reads


# ----------------------------------------------------------------------------- one fit

MODELS = {
    "kendall_mt": KendallMT, "qat_mlp": QATMLP, "grad_central": GradCentral,
    "cosine_head": CosineHead, "ctc_strip": StripCTC,
}  # fmt: skip


class Setup(s61.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw") + {
            "ohem": ("dw_masked",), "kendall_mt": ("dw_mean", "dw_val"),
            "ctc_strip": ("own_lse", "decay_lse", "plain_lse", "dw_lse"),
        }.get(name, ())  # fmt: skip
        self.own = 1e-4 if name in ("kendall_mt", "ctc_strip") else 5e-4
        self.classes, self.collate, self.regression = 10, None, False
        fashion = name in ("kendall_mt", "grad_central", "cosine_head")
        scale = DIGITS if name == "ctc_strip" else 1
        splits = images(
            data, "fashion-mnist" if fashion else "mnist", seed,
            2000 * scale, 300 * scale, 2000 * scale,
        )  # fmt: skip
        self.train, self.val, self.test = (tensors(s) for s in splits)
        if name == "ctc_strip":
            self.train, self.val, self.test = (strips(d) for d in (self.train, self.val, self.test))

    def drop_ins(self, arm: str) -> list:
        """The arm's drop-in, as README.md writes it (every default)."""
        if arm.startswith("decay"):
            return [LearnedWeightDecay(self.own)]
        if arm == "dw_mean":  # what the refusal of a negative loss says to pass
            return [LearnedDataWeights(objective="mean_loss")]
        if arm == "dw_val":  # the fine head's cross entropy as the validation loss
            return [LearnedDataWeights(validation_loss=fine_head_loss)]
        return [LearnedDataWeights()] if arm.startswith("dw") else []

    def corrupted(self) -> tuple[Any, Tensor]:
        x, y = self.train.tensors
        y2, bad = symmetric_noise(y, self.classes, self.seed)
        return TensorDataset(x, y2), bad

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        val_set = self.with_groups(self.val) if name == "kendall_mt" else self.val
        if name == "kendall_mt":
            train = self.with_groups(train)
        batch = 32 if name == "ctc_strip" else 64
        loader = recipe_loader(train, None, batch, per_sample, True)
        val = recipe_loader(val_set, None, 64, False, False)
        if name == "ohem":
            model = OHEM(wd, per_sample, masked=record["arm"] == "dw_masked")
        elif name == "ctc_strip":
            model = StripCTC(wd, per_sample, lse=record["arm"].endswith("_lse"))
        else:
            model = MODELS[name](wd, per_sample)
        self.tr = trainer(cbs, 10)
        self.tr.fit(model, loader, val)
        if name == "kendall_mt":
            record["log_vars"] = model.log_vars.detach().tolist()
        if name == "cosine_head":
            record["scale"] = float(model.log_s.exp())
        return model

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test loss and accuracy (the CTC recipe: the mean CTC loss per strip and the
        share of strips read exactly)."""
        test = recipe_loader(self.test, None, 64, False, False)
        if self.name != "ctc_strip":
            return test_loss(model, test)
        model.eval()
        total, exact, n = 0.0, 0, 0
        with torch.no_grad():
            for x, y in test:
                out = model(x)
                total += float(model.per_sample_loss(out, y).sum())
                exact += sum(r == t for r, t in zip(greedy_read(out), y.tolist()))
                n += len(y)
        return total / n, exact / n

    def run(self, arm: str) -> dict[str, Any]:
        """One fit of ``arm`` (``plain`` and the data weights' on the noisy labels), its
        record: CPU and wall time, the package's warnings and log lines, the test score, what
        the drop-in learned and, for the data weights, ``flagged()`` against the moved labels."""
        with package_logs() as logs:
            per_sample = arm.startswith("dw")
            noisy = per_sample or arm.startswith("plain")
            train, bad = self.corrupted() if noisy else (self.train, None)
            wd = 0.0 if arm.startswith("decay") else self.own
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return scored_record(self, record, model, logs, cbs, bad, per_sample)


VERSUS = {
    "decay": "own", "dw": "plain", "dw_masked": "plain", "dw_mean": "plain", "dw_val": "plain",
    "decay_lse": "own_lse", "dw_lse": "plain_lse", "own_lse": "own", "plain_lse": "plain",
}  # fmt: skip


def table(records: list[dict[str, Any]]) -> str:
    """Session 61's table (paired test loss and accuracy, CPU ratio, flags) of these records."""
    saved, s61.VERSUS = s61.VERSUS, VERSUS
    try:
        return s61.table(records)
    finally:
        s61.VERSUS = saved


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s62", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
