"""Session 64's unseen recipes for the data weights: ``LearnedDataWeights()`` on six set-ups.

Each recipe is a small ``LightningModule`` as its user writes it, on small real data (MNIST /
Fashion-MNIST subsets: 2000 training, 300 validation, 2000 test images unless said; four groups
of 20 Newsgroups: 1200 / 300 / 1000 documents), trained per seed in two arms: ``plain`` (the
recipe on training data with 30 % symmetric label noise, a clean validation set) against ``dw``
(``LearnedDataWeights()``, every default, the loss per sample, ``IndexedDataset``, as README.md
says). New here, habits no earlier round (sessions 41–63) tried on real data:

* ``tagger``  **sequence tagging**: strips of 2–6 MNIST digits, a per-digit CNN encoder and a
  bidirectional GRU tag each position; the user's own ``collate_fn`` pads the strips per batch
  (tags ``-100`` where padded), the loss per token with ``ignore_index=-100`` reduced per strip
  by the user (its mean over the real tokens; plain: the token mean of the batch); Adam, 8
  epochs of 1500 strips (test: 500 strips); 30 % of the strips have every tag moved;
  ``dw_collate``: the user's ``collate_fn`` passed unwrapped (must be refused, naming
  ``indexed_collate``);
* ``hinge``  Fashion-MNIST MLP trained with the **multi-class hinge loss**
  ``F.multi_margin_loss(reduction="none")`` (a fitted row's loss is exactly 0), SGD momentum;
  scored by the test hinge loss and accuracy; ``dw_hand``: the hinge written by hand (what the
  refusal of ``multi_margin_loss`` says to do);
* ``ordinal``  MNIST digits read as **ordinal** levels: nine cumulative binary heads
  (P(y > k), k = 0..8), the loss per image the sum of their binary cross entropies, the
  prediction the count of heads above ½; Adam; scored by that loss and the exact accuracy;
* ``bootstrap``  Fashion-MNIST MLP trained with **hard bootstrapping** (Reed et al. 2015, a
  loss users pick for noisy labels): the target 0.8 · the label + 0.2 · the network's own
  (detached) arg-max, cross entropy to it per image; Adam; scored by the test cross entropy;
* ``two_view``  Fashion-MNIST MLP on a dataset that returns **two randomly shifted views**
  ``(view1, view2, y)`` (the augmentation in ``__getitem__``), the loss per image both views'
  cross entropies plus the squared distance between their predictions; the validation set
  is ``(x, y)`` as the user's ``validation_step`` reads it; ``dw``: every default (the
  validation batches cannot run ``training_step``); ``dw_vl``: with ``validation_loss=`` the
  cross entropy of ``(x, y)``; ``dw_vl_t``: and ``target=lambda batch: batch[-1]``;
* ``trusted``  20 Newsgroups bag of words (2000 words, log counts), an MLP, Adam; the user's
  **trusted** pool (300 documents, clean) and **untrusted** pool (900, 40 % of the labels
  moved) joined by ``ConcatDataset`` and wrapped by ``IndexedDataset``;
* ``news_smooth``  20 Newsgroups word ids padded per batch by the user's ``collate_fn``
  (wrapped by ``indexed_collate``), a mean of word embeddings and an MLP, the criterion a
  module attribute ``nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")`` (plain: its
  mean); Adam; scored by the test cross entropy (unsmoothed).

Fit lengths: 10 epochs of 64 (``tagger`` 8 of 32 strips, ``trusted`` 15 of 32 documents,
``news_smooth`` 10 of 32 documents).

Usage (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s64d.py \
        --data ../shared/data --recipes all --seeds 0 1 2

Each run merges its records into ``--out`` (``benchmarks/results/user_recipes/s64d/
records.json``); ``--table`` prints the table (CPU-time ratios, the flags' precision / recall,
the weight signal of eq. drift and whether the no-signal warning was said).
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s57 as s57  # noqa: E402
import bench_user_recipes_s61 as s61  # noqa: E402
from recipe_harness import (  # noqa: E402
    Docs,
    RecipeModule,
    images,
    news,
    package_logs,
    recipe_loader,
    scored_record,
    tensors,
    test_loss,
    timed_fit,
    trainer,
)

from hypertorch_sid import IndexedDataset, LearnedDataWeights, indexed_collate  # noqa: E402

RECIPES = ("tagger", "hinge", "ordinal", "bootstrap", "two_view", "trusted", "news_smooth")
#: the share of training labels moved to another class (symmetric noise)
NOISE = 0.3
#: the tag of a padded position
PAD = -100
OUT = Path("benchmarks/results/user_recipes/s64d/records.json")
#: the words of the bag-of-words recipe
WORDS = 2000

# ----------------------------------------------------------------------------- data


def symmetric_noise(y: Tensor, classes: int, seed: int, share: float = NOISE):
    """``share`` of the labels (rows of ``y``) moved to another class, uniformly; the labels
    and the moved mask (per row: a strip's every tag moves)."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(y.shape[0], generator=g) < share
    shift = torch.randint(1, classes, y.shape, generator=g)
    mask = bad.view(-1, *([1] * (y.dim() - 1)))
    return torch.where(mask & (y >= 0), (y + shift) % classes, y), bad


class Strips(Dataset):
    """Strips of 2–6 digit images, each ``(images (L, 1, 28, 28), tags (L,))``."""

    def __init__(self, x: Tensor, y: Tensor, seed: int) -> None:
        g = torch.Generator().manual_seed(300 + seed)
        lengths, at = [], 0
        while at + 6 <= len(x):
            n = int(torch.randint(2, 7, (), generator=g))
            lengths.append((at, n))
            at += n
        self.x, self.tags = [x[a : a + n] for a, n in lengths], [y[a : a + n] for a, n in lengths]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.tags[i]


def pad_strips(samples):
    """The user's ``collate_fn``: strips padded to the batch's longest, tags ``PAD`` there."""
    longest = max(len(t) for _, t in samples)
    xs = torch.zeros(len(samples), longest, 1, 28, 28)
    ys = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for i, (x, t) in enumerate(samples):
        xs[i, : len(t)], ys[i, : len(t)] = x, t
    return xs, ys


class TwoViews(Dataset):
    """``(view1, view2, y)``: two random shifts (up to 2 pixels each way) of one image."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    @staticmethod
    def shifted(x: Tensor) -> Tensor:
        dx, dy = torch.randint(-2, 3, (2,)).tolist()
        return torch.roll(x, shifts=(dx, dy), dims=(1, 2))

    def __getitem__(self, i: int):
        return self.shifted(self.x[i]), self.shifted(self.x[i]), self.y[i]


def bag_of_words(data: Path, seed: int) -> tuple[TensorDataset, ...]:
    """The harness's four groups of 20 Newsgroups as log(1 + count) of the ``WORDS`` most
    common training words."""
    splits = news(data, seed, 1200, 300, 1000, vocab=WORDS)
    out = []
    for seqs, labels in splits:
        x = torch.zeros(len(seqs), WORDS)
        for i, s in enumerate(seqs):
            for w, c in Counter(s.tolist()).items():
                if 0 < w < WORDS:
                    x[i, w] = c
        out.append(TensorDataset(x.log1p(), labels))
    return tuple(out)


# ----------------------------------------------------------------------------- recipes


class Tagger(RecipeModule):
    """A per-digit CNN (two strided convolutions, 32 features), a bidirectional GRU over the
    strip, a tag per position; the loss per token, reduced per strip over its real tokens."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.enc = nn.Sequential(
            nn.Conv2d(1, 16, 5, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 5, stride=2), nn.ReLU(),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        )  # fmt: skip
        self.rnn = nn.GRU(64, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        b, t = x.shape[:2]
        h = self.enc(x.flatten(0, 1)).view(b, t, -1)
        return self.out(self.rnn(h)[0])

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        if not self.per_sample:  # the user's plain recipe: the token mean of the batch
            loss = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=PAD)
            self.log("train_loss", loss)
            return loss
        tok = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=PAD, reduction="none")
        loss = tok.sum(1) / (y != PAD).sum(1).clamp_min(1)
        self.log("train_loss", loss.mean())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).transpose(1, 2), y, ignore_index=PAD))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class Hinge(s57.MLP):
    """Session 57's MLP trained with the multi-class hinge loss (margin 1); SGD momentum."""

    def per_sample_loss(self, out, y):
        return F.multi_margin_loss(out, y, reduction="none")


