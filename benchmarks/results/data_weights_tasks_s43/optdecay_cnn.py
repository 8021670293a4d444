"""LearnedDataWeights on a small CNN with BatchNorm, 40 % noisy labels, SGD+momentum(wd=5e-4) and
AdamW (wd=0.01), 3 seeds: the optimizer's decay modelled (today) vs left out (monkeypatched)."""

import logging
import warnings

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hypertorch_sid.lightning.callback as C
from hypertorch_sid import IndexedDataset, LearnedDataWeights

warnings.filterwarnings("ignore")
logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
torch.set_num_threads(1)


def data(seed):
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(4, 1, 8, 8, generator=g)

    def draw(n):
        y = torch.randint(0, 4, (n,), generator=g)
        return proto[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g), y

    x, y = draw(600)
    xv, yv = draw(200)
    xt, yt = draw(1000)
    bad = torch.rand(600, generator=g) < 0.4
    y = torch.where(bad, (y + torch.randint(1, 4, (600,), generator=g)) % 4, y)
    return x, y, bad, xv, yv, xt, yt


class Net(pl.LightningModule):
    def __init__(self, opt):
        super().__init__()
        self.opt = opt
        self.f = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32, 4),
        )

    def forward(self, x):
        return self.f(x)

    def training_step(self, b, i):
        x, y = b
        return F.cross_entropy(self(x), y, reduction="none")

    def validation_step(self, b, i):
        pass

    def configure_optimizers(self):
        return self.opt(self.parameters())


opts = {
    "sgd_wd5e-4": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=5e-4),
    "adamw_0.01": lambda p: torch.optim.AdamW(p, lr=0.01),
}
orig = C.HyperOptimizationCallback._with_optimizer_decay
for name, opt in opts.items():
    for arm in ("modelled", "left out"):
        C.HyperOptimizationCallback._with_optimizer_decay = (
            orig if arm == "modelled" else (lambda self, trainer, module, problem: problem)
        )
        res = []
        for seed in (0, 1, 2):
            x, y, bad, xv, yv, xt, yt = data(seed)
            pl.seed_everything(seed, verbose=False)
            m = Net(opt)
            cb = LearnedDataWeights()
            tr = pl.Trainer(
                max_epochs=12,
                callbacks=[cb],
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
            )
            tr.fit(
                m,
                DataLoader(IndexedDataset(TensorDataset(x, y)), 32, shuffle=True),
                DataLoader(TensorDataset(xv, yv), 100),
            )
            fl = torch.zeros(600, dtype=torch.bool)
            fl[cb.flagged()] = True
            p = (fl & bad).sum() / max(fl.sum(), 1)
            r = (fl & bad).sum() / bad.sum()
            m.eval()
            acc = float((m(xt).argmax(1) == yt).float().mean())
            res.append((float(p), float(r), acc, bool(torch.isfinite(cb.data_weights()).all())))
        print(
            name,
            arm,
            "P/R/test acc/finite per seed:",
            [tuple(round(v, 3) if isinstance(v, float) else v for v in t) for t in res],
            flush=True,
        )
