"""Session 60's unseen recipes: both drop-ins on six more set-ups a Lightning user writes.

Each recipe is a small ``LightningModule`` with the user's own optimizer, Trainer flags and
Lightning habits, on small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300
validation, 2000 test images; four groups of 20 Newsgroups: 1200 / 300 / 1000 documents),
trained per seed in four arms: ``own`` (the recipe with its own ``weight_decay``, clean labels)
against ``decay`` (``LearnedWeightDecay(<own>)``, the optimizer's decay removed, as README.md
says; ``decoupled=True`` under AdamW); ``plain`` (the recipe on 35 % wrong training labels, a
clean validation set) against ``dw`` (``LearnedDataWeights()``, per-sample losses,
``IndexedDataset``). New here, habits no earlier round tried on real data:

* ``ortho_mlp``  Fashion-MNIST MLP whose square hidden layer is
  ``parametrizations.orthogonal(nn.Linear(256, 256))`` (the weight an orthogonal matrix, its
  tensor ``original`` trained), SGD momentum, own 5e-4;
* ``tied_ae``  MNIST autoencoder-classifier: the decoder reuses the encoder's weight
  (``F.linear(h, self.enc.weight.t(), self.dec_bias)``: one Parameter used twice in the graph),
  the loss cross entropy + 0.5 × the reconstruction's MSE per image, Adam, own 1e-4;
* ``custom_sched``  Fashion-MNIST MLP, AdamW (own 0.01) with the user's own warm-up / cosine
  class (no ``torch.optim.lr_scheduler`` subclass: it has ``step``, ``state_dict``,
  ``load_state_dict``), hence the ``lr_scheduler_step`` override Lightning asks for,
  ``interval: "step"``; ``Trainer(max_steps=250, max_epochs=-1)``;
* ``news_tf_bf16``  20 Newsgroups: a class token, token + position embeddings, a pre-norm
  ``nn.TransformerEncoder`` (``norm_first=True``) with the padding mask, the class token's
  state to a linear head; ``self.criterion = nn.CrossEntropyLoss(label_smoothing=0.1)``,
  AdamW (own 0.01), ``precision="bf16-mixed"`` on the CPU;
* ``grad_penalty``  MNIST MLP trained with an input-gradient penalty (double back-propagation:
  ``torch.autograd.grad(ce.sum(), x, create_graph=True)`` inside ``training_step``, the squared
  norm per image added to its loss), SGD momentum, own 5e-4;
* ``lbfgs_news``  20 Newsgroups bag-of-words (tf-idf of 2000 words) logistic regression with
  ``torch.optim.LBFGS`` (Lightning passes the closure; LBFGS has no ``weight_decay``, so the
  user's L2 term ½·λ‖W‖² is in the loss, own 1e-3), batches of 200 documents, 20 epochs.

Control (on request, ``--arms decay_free``): ``ortho_mlp``'s drop-in with
``max_overhead=None`` (every due hyper step runs: the orthogonal layer's Hessian–vector
product, through ``matrix_exp``, costs ~17 training steps, so the default budget runs none).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_user_recipes_s60.py --data ../shared/data \
        --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s60/records.json``);
``--table`` prints the table.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
from recipe_harness import (  # noqa: E402
    Docs,
    RecipeModule,
    images,
    news,
    noisy_labels,
    package_logs,
    recipe_loader,
    scored_record,
    tensors,
    timed_fit,
    trainer,
    versus_table,
)

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay  # noqa: E402

RECIPES = (
    "ortho_mlp", "tied_ae", "custom_sched", "news_tf_bf16", "grad_penalty", "lbfgs_news",
)  # fmt: skip
OUT = Path("benchmarks/results/user_recipes/s60/records.json")
#: the longest document the Transformer reads (the class token included)
MAX_TOKENS = 96
#: the class token (one past the 8000-word vocabulary)
CLS = 8000


# ----------------------------------------------------------------------------- recipes


class OrthoMLP(RecipeModule):
    """784 → 256 → (orthogonal 256 × 256) → 10; SGD momentum."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.inp = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU())
        self.mid = orthogonal(nn.Linear(256, 256))
        self.out = nn.Linear(256, 10)

    def forward(self, x):
        return self.out(F.relu(self.mid(self.inp(x))))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=self.wd)


