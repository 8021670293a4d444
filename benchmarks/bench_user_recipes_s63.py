"""Session 63's unseen recipes: both drop-ins on seven more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, scheduler and loss, on
small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300 validation, 2000 test
images; four groups of 20 Newsgroups: 1200 / 300 / 1000 documents), trained per seed in four
arms as in sessions 61–62: ``own`` (the recipe with its own ``weight_decay``, clean data)
against ``decay`` (``LearnedWeightDecay(<own>)``, every other default, the optimizer's decay
removed, ``decoupled=True`` under AdamW, as README.md says); ``plain`` (the recipe on training
data with 30 % symmetric label noise, a clean validation set) against ``dw``
(``LearnedDataWeights()``, every default, per-sample losses, ``IndexedDataset``). New here,
habits no earlier round tried:

* ``sam_fmnist``  Fashion-MNIST MLP under a user-written **SAM** optimizer (sharpness-aware
  minimisation, Foret et al. 2021: ``step(closure)`` evaluates the closure at w, climbs to
  w + ρ g/‖g‖, evaluates it again there, comes back and lets its base SGD (momentum) step with
  the second gradient), automatic optimization; own 5e-4 (SAM's ``weight_decay=``, passed to
  its base SGD);
* ``vae_mnist``  a **variational autoencoder** on MNIST (784 → 256 → 2 × 16, decoder back to
  784 logits), the negative ELBO per image (Bernoulli reconstruction + KL), Adam, own 1e-4; no
  labels, so the "noisy" arms replace 30 % of the training images by Fashion-MNIST images
  (outliers), the clean validation set is MNIST; scored by the test negative ELBO (nats per
  image, one fixed draw of the latent noise) — no accuracy;
* ``supcon``  Fashion-MNIST MLP trained with cross entropy plus a **supervised contrastive**
  term (Khosla et al. 2020) on a normalised projection, per anchor over the batch (temperature
  0.1): each row's loss depends on the other rows' labels; Adam, own 1e-4; scored on the
  classifier head;
* ``char_cnn``  a **character-level CNN** on 20 Newsgroups (the first 512 characters of the
  words, 27 symbols), SGD momentum under **``CyclicLR``** (triangular2, stepped every batch,
  cycling the momentum 0.8–0.9 as its default does), own 5e-4;
* ``rdrop``  MNIST MLP with dropout 0.3 and **R-Drop** (Liang et al. 2021: two forward passes,
  both cross entropies and the symmetric KL between the two predictions, α = 1), AdamW, own
  0.01 (``decoupled=True``);
* ``gce_fmnist``  Fashion-MNIST MLP trained with the **generalized cross entropy**
  (1 − p_y^q)/q, q = 0.7 (Zhang & Sabuncu 2018, a loss users pick for noisy labels), Adam, own
  1e-4; scored by the test cross entropy and accuracy (added after the first six's runs);
* ``stoch_depth``  Fashion-MNIST residual MLP (four blocks) with **stochastic depth** (each
  block skipped at random with probability 0.2 in training, a Python branch on
  ``torch.rand``), SGD Nesterov momentum under ``ExponentialLR(0.8)`` per epoch, own 5e-4.

Extra arms: ``dw_mean`` (``vae_mnist``: ``objective="mean_loss"``, for a loss that is no
−log p of a label).
Fit lengths: 10 epochs (``char_cnn``: 12 epochs of 32 documents).

Usage (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s63.py \
        --data ../shared/data --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s63/records.json``);
``--table`` prints the table (with CPU-time ratios and the flags' precision / recall).
"""

from __future__ import annotations

