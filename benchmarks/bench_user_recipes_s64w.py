"""Session 64's unseen recipes for the weight decay: ``LearnedWeightDecay`` on six set-ups.

Each recipe is a small ``LightningModule`` with the user's own optimizer, scheduler and loss, on
small real data (MNIST / Fashion-MNIST subsets: 2000 training, 300 validation, 2000 test
images; four groups of 20 Newsgroups: 1200 / 300 / 1000 documents), trained per seed in three
arms: ``own`` (the recipe with its own decay), ``none`` (the same with ``weight_decay=0``) and
``decay`` (``LearnedWeightDecay(<own>)``, every other default, the optimizer's decay removed,
``decoupled=True`` where the optimizer decouples its decay, ``apply_to="weights"`` where the
recipe keeps biases and norm weights undecayed — as README.md says). New here, habits no earlier
round tried:

* ``lion_fmnist``  Fashion-MNIST MLP under a user-written **Lion** optimizer (Chen et al. 2023:
  the step is lr · sign(β₁ m + (1 − β₁) g), the decay decoupled, w ← w (1 − lr · wd)), lr 1e-4,
  own 0.1 (Lion's usual 10 × AdamW's);
* ``moe_fmnist``  Fashion-MNIST, a trunk and a **mixture of four experts with top-1 (switch)
  routing** and the load-balancing loss (Fedus et al. 2022): an expert that no image of a
  batch is routed to gets no gradient; AdamW, own 0.01;
* ``maxnorm_news``  20 Newsgroups, **``nn.Embedding(max_norm=1.0)``** (rows renormalised in
  place by each forward) averaged over the document, an MLP head; Adam, own 1e-4;
* ``lookahead_mnist``  MNIST MLP under a user-written **Lookahead** wrapper (Zhang et al. 2019:
  k = 5 fast AdamW steps, then the slow weights move α = 0.5 toward them and the fast weights are
  set to them), the wrapped optimizer held as ``self.optimizer``; own 0.01 (AdamW's);
* ``tf_news``  20 Newsgroups, a two-layer **Transformer encoder** (learned positions, a class
  token), AdamW with the usual **no-decay groups** (biases, LayerNorm weights and the embeddings
  at 0) under a **linear warm-up then cosine** ``LambdaLR`` stepped every batch; own 0.01;
* ``lm_news``  a word-level **GRU language model with tied input / output embeddings** (Press &
  Wolf 2017: the decoder is ``F.linear(h, emb.weight, bias)``) on the first 64 words of the 20
  Newsgroups documents (2000 words, padding ignored), AdamW with ``gradient_clip_val=0.5``;
  own 0.01; scored by the test cross entropy per word and next-word accuracy;
* ``svm_news``  20 Newsgroups tf-idf, a **linear multi-class SVM** (``nn.MultiMarginLoss``, a
  hinge: the loss has no curvature of its own, the decay is all of it), SGD momentum, own 1e-3.

Usage (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s64w.py \
        --data ../shared/data --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s64w/records.json``);
``--table`` prints the table: the decay arm's test loss against ``own`` and against ``none``,
paired by seed, its accuracy, and its CPU time against ``own``'s.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
from recipe_harness import (  # noqa: E402
    RecipeModule,
    images,
    mean_se,
    news,
    package_logs,
    paired,
    recipe_loader,
    scored_record,
    tensors,
    test_loss,
    timed_fit,
    trainer,
)

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

RECIPES = (
    "lion_fmnist", "moe_fmnist", "maxnorm_news", "lookahead_mnist", "tf_news", "svm_news",
    "lm_news",
)  # fmt: skip
ARMS = ("own", "none", "decay")
#: extra arms: ``decay_c`` (``decoupled=False``: what the callback's warning about Lion's
#: unread preconditioner says to pass)
EXTRA = {"lion_fmnist": ("decay_c",)}
#: epochs per recipe (the images' fits are short: 32 steps an epoch)
EPOCHS = {"tf_news": 8, "maxnorm_news": 12, "svm_news": 12, "lm_news": 10}
#: the language model's vocabulary and words read per document
LM_VOCAB, LM_WORDS = 2000, 64
IMAGE_EPOCHS = 20
#: tokens kept per document (a class token first), for the padded news recipes
TOKENS = 128
VOCAB = 8000

# ----------------------------------------------------------------------------- data


def padded_news(data: Path, seed: int) -> tuple[TensorDataset, ...]:
    """The harness's 20 Newsgroups split (1200 / 300 / 1000) as ``(ids, labels)`` tensors: a
    class token (id ``VOCAB``), then the document's first ``TOKENS - 1`` word ids, 0-padded."""
    out = []
    for seqs, labels in news(data, seed, 1200, 300, 1000, vocab=VOCAB):
        ids = torch.zeros(len(seqs), TOKENS, dtype=torch.long)
        for i, s in enumerate(seqs):
            s = s[: TOKENS - 1]
            ids[i, 0] = VOCAB
            ids[i, 1 : 1 + len(s)] = s
        out.append(TensorDataset(ids, labels))
    return tuple(out)


