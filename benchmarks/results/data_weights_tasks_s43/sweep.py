# ruff: noqa
"""Session 43, helper dwrecipes: the sweep behind docs/data_weights.md "Other tasks (session 43)"
(a record of the runs, not library code; the same toys are tested in tests/test_data_weights_tasks.py).
Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/data_weights_tasks_s43/sweep.py ARG
(see the docs section for the arguments)."""

import sys, warnings, math

sys.path.insert(0, "tests")
import torch, torch.nn.functional as F, pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from lightning_problems import trainer
from hypertorch_sid import IndexedDataset, LearnedDataWeights, ConfigurationError
import logging

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning").setLevel(logging.ERROR)
N, BAD = 240, 72


def reg_data(D=1, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(4, D, generator=g)

    def draw(n):
        x = torch.randn(n, 4, generator=g)
        return x, (x @ A + 0.1 * torch.randn(n, D, generator=g))

    X, Y = draw(N)
    Xv, Yv = draw(60)
    Y[:BAD] += 6.0 * torch.sign(torch.randn(BAD, D, generator=g))  # outliers
    return X, Y * scale, Xv, Yv * scale


class Reg(pl.LightningModule):
    def __init__(self, loss, D, squeeze):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, D)
        )
        self.loss, self.squeeze = loss, squeeze

    def training_step(self, b, i):
        x, y = b
        z = self.net(x)
        if self.squeeze:
            z, y = z[:, 0], y[:, 0]
        return self.loss(z, y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def run(model, X, Y, Xv, Yv, epochs=15, **kw):
    kw.setdefault("every_n_steps", 2)
    kw.setdefault("start_step", 0)
    kw.setdefault("seed", 0)
    cb = LearnedDataWeights(**kw)
    tl = DataLoader(
        IndexedDataset(TensorDataset(X, Y)),
        batch_size=24,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=epochs).fit(
            model, tl, DataLoader(TensorDataset(Xv, Yv), batch_size=60)
        )
        fl = cb.flagged()
    w = cb.data_weights()
    msgs = sorted(
        {
            str(x.message)[:90]
            for x in ws
            if "LearnedDataWeights" in str(x.message) or "Expected" in str(x.message)
        }
    )
    return w, fl, msgs


def report(name, w, fl, msgs, bad=BAD):
    tp = int((fl < bad).sum())
    print(
        f"{name}: finite={bool(torch.isfinite(w).all())} bad={w[:bad].mean():.3f} clean={w[bad:].mean():.3f} flagged={len(fl)} (bad {tp}) {msgs}",
        flush=True,
    )


losses = {
    "mse": lambda z, y: F.mse_loss(z, y, reduction="none"),
    "l1": lambda z, y: F.l1_loss(z, y, reduction="none"),
    "huber": lambda z, y: F.huber_loss(z, y, reduction="none"),
}
which = sys.argv[1]
if which == "reg":
    for scale in (1.0, 30.0):
        for D, sq in ((1, True), (3, False)):
            for ln, lf in losses.items():
                for obj in ("default", "mean_loss"):
                    X, Y, Xv, Yv = reg_data(D, scale)
                    kw = {} if obj == "default" else {"objective": obj}
                    try:
                        r = run(Reg(lf, D, sq), X, Y, Xv, Yv, **kw)
                        report(f"scale={scale} D={D} {ln} {obj}", *r)
                    except ConfigurationError as e:
                        print(f"scale={scale} D={D} {ln} {obj}: REFUSED {str(e)[:200]}")
