"""The drop-in on the networks people train: MLPs (ReLU, tanh), a CNN with BatchNorm; SGD, SGD with
momentum, Adam, AdamW; each granularity; several seeds.

A convex oracle proves the maths; these prove the product: every run finishes (no
DivergenceError escapes with the defaults), λ stays finite and inside what the optimizer can train,
hypergradients stay bounded, the weights stay finite, and the validation loss is not worse than the
same training without weight decay.
"""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_cnn, digits_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import GaussNewton, LearnedWeightDecay

sklearn = pytest.importorskip("sklearn.datasets")


def _digits():
    return digits_split(600, 300, seed=0)


DATA = None


class Net(pl.LightningModule):
    def __init__(self, kind: str, optimizer: str):
        super().__init__()
        self.kind, self.optimizer = kind, optimizer
        if kind == "cnn":
            self.net = digits_cnn()
        else:
            act = nn.ReLU if kind == "mlp_relu" else nn.Tanh
            self.net = nn.Sequential(nn.Linear(64, 64), act(), nn.Linear(64, 64), act(),
                                     nn.Linear(64, 10))  # fmt: skip

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        p = self.parameters()
        return {
            "sgd": lambda: torch.optim.SGD(p, lr=0.1),
            "momentum": lambda: torch.optim.SGD(p, lr=0.05, momentum=0.9),
            "adam": lambda: torch.optim.Adam(p, lr=3e-3),
            "adamw": lambda: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        }[self.optimizer]()


def _fit(kind, optimizer, seed, callback=None):
    global DATA
    if DATA is None:
        DATA = _digits()
    X, y, Xv, yv = DATA
    pl.seed_everything(seed, verbose=False)
    model = Net(kind, optimizer)
    if callback is not None and not isinstance(callback, pl.Callback):
        callback = callback(model)  # a factory of the model
    trainer = pl.Trainer(
        max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback] if callback else [],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(
            model,
            DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(Xv, yv), batch_size=300),
        )
    return model, float(trainer.callback_metrics["val_loss"])


MATRIX = [
    (kind, opt, gran)
    for i, (kind, opt) in enumerate(
        (k, o)
        for k in ("mlp_relu", "mlp_tanh", "cnn")
        for o in ("sgd", "momentum", "adam", "adamw")
    )
    for gran in [("global", "per_layer", "per_element")[i % 3]]
]


@pytest.mark.parametrize("kind,optimizer,granularity", MATRIX)
def test_drop_in_trains_every_network_without_harm(kind, optimizer, granularity):
    for seed in (0, 1):
        cb = LearnedWeightDecay(
            1e-3,
            granularity=granularity,
            decoupled=optimizer == "adamw",
            every_n_steps=5,
            max_overhead=None,
        )
        model, val = _fit(kind, optimizer, seed, cb)
        _, plain = _fit(kind, optimizer, seed)
        assert cb.history, "no hyper step ran"
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
        assert torch.isfinite(lam).all() and (lam > 0).all()
        bounds = cb.problem.stability.bounds()
        assert float(lam.max()) <= max(bounds) * (1 + 1e-6)
        norms = [h["hyper/hypergradient_norm"] for h in cb.history]
        assert all(math.isfinite(n) and n < 1e3 for n in norms), norms
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert val <= plain * 1.05 + 0.02, (val, plain)


def test_lambda_is_kept_inside_what_the_optimizer_can_train():
    """A huge outer step would push λ past SGD's limit 2(1+m)/lr: it is clamped at (1+m)/lr."""
    cb = LearnedWeightDecay(1e-3, granularity="per_element", every_n_steps=2, outer_lr=50.0)
    model, _ = _fit("mlp_relu", "momentum", 0, cb)
    lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
    assert float(lam.max()) <= (1 + 0.9) / 0.05 * (1 + 1e-6)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    "kind,optimizer", [("mlp_relu", "sgd"), ("mlp_tanh", "adam"), ("cnn", "momentum")]
)
def test_drop_in_with_gauss_newton_products(kind, optimizer):
    """``hvp=GaussNewton(outputs, output_loss)`` through the drop-in, which adds its own decay as
    the regularizer: every run finishes, λ stays finite, hypergradients stay bounded and the
    validation loss is not worse than without weight decay."""
    made = []

    def callback(model):
        made.append(LearnedWeightDecay(
            1e-3, granularity="per_layer", every_n_steps=5,
            hvp=GaussNewton(lambda b: model.net(b[0]), lambda z, b: F.cross_entropy(z, b[1])),
            max_overhead=None,
        ))  # fmt: skip
        return made[-1]

    for seed in (0, 1):
        model, val = _fit(kind, optimizer, seed, callback)
        _, plain = _fit(kind, optimizer, seed)
        cb = made[-1]
        assert cb.history, "no hyper step ran"
        assert cb.sid.config.hvp.regularizer is not None  # the drop-in's decay, exact Hessian
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
        assert torch.isfinite(lam).all() and (lam > 0).all()
        norms = [h["hyper/hypergradient_norm"] for h in cb.history]
        assert all(math.isfinite(n) and n < 1e3 for n in norms), norms
        assert val <= plain * 1.05 + 0.02, (val, plain)
