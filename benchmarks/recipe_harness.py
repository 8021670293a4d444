"""The harness every user-recipe benchmark shares (sessions 50–55): data, one fit, the records.

The recipe benchmarks (``bench_user_recipes_s5*.py``) and the probes built on them
(``bench_imbalanced_s53.py``, ``bench_dw_accuracy_s52.py``, ``bench_hard_rows_s53.py``,
``bench_news_weights_s51.py``) each write their recipes, arms and table; what they share stands
here, once:

* data: random disjoint subsets of MNIST / Fashion-MNIST (:func:`images`), four groups of 20
  Newsgroups (:func:`news`, :class:`Docs`), scikit-learn's diabetes (:func:`diabetes`); the
  corruptions (:func:`corrupt`, :func:`shift_targets`, :func:`noisy_labels`) and a subset of
  rows (:func:`keep_rows`);
* one fit: the Trainer (:func:`trainer`), a recipe's loader (:func:`recipe_loader`), the fit
  timed with its warnings kept and its error recorded (:func:`timed_fit`), the test loss
  (:func:`test_loss`), what a drop-in learned (:func:`decay_record`, :func:`weights_record`,
  :func:`auc`);
* the summary: mean ± s.e. of paired differences by seed (:func:`mean_se`, :func:`paired`);
* the records: ``--out`` read, merged by key and written (:func:`read_records`,
  :func:`merge_records`, :func:`write_json`), the recipe benchmarks' command line
  (:func:`recipe_cli`) and a round's paired table (:func:`paired_table`, :func:`versus_table`).

The scripts keep importing these names from where they first stood
(``bench_user_recipes_s50``, ``bench_user_recipes_s53``), which re-export them.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import logging
import math
import re
import sys
import tarfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hypertorch_sid import IndexedDataset, indexed_collate

#: the share of the labels the classification recipes move to another class
NOISE = 0.35

# ----------------------------------------------------------------------------- data


def _idx(path: Path) -> np.ndarray:
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def images(data: Path, name: str, seed: int, n_train: int, n_val: int, n_test: int):
    """Disjoint random subsets: train / val from the training file, test from the test file."""
    folder = data / name
    x = torch.tensor(_idx(folder / "train-images-idx3-ubyte.gz"), dtype=torch.float32) / 255
    y = torch.tensor(_idx(folder / "train-labels-idx1-ubyte.gz"), dtype=torch.long)
    xt = torch.tensor(_idx(folder / "t10k-images-idx3-ubyte.gz"), dtype=torch.float32) / 255
    yt = torch.tensor(_idx(folder / "t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
    g = torch.Generator().manual_seed(1000 + seed)
    p, q = torch.randperm(len(x), generator=g), torch.randperm(len(xt), generator=g)
    tr, va, te = p[:n_train], p[n_train : n_train + n_val], q[:n_test]
    x, xt = (x - 0.1307) / 0.3081, (xt - 0.1307) / 0.3081
    return (x[tr, None], y[tr]), (x[va, None], y[va]), (xt[te, None], yt[te])


NEWS_GROUPS = ("comp.graphics", "rec.sport.hockey", "sci.space", "talk.politics.guns")
_TOKEN = re.compile(r"[a-z]{2,}")


def news(data: Path, seed: int, n_train: int, n_val: int, n_test: int, vocab: int = 8000):
    """Four groups of 20 Newsgroups (bydate), headers dropped, lower-case word tokens."""
    docs: dict[str, list[tuple[list[str], int]]] = {"train": [], "test": []}
    with tarfile.open(data / "20news" / "20news-bydate.tar.gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 3 or parts[1] not in NEWS_GROUPS:
                continue
            text = tar.extractfile(member).read().decode("latin-1")
            body = text.split("\n\n", 1)[-1].lower()
            split = "train" if parts[0].endswith("train") else "test"
            docs[split].append((_TOKEN.findall(body)[:200], NEWS_GROUPS.index(parts[1])))
    docs["train"].sort(key=lambda d: (d[1], d[0][:5]))
    docs["test"].sort(key=lambda d: (d[1], d[0][:5]))
    g = torch.Generator().manual_seed(1000 + seed)
    p = torch.randperm(len(docs["train"]), generator=g).tolist()
    q = torch.randperm(len(docs["test"]), generator=g).tolist()
    tr = [docs["train"][i] for i in p[:n_train]]
    va = [docs["train"][i] for i in p[n_train : n_train + n_val]]
    te = [docs["test"][i] for i in q[:n_test]]
    counts = Counter(w for toks, _ in tr for w in toks)
    ids = {w: i + 1 for i, (w, _) in enumerate(counts.most_common(vocab - 1))}

    def encode(split):
        seqs = [torch.tensor([ids[w] for w in toks if w in ids] or [0]) for toks, _ in split]
        return seqs, torch.tensor([lab for _, lab in split])

    return encode(tr), encode(va), encode(te)


class Docs(Dataset):
    """Documents of word ids (of different lengths) and their labels."""

    def __init__(self, seqs: list[torch.Tensor], labels: torch.Tensor) -> None:
        self.seqs, self.labels = seqs, labels

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        return self.seqs[i], self.labels[i]


def split(n: int, seed: int, n_train: int, n_val: int) -> tuple[torch.Tensor, ...]:
    """A random split of ``n`` rows into train / val / the rest (test)."""
    g = torch.Generator().manual_seed(1000 + seed)
    p = torch.randperm(n, generator=g)
    return p[:n_train], p[n_train : n_train + n_val], p[n_train + n_val :]


def diabetes(seed: int):
    """scikit-learn's diabetes (442 × 10): 260 train / 80 val / 102 test, standardised on train."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    x, y = torch.tensor(d.data, dtype=torch.float32), torch.tensor(d.target, dtype=torch.float32)
    tr, va, te = split(len(x), seed, 260, 80)
    mx, sx, my, sy = x[tr].mean(0), x[tr].std(0), y[tr].mean(), y[tr].std()
    x, y = (x - mx) / sx, (y - my) / sy
    return (x[tr], y[tr]), (x[va], y[va]), (x[te], y[te])


