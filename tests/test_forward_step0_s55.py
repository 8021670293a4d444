"""``benchmarks/issue28_forward_step0.py``: its exact forward sensitivity through SGD with
momentum and coupled L2 equals the central finite difference of a whole float64 training."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from problems import import_from
from torch import nn

step0 = import_from(Path(__file__).resolve().parents[1] / "benchmarks", "issue28_forward_step0")
bench = step0.bench


def _problem() -> tuple[object, dict]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (60,), generator=g)
    data = bench.Data(X[:24], y[:24], X[24:42], y[24:42], X[42:], y[42:])

    def make_net() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()

    return data, dict(make_net=make_net, seed=1, lr=0.2, momentum=0.9, batch_size=8, epochs=4)


def test_exact_sensitivity_is_the_finite_difference_of_the_whole_training() -> None:
    data, kw = _problem()
    lam, h = 0.05, 1e-5
    base = step0.train(data=data, lam=lam, **kw)
    plus = step0.train(data=data, lam=lam * math.exp(h), track=False, **kw)
    minus = step0.train(data=data, lam=lam * math.exp(-h), track=False, **kw)
    for split in ("val", "test"):
        for e in range(kw["epochs"]):
            fd = (plus[f"{split}_curve"][e] - minus[f"{split}_curve"][e]) / (2 * h)
            assert abs(base[f"ex_{split}"][e] - fd) <= 1e-7 + 1e-6 * abs(fd), (split, e)
    # the decay path alone (H z dropped) is not the whole derivative here: the test can tell
    fd = (plus["val_curve"][-1] - minus["val_curve"][-1]) / (2 * h)
    assert abs(base["dp_val"][-1] - fd) > 1e-3 * abs(fd)


def test_same_seed_same_trajectory_and_best_epoch() -> None:
    data, kw = _problem()
    a = step0.train(data=data, lam=0.01, track=False, **kw)
    b = step0.train(data=data, lam=0.01, **kw)
    # carrying the sensitivities (the gradient through jvp) moves the weights by rounding only
    assert max(abs(u - v) for u, v in zip(a["val_curve"], b["val_curve"], strict=True)) < 1e-12
    assert step0.best_epoch([3.0, 1.0, 2.0, 1.0, math.nan]) == 2
