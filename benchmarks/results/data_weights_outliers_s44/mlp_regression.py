# ruff: noqa
"""Session 44 (mse44): LearnedDataWeights on an MLP regression with outlying targets, gauge
"auto" (now "mean_logit" for real targets) against "batch" (the code before), 3 seeds.
Friedman #1 (sklearn.datasets.make_friedman1: 10 features, 5 of them used, nonlinear; noise 1),
targets standardised on the clean training set; 2000 training examples of which the first 400
(20 %) have their target moved by +-5 standard deviations; 500 clean validation, 2000 clean test
examples. MLP 10-64-64-1 (ReLU), Adam 1e-3, batch 64, EPOCHS epochs; the drop-in with its
defaults and objective="mean_loss" (a regression needs it). Also "plain" (no weights) and
"oracle" (the outliers removed). Prints per run: the outliers' / clean mean weight, flagged()
with precision / recall, the clean test MSE.
Run from the repository root:
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/data_weights_outliers_s44/mlp_regression.py LOSS EPOCHS SEEDS... [--arms ...]"""

import sys, warnings, logging, time

sys.path.insert(0, "tests")
import torch, torch.nn.functional as F, pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from sklearn.datasets import make_friedman1
from lightning_problems import trainer
from hypertorch_sid import IndexedDataset, LearnedDataWeights

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning").setLevel(logging.ERROR)
N, BAD, NV, NT = 2000, 400, 500, 2000
loss = sys.argv[1]
epochs = int(sys.argv[2])
args = sys.argv[3:]
arms = ["plain", "oracle", "batch", "auto"]
if "--arms" in args:
    i = args.index("--arms")
    arms, args = args[i + 1 :], args[:i]
seeds = [int(s) for s in args]
LF = {"mse": F.mse_loss, "huber": F.huber_loss, "l1": F.l1_loss}[loss]


def data(seed):
    X, y = make_friedman1(N + NV + NT, noise=1.0, random_state=seed)
    X, y = torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    mu, sd = y[:N].mean(), y[:N].std()
    y = (y - mu) / sd
    X = (X - 0.5) / 0.29
    g = torch.Generator().manual_seed(seed)
    y[:BAD] += 5.0 * torch.sign(torch.randn(BAD, generator=g))
    return X[:N], y[:N], X[N : N + NV], y[N : N + NV], X[N + NV :], y[N + NV :]


class Reg(pl.LightningModule):
    def __init__(self, seed, per_sample):
        super().__init__()
        self.per_sample = per_sample
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(10, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 1),
        )

    def training_step(self, b, i):
        x, y = b
        out = LF(self.net(x)[:, 0], y, reduction="none")
        return out if self.per_sample else out.mean()

    def validation_step(self, b, i):
        pass

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


for seed in seeds:
    X, Y, Xv, Yv, Xt, Yt = data(seed)
    for arm in arms:
        t0 = time.process_time()
        keep = torch.arange(BAD if arm == "oracle" else 0, N)
        tl = DataLoader(
            IndexedDataset(TensorDataset(X[keep], Y[keep]))
            if arm in ("batch", "auto")
            else TensorDataset(X[keep], Y[keep]),
            batch_size=64,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )
        model = Reg(seed, arm in ("batch", "auto"))
        cbs = []
        if arm in ("batch", "auto"):
            cb = LearnedDataWeights(objective="mean_loss", gauge=arm, seed=seed)
            cbs = [cb]
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            trainer(cbs, max_epochs=epochs).fit(
                model, tl, DataLoader(TensorDataset(Xv, Yv), batch_size=NV)
            )
            fl = cb.flagged() if cbs else None
        with torch.no_grad():
            test = float(F.mse_loss(model.net(Xt)[:, 0], Yt))
        line = f"{loss} seed {seed} {arm:6s}: test MSE {test:.4f}"
        if cbs:
            w = cb.data_weights()
            tp = int((fl < BAD).sum())
            said = sorted({str(x.message)[:70] for x in ws if "flagged" in str(x.message)})
            line += (
                f" | gauge {cb.problem.weights.gauge} omega out {w[:BAD].mean():.3f} clean {w[BAD:].mean():.3f}"
                f" | flagged {len(fl)} ({tp} outliers): precision {tp / max(len(fl), 1):.2f} recall {tp / BAD:.2f} {said}"
            )
        print(line + f" | {time.process_time() - t0:.0f} cpu s", flush=True)
