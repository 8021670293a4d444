"""Session 52: why the data weights' lower test loss comes with a lower test accuracy on some fits.

Issue 27. Session 51 measured ``LearnedDataWeights()`` against plain noisy-label training on its
unseen recipes (``bench_user_recipes_s51.py``) and on session 50's 20 Newsgroups recipe
(``bench_news_weights_s51.py``): the test loss is lower on 13 of 16 recipe fits, the test
accuracy lower on 5 of them (0.4 to 2.0 points), and 20 Newsgroups seed 10 is 2.0 points below
plain with a lower test loss. This probe refits a recipe's plain and data-weights arms on the same
noisy data, with the same model initialisation (``--inits``: extra initialisation seeds on the
same data and corruption, to see how far accuracy moves by initialisation alone), and records per
fit (one JSON record each):

* the test set: loss, accuracy, per-class accuracy, the mean loss of the examples it gets right /
  wrong, the mean confidence (largest probability), the expected calibration error (15 bins);
* for the data weights, against the plain fit of the same initialisation: the mean weight of the
  clean training rows by quartile of the plain model's margin on their label (hypothesis (a):
  hard clean rows down-weighted), the corrupted rows' mean weight, Σω/n (hypothesis (c): a
  smaller effective training set), each class's share of the total weight against its share of
  the rows (hypothesis (d): the class gauge moving whole classes), and the test examples the
  plain model gets right and the weighted one wrong (and back) by class;
* arms: ``plain``, ``dw`` (every default; on ``news_bag`` with ``target=`` the labels, as
  session 51's numbers), ``dw_mean_loss`` (``objective="mean_loss"``, hypothesis (b)),
  ``dw_margin`` (``objective="margin_error"``), ``oracle`` (plain on the clean rows only),
  ``plain_neff`` (plain on a random subset of the noisy rows as large as the ``dw`` fit's
  effective sample size (Σω)²/Σω², hypothesis (c); give it after ``dw``).
* the test loss once each model's logits are divided by the temperature that minimises its
  clean validation loss (``test_loss_ts``): the loss left when the predictions' scale is set.

Usage (from the repository root; one thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_dw_accuracy_s52.py --recipes cutmix_cnn \
        --seeds 0 --inits 0 1 2 3 --arms plain dw --out benchmarks/results/user_recipes/s52_acc.json
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s50 as s50  # noqa: E402
import bench_user_recipes_s51 as s51  # noqa: E402
from recipe_harness import (  # noqa: E402
    auc,
    keep_rows,
    probe_parser,
    read_records,
    run_probe,
    trainer,
)

from hypertorch_sid import LearnedDataWeights  # noqa: E402
from hypertorch_sid.core.objectives import MarginError  # noqa: E402

ARMS = ("plain", "dw", "dw_mean_loss", "dw_margin", "oracle", "plain_neff")
RECIPES = tuple(r for r in s51.RECIPES if r != "mobile_bf16") + ("news_bag",)


def _last(batch):
    """The news recipe's labels: the last item of its ``(tokens, offsets, y)`` batches."""
    return batch[-1]


def _logits(module, batch):
    """The margin objective's logits and labels from any recipe's ``(*inputs, y)`` batch."""
    *x, y = batch
    return module(*x), y


def setup_for(name: str, data: Path, seed: int):
    return (s50 if name == "news_bag" else s51).Setup(name, data, seed)


