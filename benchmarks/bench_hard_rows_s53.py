"""Session 53: do the data weights sink the hard clean rows of easy classes, and what stops it?

Session 52 (docs/failures.md, "Lower test loss with lower accuracy") found the data weights losing
accuracy against plain noisy training on 20 Newsgroups seed 10 and on the Transformer recipe, with
the clean rows of the lowest plain-margin quartile of *easy* classes pushed to the corrupted rows'
weight. This probe refits plain and data-weights arms on the same noisy data and initialisation
(``bench_dw_accuracy_s52.fit``) and records, per fit, the test accuracy and the weights' AUC at the
corrupted rows, and per training row (``--rows``: an ``.npz`` per fit) its weight, whether it was
corrupted, its noisy and clean labels, and the plain model's margin / loss / prediction on it, from
which :func:`summary` reads

* ``sunk``: the share of the clean rows whose weight lies below the corrupted rows' median weight,
  and by class; ``sunk_right``: of those, the share the plain model predicts right;
* ``w_clean_q``: the clean rows' mean weight by quartile of the plain margin *within their class*
  (the lowest quartile: the class's hard clean rows), and ``w_hard_by_class`` that quartile per
  class next to the plain model's validation accuracy of the class (its easiness);
* ``corr_w_margin``: the rank correlation of weight and plain margin over the clean rows, within
  class (mean over classes).

Arms: ``plain``, ``dw`` (the defaults, with ``--dw-kwargs``), and the candidates of
:data:`CANDIDATES` (LearnedDataWeights settings that differ from the default in one thing). The
session-53 arms ``dw_shrink1`` / ``dw_shrink2`` (``shrink=1.0`` / ``2.0``, eq. shrunkstep, rejected:
docs/failures.md) exist only at the git tag ``s53-shrunk-step-unmerged``.

Usage (from the repository root; one thread)::

    OMP_NUM_THREADS=1 python benchmarks/bench_hard_rows_s53.py --recipes news_bag --seeds 10 \
        --inits 10 110 --arms plain dw --out benchmarks/results/user_recipes/s53_hard_probe.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_dw_accuracy_s52 as s52  # noqa: E402
from recipe_harness import auc, probe_parser, read_records, run_probe  # noqa: E402

from hypertorch_sid.core.objectives import OBJECTIVES  # noqa: E402

#: candidate arms: LearnedDataWeights settings (objects built per fit)
CANDIDATES: dict[str, Any] = {
    "dw_mean_loss": lambda: {"objective": "mean_loss"},
    "dw_q1": lambda: {"objective": OBJECTIVES["expected_error"](q=1.0)},
}
for _name in ("class_relative_error", "class_error"):
    if _name in OBJECTIVES:
        CANDIDATES[f"dw_{_name}"] = lambda _n=_name: {"objective": _n}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = a.argsort().argsort(), b.argsort().argsort()
    return float(np.corrcoef(ra, rb)[0, 1])


def summary(rows: dict[str, np.ndarray], classes: int) -> dict[str, Any]:
    """The per-fit numbers of the module docstring from one fit's per-row arrays."""
    w, bad, yc, m = rows["w"], rows["bad"], rows["y_clean"], rows["plain_margin_clean"]
    good = ~bad
    cut = np.median(w[bad])
    sunk = good & (w < cut)
    q_low = np.zeros_like(good)
    w_q = np.zeros(4)
    counts = np.zeros(4)
    corr, hard_by_class = [], []
    for c in range(classes):
        gc = good & (yc == c)
        edges = np.quantile(m[gc], [0.25, 0.5, 0.75])
        b = np.digitize(m[gc], edges)
        for k in range(4):
            w_q[k] += w[gc][b == k].sum()
            counts[k] += (b == k).sum()
        q_low[np.flatnonzero(gc)[b == 0]] = True
        corr.append(spearman(w[gc], m[gc]))
        hard_by_class.append(float(w[gc][b == 0].mean()))
    return {
        "auc": auc(w[bad], w[good]),
        "w_bad": float(w[bad].mean()),
        "w_bad_median": float(cut),
        "w_clean": float(w[good].mean()),
        "sunk": float(sunk.sum() / good.sum()),
        "sunk_by_class": [
            float(sunk[yc == c].sum() / (good & (yc == c)).sum()) for c in range(classes)
        ],
        "sunk_right": float((m[sunk] > 0).mean()) if sunk.any() else float("nan"),
        "sunk_hard_q": float(sunk[q_low].mean()),
        "w_clean_q": (w_q / counts).tolist(),
        "w_hard_by_class": hard_by_class,
        "corr_w_margin": float(np.nanmean(corr)),
    }