class HingeByHand(Hinge):
    """The hinge written by hand, as the refusal of ``multi_margin_loss`` says (torch has no
    second derivative of it): mean over the other classes of max(0, 1 − z_y + z_j)."""

    def per_sample_loss(self, out, y):
        margins = (1 - out.gather(1, y[:, None]) + out).clamp_min(0)
        return margins.scatter(1, y[:, None], 0.0).sum(1) / out.shape[1]


class Ordinal(RecipeModule):
    """An MLP with nine cumulative heads, P(y > k) for k = 0..8; the loss per image the sum of
    their binary cross entropies; Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 9),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def per_sample_loss(self, out, y):
        levels = (y[:, None] > torch.arange(9, device=y.device)).float()
        return F.binary_cross_entropy_with_logits(out, levels, reduction="none").sum(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class Bootstrap(s57.MLP):
    """Session 57's MLP trained with hard bootstrapping (Reed et al. 2015, β = 0.8): the cross
    entropy to 0.8 · the label + 0.2 · the network's own arg-max; Adam."""

    BETA = 0.8

    def per_sample_loss(self, out, y):
        own = F.one_hot(out.detach().argmax(1), out.shape[1]).float()
        target = self.BETA * F.one_hot(y, out.shape[1]).float() + (1 - self.BETA) * own
        return F.cross_entropy(out, target, reduction="none")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class TwoView(s57.MLP):
    """Session 57's MLP on two shifted views: both views' cross entropies (their mean) plus
    the squared distance between their predicted distributions, per image; its
    ``validation_step`` reads ``(x, y)``."""

    def training_step(self, batch, batch_idx):
        a, b, y = batch
        za, zb = self(a), self(b)
        ce = 0.5 * (
            F.cross_entropy(za, y, reduction="none") + F.cross_entropy(zb, y, reduction="none")
        )
        agree = (za.softmax(1) - zb.softmax(1)).pow(2).sum(1)
        return self.reduce(ce + agree)