def tfidf_news(data: Path, seed: int) -> tuple[TensorDataset, ...]:
    """The same split as tf-idf rows (sublinear counts, idf from the training documents, each
    row of unit length), as scikit-learn's ``TfidfVectorizer`` gives them."""
    splits = news(data, seed, 1200, 300, 1000, vocab=VOCAB)
    df = Counter(int(t) for s in splits[0][0] for t in set(s.tolist()))
    idf = torch.ones(VOCAB)
    for t, n in df.items():
        idf[t] = math.log((1 + 1200) / (1 + n)) + 1
    out = []
    for seqs, labels in splits:
        x = torch.zeros(len(seqs), VOCAB)
        for i, s in enumerate(seqs):
            x[i].index_add_(0, s, torch.ones(len(s)))
        x[:, 0] = 0
        x = torch.where(x > 0, 1 + x.clamp(min=1).log(), x) * idf
        out.append(TensorDataset(F.normalize(x, dim=1), labels))
    return tuple(out)


def lm_news(data: Path, seed: int) -> tuple[TensorDataset, ...]:
    """The same split as ``(words, next words)``: the first ``LM_WORDS + 1`` word ids of each
    document among the ``LM_VOCAB`` commonest (others dropped), 0-padded (0 is ignored)."""
    out = []
    for seqs, _ in news(data, seed, 1200, 300, 1000, vocab=LM_VOCAB):
        ids = torch.zeros(len(seqs), LM_WORDS + 1, dtype=torch.long)
        for i, s in enumerate(seqs):
            s = s[: LM_WORDS + 1]
            ids[i, : len(s)] = s
        out.append(TensorDataset(ids[:, :-1], ids[:, 1:]))
    return tuple(out)