def run(name: str, data: Path, seed: int, inits, arms, dw_kwargs, rows_dir: Path | None):
    setup = s52.setup_for(name, data, seed)
    noisy, bad = setup.noisy_train()
    y_noisy = noisy[:][1]
    test_kw = {"collate_fn": setup.collate} if setup.collate else {}
    test = DataLoader(setup.test, batch_size=500, **test_kw)
    train_clean = setup.loader(setup.train, False, False)
    train_noisy = setup.loader(noisy, False, False)
    val = setup.loader(setup.val, False, False)
    y_clean = setup.train[:][1]
    records = []
    for init in inits:
        plain: dict[str, np.ndarray] = {}
        for arm in arms:
            kw = dict(dw_kwargs)
            if arm in CANDIDATES:
                kw.update(CANDIDATES[arm]())
            model, cb, cpu = s52.fit(setup, noisy, "dw" if arm != "plain" else "plain", init, kw)
            z, y = s52.logits_of(model, test)
            zv, yv = s52.logits_of(model, val)
            pred = z.argmax(1)
            rec: dict[str, Any] = {
                "recipe": name, "seed": seed, "init": init, "arm": arm, "cpu_s": cpu,
                "test_acc": float((pred == y).float().mean()),
                "test_loss": float(F.cross_entropy(z, y)),
                "val_acc": float((zv.argmax(1) == yv).float().mean()),
                "class_acc": [
                    float((pred[y == c] == c).float().mean()) for c in range(setup.classes)
                ],
                "val_class_acc": [
                    float((zv.argmax(1)[yv == c] == c).float().mean()) for c in range(setup.classes)
                ],
            }  # fmt: skip
            t = s52.temperature(zv, yv)
            rec["test_loss_ts"] = float(F.cross_entropy(z / t, y))
            if arm == "plain":
                zc, _ = s52.logits_of(model, train_clean)
                zn, yn = s52.logits_of(model, train_noisy)
                plain = {
                    "plain_margin_clean": s52.margins(zc, y_clean).numpy(),
                    "plain_margin_noisy": s52.margins(zn, yn).numpy(),
                    "plain_loss_noisy": F.cross_entropy(zn, yn, reduction="none").numpy(),
                    "plain_pred": zc.argmax(1).numpy(),
                }
            if cb is not None:
                rows = {
                    "w": cb.data_weights().detach().float().numpy(),
                    "bad": bad.numpy(),
                    "y_noisy": y_noisy.numpy(),
                    "y_clean": y_clean.numpy(),
                    **plain,
                }
                if plain:
                    rec.update(summary(rows, setup.classes))
                else:
                    rec["auc"] = auc(rows["w"][rows["bad"]], rows["w"][~rows["bad"]])
                if rows_dir is not None:
                    rows_dir.mkdir(parents=True, exist_ok=True)
                    np.savez_compressed(rows_dir / f"{name}_{seed}_{init}_{arm}.npz", **rows)
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if "class" not in k}), flush=True)
    return records


def _label(r: dict[str, Any]) -> str:
    """An arm's name with the settings it ran with (``--dw-kwargs``)."""
    kw = r.get("dw_kwargs") or {}
    return r["arm"] if r["arm"] == "plain" or not kw else f"{r['arm']} {json.dumps(kw)}"


def table(records: list[dict[str, Any]]) -> str:
    records = [{**r, "arm": _label(r)} for r in records]
    plain = {(r["recipe"], r["seed"], r["init"]): r for r in records if r["arm"] == "plain"}
    out = ["| recipe | arm | fits | acc − plain (points, mean ± se) | worse | AUC | sunk | "
           "sunk, hard quartile | w clean by within-class margin quartile | w bad |",
           "| --- " * 10 + "|"]  # fmt: skip
    for name in dict.fromkeys(r["recipe"] for r in records):
        for arm in dict.fromkeys(r["arm"] for r in records if r["recipe"] == name):
            if arm == "plain":
                continue
            rs = [r for r in records if r["recipe"] == name and r["arm"] == arm]
            d = np.array([
                100 * (r["test_acc"] - plain[(name, r["seed"], r["init"])]["test_acc"])
                for r in rs if (name, r["seed"], r["init"]) in plain
            ])  # fmt: skip
            se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")

            def mean(k, rs=rs):
                return np.mean([r[k] for r in rs if k in r], axis=0)

            out.append(
                f"| {name} | {arm} | {len(rs)} | {d.mean():+.2f} ± {se:.2f} | "
                f"{int((d < 0).sum())} | {mean('auc'):.3f} | {mean('sunk'):.3f} | "
                f"{mean('sunk_hard_q'):.3f} | "
                + " / ".join(f"{v:.2f}" for v in mean("w_clean_q"))
                + f" | {mean('w_bad'):.3f} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = probe_parser(__doc__, s52.RECIPES, "news_bag", 10)
    p.add_argument("--arms", nargs="+", default=["plain", "dw"])
    p.add_argument("--rows", type=Path, default=None, help="folder for the per-row .npz files")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_records(args.out)))
        return
    bad_arms = [a for a in args.arms if a not in ("plain", "dw") and a not in CANDIDATES]
    if bad_arms:
        raise SystemExit(f"unknown arms {bad_arms}; known: plain, dw, {', '.join(CANDIDATES)}")

    def run_seed(name: str, seed: int, inits: list[int]) -> list[dict[str, Any]]:
        recs = run(name, args.data, seed, inits, args.arms, args.dw_kwargs, args.rows)
        for r in recs:
            r["dw_kwargs"] = args.dw_kwargs
        return recs

    run_probe(args, run_seed)


if __name__ == "__main__":
    main()