class TiedAE(RecipeModule):
    """Encoder 784 → 128, decoder its transpose (the same Parameter), a head on the code."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.enc = nn.Linear(784, 128)
        self.dec_bias = nn.Parameter(torch.zeros(784))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.head(self.enc(x.flatten(1)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x.flatten(1)
        h = self.enc(x)
        recon = torch.sigmoid(F.linear(torch.relu(h), self.enc.weight.t(), self.dec_bias))
        rec = F.mse_loss(recon, (x * 0.3081 + 0.1307).clamp(0, 1), reduction="none").mean(1)
        ce = F.cross_entropy(self.head(h), y, reduction="none")
        return self.reduce(ce + 0.5 * rec)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class WarmupCosine:
    """The user's own schedule (no torch scheduler class): linear warm-up, then cosine."""

    def __init__(self, optimizer, warmup: int, total: int) -> None:
        self.optimizer, self.warmup, self.total, self.t = optimizer, warmup, total, 0
        self.base = [g["lr"] for g in optimizer.param_groups]
        self._set()

    def _set(self) -> None:
        t = self.t
        if t < self.warmup:
            scale = (t + 1) / self.warmup
        else:
            scale = 0.5 * (1 + math.cos(math.pi * min(1.0, (t - self.warmup) / self.total)))
        for g, lr in zip(self.optimizer.param_groups, self.base):
            g["lr"] = lr * scale

    def step(self) -> None:
        self.t += 1
        self._set()

    def state_dict(self) -> dict:
        return {"t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self._set()


class CustomSched(s57.MLP):
    """AdamW with the user's own schedule, stepped by ``lr_scheduler_step``."""

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=self.wd)
        sched = WarmupCosine(opt, warmup=25, total=self.trainer.max_steps - 25)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step()


def cls_collate(samples):
    """The class token, then the document (cut), padded with 0: ``(tokens (B, L), labels)``."""
    seqs = [torch.cat([torch.tensor([CLS]), s[: MAX_TOKENS - 1]]) for s, _ in samples]
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True), torch.stack([y for _, y in samples])


class NewsTransformer(RecipeModule):
    """Pre-norm Transformer encoder; the class token's state to the head; label smoothing."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(8001, 64, padding_idx=0)
        self.pos = nn.Embedding(MAX_TOKENS, 64)
        layer = nn.TransformerEncoderLayer(
            64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 4)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.encoder(self.emb(tokens) + self.pos(pos), src_key_padding_mask=tokens == 0)
        return self.head(self.norm(h[:, 0])).float()

    def training_step(self, batch, batch_idx):
        tokens, y = batch
        return self.reduce(self.criterion(self(tokens), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=self.wd)


class GradPenalty(s57.MLP):
    """Cross entropy + the squared norm of its gradient in the input, per image."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x.clone().requires_grad_(True)
        ce = F.cross_entropy(self(x), y, reduction="none")
        (gx,) = torch.autograd.grad(ce.sum(), x, create_graph=True)
        return self.reduce(ce + 0.1 * gx.flatten(1).pow(2).sum(1))


def tfidf(docs: Docs, idf: torch.Tensor | None = None, words: int = 2000):
    """Bag of words of the ``words`` most frequent ids (ids 1..words), tf-idf, rows L2-unit."""
    x = torch.zeros(len(docs), words)
    for i, s in enumerate(docs.seqs):
        s = s[(s >= 1) & (s <= words)] - 1
        x[i].index_add_(0, s, torch.ones(len(s)))
    if idf is None:
        idf = torch.log((1 + len(docs)) / (1 + (x > 0).sum(0))) + 1
    x = x * idf
    return x / x.norm(dim=1, keepdim=True).clamp(min=1e-8), idf


