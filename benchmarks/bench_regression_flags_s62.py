"""Session 62: what tells a regression's good flags from poor ones (docs/data_weights.md, "Flags
on a regression (session 62)").

Each fit runs ``LearnedDataWeights(objective="mean_loss")`` on a regression whose corrupted rows
are known and keeps what :meth:`RowEvidence.flag_contrast` may read (each row's training loss at
its last visit, the clean validation losses the last hyper steps read, the weights, the default
flags) with the truth, in ``<out>/<setup>_<seed>.pt``; ``--table`` reads them back and prints
each candidate rule's statistic beside the flags' precision. Set-ups:

* ``noisy_reg``    session 61's rotated-MNIST angle, 30 % heavy-tailed (Cauchy) targets;
* ``diabetes_mse`` session 53's diabetes MLP, 30 % targets shifted by ±3–6 s.d.;
* ``outliers``     a synthetic MLP teacher (8 features, noise s.d. 0.1), 1000 / 200 rows, 25 %
  targets moved by ±(4–8) s.d. of y: flags should be clean;
* ``few_outliers`` the same with 8 % of the targets moved;
* ``clean``        the same without any corruption: every flag is a clean row;
* ``mild``         the same with 30 % targets plus N(0, 1 s.d. of y): flags mostly poor;
* ``t_*``          the targets without class labels of tests/test_data_weights_tasks.py
  (:func:`fit_task`).

From the repository root, one thread::

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/bench_regression_flags_s62.py \\
        --data ../shared/data --setups noisy_reg diabetes_mse outliers clean mild --seeds 0 1 2
    .venv/bin/python benchmarks/bench_regression_flags_s62.py --table
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_harness import auc, trainer  # noqa: E402

from hypertorch_sid import IndexedDataset, LearnedDataWeights  # noqa: E402
from hypertorch_sid.lightning.evidence import RowEvidence  # noqa: E402

OUT = Path("benchmarks/results/regression_flags_s62")
CAUGHT: dict = {}


class Capture(LearnedDataWeights):
    """The drop-in, keeping itself and the module at the fit's end."""

    def on_train_end(self, trainer, pl_module):
        super().on_train_end(trainer, pl_module)
        CAUGHT["cb"], CAUGHT["model"] = self, pl_module


# ----------------------------------------------------------------------------- synthetic


def teacher_data(seed: int, kind: str) -> tuple[TensorDataset, TensorDataset, torch.Tensor]:
    """y = a random tanh MLP of 8 features + N(0, 0.1²), standardised; ``kind`` corrupts the
    training targets (see the module docstring). Returns train, val and the corrupted mask."""
    g = torch.Generator().manual_seed(300 + seed)
    w1, w2 = torch.randn(8, 32, generator=g), torch.randn(32, generator=g) / 32**0.5

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 8, generator=g)
        return x, torch.tanh(x @ w1 / 8**0.5) @ w2 + 0.1 * torch.randn(n, generator=g)

    (x, y), (xv, yv) = draw(1000), draw(200)
    m, s = y.mean(), y.std()
    y, yv = (y - m) / s, (yv - m) / s
    bad = torch.zeros(len(y), dtype=torch.bool)
    if kind in ("outliers", "few_outliers"):
        bad = torch.rand(len(y), generator=g) < (0.25 if kind == "outliers" else 0.08)
        size = (4 + 4 * torch.rand(len(y), generator=g)) * torch.sign(
            torch.randn(len(y), generator=g)
        )
        y = torch.where(bad, y + size, y)
    elif kind == "mild":
        bad = torch.rand(len(y), generator=g) < 0.3
        y = torch.where(bad, y + torch.randn(len(y), generator=g), y)
    return TensorDataset(x, y), TensorDataset(xv, yv), bad


