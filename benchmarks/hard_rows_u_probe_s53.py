"""Session 53, a hand probe: each training row's first-order evidence on 20 Newsgroups.

Fits plain on the noisy rows (``bench_dw_accuracy_s52.fit``), then, with the network in eval
mode, reads v = ∇E of the default objective (``ExpectedError(q=0.5)``) on the whole clean
validation set and on 8 random splits of it into halves A / B, and every training row's
uⱼ = ⟨∇ℓⱼ, v⟩ (no adjoint), centred on the mean of its noisy label's class. Prints, for the
corrupted rows, the clean rows of the lowest within-class quartile of the plain margin ("hard")
and the other clean rows: the mean of u and its share below 0, the halves' sign agreement and
the split-half reliability mean uᴬuᴮ / mean (uᴬ² + uᴮ²)/2.

Usage (repository root, one thread)::

    OMP_NUM_THREADS=1 python benchmarks/hard_rows_u_probe_s53.py --seed 10 --init 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_dw_accuracy_s52 as s52  # noqa: E402
import bench_user_recipes_s50 as s50  # noqa: E402


def soft_error(losses: torch.Tensor, q: float = 0.5) -> torch.Tensor:
    return (-torch.expm1(-q * losses)).mean() / q


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--init", type=int, default=10)
    p.add_argument("--splits", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    setup = s52.setup_for("news_bag", args.data, args.seed)
    noisy, bad = setup.noisy_train()
    bad = bad.numpy()
    model, _, _ = s52.fit(setup, noisy, "plain", args.init, {})
    model.eval()
    params = [q for q in model.parameters() if q.requires_grad]

    def grad(loss: torch.Tensor) -> torch.Tensor:
        g = torch.autograd.grad(loss, params, retain_graph=True)
        return torch.cat([x.reshape(-1) for x in g])

    tokens, offsets, yv = s50.bag_collate([setup.val[i] for i in range(len(setup.val))])
    lv = F.cross_entropy(model(tokens, offsets), yv, reduction="none")
    rng = np.random.default_rng(0)
    v = grad(soft_error(lv))
    halves = []
    for _ in range(args.splits):
        perm = rng.permutation(len(yv))
        a, b = perm[: len(yv) // 2], perm[len(yv) // 2 :]
        halves.append((grad(soft_error(lv[a])), grad(soft_error(lv[b]))))
    yc, yn = setup.train[:][1].numpy(), noisy[:][1].numpy()
    n = len(yn)
    u, ua, ub, margin = (
        np.zeros(n),
        np.zeros((args.splits, n)),
        np.zeros((args.splits, n)),
        np.zeros(n),
    )
    for j in range(n):
        t, o, y = s50.bag_collate([noisy[j]])
        z = model(t, o)
        g = grad(F.cross_entropy(z, y))
        u[j] = float(g @ v)
        for s, (va, vb) in enumerate(halves):
            ua[s, j], ub[s, j] = float(g @ va), float(g @ vb)
        margin[j] = float(s52.margins(z.detach(), torch.tensor([int(yc[j])]))[0])
    for c in range(int(yc.max()) + 1):  # centred on the noisy label's class (the class gauge)
        s = yn == c
        u[s] -= u[s].mean()
        ua[:, s] -= ua[:, s].mean(1, keepdims=True)
        ub[:, s] -= ub[:, s].mean(1, keepdims=True)
    good = ~bad
    hard = np.zeros(n, dtype=bool)
    for c in range(int(yc.max()) + 1):
        gc = good & (yc == c)
        hard |= gc & (margin < np.quantile(margin[gc], 0.25))
    for name, s in (
        ("corrupted", bad),
        ("clean, hard quartile", hard),
        ("clean, rest", good & ~hard),
    ):
        prod, sq = (ua * ub)[:, s], ((ua**2 + ub**2) / 2)[:, s]
        print(
            f"{name:22s} n={s.sum():4d}  mean u {u[s].mean():+.4f}"
            f"  share u<0 {(u[s] < 0).mean():.2f}"
            f"  |u| {np.abs(u[s]).mean():.4f}  halves' signs agree "
            f"{(np.sign(ua[:, s]) == np.sign(ub[:, s])).mean():.2f}  reliability "
            f"{prod.mean() / sq.mean():+.2f}"
        )


if __name__ == "__main__":
    main()