class BagMLP(RecipeModule):
    """log(1 + counts) of 2000 words → 128 → 4, dropout 0.3; Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.net = nn.Sequential(
            nn.Linear(WORDS, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 4)
        )

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


class SmoothNews(RecipeModule):
    """Mean of word embeddings (8000 × 64, padding 0 left out) → 64 → 4; the loss a module
    attribute, cross entropy with label smoothing 0.1; Adam."""

    def __init__(self, wd, per_sample):
        super().__init__(wd, per_sample)
        self.emb = nn.Embedding(8000, 64, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        self.crit = nn.CrossEntropyLoss(
            label_smoothing=0.1, reduction="none" if per_sample else "mean"
        )

    def forward(self, tokens):
        real = (tokens != 0).float().unsqueeze(2)
        return self.head((self.emb(tokens) * real).sum(1) / real.sum(1).clamp_min(1))

    def training_step(self, batch, batch_idx):
        tokens, y = batch
        loss = self.crit(self(tokens), y)
        self.log("train_loss", loss.mean())
        return loss

    def validation_step(self, batch, batch_idx):
        tokens, y = batch
        self.log("val_loss", self.crit(self(tokens), y).mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, weight_decay=self.wd)


MODELS = {"hinge": Hinge, "ordinal": Ordinal, "bootstrap": Bootstrap, "two_view": TwoView}

# ----------------------------------------------------------------------------- one fit


class Setup(s61.Setup):
    def __init__(self, name: str, data: Path, seed: int) -> None:
        if name not in RECIPES:
            raise SystemExit(f"unknown recipe {name!r}")
        self.name, self.seed, self.data = name, seed, data
        self.arms = ("plain", "dw") + {
            "tagger": ("dw_collate",),
            "two_view": ("dw_vl", "dw_vl_t"),
            "hinge": ("dw_hand",),
        }.get(name, ())
        self.own = 5e-4 if name == "hinge" else 1e-4
        self.classes, self.collate, self.regression = 10, None, False
        if name == "trusted":
            self.classes = 4
            self.train, self.val, self.test = bag_of_words(data, seed)
            return
        if name == "news_smooth":
            self.classes, self.collate = 4, s61.bag_collate
            self.train, self.val, self.test = (Docs(*d) for d in news(data, seed, 1200, 300, 1000))
            return
        fashion = name in ("hinge", "bootstrap", "two_view")
        n = (6000, 1200, 2000) if name == "tagger" else (2000, 300, 2000)
        splits = images(data, "fashion-mnist" if fashion else "mnist", seed, *n)
        self.train, self.val, self.test = (tensors(s) for s in splits)
        if name == "tagger":
            self.collate = pad_strips
            self.train, self.val, self.test = (
                Strips(*d.tensors, seed + 10 * k)
                for k, d in enumerate((self.train, self.val, self.test))
            )

    def drop_ins(self, arm: str) -> list:
        """``LearnedDataWeights()`` as README.md writes it (``dw_vl``: with the validation
        loss of the ``(x, y)`` validation batches)."""
        if arm.startswith("dw_vl"):  # dw_vl_t: and the labels named, target=
            kw: dict[str, Any] = {"target": (lambda b: b[-1])} if arm == "dw_vl_t" else {}
            return [
                LearnedDataWeights(
                    validation_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"),
                    **kw,
                )
            ]
        return [LearnedDataWeights()] if arm.startswith("dw") else []

    def corrupted(self) -> tuple[Any, Tensor]:
        """The noisy training set and the mask of its corrupted rows."""
        if self.name == "tagger":  # a strip's every tag moved
            g = torch.Generator().manual_seed(7 + self.seed)
            bad = torch.rand(len(self.train), generator=g) < NOISE
            tags = [
                (t + torch.randint(1, 10, t.shape, generator=g)) % 10 if moved else t
                for t, moved in zip(self.train.tags, bad.tolist())
            ]
            strips = Strips.__new__(Strips)
            strips.x, strips.tags = self.train.x, tags
            return strips, bad
        if self.name == "news_smooth":
            y2, bad = symmetric_noise(self.train.labels, 4, self.seed)
            return Docs(self.train.seqs, y2), bad
        x, y = self.train.tensors
        if self.name == "trusted":  # 300 trusted (clean) and 900 untrusted (40 % moved)
            y2, bad = symmetric_noise(y[300:], 4, self.seed, share=0.4)
            both = ConcatDataset([TensorDataset(x[:300], y[:300]), TensorDataset(x[300:], y2)])
            return both, torch.cat([torch.zeros(300, dtype=torch.bool), bad])
        y2, bad = symmetric_noise(y, self.classes, self.seed)
        if self.name == "two_view":
            return TwoViews(x, y2), bad
        return TensorDataset(x, y2), bad

    def loader(self, train, per_sample: bool, raw_collate: bool) -> DataLoader:
        batch = {"tagger": 32, "trusted": 32, "news_smooth": 32}.get(self.name, 64)
        if raw_collate:  # the user's collate_fn unwrapped: a refusal to check
            return DataLoader(IndexedDataset(train), batch_size=batch, shuffle=True,
                              collate_fn=self.collate)  # fmt: skip
        if per_sample and self.collate is not None:
            return DataLoader(IndexedDataset(train), batch_size=batch, shuffle=True,
                              collate_fn=indexed_collate(self.collate))  # fmt: skip
        return recipe_loader(train, self.collate, batch, per_sample, True)

    def fit(self, cbs: list, train, bad, per_sample: bool, wd: float, record: dict) -> nn.Module:
        torch.manual_seed(self.seed)
        name = self.name
        loader = self.loader(train, per_sample, record["arm"] == "dw_collate")
        val = recipe_loader(self.val, self.collate, 64, False, False)
        if name == "tagger":
            model = Tagger(wd, per_sample)
        elif name == "trusted":
            model = BagMLP(wd, per_sample)
        elif name == "news_smooth":
            model = SmoothNews(wd, per_sample)
        elif record["arm"] == "dw_hand":
            model = HingeByHand(wd, per_sample)
        else:
            model = MODELS[name](wd, per_sample)
        epochs = {"tagger": 8, "trusted": 15}.get(name, 10)
        self.tr = trainer(cbs, epochs)
        self.tr.fit(model, loader, val)
        return model

    def score(self, model: nn.Module) -> tuple[float, float]:
        """Held-out test loss and accuracy: cross entropy (the tagger: per token; the hinge:
        the hinge loss; the ordinal: its summed binary cross entropies)."""
        test = recipe_loader(self.test, self.collate, 64, False, False)
        if self.name in ("bootstrap", "two_view", "trusted", "news_smooth"):
            return test_loss(model, test)
        model.eval()
        total, correct, n = 0.0, 0, 0
        with torch.no_grad():
            for x, y in test:
                out = model(x)
                if self.name == "tagger":
                    real = y != PAD
                    total += float(F.cross_entropy(out.transpose(1, 2), y, ignore_index=PAD,
                                                   reduction="sum"))  # fmt: skip
                    correct += int((out.argmax(2) == y)[real].sum())
                    n += int(real.sum())
                    continue
                if self.name == "hinge":
                    total += float(F.multi_margin_loss(out, y, reduction="sum"))
                    correct += int((out.argmax(1) == y).sum())
                else:
                    total += float(model.per_sample_loss(out, y).sum())
                    correct += int(((out > 0).sum(1) == y).sum())
                n += len(y)
        return total / n, correct / n

    def run(self, arm: str) -> dict[str, Any]:
        """One fit of ``arm`` on the noisy data, its record (session 63's, plus the weights'
        signal reading of eq. drift and whether the no-signal warning was said)."""
        with package_logs() as logs:
            per_sample = arm.startswith("dw")
            train, bad = self.corrupted()
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed}
            model = timed_fit(
                record, lambda: self.fit(cbs, train, bad, per_sample, self.own, record), 600
            )
        record = scored_record(self, record, model, logs, cbs, bad, per_sample)
        if per_sample and model is not None:
            reading = cbs[0].weight_signal()
            record["signal"] = None if reading is None else [reading.drift, reading.median]
            record["no_signal_said"] = any("no more signal" in w for w in record["warnings"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                misfit = cbs[0].flagged("split_misfit")
            hit = int(bad[misfit].sum()) if len(misfit) else 0
            record["misfit_flags"] = [len(misfit), hit / max(len(misfit), 1), hit / int(bad.sum())]
        return record


VERSUS = {arm: "plain" for arm in ("dw", "dw_vl", "dw_vl_t", "dw_collate", "dw_hand")}


def table(records: list[dict[str, Any]]) -> str:
    """Session 61's table (paired test loss and accuracy, CPU ratio, flags) of these records,
    then each data-weights fit's signal reading and whether the no-signal warning was said."""
    saved, s61.VERSUS = s61.VERSUS, VERSUS
    try:
        out = [s61.table(records), "", "| recipe | arm | seed | AUC | R, median | no-signal said |",
               "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    finally:
        s61.VERSUS = saved
    for r in sorted(records, key=lambda r: (r["recipe"], r["arm"], r["seed"])):
        if "signal" not in r:
            continue
        sig = "—" if r["signal"] is None else f"{r['signal'][0]:.2f}, {r['signal'][1]:.2f}"
        out.append(f"| {r['recipe']} | {r['arm']} | {r['seed']} | {r.get('auc', float('nan')):.2f}"
                   f" | {sig} | {r['no_signal_said']} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    s54.run_cli(argv, sys.modules[__name__], "s64d", seeds=[0, 1, 2], shown=("steps",))


if __name__ == "__main__":
    main()