class Regressor(pl.LightningModule):
    """An MLP (8 → 64 → 64 → 1), MSE per sample, Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 1))  # fmt: skip

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def per_sample_loss(self, out, y):
        return F.mse_loss(out, y, reduction="none")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.per_sample_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def fit_synthetic(kind: str, seed: int) -> tuple[TensorDataset, torch.Tensor]:
    train, val, bad = teacher_data(seed, kind)
    torch.manual_seed(seed)
    loader = DataLoader(IndexedDataset(train), batch_size=64, shuffle=True)
    cb = Capture(objective="mean_loss", seed=seed)
    trainer([cb], 40).fit(Regressor(), loader, DataLoader(val, batch_size=200))
    return val, bad


# ----------------------------------------------------------------------------- the tests' tasks


def fit_task(name: str, seed: int) -> tuple[TensorDataset, torch.Tensor]:
    """The targets without class labels of ``tests/test_data_weights_tasks.py`` (240 rows, the
    first 72 corrupted; the data fixed, ``seed`` the callback's): ``t_l1`` / ``t_huber3`` (a
    robust loss, ``gauge="batch"``, one / three outputs), ``t_mse`` (squared error, the
    defaults), ``t_multilabel`` (inverted label sets), ``t_tokens`` (shifted token labels)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import test_data_weights_tasks as t

    t.LearnedDataWeights = Capture
    kw: dict = {"seed": seed}
    if name in ("t_l1", "t_huber3", "t_mse"):
        out = 3 if name == "t_huber3" else 1
        loss = {"t_l1": F.l1_loss, "t_huber3": F.huber_loss, "t_mse": F.mse_loss}[name]
        data = t.regression(out)
        net, kw = t.mlp(4, out), {**kw, "objective": "mean_loss"}
        if name != "t_mse":
            kw["gauge"] = "batch"

        def step(z, y):
            return loss(z, y, reduction="none")[:, 0] if out == 1 else loss(z, y, reduction="none")
    elif name == "t_multilabel":
        data, net = t.multi_label(), t.mlp(4, 5)

        def step(z, y):
            return F.binary_cross_entropy_with_logits(z, y, reduction="none")
    else:
        data, net = t.sequences(), t.tagger()

        def step(z, y):
            return t.tokens(z, y).sum(1) / (y != t.PAD).sum(1).clamp_min(1)

    t.fit(t.Task(net, step), data, **kw)
    bad = torch.arange(t.N) < t.BAD
    return TensorDataset(data[2], data[3]), bad


# ----------------------------------------------------------------------------- the recipes


def fit_recipe(name: str, seed: int, data: Path) -> tuple[TensorDataset, torch.Tensor]:
    """Session 61's ``noisy_reg`` or session 53's ``diabetes_mse``, their ``dw`` arm."""
    if name == "noisy_reg":
        import bench_user_recipes_s61 as bench
    else:
        import bench_user_recipes_s53 as bench
    bench.LearnedDataWeights = Capture
    setup = bench.Setup(name, data, seed)
    setup.run("dw")
    bad = (setup.corrupted() if name == "noisy_reg" else setup.noisy_train())[1]
    return setup.val, bad


def keep(name: str, seed: int, val: TensorDataset, bad: torch.Tensor) -> dict:
    """What the fit left for the evidence, with the truth."""
    cb, model = CAUGHT.pop("cb"), CAUGHT.pop("model")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flags = cb.flagged()
    model.eval()
    x, y = val.tensors
    with torch.no_grad():
        if hasattr(model, "per_sample_loss"):
            final = model.per_sample_loss(model(x), y)
        else:  # a test's Task
            final = model.step(model.net(x), y)
        final = final.reshape(len(y), -1).mean(1)
    p = cb.problem
    return {
        "setup": name, "seed": seed, "bad": bad, "flags": flags,
        "weights": cb.data_weights().detach().float().cpu(),
        "last_loss": p._last_loss.detach().float().cpu(),
        "val_losses": p._val_losses.detach().float().cpu(),
        "val_final": final.float(),
        "warnings": [str(w.message) for w in caught if "flagged" in str(w.message)],
    }  # fmt: skip


# ----------------------------------------------------------------------------- the table