def corrupt(y: torch.Tensor, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """35 % of the labels moved to another class, uniformly; returns the labels and the mask."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < NOISE
    shift = torch.randint(1, classes, (len(y),), generator=g)
    return torch.where(bad, (y + shift) % classes, y), bad


def shift_targets(y: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """30 % of the (standardised) targets shifted by ±3–6."""
    g = torch.Generator().manual_seed(7 + seed)
    bad = torch.rand(len(y), generator=g) < 0.3
    size = 3 + 3 * torch.rand(len(y), generator=g)
    sign = torch.where(torch.rand(len(y), generator=g) < 0.5, -1.0, 1.0)
    return torch.where(bad, y + sign * size, y), bad


def noisy_labels(train: Docs | TensorDataset, classes: int, seed: int):
    """``train`` with :func:`corrupt`'s labels (documents or ``(x, y)`` tensors), and the mask of
    the moved labels."""
    if isinstance(train, Docs):
        y, bad = corrupt(train.labels, classes, seed)
        return Docs(train.seqs, y), bad
    x, y = train.tensors
    y2, bad = corrupt(y, classes, seed)
    return TensorDataset(x, y2), bad


def keep_rows(data: Docs | TensorDataset, keep: torch.Tensor) -> Docs | TensorDataset:
    """The rows ``keep`` (indices) of documents or of ``(x, y)`` tensors."""
    if isinstance(data, Docs):
        return Docs([data.seqs[i] for i in keep.tolist()], data.labels[keep])
    return TensorDataset(*(t[keep] for t in data.tensors))


# ----------------------------------------------------------------------------- recipes


class RecipeModule(pl.LightningModule):
    """What every recipe's module shares: its own weight decay ``wd`` (for its optimizer), a
    per-sample switch (the data weights take ``training_step``'s losses per sample), and the
    training and validation losses from :meth:`per_sample_loss` (cross entropy unless a recipe
    says otherwise)."""

    def __init__(self, wd: float, per_sample: bool) -> None:
        super().__init__()
        self.wd, self.per_sample = wd, per_sample

    def per_sample_loss(self, out, y):
        return F.cross_entropy(out, y, reduction="none")

    def reduce(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss ``training_step`` returns: per sample when asked, else its mean."""
        self.log("train_loss", loss.mean())
        return loss if self.per_sample else loss.mean()

    def training_step(self, batch, batch_idx):
        *x, y = batch
        return self.reduce(self.per_sample_loss(self(*x), y))

    def validation_step(self, batch, batch_idx):
        *x, y = batch
        self.log("val_loss", self.per_sample_loss(self(*x), y).mean(), prog_bar=True)


# ----------------------------------------------------------------------------- one fit


def trainer(callbacks, epochs, **kw) -> pl.Trainer:
    """A quiet CPU Trainer, checkpointing only when ``callbacks`` hold a ``ModelCheckpoint``."""
    return pl.Trainer(
        max_epochs=epochs, callbacks=callbacks, logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks or []),
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **kw,
    )  # fmt: skip


def recipe_loader(data, collate, batch: int, indexed: bool, shuffle: bool) -> DataLoader:
    """A recipe's loader: indexed for the data weights (the user's ``collate_fn`` wrapped by
    ``indexed_collate``), ``batch`` while training, 256 for evaluation."""
    if indexed:
        data = IndexedDataset(data)
        collate = indexed_collate(collate) if collate is not None else None
    kw = {"collate_fn": collate} if collate is not None else {}
    return DataLoader(data, batch_size=batch if shuffle else 256, shuffle=shuffle, **kw)


class LogLines(logging.Handler):
    """The package's log lines of one fit (each cut at 400 characters)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:400])


@contextmanager
def package_logs() -> Iterator[LogLines]:
    """The package's and Lightning's log lines (at INFO) while the block runs."""
    logs = LogLines()
    loggers = [logging.getLogger(n) for n in ("hypertorch_sid", "pytorch_lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(logs)
        lg.setLevel(logging.INFO)
    try:
        yield logs
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(logs)
            lg.setLevel(level)


def scored_record(
    recipe: Any,
    record: dict[str, Any],
    model: Any,
    logs: LogLines,
    cbs: list[Any],
    bad: torch.Tensor | None,
    per_sample: bool,
) -> dict[str, Any]:
    """``record`` of one recipe fit completed: its hyper-step log lines; unless the fit failed
    (``model`` None), whether the weights are finite, the test score (``recipe.score``), the
    steps and last validation loss (``recipe.tr``), what the drop-ins learned and, for the data
    weights, ``recipe.flags_record``'s flags against the corrupted rows."""
    record["logs"] = sorted(
        {line for line in logs.lines if "Hyper" in line or "Learned" in line or "λ" in line}
    )
    if model is None:
        return record
    record["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    record["test_loss"], record["test_acc"] = recipe.score(model)
    record["steps"] = recipe.tr.global_step
    record["val_loss"] = float(recipe.tr.callback_metrics.get("val_loss", float("nan")))
    callbacks_record(record, cbs, bad)
    if per_sample:
        recipe.flags_record(record, cbs[0], bad)
    return record


def tensors(data) -> TensorDataset:
    """A ``TensorDataset`` of a split's tensors."""
    return TensorDataset(*data)


def package_warnings(caught: list, width: int) -> list[str]:
    """The warnings of a fit that come from this package (its messages cut at ``width``)."""
    return sorted(
        {
            str(w.message)[:width]
            for w in caught
            if "hypertorch" in (w.filename or "")
            or "Learned" in str(w.message)
            or "hyper" in str(w.message)
        }
    )


def timed_fit(record: dict[str, Any], fit: Callable[[], Any], width: int = 400) -> Any:
    """Run ``fit()`` and return what it returns, keeping in ``record`` its CPU and wall seconds
    and this package's warnings (cut at ``width``); a fit that raises is a finding: its error
    (first 2000 characters) and warnings are recorded and ``None`` returned."""
    t0, w0 = time.process_time(), time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fit()
        except Exception as err:  # noqa: BLE001 - a finding, recorded
            record["error"] = f"{type(err).__name__}: {err}"[:2000]
            record["warnings"] = package_warnings(caught, width)
            return None
        record["cpu_s"] = time.process_time() - t0
        record["wall_s"] = time.perf_counter() - w0
        record["warnings"] = package_warnings(caught, width)
    return out


def test_loss(
    model: nn.Module, loader: DataLoader, regression: bool = False
) -> tuple[float, float]:
    """Mean cross entropy (MSE for a regression) and accuracy (of the rounded value) on
    ``loader``, in eval mode."""
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for *x, y in loader:
            out = model(*x)
            if regression:
                total += F.mse_loss(out, y, reduction="sum").item()
                correct += (out.round() == y).sum().item()
            else:
                total += F.cross_entropy(out, y, reduction="sum").item()
                correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    return total / n, correct / n


def auc(scores_bad: np.ndarray, scores_good: np.ndarray) -> float:
    """P(a corrupted example's weight < a clean one's), ties counted half."""
    allv = np.concatenate([scores_bad, scores_good])
    ranks = allv.argsort().argsort() + 1.0
    # average ranks for ties
    _, inv, cnt = np.unique(allv, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / cnt)[inv]
    rb = ranks[: len(scores_bad)].sum()
    u = rb - len(scores_bad) * (len(scores_bad) + 1) / 2
    return float(1 - u / (len(scores_bad) * len(scores_good)))


def decay_record(cb: Any) -> dict[str, Any]:
    """A ``LearnedWeightDecay``'s learned λ: each group's mean (``lam``) and their range."""
    lam = {k: float(v.mean()) for k, v in cb.learned_weight_decay.items()}
    return {"lam": lam, "lam_range": [min(lam.values()), max(lam.values())]}


def weights_record(w: np.ndarray, bad: np.ndarray) -> dict[str, float]:
    """The corrupted rows' mean weight, the clean rows', and the weights' AUC at telling them."""
    return {
        "w_bad": float(w[bad].mean()), "w_good": float(w[~bad].mean()), "auc": auc(w[bad], w[~bad])
    }  # fmt: skip


# ----------------------------------------------------------------------------- summary


def callbacks_record(record: dict[str, Any], cbs: Iterable[Any], bad: torch.Tensor) -> None:
    """Add each drop-in's hyper steps (run, and due against run in the fit) to ``record``, and
    λ (``decay_record``) or the weights' flags against the corrupted rows ``bad``."""
    for cb in cbs:
        name = type(cb).__name__
        record.setdefault("hyper_steps", {})[name] = len(cb.history or [])
        record.setdefault("due_ran", {})[name] = [cb._due_in_fit, cb._ran_in_fit]
        if hasattr(cb, "decay_values"):
            record.update(decay_record(cb))
            record["decayed"] = sorted(cb.decay_values())
        else:
            w = cb.data_weights().detach().float().numpy()
            record.update(weights_record(w, bad.numpy()))


def mean_se(values: Iterable[float]) -> tuple[float, float]:
    """The mean and its standard error (NaN from one value)."""
    a = np.asarray(list(values), float)
    se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else float("nan")
    return float(a.mean()), se


def paired(diffs: Iterable[float]) -> str:
    """Paired differences by seed (an arm − its comparison): mean ± s.e. (seeds worse / seeds)."""
    d = list(diffs)
    mean, se = mean_se(d)
    return f"{mean:+.4f} ± {se:.4f} ({sum(x > 0 for x in d)}/{len(d)})"


# ----------------------------------------------------------------------------- records


def paired_table(
    records: list[dict[str, Any]], versus: dict[str, str], accuracy: bool = False
) -> str:
    """Per recipe and drop-in arm: test loss − the comparison arm's (``versus[arm]``), paired
    by seed (mean ± s.e., seeds worse), with ``accuracy`` the points of test accuracy lost,
    the wall ratio, optimizer steps, λ range / AUC, errors."""
    acc_head, acc_rule = (" accuracy − comparison |", " --- |") if accuracy else ("", "")
    out = [f"| recipe | arm | test loss − comparison (s.e., worse) |{acc_head} wall × | steps | "
           "λ / AUC |", f"| --- | --- | --- |{acc_rule} --- | --- | --- |"]  # fmt: skip
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for r in records:
        by.setdefault((r["recipe"], r["arm"]), {})[r["seed"]] = r
    for (recipe, arm), runs in sorted(by.items()):
        ref = by.get((recipe, versus.get(arm, "")), {})
        err = next((r["error"] for r in runs.values() if "error" in r), None)
        if err or not ref:
            loss = "" if err else " / ".join(f"{runs[s]['test_loss']:.4f}" for s in sorted(runs))
            blanks = " | | | | |" if accuracy else " | | | |"
            out.append(f"| {recipe} | {arm} | {err[:200] if err else loss}{blanks}")
            continue
        seeds = sorted(s for s in runs if s in ref and "test_loss" in ref[s])
        diff = paired(runs[s]["test_loss"] - ref[s]["test_loss"] for s in seeds)
        acc = paired(100 * (ref[s]["test_acc"] - runs[s]["test_acc"]) for s in seeds)
        wall = [runs[s]["wall_s"] / ref[s]["wall_s"] for s in seeds]
        steps = "/".join(f"{runs[s]['steps']}" for s in seeds)
        ref_steps = "/".join(f"{ref[s]['steps']}" for s in seeds)
        note = "; ".join(
            f"{r['lam_range'][0]:.2g}–{r['lam_range'][1]:.2g}" if "lam_range" in r
            else f"{r.get('auc', float('nan')):.2f}"
            for r in (runs[s] for s in seeds)
        )  # fmt: skip
        acc_cell = f" {acc} (points lost) |" if accuracy else ""
        out.append(
            f"| {recipe} | {arm} | {diff} |{acc_cell} "
            f"{min(wall):.1f}–{max(wall):.1f} | {steps} (vs {ref_steps}) | {note} |"
        )
    return "\n".join(out)


def versus_table(versus: dict[str, str]) -> Callable[[list[dict[str, Any]]], str]:
    """A round's ``table``: :func:`paired_table` of its records, each arm against
    ``versus[arm]``, with the accuracy."""
    return functools.partial(paired_table, versus=versus, accuracy=True)


def read_records(path: Path | None) -> list[dict[str, Any]]:
    """The records kept in ``path`` (none when there is no file): ``{"records": [...]}`` or a bare
    list (session 54's form)."""
    if path is None or not path.exists():
        return []
    kept = json.loads(path.read_text())
    return kept if isinstance(kept, list) else kept["records"]


def learned_lam(paths: list[Path], recipe: str, seed: int) -> float:
    """The ``decay`` arm's λ for ``recipe`` and ``seed`` (the mean over its layers) from the
    first of ``paths`` that holds it; NaN where none does (the ``own_learned`` control)."""
    for r in (r for path in paths for r in read_records(path)):
        if (r["recipe"], r["arm"], r["seed"]) == (recipe, "decay", seed):
            return float(sum(r["lam"].values()) / len(r["lam"]))
    return float("nan")


def merge_records(
    old: list[dict[str, Any]], new: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]
) -> list[dict[str, Any]]:
    """``old`` without the records ``new`` replaces (the same ``key``), then ``new``."""
    replaced = {key(r) for r in new}
    return [r for r in old if key(r) not in replaced] + new


def write_json(path: Path, payload: Any) -> None:
    """``payload`` as indented JSON at ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


def recipe_key(r: dict[str, Any]) -> tuple:
    """A recipe record's identity: a rerun of the same recipe, arm and seed replaces it."""
    return r["recipe"], r["arm"], r["seed"]


def recipe_cli(
    argv: list[str] | None,
    bench: Any,
    default_out: Path,
    seeds: tuple[int, ...] = (0, 1),
    header: dict[str, Any] | None = None,
) -> None:
    """The recipe benchmarks' command line: run ``--recipes`` × ``--seeds`` × ``--arms``, print
    each record, and keep every record in ``--out`` (a rerun replaces the records of the same
    recipe, arm and seed), each with the command that made it; ``--table`` prints the table of
    ``--out`` and stops.

    Parameters
    ----------
    argv
        The arguments (``None``: the process's).
    bench
        The benchmark's module, whose ``RECIPES``, ``ARMS``, ``EXTRA_ARMS``, ``Setup`` and
        ``table`` are read; an arm a recipe's ``Setup(...).arms`` lacks is skipped unless it is
        one of ``EXTRA_ARMS``. Where the module has ``DW_KWARGS`` (the settings every
        data-weights arm gets), ``--dw-kwargs`` (JSON) updates it.
    default_out
        ``--out``'s default.
    seeds
        ``--seeds``' default.
    header
        Fields written next to ``command`` and ``records`` in ``--out`` (``None``: ``command``
        only).
    """
    arms, extra_arms = bench.ARMS, bench.EXTRA_ARMS
    p = argparse.ArgumentParser(description=bench.__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=["all"])
    p.add_argument("--arms", nargs="+", default=list(arms), choices=arms + extra_arms)
    p.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    p.add_argument("--out", type=Path, default=default_out)
    p.add_argument("--table", action="store_true", help="print --out's table and stop")
    if hasattr(bench, "DW_KWARGS"):
        p.add_argument(
            "--dw-kwargs", type=json.loads, default={}, help="LearnedDataWeights settings"
        )
    args = p.parse_args(argv)
    if hasattr(bench, "DW_KWARGS"):
        bench.DW_KWARGS.update(args.dw_kwargs)
    if args.table:
        print(bench.table(read_records(args.out)))
        return
    torch.set_num_threads(1)
    command = " ".join(["python", *sys.argv])
    old = read_records(args.out)
    for name in bench.RECIPES if args.recipes == ["all"] else args.recipes:
        for seed in args.seeds:
            made = bench.Setup(name, args.data, seed)
            for arm in args.arms:
                if arm not in made.arms and arm not in extra_arms:
                    continue
                rec = made.run(arm)
                rec["command"] = command
                shown = {k: v for k, v in rec.items() if k not in ("warnings", "lam", "command")}
                print(json.dumps(shown), flush=True)
                old = merge_records(old, [rec], recipe_key)
                write_json(args.out, {"command": command, **(header or {}), "records": old})


def init_key(r: dict[str, Any]) -> tuple:
    """A probe record's identity (recipe, data seed, initialisation seed, arm, settings)."""
    return r["recipe"], r["seed"], r["init"], r["arm"], json.dumps(r["dw_kwargs"])


def probe_parser(
    description: str, recipes: Iterable[str], default_recipe: str, default_seed: int
) -> argparse.ArgumentParser:
    """The probes' command line (``bench_dw_accuracy_s52.py``, ``bench_hard_rows_s53.py``) but
    for ``--arms``: ``--data``, ``--recipes``, ``--seeds``, ``--inits``, ``--dw-kwargs``,
    ``--out`` and ``--table``.

    Parameters
    ----------
    description
        The probe's module docstring (its first line is shown).
    recipes
        The recipes ``--recipes`` takes.
    default_recipe
        ``--recipes``' default.
    default_seed
        ``--seeds``' default.
    """
    p = argparse.ArgumentParser(description=description.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=[default_recipe], choices=recipes)
    p.add_argument("--seeds", nargs="+", type=int, default=[default_seed])
    p.add_argument(
        "--inits", nargs="+", type=int, default=None,
        help="initialisation seeds (default: the data seed, as the session-51 benchmarks)",
    )  # fmt: skip
    p.add_argument("--dw-kwargs", type=json.loads, default={}, help="LearnedDataWeights settings")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--table", action="store_true", help="print --out's table and stop")
    return p


def run_probe(args: argparse.Namespace, run: Callable[[str, int, list[int]], list[dict]]) -> None:
    """Per ``--recipes`` and ``--seeds``: ``run(recipe, seed, inits)``'s records (``--inits``, or
    the data seed), merged into ``--out`` (by :func:`init_key`) after each seed."""
    torch.set_num_threads(1)
    old = read_records(args.out)
    for name in args.recipes:
        for seed in args.seeds:
            inits = args.inits if args.inits is not None else [seed]
            old = merge_records(old, run(name, seed, inits), init_key)
            if args.out is not None:
                write_json(args.out, {"command": " ".join(["python", *sys.argv]), "records": old})