def logits_of(model, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits (eval mode, float32) and the loader's labels, in the loader's order."""
    model.eval()
    zs, ys = [], []
    with torch.no_grad():
        for *x, y in loader:
            zs.append(model(*x).float())
            ys.append(y)
    return torch.cat(zs), torch.cat(ys)


def margins(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """z_y − max_{k≠y} z_k per row."""
    right = z.gather(1, y[:, None]).squeeze(1)
    rival = z.scatter(1, y[:, None], float("-inf")).amax(1)
    return right - rival


def test_diagnostics(z: torch.Tensor, y: torch.Tensor, classes: int) -> dict[str, Any]:
    nll = F.cross_entropy(z, y, reduction="none")
    p = z.softmax(1)
    conf, pred = p.max(1)
    right = pred == y
    edges = torch.linspace(0, 1, 16)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += float(m.float().mean() * (conf[m].mean() - right[m].float().mean()).abs())
    return {
        "test_loss": float(nll.mean()),
        "test_acc": float(right.float().mean()),
        "class_acc": [float(right[y == c].float().mean()) for c in range(classes)],
        "loss_right": float(nll[right].mean()),
        "loss_wrong": float(nll[~right].mean()),
        "share_wrong_of_loss": float(nll[~right].sum() / nll.sum()),
        "confidence_right": float(conf[right].mean()),
        "confidence": float(conf.mean()),
        "ece": ece,
        "pred": pred.tolist(),
    }


def temperature(zv: torch.Tensor, yv: torch.Tensor) -> float:
    """The temperature T minimising the clean validation set's cross entropy of z/T (a grid)."""
    grid = torch.logspace(-1.5, 1.5, 301)
    nll = torch.stack([F.cross_entropy(zv / t, yv) for t in grid])
    return float(grid[nll.argmin()])


def fit(setup, train, arm: str, init: int, dw_kwargs: dict[str, Any]):
    """One fit of ``arm`` on ``train`` from initialisation seed ``init``: (model, callback, s)."""
    dw = arm.startswith("dw")
    setup.counts = torch.bincount(train[:][1], minlength=setup.classes).float()  # focal's α
    cb = None
    if dw:
        kw = dict(dw_kwargs)
        if arm == "dw_mean_loss":
            kw["objective"] = "mean_loss"
        elif arm == "dw_margin":
            kw["objective"] = MarginError(logits=_logits)
        if setup.name == "news_bag":
            kw["target"] = _last
        cb = LearnedDataWeights(**kw)
    torch.manual_seed(init)
    model = setup.make(setup.own, dw)
    tr = trainer([cb] if cb is not None else [], setup.epochs, **setup.trainer_kw)
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.fit(model, setup.loader(train, dw, True), setup.loader(setup.val, False, False))
    return model, cb, time.process_time() - t0


def clean_train(setup):
    """The training rows with their clean labels (for the margins on the right label)."""
    return setup.train


def run(name: str, data: Path, seed: int, inits, arms, dw_kwargs) -> list[dict[str, Any]]:
    setup = setup_for(name, data, seed)
    noisy, bad = setup.noisy_train()
    badn = bad.numpy()
    y_noisy = noisy[:][1]
    test_kw = {"collate_fn": setup.collate} if setup.collate else {}
    test = DataLoader(setup.test, batch_size=500, **test_kw)
    train_eval = setup.loader(clean_train(setup), False, False)
    records = []
    for init in inits:
        plain_margin = plain_pred = None
        n_eff = float(len(bad))
        for arm in arms:
            train = noisy
            if arm in ("oracle", "plain_neff"):
                keep = torch.nonzero(~bad).squeeze(1)
                if arm == "plain_neff":  # a random subset of the noisy rows, n_eff of the dw fit
                    g = torch.Generator().manual_seed(init)
                    keep = torch.randperm(len(bad), generator=g)[: round(n_eff)]
                train = keep_rows(noisy, keep)
            model, cb, cpu = fit(setup, train, arm, init, dw_kwargs)
            z, y = logits_of(model, test)
            rec: dict[str, Any] = {"recipe": name, "seed": seed, "init": init, "arm": arm}
            rec.update(test_diagnostics(z, y, setup.classes))
            zv, yv = logits_of(model, setup.loader(setup.val, False, False))
            rec["val_loss"] = float(F.cross_entropy(zv, yv))
            rec["val_acc"] = float((zv.argmax(1) == yv).float().mean())
            rec["cpu_s"] = cpu
            # the loss once each model's confidence is set on the clean validation set: what is
            # left of the loss gap is not a matter of the predictions' scale (calibration)
            rec["temperature"] = t = temperature(zv, yv)
            rec["test_loss_ts"] = float(F.cross_entropy(z / t, y))
            rec["val_loss_ts"] = float(F.cross_entropy(zv / t, yv))  # what a user can see
            pred = torch.tensor(rec.pop("pred"))
            zt, yt = logits_of(model, train_eval)
            m_clean = margins(zt, yt).numpy()  # margin on the clean label, every row
            if arm == "plain":
                plain_margin, plain_pred = m_clean, pred
            if cb is not None:
                w = cb.data_weights().detach().float().numpy()
                good = ~badn
                rec["w_bad"], rec["w_good"] = float(w[badn].mean()), float(w[good].mean())
                rec["auc"] = auc(w[badn], w[good])
                rec["sum_w_over_n"] = float(w.mean())
                rec["n_eff"] = float(w.sum() ** 2 / (w**2).sum())
                if arm == "dw":
                    n_eff = rec["n_eff"]
                # clean rows by the margin of the plain fit (same init) on their label
                ref = plain_margin if plain_margin is not None else m_clean
                q = np.quantile(ref[good], [0.25, 0.5, 0.75])
                bins = np.digitize(ref[good], q)
                rec["w_clean_by_plain_margin_quartile"] = [
                    float(w[good][bins == b].mean()) for b in range(4)
                ]
                rec["plain_margin_quartile_edges"] = [float(v) for v in q]
                rec["w_clean_plain_wrong"] = float(w[good][ref[good] < 0].mean())
                rec["n_clean_plain_wrong"] = int((ref[good] < 0).sum())
                yn = y_noisy.numpy()
                rec["class_weight_share"] = [
                    float(w[yn == c].sum() / w.sum()) for c in range(setup.classes)
                ]
                rec["class_row_share"] = [float((yn == c).mean()) for c in range(setup.classes)]
                yc = clean_train(setup)[:][1].numpy()
                low = good & (ref < q[0])  # the clean rows of the lowest plain-margin quartile
                rec["w_clean_low_margin_by_class"] = [
                    float(w[low & (yc == c)].mean()) if (low & (yc == c)).any() else None
                    for c in range(setup.classes)
                ]
                rec["n_clean_low_margin_by_class"] = [
                    int((low & (yc == c)).sum()) for c in range(setup.classes)
                ]
                rec["w_clean_by_class"] = [
                    float(w[good & (yc == c)].mean()) for c in range(setup.classes)
                ]
                if plain_pred is not None:
                    lost = (plain_pred == y) & (pred != y)
                    won = (plain_pred != y) & (pred == y)
                    rec["test_lost_vs_plain"] = int(lost.sum())
                    rec["test_won_vs_plain"] = int(won.sum())
                    rec["lost_by_class"] = torch.bincount(y[lost], minlength=setup.classes).tolist()
                    rec["won_by_class"] = torch.bincount(y[won], minlength=setup.classes).tolist()
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per recipe and arm, the mean over its fits of the test accuracy, raw test loss and
    temperature-scaled test loss, and each against ``plain`` of the same seed and init."""
    plain = {(r["recipe"], r["seed"], r["init"]): r for r in records if r["arm"] == "plain"}
    rows = ["| recipe | arm | fits | accuracy (− plain, points) | test loss (− plain) "
            "| scaled test loss (− plain) | T |", "| --- " * 7 + "|"]  # fmt: skip
    for name in dict.fromkeys(r["recipe"] for r in records):
        for arm in dict.fromkeys(r["arm"] for r in records if r["recipe"] == name):
            rs = [r for r in records if r["recipe"] == name and r["arm"] == arm]
            ps = [plain.get((r["recipe"], r["seed"], r["init"])) for r in rs]

            def mean(key, rs=rs):
                return float(np.mean([r.get(key, np.nan) for r in rs]))  # nan: not recorded

            def gap(key, scale=1.0, rs=rs, ps=ps, arm=arm):
                d = [scale * (r.get(key, np.nan) - p.get(key, np.nan))
                     for r, p in zip(rs, ps, strict=True) if p]  # fmt: skip
                return f" ({np.mean(d):+.2f})" if d and arm != "plain" else ""

            rows.append(
                f"| {name} | {arm} | {len(rs)} | {100 * mean('test_acc'):.2f}"
                f"{gap('test_acc', 100)} | {mean('test_loss'):.3f}{gap('test_loss')} | "
                f"{mean('test_loss_ts'):.3f}{gap('test_loss_ts')} | {mean('temperature'):.2f} |"
            )
    for arm in dict.fromkeys(r["arm"] for r in records if r["arm"].startswith("dw")):
        pairs = [
            (r, plain[(r["recipe"], r["seed"], r["init"])])
            for r in records
            if r["arm"] == arm and (r["recipe"], r["seed"], r["init"]) in plain
        ]
        keys = ("test_acc", "test_loss", "test_loss_ts", "val_loss", "val_loss_ts")
        d = np.array([[r.get(k, np.nan) - p.get(k, np.nan) for k in keys] for r, p in pairs])
        d = d[~np.isnan(d[:, 2])]  # fits recorded before the scaled losses were
        if len(d) < 3:
            continue
        lower_loss = d[:, 1] < 0
        rows.append(
            f"\n{arm} against plain, {len(d)} paired fits: raw test loss lower on "
            f"{int(lower_loss.sum())}, accuracy lower on {int((d[:, 0] < 0).sum())} "
            f"({int((lower_loss & (d[:, 0] < 0)).sum())} of them with a lower raw test loss); "
            f"corr(Δacc, Δ raw test loss) {np.corrcoef(d[:, 0], d[:, 1])[0, 1]:+.2f}, "
            f"corr(Δacc, Δ scaled test loss) {np.corrcoef(d[:, 0], d[:, 2])[0, 1]:+.2f}, "
            f"corr(Δacc, Δ raw val loss) {np.corrcoef(d[:, 0], d[:, 3])[0, 1]:+.2f}"
            + (
                f", corr(Δacc, Δ scaled val loss) {np.corrcoef(d[:, 0], d[:, 4])[0, 1]:+.2f}"
                if not np.isnan(d[:, 4]).any()
                else ""
            )
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = probe_parser(__doc__, RECIPES, "cutmix_cnn", 0)
    p.add_argument("--arms", nargs="+", default=["plain", "dw"], choices=ARMS)
    args = p.parse_args(argv)
    if args.table:
        print(table(read_records(args.out)))
        return

    def run_seed(name: str, seed: int, inits: list[int]) -> list[dict[str, Any]]:
        recs = run(name, args.data, seed, inits, args.arms, args.dw_kwargs)
        for r in recs:
            r["dw_kwargs"] = args.dw_kwargs if r["arm"].startswith("dw") else {}
        return recs

    run_probe(args, run_seed)


if __name__ == "__main__":
    main()