def contrast(rec: dict, tau: float) -> tuple[float, float]:
    """The flagged and kept rows' shares of last-visit losses above ``tau``."""
    last, flags = rec["last_loss"], rec["flags"]
    mask = torch.zeros(len(last), dtype=torch.bool)
    mask[flags] = True
    seen = torch.isfinite(last)
    low, kept = last[mask & seen], last[~mask & seen]
    if low.numel() == 0 or kept.numel() == 0:
        return float("nan"), float("nan")
    return float((low > tau).float().mean()), float((kept > tau).float().mean())


class Record(RowEvidence):
    """The evidence on a fit's kept record (per sample, no class labels): what
    ``flagged()`` checks now, on the rows it flagged then."""

    def __init__(self, rec: dict) -> None:
        self.per, self._labels = "sample", None
        self._last_loss, self._val_losses = rec["last_loss"], rec["val_losses"]


def row(rec: dict) -> dict:
    bad, flags = rec["bad"], rec["flags"]
    hit = int(bad[flags].sum()) if len(flags) else 0
    w = rec["weights"].numpy()
    out = {
        "setup": rec["setup"], "seed": rec["seed"], "flagged": len(flags),
        "precision": hit / max(len(flags), 1), "recall": hit / max(int(bad.sum()), 1),
        "auc": auc(w[bad.numpy()], w[~bad.numpy()]) if bad.any() else float("nan"),
        "warned_at_fit": [m[28:90] for m in rec["warnings"]],
        "warns_now": Record(rec).flag_contrast(flags) is not None,
    }  # fmt: skip
    for source in ("val_losses", "val_final"):
        for q in (0.9, 0.99):
            for factor in (1, 2, 4):
                tau = factor * float(rec[source].quantile(q))
                s_low, s_kept = contrast(rec, tau)
                key = f"{'' if source == 'val_losses' else '_final'}_q{q}_x{factor}"
                out["J" + key] = round(s_low - s_kept, 3)  # the flagged share − the kept share
                out["Jn" + key] = round((s_low - s_kept) / max(1 - s_kept, 1e-9), 3)  # of 1 − kept
                if factor == 1:
                    out["s" + key] = (round(s_low, 3), round(s_kept, 3))
    return out


def table(out: Path) -> None:
    """Each fit's row (``table.jsonl``), then the markdown table by set-up."""
    rows = [row(torch.load(f, weights_only=False)) for f in sorted(out.glob("*.pt"))]
    (out / "table.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("| set-up | flagged | precision | AUC | J (eq. scalecontrast) | s_low / s_kept "
          "| J unscaled | J at q 0.99 | J at 2τ | warns |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["setup"], []).append(r)

    def span(key: str, rs: list[dict], f: str = ".2f") -> str:
        lo, hi = min(r[key] for r in rs), max(r[key] for r in rs)
        return f"{lo:{f}}" if f"{lo:{f}}" == f"{hi:{f}}" else f"{lo:{f}}–{hi:{f}}"

    for name, rs in by.items():
        shares = "; ".join(f"{a:.2f} / {b:.2f}" for a, b in (r["s_q0.9_x1"] for r in rs))
        print(
            f"| `{name}` | {span('flagged', rs, 'd')} | {span('precision', rs)} "
            f"| {span('auc', rs)} | {span('Jn_q0.9_x1', rs)} | {shares} | {span('J_q0.9_x1', rs)} "
            f"| {span('Jn_q0.99_x1', rs)} | {span('Jn_q0.9_x2', rs)} "
            f"| {sum(r['warns_now'] for r in rs)}/{len(rs)} |"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--setups", nargs="+", default=["noisy_reg", "diabetes_mse", "outliers",
                                                     "clean", "mild"])  # fmt: skip
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args(argv)
    if args.table:
        table(args.out)
        return
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    for name in args.setups:
        for seed in args.seeds:
            if name in ("noisy_reg", "diabetes_mse"):
                val, bad = fit_recipe(name, seed, args.data)
            elif name.startswith("t_"):
                val, bad = fit_task(name, seed)
            else:
                val, bad = fit_synthetic(name, seed)
            rec = keep(name, seed, val, bad)
            torch.save(rec, args.out / f"{name}_{seed}.pt")
            print(json.dumps(row(rec)), flush=True)


if __name__ == "__main__":
    main()
