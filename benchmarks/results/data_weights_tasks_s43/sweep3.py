# ruff: noqa
"""Session 43, helper dwrecipes: the sweep behind docs/data_weights.md "Other tasks (session 43)"
(a record of the runs, not library code; the same toys are tested in tests/test_data_weights_tasks.py).
Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/data_weights_tasks_s43/sweep3.py ARG
(see the docs section for the arguments)."""

import sys

sys.argv = [sys.argv[0], "none"] + sys.argv[1:]
exec(open(__file__.rsplit("/", 1)[0] + "/sweep.py").read().split("which = sys.argv[1]")[0])
which = sys.argv[2]
mse = lambda z, y: F.mse_loss(z, y, reduction="none")
if which == "mse":
    for name, kw in [
        ("base", {}),
        ("40ep", {"epochs": 40}),
        ("forward_mode", {"directional": "forward_mode"}),
        ("hyper_step", {"cross_term": "hyper_step"}),
        ("sgd-ish normalize=False", {"normalize": False}),
    ]:
        X, Y, Xv, Yv = reg_data(1, 1.0)
        r = run(Reg(mse, 1, True), X, Y, Xv, Yv, objective="mean_loss", **kw)
        report(f"mse D=1 {name}", *r)
    # smaller outliers
    X, Y, Xv, Yv = reg_data(1, 1.0)
    Y[:BAD] = Y[:BAD] - 4.0 * torch.sign(Y[:BAD] - (X[:BAD] @ torch.zeros(4, 1)))  # no-op-ish
import math


class Mix(pl.LightningModule):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )
        self.mode = mode

    def training_step(self, b, i):
        x, y = b
        perm = torch.randperm(len(y))
        lam = torch.distributions.Beta(1.0, 1.0).sample((len(y),))
        if self.mode == "max":
            lam = torch.maximum(lam, 1 - lam)
        z = self.net(lam[:, None] * x + (1 - lam[:, None]) * x[perm])
        return lam * F.cross_entropy(z, y, reduction="none") + (1 - lam) * F.cross_entropy(
            z, y[perm], reduction="none"
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


if which == "mix":
    sys.path.insert(0, "tests")
    from test_data_weights_recipes import blobs

    X, Y, Xv, Yv = blobs()
    for mode in ("beta11", "max"):
        r = run(Mix(mode), X, Y, Xv, Yv)
        report(f"mixup {mode}", *r)
if which == "mse2":
    for name, kw in [
        ("row_scale=batch", {"row_scale": "batch"}),
        ("row_scale=False", {"row_scale": False}),
        ("normalize=False", {"normalize": False}),
        ("normalize=False D3", {"normalize": False, "D": 3}),
    ]:
        D = kw.pop("D", 1)
        X, Y, Xv, Yv = reg_data(D, 1.0)
        r = run(Reg(mse, D, D == 1), X, Y, Xv, Yv, objective="mean_loss", **kw)
        report(f"mse D={D} {name}", *r)
    X, Y, Xv, Yv = reg_data(3, 30.0)
    r = run(Reg(mse, 3, False), X, Y, Xv, Yv, objective="mean_loss", normalize=False)
    report(f"mse D=3 scale30 normalize=False", *r)