# ----------------------------------------------------------------------------- optimizers


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), as its reference implementation writes it: decoupled decay
    w ← w (1 − lr · wd), the step −lr · sign(β₁ m + (1 − β₁) g), then m ← β₂ m + (1 − β₂) g."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.mul_(1 - group["lr"] * group["weight_decay"])
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.add_((m * b1 + p.grad * (1 - b1)).sign_(), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al. 2019) around any optimizer, as the widely copied implementation
    writes it: the wrapped optimizer is ``self.optimizer``, its groups are this one's; every
    ``k`` steps the slow weights move ``alpha`` toward the fast ones, which are set to them."""

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5):
        self.optimizer, self.k, self.alpha = optimizer, k, alpha
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = optimizer.state
        self.slow = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
        self.count = 0

    def __getstate__(self):
        return {"optimizer": self.optimizer, "k": self.k, "alpha": self.alpha}

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.count += 1
        if self.count % self.k == 0:
            for group, slow in zip(self.param_groups, self.slow):
                for p, q in zip(group["params"], slow):
                    q.add_(p - q, alpha=self.alpha)
                    p.copy_(q)
        return loss


# ----------------------------------------------------------------------------- recipes


class LionMLP(RecipeModule):
    """784 → 256 → 128 → 10 under :class:`Lion`, lr 1e-4."""

    def __init__(self, wd, per_sample=False):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return Lion(self.parameters(), lr=1e-4, weight_decay=self.wd)


class SwitchMoE(RecipeModule):
    """A trunk (784 → 128), a router and four experts (128 → 128 → 128), each image sent to its
    top-1 expert (its output scaled by the router's probability), a head; the cross entropy plus
    0.01 × the switch load-balancing loss. AdamW."""

    EXPERTS, AUX = 4, 0.01

    def __init__(self, wd, per_sample=False):
        super().__init__(wd, per_sample)
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU())
        self.router = nn.Linear(128, self.EXPERTS)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))
            for _ in range(self.EXPERTS)
        )
        self.head = nn.Linear(128, 10)
        self.aux = torch.zeros(())

    def forward(self, x):
        h = self.trunk(x)
        probs = self.router(h).softmax(1)
        top, choice = probs.max(1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().squeeze(1)
            if len(rows):
                out = out.index_add(0, rows, expert(h[rows]) * top[rows, None])
        share = F.one_hot(choice, self.EXPERTS).float().mean(0)
        self.aux = self.EXPERTS * (share * probs.mean(0)).sum()
        return self.head(h + out)

    def training_step(self, batch, batch_idx):
        x, y = batch
        ce = F.cross_entropy(self(x), y)
        self.log("train_ce", ce)
        return ce + self.AUX * self.aux

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=self.wd)


class MaxNormBag(RecipeModule):
    """``nn.Embedding(VOCAB + 1, 64, padding_idx=0, max_norm=1.0)`` averaged over the tokens,
    64 → 64 → 4; Adam."""

    def __init__(self, wd, per_sample=False):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(VOCAB + 1, 64, padding_idx=0, max_norm=1.0)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, ids):
        mask = (ids > 0).float()
        mean = (self.emb(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(mean)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3, weight_decay=self.wd)


class LookaheadMLP(LionMLP):
    """The same MLP under :class:`Lookahead` around AdamW (lr 1e-3)."""

    def configure_optimizers(self):
        return Lookahead(torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=self.wd))


class NewsEncoder(RecipeModule):
    """Token and learned position embeddings (d = 64), two ``TransformerEncoderLayer`` (4 heads,
    feed-forward 128, dropout 0.1, padding masked), the class token's output → 4 groups; AdamW
    with no decay on biases, LayerNorm weights and embeddings, a linear warm-up over the first
    10 % of the steps then a cosine to 0, stepped every batch."""

    def __init__(self, wd, per_sample=False, total_steps: int = 1):
        super().__init__(wd, per_sample)
        self.total_steps = total_steps
        self.tok = nn.Embedding(VOCAB + 1, 64, padding_idx=0)
        self.pos = nn.Embedding(TOKENS, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 4)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        h = self.encoder(h, src_key_padding_mask=ids == 0)
        return self.head(self.norm(h[:, 0]))

    def configure_optimizers(self):
        no_decay = ("bias", "norm", "tok.", "pos.")
        named = list(self.named_parameters())
        groups = [
            {"params": [p for n, p in named if not any(k in n for k in no_decay)],
             "weight_decay": self.wd},
            {"params": [p for n, p in named if any(k in n for k in no_decay)],
             "weight_decay": 0.0},
        ]  # fmt: skip
        opt = torch.optim.AdamW(groups, lr=5e-4)
        warm = max(1, self.total_steps // 10)

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.total_steps - warm)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class LinearSVM(RecipeModule):
    """A linear map of the tf-idf rows to 4 scores, ``nn.MultiMarginLoss`` (the multi-class
    hinge); SGD momentum, lr 0.5."""

    def __init__(self, wd, per_sample=False):
        super().__init__(wd, per_sample)
        self.linear = nn.Linear(VOCAB, 4)
        self.hinge = nn.MultiMarginLoss(reduction="none")

    def forward(self, x):
        return self.linear(x)

    def per_sample_loss(self, out, y):
        return self.hinge(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9, weight_decay=self.wd)


class TiedLM(RecipeModule):
    """Word embeddings (``LM_VOCAB`` × 64), a one-layer GRU (64), dropout 0.2, the decoder the
    embedding matrix itself (tied) plus a bias; the cross entropy per word, padding ignored;
    AdamW lr 3e-3."""

    def __init__(self, wd, per_sample=False):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(LM_VOCAB, 64)
        self.rnn = nn.GRU(64, 64, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.bias = nn.Parameter(torch.zeros(LM_VOCAB))

    def forward(self, ids):
        h, _ = self.rnn(self.drop(self.emb(ids)))
        return F.linear(self.drop(h), self.emb.weight, self.bias)

    def per_sample_loss(self, out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=0)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=self.wd)


# ----------------------------------------------------------------------------- one fit

MODELS = {
    "lion_fmnist": LionMLP, "moe_fmnist": SwitchMoE, "maxnorm_news": MaxNormBag,
    "lookahead_mnist": LookaheadMLP, "tf_news": NewsEncoder, "svm_news": LinearSVM,
    "lm_news": TiedLM,
}  # fmt: skip
OWN = {"lion_fmnist": 0.1, "moe_fmnist": 0.01, "maxnorm_news": 1e-4, "lookahead_mnist": 0.01,
       "tf_news": 0.01, "svm_news": 1e-3, "lm_news": 0.01}  # fmt: skip
#: the recipes whose optimizer decouples its decay (README: ``decoupled=True``)
DECOUPLED = ("lion_fmnist", "moe_fmnist", "lookahead_mnist", "tf_news", "lm_news")
#: the recipes that keep biases and norm weights undecayed (README: ``apply_to="weights"``)
WEIGHTS_ONLY = ("tf_news",)


class Setup:
    """One recipe and seed: its data, and one fit per arm."""

    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ARMS + EXTRA.get(name, ())
        self.own = OWN[name]
        if name in ("maxnorm_news", "tf_news"):
            self.train, self.val, self.test = padded_news(data, seed)
        elif name == "svm_news":
            self.train, self.val, self.test = tfidf_news(data, seed)
        elif name == "lm_news":
            self.train, self.val, self.test = lm_news(data, seed)
        else:
            fashion = name in ("lion_fmnist", "moe_fmnist")
            splits = images(data, "fashion-mnist" if fashion else "mnist", seed, 2000, 300, 2000)
            self.train, self.val, self.test = (tensors(s) for s in splits)

    def drop_ins(self, arm: str) -> list:
        """The decay arm's drop-in as README.md writes it (``decay_c``: ``decoupled=False``)."""
        if not arm.startswith("decay"):
            return []
        kw: dict[str, Any] = {"decoupled": self.name in DECOUPLED and arm == "decay"}
        if self.name in WEIGHTS_ONLY:
            kw["apply_to"] = "weights"
        return [LearnedWeightDecay(self.own, **kw)]

    def fit(self, cbs: list, wd: float) -> nn.Module:
        torch.manual_seed(self.seed)
        batch = 32 if self.name in ("maxnorm_news", "tf_news", "svm_news", "lm_news") else 64
        loader = recipe_loader(self.train, None, batch, False, True)
        val = recipe_loader(self.val, None, 64, False, False)
        epochs = EPOCHS.get(self.name, IMAGE_EPOCHS)
        if self.name == "tf_news":
            model = NewsEncoder(wd, total_steps=epochs * math.ceil(len(self.train) / batch))
        else:
            model = MODELS[self.name](wd)
        clip = {"gradient_clip_val": 0.5} if self.name == "lm_news" else {}
        self.tr = trainer(cbs, epochs, **clip)
        self.tr.fit(model, loader, val)
        return model

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test cross entropy and accuracy (the SVM: of its scores as logits; the
        language model: per word, padding left out)."""
        if self.name != "lm_news":
            return test_loss(model, recipe_loader(self.test, None, 64, False, False))
        model.eval()
        x, y = self.test.tensors
        with torch.no_grad():
            out = model(x).flatten(0, 1)
        keep = y.flatten() > 0
        loss = F.cross_entropy(out[keep], y.flatten()[keep])
        return float(loss), float((out[keep].argmax(1) == y.flatten()[keep]).float().mean())

    def run(self, arm: str) -> dict[str, Any]:
        """One fit of ``arm``, its record: CPU and wall time, the package's warnings and log
        lines, the test score and the learned λ."""
        with package_logs() as logs:
            wd = self.own if arm == "own" else 0.0
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = timed_fit(record, lambda: self.fit(cbs, wd), 600)
            if model is not None and self.name == "svm_news":
                record["hinge"] = hinge_loss(model, self.test)
        return scored_record(self, record, model, logs, cbs, None, False)


def hinge_loss(model: nn.Module, test: TensorDataset) -> float:
    """The SVM's own test loss (the multi-class hinge)."""
    x, y = test.tensors
    with torch.no_grad():
        return float(nn.MultiMarginLoss()(model(x), y))


# ----------------------------------------------------------------------------- table


def table(records: list[dict[str, Any]]) -> str:
    """Per recipe and learned arm (``decay``, ``decay_c``): its test loss − own's and − none's
    (paired by seed: mean ± s.e., seeds worse), accuracy points lost to own, CPU time × own's,
    λ's range, errors (the seeds where every arm has a score)."""
    by = {(r["recipe"], r["arm"], r["seed"]): r for r in records}
    lines = ["| recipe | arm | seeds | own loss | − own | − none | acc. pts lost to own | "
             "CPU × own | λ range | errors |", "|" + " --- |" * 10]  # fmt: skip
    for recipe, arm in dict.fromkeys(
        (r["recipe"], r["arm"]) for r in records if r["arm"].startswith("decay")
    ):
        seeds = sorted({r["seed"] for r in records if (r["recipe"], r["arm"]) == (recipe, arm)})
        lines.append(_row(by, recipe, arm, seeds))
    return "\n".join(lines)


def _row(by: dict, recipe: str, arm: str, seeds: list[int]) -> str:
    runs = {a: [by.get((recipe, a, s)) for s in seeds] for a in (*ARMS, arm)}
    errs = [r["error"][:160] for a in runs for r in runs[a] if r and "error" in r]
    ok = [
        i for i in range(len(seeds)) if all(rs[i] and "test_loss" in rs[i] for rs in runs.values())
    ]
    if not ok:
        return f"| {recipe} | {arm} | {seeds} | | | | | | | {'; '.join(errs)} |"

    def diff(a: str, ref: str, key: str = "test_loss", scale: float = 1.0) -> str:
        return paired(scale * (runs[a][i][key] - runs[ref][i][key]) for i in ok)

    own = mean_se(runs["own"][i]["test_loss"] for i in ok)
    cpu = [runs[arm][i]["cpu_s"] / runs["own"][i]["cpu_s"] for i in ok]
    lam = [runs[arm][i]["lam_range"] for i in ok]
    return (
        f"| {recipe} | {arm} | {[seeds[i] for i in ok]} | {own[0]:.4f} | {diff(arm, 'own')} | "
        f"{diff(arm, 'none')} | {diff('own', arm, 'test_acc', 100)} | "
        f"{min(cpu):.2f}–{max(cpu):.2f} | {min(x[0] for x in lam):.2g}–"
        f"{max(x[1] for x in lam):.2g} | {'; '.join(errs)} |"
    )


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s64w", seeds=[0, 1, 2], shown=("steps", "hinge"))


if __name__ == "__main__":
    main()
