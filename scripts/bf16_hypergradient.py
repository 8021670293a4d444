"""Is a hypergradient computed under bf16 autocast close enough to the fp32 one? (session 42)

The core ``SIDHyperOptimizer`` with its defaults (t = 100, k = 50) on the digits, weight decay
one log λ per tensor (tests/test_core_networks.py's set-up), an MLP and a CNN with BatchNorm,
after 3 fp32 hyper steps. From the same saved state (w, BatchNorm buffers, λ, the warm-start v,
the constants), on the same minibatches, the hypergradient is computed:

* fp32 on minibatches A (the reference) and on minibatches B (the estimator's own noise);
* under ``torch.autocast("cpu", torch.bfloat16)`` around the call (as a user of the core who
  calls it inside an autocast region) on A;
* on A with autocast inside the network's forward (a user's ``with torch.autocast`` block in
  ``forward``), when ``--forward`` is given.

Prints the cosine and the relative error of each against the fp32 one on A.
Run: ``OMP_NUM_THREADS=1 PYTHONPATH=$PWD python scripts/bf16_hypergradient.py --seeds 0 1 2``
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from hypertorch_sid import SIDConfig, SIDHyperOptimizer


class AutocastForward(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.on = net, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16, enabled=self.on):
            return self.net(x).float()


def nets() -> dict[str, nn.Module]:
    return {
        "mlp": nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
        "cnn": nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8),
            nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10),
        ),
    }  # fmt: skip


def batches(X: torch.Tensor, y: torch.Tensor, seed: int, n: int = 400) -> list:
    gen = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        perm = torch.randperm(len(y), generator=gen)
        out += [(X[perm[i : i + 32]], y[perm[i : i + 32]]) for i in range(0, len(y) - 31, 32)]
    return out[:n]


def flat(g: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in g])


def compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    return float(F.cosine_similarity(a, b, dim=0)), float((a - b).norm() / b.norm())


def run(kind: str, seed: int, forward: bool) -> dict[str, tuple[float, float]]:
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    Xtr, ytr, Xva, yva = X[:1000], y[:1000], X[1000:], y[1000:]
    torch.manual_seed(seed)
    net = AutocastForward(nets()[kind])
    params = list(net.parameters())
    log_lam = torch.full((len(params),), math.log(1e-3), requires_grad=True)

    def inner(batch):
        x, t = batch
        decay = sum(lam.exp() * (p**2).sum() for lam, p in zip(log_lam, params))
        return F.cross_entropy(net(x), t) + 0.5 * decay

    hopt = SIDHyperOptimizer(
        [log_lam], params, inner, lambda b: F.cross_entropy(net(b[0]), b[1]),
        torch.optim.Adam([log_lam], lr=0.1), module=net, config=SIDConfig(),
    )  # fmt: skip
    warm = batches(Xtr, ytr, 100 + seed, 2000)
    for _ in range(3):
        hopt.step(warm, (Xva, yva))
    saved = (copy.deepcopy(net.state_dict()), copy.deepcopy(hopt.state_dict()))

    def hypergradient(data_seed: int, around: bool, inside: bool) -> torch.Tensor:
        net.load_state_dict(saved[0])
        hopt.load_state_dict(copy.deepcopy(saved[1]))
        net.on = inside
        torch.manual_seed(1234)
        ctx = torch.autocast("cpu", torch.bfloat16) if around else contextlib.nullcontext()
        with ctx:
            g = hopt.hypergradient(batches(Xtr, ytr, data_seed), (Xva, yva))
        net.on = False
        return flat(g)

    ref = hypergradient(1, False, False)
    out = {
        "fp32, other minibatches": compare(hypergradient(2, False, False), ref),
        "autocast bf16 around the call": compare(hypergradient(1, True, False), ref),
    }
    if forward:
        out["autocast bf16 inside forward"] = compare(hypergradient(1, False, True), ref)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--kinds", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--forward", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for kind in args.kinds:
        for seed in args.seeds:
            for what, (cos, rel) in run(kind, seed, args.forward).items():
                print(f"{kind} seed {seed} {what:32s} cosine {cos:+.4f} relative error {rel:.3f}")


if __name__ == "__main__":
    main()