class LBFGSNews(RecipeModule):
    """Logistic regression on tf-idf; ``torch.optim.LBFGS`` (Lightning passes the closure)."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.lin = nn.Linear(2000, 4)

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        l2 = 0.5 * self.wd * self.lin.weight.pow(2).sum()  # LBFGS has no weight_decay
        return self.reduce(F.cross_entropy(self(x), y, reduction="none") + l2)

    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=5, history_size=10)


# ----------------------------------------------------------------------------- one fit


class Setup(s57.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("own", "decay", "plain", "dw") + ("decay_free",) * (name == "ortho_mlp")
        self.own = {"tied_ae": 1e-4, "custom_sched": 0.01, "news_tf_bf16": 0.01}.get(name, 5e-4)
        self.own = 1e-3 if name == "lbfgs_news" else self.own
        self.classes, self.collate = 10, None
        if name in ("news_tf_bf16", "lbfgs_news"):
            tr, va, te = news(data, seed, 1200, 300, 1000)
            self.train, self.val, self.test = Docs(*tr), Docs(*va), Docs(*te)
            self.classes = 4
            if name == "news_tf_bf16":
                self.collate = cls_collate
            else:
                x, idf = tfidf(self.train)
                self.train = TensorDataset(x, self.train.labels)
                self.val = TensorDataset(tfidf(self.val, idf)[0], self.val.labels)
                self.test = TensorDataset(tfidf(self.test, idf)[0], self.test.labels)
            return
        mnist = name in ("tied_ae", "grad_penalty")
        tr, va, te = images(data, "mnist" if mnist else "fashion-mnist", seed, 2000, 300, 2000)
        self.train, self.val, self.test = tensors(tr), tensors(va), tensors(te)

    def drop_ins(self, arm: str) -> list:
        """The arm's drop-in, as README.md writes it (``decoupled=True`` under AdamW)."""
        if arm in ("decay", "decay_free"):
            free = {"max_overhead": None} if arm == "decay_free" else {}
            return [LearnedWeightDecay(self.own, decoupled=self.name in ADAMW, **free)]
        return [LearnedDataWeights()] if arm == "dw" else []

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        batch = {"news_tf_bf16": 32, "lbfgs_news": 200}.get(name, 64)
        val = recipe_loader(self.val, self.collate, 64, False, False)
        loader = recipe_loader(train, self.collate, batch, per_sample, True)
        model = {
            "ortho_mlp": OrthoMLP, "tied_ae": TiedAE, "custom_sched": CustomSched,
            "news_tf_bf16": NewsTransformer, "grad_penalty": GradPenalty, "lbfgs_news": LBFGSNews,
        }[name](wd, per_sample)  # fmt: skip
        if name == "custom_sched":
            model.lr = 2e-3
            self.tr = trainer(cbs, -1, max_steps=250)
        elif name == "news_tf_bf16":
            self.tr = trainer(cbs, 6, precision="bf16-mixed")
        elif name == "lbfgs_news":
            self.tr = trainer(cbs, 20)
        else:
            self.tr = trainer(cbs, 5)
        self.tr.fit(model, loader, val)
        return model

    def run(self, arm: str) -> dict[str, Any]:
        with package_logs() as logs:
            noisy, per_sample = arm in ("plain", "dw"), arm == "dw"
            train, bad = (
                noisy_labels(self.train, self.classes, self.seed) if noisy else (self.train, None)
            )
            wd = 0.0 if arm.startswith("decay") else self.own
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, wd, record), 600
            )
        return scored_record(self, record, model, logs, cbs, bad, per_sample)


#: the recipes whose optimizer decays decoupled (AdamW): the drop-in's ``decoupled=True``
ADAMW = ("custom_sched", "news_tf_bf16")
VERSUS = {"decay": "own", "dw": "plain", "decay_free": "own"}


#: the paired table of this round (`recipe_harness.paired_table`)
table = versus_table(VERSUS)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s60", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