import math
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s61 as s61  # noqa: E402
from recipe_harness import (  # noqa: E402
    NEWS_GROUPS,
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

RECIPES = ("sam_fmnist", "vae_mnist", "supcon", "char_cnn", "rdrop", "stoch_depth", "gce_fmnist")
#: the share of training labels moved to another class (symmetric noise), or of the VAE's
#: training images replaced by outliers
NOISE = 0.3
#: characters read per document, and the alphabet (0: padding, 1: space, 2–27: a–z)
CHARS = 512
OUT = Path("benchmarks/results/user_recipes/s63/records.json")
#: the pixel mean and spread the harness normalised the images with (the VAE reads [0, 1])
PIXEL_MEAN, PIXEL_STD = 0.1307, 0.3081

# ----------------------------------------------------------------------------- data


def symmetric_noise(y: Tensor, classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """30 % of the labels moved to another class, uniformly; the labels and the moved mask."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < NOISE
    shift = torch.randint(1, classes, y.shape, generator=g)
    return torch.where(bad, (y + shift) % classes, y), bad


def char_ids(words: list[str]) -> Tensor:
    """A document's words, joined by spaces, as ``CHARS`` character ids (zero-padded)."""
    text = " ".join(words)[:CHARS]
    out = torch.zeros(CHARS, dtype=torch.long)
    out[: len(text)] = torch.tensor(
        [1 if c == " " else ord(c) - 95 for c in text], dtype=torch.long
    )
    return out


def news_chars(data: Path, seed: int) -> tuple[TensorDataset, ...]:
    """The harness's four groups of 20 Newsgroups (the same documents, order and split as
    :func:`recipe_harness.news`: 1200 / 300 / 1000), each as the character ids of its words."""
    docs: dict[str, list[tuple[list[str], int]]] = {"train": [], "test": []}
    with tarfile.open(data / "20news" / "20news-bydate.tar.gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 3 or parts[1] not in NEWS_GROUPS:
                continue
            body = tar.extractfile(member).read().decode("latin-1").split("\n\n", 1)[-1]
            split = "train" if parts[0].endswith("train") else "test"
            words = re.findall(r"[a-z]{2,}", body.lower())[:200]
            docs[split].append((words, NEWS_GROUPS.index(parts[1])))
    for split in docs.values():
        split.sort(key=lambda d: (d[1], d[0][:5]))
    g = torch.Generator().manual_seed(1000 + seed)
    p = torch.randperm(len(docs["train"]), generator=g).tolist()
    q = torch.randperm(len(docs["test"]), generator=g).tolist()
    rows = [
        [docs["train"][i] for i in p[:1200]], [docs["train"][i] for i in p[1200:1500]],
        [docs["test"][i] for i in q[:1000]],
    ]  # fmt: skip
    return tuple(
        TensorDataset(
            torch.stack([char_ids(w) for w, _ in split]), torch.tensor([c for _, c in split])
        )
        for split in rows
    )


# ----------------------------------------------------------------------------- recipes


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation as a user writes it for Lightning's automatic optimization:
    ``step(closure)`` evaluates the closure at w (the gradient g), moves to w + ρ g/‖g‖,
    evaluates it again, moves back and steps the base optimizer with the second gradient."""

    def __init__(self, params, base_optimizer: type, rho: float = 0.05, **kwargs: Any) -> None:
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def _climb(self) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.stack([gr.norm() for gr in grads]).norm()
        for group in self.param_groups:
            scale = group["rho"] / (norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                e = p.grad * scale
                p.add_(e)
                self.state[p]["e"] = e

    @torch.no_grad()
    def _descend(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if "e" in self.state[p]:
                    p.sub_(self.state[p].pop("e"))
        self.base_optimizer.step()

    @torch.no_grad()
    def step(self, closure=None):
        if closure is None:
            raise RuntimeError("SAM needs the closure (two evaluations per step)")
        with torch.enable_grad():
            loss = closure()
        self._climb()
        with torch.enable_grad():
            closure()
        self._descend()
        return loss


class SAMMLP(s57.MLP):
    """Session 57's MLP under :class:`SAM` (ρ = 0.05) over SGD momentum."""

    def configure_optimizers(self):
        return SAM(
            self.parameters(), torch.optim.SGD, rho=0.05, lr=0.05, momentum=0.9,
            weight_decay=self.wd,
        )  # fmt: skip


class VAE(RecipeModule):
    """784 → 256 → (μ, log σ²) of 16 latents → 256 → 784 Bernoulli logits; the negative ELBO
    per image (nats); Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.enc = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 32))
        self.dec = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 784))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z), mu, logvar

    def per_sample_loss(self, out, x):
        logits, mu, logvar = out
        pixels = (x * PIXEL_STD + PIXEL_MEAN).clamp(0, 1).flatten(1)
        recon = F.binary_cross_entropy_with_logits(logits, pixels, reduction="none").sum(1)
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1)
        return recon + kl

    def training_step(self, batch, batch_idx):
        x = batch[0]
        return self.reduce(self.per_sample_loss(self(x), x))

    def validation_step(self, batch, batch_idx):
        x = batch[0]
        self.log("val_loss", self.per_sample_loss(self(x), x).mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class SupCon(RecipeModule):
    """An MLP trunk, a classifier head and a projection head; each row's loss the cross
    entropy plus ½ · its supervised contrastive loss over the batch (temperature 0.1)."""

    TAU, BETA = 0.1, 0.5

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU()
        )
        self.head = nn.Linear(128, 10)
        self.proj = nn.Linear(128, 64)

    def forward(self, x):
        return self.head(self.trunk(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.trunk(x)
        ce = F.cross_entropy(self.head(h), y, reduction="none")
        loss = ce + self.BETA * supcon_loss(F.normalize(self.proj(h), dim=1), y, self.TAU)
        self.log("train_ce", ce.mean())
        return self.reduce(loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


def supcon_loss(z: Tensor, y: Tensor, tau: float) -> Tensor:
    """The supervised contrastive loss per anchor (Khosla et al. 2020, L_out): minus the mean
    log-probability of the anchor's positives (same label, itself excluded) among all other
    rows; 0 for an anchor without positives in the batch."""
    n = len(y)
    eye = torch.eye(n, dtype=torch.bool)
    logits = (z @ z.t() / tau).masked_fill(eye, -1e9)
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos = (y[:, None] == y[None, :]) & ~eye
    count = pos.sum(1)
    return -(log_prob * pos).sum(1) / count.clamp(min=1)


class CharCNN(RecipeModule):
    """Character embeddings (28 × 16), two 1-D convolutions with max-pooling, a global max,
    a linear read-out into 4 groups; SGD momentum under ``CyclicLR`` per batch."""

    def __init__(self, wd, per_sample, steps_per_epoch: int):
        super().__init__(wd, per_sample)
        self.steps_per_epoch = steps_per_epoch
        self.emb = nn.Embedding(28, 16, padding_idx=0)
        self.conv = nn.Sequential(
            nn.Conv1d(16, 64, 7), nn.ReLU(), nn.MaxPool1d(3), nn.Conv1d(64, 64, 5), nn.ReLU(),
            nn.AdaptiveMaxPool1d(1), nn.Flatten(),
        )  # fmt: skip
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        return self.out(self.conv(self.emb(x).transpose(1, 2)))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9, weight_decay=self.wd)
        cyc = torch.optim.lr_scheduler.CyclicLR(
            opt, base_lr=0.01, max_lr=0.1, step_size_up=2 * self.steps_per_epoch,
            mode="triangular2",
        )  # fmt: skip
        return {"optimizer": opt, "lr_scheduler": {"scheduler": cyc, "interval": "step"}}


class RDrop(RecipeModule):
    """An MLP with dropout 0.3; each row's loss both passes' cross entropies (their mean) plus
    α · the symmetric KL between the two predictions; AdamW."""

    ALPHA = 1.0

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 128),
            nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        a, b = self(x), self(x)
        ce = 0.5 * (
            F.cross_entropy(a, y, reduction="none") + F.cross_entropy(b, y, reduction="none")
        )
        la, lb = a.log_softmax(1), b.log_softmax(1)
        kl = 0.5 * ((la.exp() * (la - lb)).sum(1) + (lb.exp() * (lb - la)).sum(1))
        self.log("train_ce", ce.mean())
        return self.reduce(ce + self.ALPHA * kl)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=self.wd)


class StochDepth(RecipeModule):
    """784 → 256, four residual blocks (Linear–ReLU–Linear) each skipped with probability 0.2
    in training (kept ones scaled by 1/0.8), → 10; SGD Nesterov, ``ExponentialLR(0.8)``."""

    KEEP = 0.8

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)) for _ in range(4)
        )
        self.out = nn.Linear(256, 10)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            if self.training:
                if torch.rand(()) < self.KEEP:
                    h = F.relu(h + block(h) / self.KEEP)
            else:
                h = F.relu(h + block(h))
        return self.out(h)

    def configure_optimizers(self):
        opt = torch.optim.SGD(
            self.parameters(), lr=0.02, momentum=0.9, nesterov=True, weight_decay=self.wd
        )
        return [opt], [torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)]


class GCE(s57.MLP):
    """Session 57's MLP trained with the generalized cross entropy (Zhang & Sabuncu 2018), a
    loss users pick for noisy labels: (1 − p_y^q)/q per image, q = 0.7; Adam."""

    Q = 0.7

    def per_sample_loss(self, out, y):
        p_y = out.softmax(1).gather(1, y[:, None]).squeeze(1)
        return (1 - p_y.clamp(min=1e-12) ** self.Q) / self.Q

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


# ----------------------------------------------------------------------------- one fit

MODELS = {
    "sam_fmnist": SAMMLP, "vae_mnist": VAE, "supcon": SupCon, "rdrop": RDrop,
    "stoch_depth": StochDepth, "gce_fmnist": GCE,
}  # fmt: skip
ADAMW = ("rdrop",)


class Setup(s61.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw") + ("dw_mean",) * (name == "vae_mnist")
        self.own = {"vae_mnist": 1e-4, "supcon": 1e-4, "rdrop": 0.01, "gce_fmnist": 1e-4}.get(
            name, 5e-4
        )
        self.classes, self.collate, self.regression = 10, None, False
        if name == "char_cnn":
            self.classes = 4
            self.train, self.val, self.test = news_chars(data, seed)
            return
        fashion = name in ("sam_fmnist", "supcon", "stoch_depth", "gce_fmnist")
        splits = images(data, "fashion-mnist" if fashion else "mnist", seed, 2000, 300, 2000)
        self.train, self.val, self.test = (tensors(s) for s in splits)

    def drop_ins(self, arm: str) -> list:
        """The arm's drop-in, as README.md writes it (every default but ``decoupled=True``
        under AdamW; ``dw_mean``: ``objective="mean_loss"``)."""
        if arm == "decay":
            return [LearnedWeightDecay(self.own, decoupled=self.name in ADAMW)]
        if arm == "dw_mean":
            return [LearnedDataWeights(objective="mean_loss")]
        return [LearnedDataWeights()] if arm == "dw" else []

    def corrupted(self) -> tuple[Any, Tensor]:
        """The noisy training set and the mask of its corrupted rows: labels moved; the VAE's
        images replaced by Fashion-MNIST images (the same normalisation)."""
        x, y = self.train.tensors
        if self.name != "vae_mnist":
            y2, bad = symmetric_noise(y, self.classes, self.seed)
            return TensorDataset(x, y2), bad
        g = torch.Generator().manual_seed(7 + self.seed)
        bad = torch.rand(len(y), generator=g) < NOISE
        other = images(self.data, "fashion-mnist", self.seed + 50, len(y), 0, 0)[0][0]
        return TensorDataset(torch.where(bad.view(-1, 1, 1, 1), other, x), y), bad

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        batch = 32 if name == "char_cnn" else 64
        loader = recipe_loader(train, None, batch, per_sample, True)
        val = recipe_loader(self.val, None, 64, False, False)
        if name == "char_cnn":
            model = CharCNN(wd, per_sample, steps_per_epoch=math.ceil(len(train) / batch))
        else:
            model = MODELS[name](wd, per_sample)
        self.tr = trainer(cbs, 12 if name == "char_cnn" else 10)
        self.tr.fit(model, loader, val)
        return model

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test loss and accuracy (the VAE: the negative ELBO per image, one seeded
        draw of the latent noise, and no accuracy)."""
        test = recipe_loader(self.test, None, 64, False, False)
        if self.name != "vae_mnist":
            return test_loss(model, test)
        model.eval()
        torch.manual_seed(12345)
        total, n = 0.0, 0
        with torch.no_grad():
            for x, _ in test:
                total += float(model.per_sample_loss(model(x), x).sum())
                n += len(x)
        return total / n, float("nan")

    def run(self, arm: str) -> dict[str, Any]:
        """One fit of ``arm`` (``plain`` and the data weights' on the noisy data), its record:
        CPU and wall time, the package's warnings and log lines, the test score, what the
        drop-in learned and, for the data weights, ``flagged()`` against the corrupted rows."""
        with package_logs() as logs:
            per_sample = arm.startswith("dw")
            noisy = per_sample or arm == "plain"
            train, bad = self.corrupted() if noisy else (self.train, None)
            wd = 0.0 if arm == "decay" else self.own
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return scored_record(self, record, model, logs, cbs, bad, per_sample)


VERSUS = {"decay": "own", "dw": "plain", "dw_mean": "plain"}


def table(records: list[dict[str, Any]]) -> str:
    """Session 61's table (paired test loss and accuracy, CPU ratio, flags) of these records."""
    saved, s61.VERSUS = s61.VERSUS, VERSUS
    try:
        return s61.table(records)
    finally:
        s61.VERSUS = saved


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s63", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
