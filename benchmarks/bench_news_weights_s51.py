"""Session 51: why the data weights lose to plain training on session 50's 20 Newsgroups recipe.

Two tools, on the recipe of ``bench_user_recipes_s50.py`` (``news_bag``: 1200 noisy training
documents, 35 % wrong labels, 300 clean validation documents, 8 epochs, Adam, dropout) and on
the noisy-label CNN of ``bench_noisy_labels.py`` (the benchmark the defaults were chosen on):

* ``--probe``: the agreement of the rows' hypergradients read from two disjoint halves of the
  validation set (hypothesis: the per-row signal is too weak on news for the outer step's ~1 per
  visit). During a plain fit on the noisy labels, at steps 50, 90, 130, ... (the drop-in's
  hyper steps), the validation set is split at random into halves A / B; gᴬ, gᴮ = ∇E on each
  (E the drop-in's default objective, ``ExpectedError(q=0.5)``, eval mode); every training row's
  uⱼ = ⟨∇ℓⱼ, g⟩ by a forward difference. Recorded: corr(uᴬ, uᴮ) over the rows (the
  split-half reliability of one half; Spearman–Brown 2ρ/(1+ρ) for the whole set) and the AUC
  of −(uᴬ + uᴮ) at telling corrupted rows (a row whose loss gradient aligns with the
  validation's is helpful, u > 0 meaning that a step on it lowers E). A proxy: v = ∇E, without
  the adjoint's inverse curvature.
* arms (``--arms``): ``plain`` / ``dw`` as in session 50, and ``dw`` with settings
  (``--dw-kwargs``, JSON), each record also with the test loss, accuracy and weights' AUC.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_news_weights_s51.py --probe news --seeds 0 1 2
    OMP_NUM_THREADS=1 python benchmarks/bench_news_weights_s51.py --probe cnn --seeds 0 1
    OMP_NUM_THREADS=1 python benchmarks/bench_news_weights_s51.py --arms plain dw \
        --seeds 0 1 2 3 4 5 --out benchmarks/results/user_recipes/s51_news_default.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s50 as s50  # noqa: E402

from hypertorch_sid.core.objectives import ExpectedError  # noqa: E402


def _flat_grad(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params))


@torch.no_grad()
def _shifted_losses(model, rows_loss, direction, h: float) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    for p, d in zip(params, direction):
        p.add_(d, alpha=h)
    out = rows_loss(model)
    for p, d in zip(params, direction):
        p.sub_(d, alpha=h)
    return out


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm() + 1e-30))


def _within(u: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """u less its label's mean: the part of the rows' signal a class-level shift does not carry."""
    out = u.clone()
    for c in labels.unique():
        out[labels == c] -= u[labels == c].mean()
    return out


def class_common(u: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """ū_c − û per class c: each label's mean of u less their mean weighted by ``rows`` (the
    share of the batches each row fills: 1 under shuffling, 1/count(c) under the imbalanced
    recipe's balancing sampler), the class-common part the class gauges centre away."""
    k = int(labels.max()) + 1
    mass = torch.zeros(k, dtype=u.dtype).index_add_(0, labels, rows)
    means = torch.zeros(k, dtype=u.dtype).index_add_(0, labels, rows * u) / mass
    return means - (rows * u).sum() / rows.sum()


