"""Why session 49's autoencoder ended above plain training with data weights (a diagnosis).

Session 49's recipe, re-typed from its description in docs/failures.md (its script was not
kept): scikit-learn's digits scaled to [0, 1], 1000 training / 300 validation / 497 test images,
an autoencoder 64-32-8-32-64 (ReLU, sigmoid output), Adam, ``F.mse_loss(..., reduction="none")``
(B, 64) averaged per row; 30 % of the training images replaced by uniform noise (input and
target). Per seed, fits that separate the possible causes:

* ``clean``      the 700 clean images only (what the data weights could at best reach);
* ``plain``      all 1000, noise included, unweighted;
* ``dw``         ``LearnedDataWeights(objective="mean_loss")`` (every other default);
* ``fixed_dw``   the weights ``dw`` ended with, held fixed from the start;
* ``fixed_clean_spread`` those weights on the clean images, 0 on the noise images;
* ``fixed_noise_only``   1 on every clean image, ``dw``'s weights on the noise images;
* ``refit_unflagged``    plain training again on the rows ``dw``'s ``flagged()`` kept;
* ``plain_init<k>``, ``dw_init<k>``  plain and ``dw`` on the same data from other
  initialisations and shuffles (``--extra-inits``): the spread of a fit.

Each reports the test MSE, the validation MSE (the objective the weights were learned on) and
the learned weights' spread. Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_autoencoder_weights_s50.py --seeds 0 1 \
        --epochs 100 --extra-inits 10 11 --out benchmarks/results/user_recipes/s50_autoencoder.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights


def split(seed: int):
    x = torch.tensor(load_digits().data, dtype=torch.float32) / 16
    g = torch.Generator().manual_seed(seed)
    p = torch.randperm(len(x), generator=g)
    train, val, test = x[p[:1000]], x[p[1000:1300]], x[p[1300:]]
    bad = torch.rand(1000, generator=g) < 0.3
    train = torch.where(bad[:, None], torch.rand(1000, 64, generator=g), train)
    return train, val, test, bad


class AE(pl.LightningModule):
    def __init__(self, per_sample: bool = False, lr: float = 1e-3) -> None:
        super().__init__()
        self.per_sample, self.lr = per_sample, lr
        self.enc = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
        self.dec = nn.Sequential(nn.ReLU(), nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x):
        return torch.sigmoid(self.dec(self.enc(x)))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        loss = F.mse_loss(self(x), x, reduction="none").mean(1)
        if len(batch) == 2:  # fixed weights: (x, ω), self-normalised as the drop-in's
            loss = loss * batch[1] * len(loss) / batch[1].sum().clamp(min=1e-12)
        self.log("train_loss", loss.mean())
        return loss if self.per_sample else loss.mean()

    def validation_step(self, batch, batch_idx):
        x = batch[0]
        self.log("val_loss", F.mse_loss(self(x), x))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def mse(model: nn.Module, x: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float(F.mse_loss(model(x), x))


def fit(seed: int, data, epochs: int, arm: str, weights: torch.Tensor | None = None, **dw: Any):
    train, val, test, bad = data
    torch.manual_seed(seed)
    model = AE(per_sample=arm == "dw")
    cb = None
    if arm == "clean":
        ds = TensorDataset(train[~bad])
    elif arm == "refit_unflagged":  # weights: a mask of the rows flagged() returned
        ds = TensorDataset(train[~weights])
    elif arm == "plain":
        ds = TensorDataset(train)
    elif arm == "dw":
        ds = IndexedDataset(TensorDataset(train))
        cb = LearnedDataWeights(**dw)
    else:
        ds = TensorDataset(train, weights)
    trainer = pl.Trainer(
        max_epochs=epochs, callbacks=[cb] if cb else [], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu",
    )  # fmt: skip
    trainer.fit(
        model,
        DataLoader(ds, batch_size=32, shuffle=True),
        DataLoader(TensorDataset(val), batch_size=300),
    )
    out = {"arm": arm, "seed": seed, "test": mse(model, test), "val": mse(model, val)}
    if cb is not None:
        w = cb.data_weights().detach()
        out.update(
            w_noise=float(w[bad].mean()), w_clean=float(w[~bad].mean()),
            clean_below_half=float((w[~bad] < 0.5).float().mean()),
            below_half=float((w < 0.5).float().mean()),
        )  # fmt: skip
        out["_w"] = w
        out["_flagged"] = cb.flagged()
        # which clean images are down-weighted: their loss under the plain model
        model.eval()
        with torch.no_grad():
            per = F.mse_loss(model(train), train, reduction="none").mean(1)
        c = ~bad
        out["corr_w_loss_clean"] = float(np.corrcoef(w[c].numpy(), per[c].numpy())[0, 1])
        out["corr_w_ink_clean"] = float(np.corrcoef(w[c].numpy(), train[c].mean(1).numpy())[0, 1])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--extra-inits", nargs="*", type=int, default=[10, 11])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        data = split(seed)
        bad = data[3]
        res = {arm: fit(seed, data, args.epochs, arm) for arm in ("clean", "plain", "dw")}
        w = res["dw"].pop("_w")
        flagged = res["dw"].pop("_flagged")
        mask = torch.zeros(len(w), dtype=torch.bool)
        mask[flagged] = True
        res["dw"].update(flagged=int(mask.sum()), flag_precision=float(bad[mask].float().mean()))
        res["refit_unflagged"] = fit(seed, data, args.epochs, "refit_unflagged", mask)
        one = torch.ones_like(w)
        res["fixed_dw"] = fit(seed, data, args.epochs, "fixed", w)
        res["fixed_clean_spread"] = fit(
            seed, data, args.epochs, "fixed", torch.where(bad, 0 * w, w)
        )
        res["fixed_noise_only"] = fit(seed, data, args.epochs, "fixed", torch.where(bad, w, one))
        for init in args.extra_inits:  # the same data, another initialisation and shuffle
            for arm in ("plain", "dw"):
                r = fit(init, data, args.epochs, arm)
                r.pop("_w", None), r.pop("_flagged", None)
                res[f"{arm}_init{init}"] = r
        for name, r in res.items():
            r["arm"], r["data_seed"] = name, seed
            print(json.dumps(r), flush=True)
            rows.append(r)
    if args.out is not None:
        args.out.write_text(json.dumps({"epochs": args.epochs, "records": rows}, indent=1))


if __name__ == "__main__":
    main()