def agreement(
    model, train_losses, val_losses, n_val: int, gen: torch.Generator, bad, labels, rows=None
):
    """corr(uᴬ, uᴮ) over the training rows (all; within each noisy label), the share of u's
    variance between the labels' means, and the AUC of uᴬ + uᴮ at the corrupted rows; with
    session 52's class-level numbers: corr over the classes of the two halves' class-common
    parts dᴬ, dᴮ (:func:`class_common`), the share of the classes whose sign agrees, and the
    full set's d (for its persistence across steps, :func:`persistence`)."""
    was = model.training
    model.eval()
    perm = torch.randperm(n_val, generator=gen)
    halves = perm[: n_val // 2], perm[n_val // 2 :]
    objective = ExpectedError(0.5)
    u = []
    with torch.no_grad():
        base = train_losses(model)
    for half in halves:
        with torch.enable_grad():
            g = _flat_grad(model, objective(val_losses(model)[half]))
        scale = float(torch.sqrt(sum((x * x).sum() for x in g)))
        h = 1e-3 / max(scale, 1e-12)
        u.append((_shifted_losses(model, train_losses, g, h) - base) / h)
    model.train(was)
    rho = _corr(*u)
    wa, wb = (_within(x, labels) for x in u)
    full = u[0] + u[1]
    badn = bad.numpy()
    centred = full - full.mean()
    rows = torch.ones_like(full) if rows is None else rows.to(full.dtype)
    da, db = (class_common(x, labels, rows) for x in u)
    d = class_common(full, labels, rows)
    spread = float(
        torch.sqrt((rows * (full - (rows * full).sum() / rows.sum()) ** 2).sum() / rows.sum())
    )
    return {
        "class_rho_half": _corr(da, db),
        "class_sign_agree": float(((da > 0) == (db > 0)).double().mean()),
        "class_common": (d / max(spread, 1e-30)).tolist(),
        "rho_half": rho,
        "rho_half_within_class": _corr(wa, wb),
        "between_class_share": 1 - float(_within(full, labels).norm() ** 2 / centred.norm() ** 2),
        "auc_u": s50.auc(full.numpy()[badn], full.numpy()[~badn]),
        "auc_u_within_class": s50.auc((wa + wb).numpy()[badn], (wa + wb).numpy()[~badn]),
    }


def persistence(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over one fit's probe steps: corr(d_t, d_t+1) of the class-common part (d in units of
    u's spread), the share of classes keeping their sign, and per class the t-statistic
    mean/se of d over the steps with the James–Stein factor max(0, 1 − se²/mean²)."""
    d = torch.tensor([r["class_common"] for r in rows], dtype=torch.float64)
    steps = len(d)
    mean, se = d.mean(0), d.std(0) / steps**0.5
    return {
        "steps": steps,
        "corr_next": float(np.mean([_corr(d[i], d[i + 1]) for i in range(steps - 1)])),
        "sign_kept_next": float(((d[1:] > 0) == (d[:-1] > 0)).double().mean()),
        "t_per_class": (mean / se).tolist(),
        "shrink_per_class": (1 - se**2 / mean**2).clamp_min(0).tolist(),
        "class_rho_half_mean": float(np.mean([r["class_rho_half"] for r in rows])),
        "class_sign_agree_mean": float(np.mean([r["class_sign_agree"] for r in rows])),
        "between_class_share_mean": float(np.mean([r["between_class_share"] for r in rows])),
    }


class Probe(pl.Callback):
    def __init__(self, steps, train_losses, val_losses, n_val, bad, labels, seed, rows=None):
        self.steps, self.rows, self.labels, self.row_share = set(steps), [], labels, rows
        self.train_losses, self.val_losses, self.n_val, self.bad = (
            train_losses,
            val_losses,
            n_val,
            bad,
        )
        self.gen = torch.Generator().manual_seed(5000 + seed)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            rec = agreement(
                module,
                self.train_losses,
                self.val_losses,
                self.n_val,
                self.gen,
                self.bad,
                self.labels,
                self.row_share,
            )
            rec["step"] = trainer.global_step
            self.rows.append(rec)


def probe_news(data: Path, seed: int) -> list[dict[str, Any]]:
    setup = s50.Setup("news_bag", data, seed)
    train, bad = setup.noisy_train()
    tb = s50.bag_collate([train[i] for i in range(len(train))])
    vb = s50.bag_collate([setup.val[i] for i in range(len(setup.val))])

    def train_losses(m):
        return F.cross_entropy(m(tb[0], tb[1]), tb[2], reduction="none")

    def val_losses(m):
        return F.cross_entropy(m(vb[0], vb[1]), vb[2], reduction="none")

    torch.manual_seed(seed)
    model = setup.make(setup.own, False)
    probe = Probe(range(10, 160, 20), train_losses, val_losses, len(setup.val), bad, tb[2], seed)
    s50.trainer([probe], setup.epochs).fit(model, setup.loader(train, False, True))
    return [{"recipe": "news_bag", "seed": seed, **r} for r in probe.rows]


def probe_cnn(data: Path, seed: int, dataset: str = "mnist", epochs: int = 12):
    import bench_noisy_labels as nl

    args = argparse.Namespace(n_train=2000, n_val=1000, n_test=5000, rate=0.4)
    d = nl.noisy_setting(nl.load(dataset, data), "symmetric", args, seed)
    bad = ~d["clean"]

    def train_losses(m):
        return F.cross_entropy(m(d["X"]), d["y_noisy"], reduction="none")

    def val_losses(m):
        return F.cross_entropy(m(d["Xv"]), d["yv"], reduction="none")

    torch.manual_seed(seed)
    model = nl.Classifier(0.05)
    loader = DataLoader(
        torch.utils.data.TensorDataset(d["X"], d["y_noisy"]),
        batch_size=64,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    probe = Probe(
        range(10, 32 * epochs, 40), train_losses, val_losses, 1000, bad, d["y_noisy"], seed
    )
    nl.trainer(epochs, [probe], 1.0).fit(model, loader)
    return [{"recipe": f"cnn_{dataset}", "seed": seed, **r} for r in probe.rows]


def probe_imbalanced(data: Path, seed: int) -> list[dict[str, Any]]:
    """The probe on session 50's imbalanced recipe (MNIST digits 5–9 at a tenth, 35 % wrong
    labels, a ``WeightedRandomSampler`` balancing the noisy labels, 300 balanced validation
    images, the small CNN, Adam, 6 epochs), every row weighted by the share of the batches the
    sampler gives it (1/count of its label)."""
    setup = s50.Setup("imbalanced", data, seed)
    train, bad = setup.noisy_train()
    x, y = train.tensors
    xv, yv = setup.val.tensors
    share = (1.0 / torch.bincount(y, minlength=10).double())[y]

    def train_losses(m):
        return torch.cat(
            [
                F.cross_entropy(m(x[i : i + 2000]), y[i : i + 2000], reduction="none")
                for i in range(0, len(y), 2000)
            ]
        )

    def val_losses(m):
        return F.cross_entropy(m(xv), yv, reduction="none")

    torch.manual_seed(seed)
    model = setup.make(setup.own, False)
    steps = setup.epochs * ((len(y) + 63) // 64)
    probe = Probe(range(10, steps, 20), train_losses, val_losses, len(yv), bad, y, seed, share)
    s50.trainer([probe], setup.epochs).fit(
        model, datamodule=s50.ImbalancedData((x, y), (xv, yv), False)
    )
    return [{"recipe": "imbalanced", "seed": seed, **r} for r in probe.rows]


def _last(batch):
    """The recipe's labels: the last item of its ``(tokens, offsets, y)`` batches."""
    return batch[-1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--probe", choices=["news", "cnn", "cnn_fashion", "imbalanced"])
    p.add_argument("--arms", nargs="+", default=["plain", "dw"], choices=["plain", "dw"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--dw-kwargs", type=json.loads, default={}, help="LearnedDataWeights settings")
    p.add_argument(
        "--target-last",
        action="store_true",
        help="give the data weights target=lambda batch: batch[-1] (the recipe's labels)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    records: list[dict[str, Any]] = []
    for seed in args.seeds:
        if args.probe == "news":
            rows = probe_news(args.data, seed)
        elif args.probe == "imbalanced":
            rows = probe_imbalanced(args.data, seed)
        elif args.probe:
            rows = probe_cnn(args.data, seed, "fashion" if "fashion" in args.probe else "mnist")
        else:
            s50.DW_KWARGS.clear()
            s50.DW_KWARGS.update(args.dw_kwargs)
            if args.target_last:
                s50.DW_KWARGS["target"] = _last
            setup = s50.Setup("news_bag", args.data, seed)
            rows = [setup.run(arm) for arm in args.arms]
            for r in rows:
                r["dw_kwargs"] = args.dw_kwargs if r["arm"] == "dw" else {}
                r["target_last"] = args.target_last and r["arm"] == "dw"
                r.pop("warnings", None)
        for r in rows:
            print(json.dumps({k: v for k, v in r.items() if k != "flag_warnings"}), flush=True)
        if args.probe:
            summary = {"recipe": rows[0]["recipe"], "seed": seed, "summary": persistence(rows)}
            print(json.dumps(summary), flush=True)
            rows = [*rows, summary]
        records += rows
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"command": " ".join(["python", *sys.argv]), "records": records}
        args.out.write_text(json.dumps(payload, indent=1))
    if not args.probe:
        for arm in args.arms:
            rs = [r for r in records if r["arm"] == arm]
            acc = np.mean([r["test_acc"] for r in rs])
            loss = np.mean([r["test_loss"] for r in rs])
            print(f"{arm}: mean test acc {acc:.4f}, test loss {loss:.4f}")


if __name__ == "__main__":
    main()
