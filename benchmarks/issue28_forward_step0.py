"""Issue 28, step 0 of the forward sensitivity (session 54's rule): does the decay path's sign
agree with the finite difference of the whole training on digits_small?

The fixed-λ trainings of ``bench_weight_decay.py`` apply decay through SGD's own
``weight_decay=`` (coupled L2 on every parameter, weights and biases) with momentum μ:
g = ∇L(w) + λw, u ← μu + g, w ← w − ηu. Differentiating one step by λ gives the forward
sensitivity z = ∂w/∂λ with the velocity's sensitivity z_u = ∂u/∂λ,

    z_u ← μ z_u + (H z + w + λ z),      z ← z − η z_u,

H = ∇²L(w) of the batch. The *decay path* drops H z (what the candidate of session 54 would
carry), the *exact* one keeps it (a Hessian–vector product per step, ``torch.func.jvp`` of the
gradient). At a checkpoint, dE/d log λ = λ ⟨∇E(w), z⟩.

For each seed and λ: one training at λ carrying both sensitivities (the same trajectory), and
two trainings at λe^{±h} (same seed: same split, initial weights and batch order) for the
central finite difference of the validation and held-out test losses in log λ, (a) at the
base run's best-validation epoch (the derivative z estimates) and (b) at each run's own
best-validation epoch (the checkpoint a user deploys). The best epoch is chosen as
``bench_weight_decay.Classifier`` chooses it: the first epoch of the lowest validation loss.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/issue28_forward_step0.py \\
        --out benchmarks/results/weight_decay/runs/s55_step0/step0.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as bench  # noqa: E402

Params = dict[str, Tensor]
DEFAULT_OUT = bench.REPO / "benchmarks/results/weight_decay/runs/s55_step0/step0.json"


def batch_loader(data: bench.Data, batch_size: int, seed: int) -> DataLoader:
    """The training batches of ``bench_weight_decay.train_once``: the same seed, the same order."""
    return DataLoader(
        TensorDataset(data.X_train, data.y_train),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )


def full_loss(net: nn.Module, params: Params, X: Tensor, y: Tensor) -> Tensor:
    """The mean cross-entropy over a whole set (validation or test)."""
    return F.cross_entropy(functional_call(net, params, (X,)), y)


def inner(a: Params, b: Params) -> float:
    return float(sum((a[k] * b[k]).sum() for k in a))


def train(
    make_net: Callable[[], nn.Module],
    data: bench.Data,
    seed: int,
    lam: float,
    lr: float,
    momentum: float,
    batch_size: int,
    epochs: int,
    track: bool = True,
) -> dict[str, Any]:
    """One SGD training at the fixed decay ``lam`` (torch.optim.SGD's own arithmetic), recording
    per epoch the validation and test losses and, when ``track``, λ⟨∇E, z⟩ for E the validation
    and the test loss and z the decay path's and the exact sensitivity."""
    pl.seed_everything(seed, verbose=False)
    net = make_net()
    names = [n for n, _ in net.named_parameters()]
    w = [p for _, p in net.named_parameters()]
    opt = torch.optim.SGD(w, lr=lr, momentum=momentum, weight_decay=lam)

    def params() -> Params:
        return {n: p.detach() for n, p in zip(names, w, strict=True)}

    def zeros() -> Params:
        return {n: torch.zeros_like(p) for n, p in zip(names, w, strict=True)}

    z_dp, zu_dp, z_ex, zu_ex = zeros(), zeros(), zeros(), zeros()
    curves: dict[str, list[float]] = {k: [] for k in ("val", "test")}
    hyper: dict[str, list[float]] = {k: [] for k in ("dp_val", "ex_val", "dp_test", "ex_test")}
    loader = batch_loader(data, batch_size, seed)  # one generator over all epochs, as Lightning
    for _ in range(epochs):
        for x, y in loader:
            p = params()
            g_fn = grad(lambda q, x=x, y=y: F.cross_entropy(functional_call(net, q, (x,)), y))
            if track:
                g, hz = jvp(g_fn, (p,), (z_ex,))
                for n in names:
                    zu_dp[n] = momentum * zu_dp[n] + p[n] + lam * z_dp[n]
                    zu_ex[n] = momentum * zu_ex[n] + hz[n] + p[n] + lam * z_ex[n]
                    z_dp[n] = z_dp[n] - lr * zu_dp[n]
                    z_ex[n] = z_ex[n] - lr * zu_ex[n]
            else:
                g = g_fn(p)
            for n, q in zip(names, w, strict=True):
                q.grad = g[n].detach().clone()
            opt.step()
        p = params()
        for split, X, y in (("val", data.X_val, data.y_val), ("test", data.X_test, data.y_test)):
            curves[split].append(float(full_loss(net, p, X, y)))
            if track:
                dE = grad(lambda q, X=X, y=y: full_loss(net, q, X, y))(p)
                hyper[f"dp_{split}"].append(lam * inner(dE, z_dp))
                hyper[f"ex_{split}"].append(lam * inner(dE, z_ex))
    return dict(lam=lam, **{f"{k}_curve": v for k, v in curves.items()},
                best_epoch=best_epoch(curves["val"]), **(hyper if track else {}))  # fmt: skip


def best_epoch(val_curve: list[float]) -> int:
    """``Classifier``'s deployed epoch (1-based): the first of the lowest validation loss."""
    best, epoch = math.inf, -1
    for i, v in enumerate(val_curve):
        if v < best:  # NaN never improves
            best, epoch = v, i + 1
    return epoch


def central_difference(plus: dict[str, Any], minus: dict[str, Any], split: str, h: float,
                       epoch: int | None) -> float:  # fmt: skip
    """(E(λe^h) − E(λe^−h)) / 2h at ``epoch`` (1-based), or at each run's own best epoch."""
    ep, em = (epoch, epoch) if epoch else (plus["best_epoch"], minus["best_epoch"])
    return (plus[f"{split}_curve"][ep - 1] - minus[f"{split}_curve"][em - 1]) / (2 * h)


def step0_cell(s: bench.Setting, data: bench.Data, seed: int, lam: float, h: float) -> dict:
    """One (seed, λ): (a) decay path, (b) exact, (c) the finite difference of the validation
    loss, (d) of the test loss, all in d/d log λ at the base run's best-validation epoch."""

    def run(lam_: float, track: bool) -> dict[str, Any]:
        def make_net() -> nn.Module:
            return bench.make_network(s.model)

        return train(make_net, data, seed, lam_, s.lr, s.momentum, s.batch_size, s.epochs, track)

    base = run(lam, True)
    plus, minus = run(lam * math.exp(h), False), run(lam * math.exp(-h), False)
    e = base["best_epoch"]
    return dict(
        seed=seed, lam=lam, h=h, best_epoch=e,
        best_epoch_plus=plus["best_epoch"], best_epoch_minus=minus["best_epoch"],
        val_at_best=base["val_curve"][e - 1], test_at_best=base["test_curve"][e - 1],
        a_decay_path=base["dp_val"][e - 1], b_exact=base["ex_val"][e - 1],
        c_fd_val_same_epoch=central_difference(plus, minus, "val", h, e),
        c_fd_val_own_best=central_difference(plus, minus, "val", h, None),
        d_fd_test_same_epoch=central_difference(plus, minus, "test", h, e),
        d_fd_test_own_best=central_difference(plus, minus, "test", h, None),
        decay_path_test=base["dp_test"][e - 1], exact_test=base["ex_test"][e - 1],
        base=base, plus=plus, minus=minus,
    )  # fmt: skip


def verdict(cells: list[dict[str, Any]], lam: float) -> dict[str, Any]:
    """The rule's step 0: GO only if, at ``lam``, the decay path's sign agrees with the finite
    difference of the validation loss (at the base run's best epoch) on ≥ 2 of 3 seeds and says
    "more decay" (a negative d/d log λ) there. The same count for the exact sensitivity."""
    at = [c for c in cells if c["lam"] == lam]

    def count(key: str, fd: str) -> int:
        return sum(1 for c in at if c[key] < 0 and c[fd] < 0)

    def agree(key: str, fd: str) -> int:
        return sum(1 for c in at if (c[key] < 0) == (c[fd] < 0))

    out = {
        f"{k}_{fd}": dict(agree=agree(k, fd), agree_and_more_decay=count(k, fd))
        for k in ("a_decay_path", "b_exact") for fd in ("c_fd_val_same_epoch", "c_fd_val_own_best")
    }  # fmt: skip
    out["GO"] = out["a_decay_path_c_fd_val_same_epoch"]["agree_and_more_decay"] >= 2
    out["seeds"] = len(at)
    return out


def check_against_lightning(s: bench.Setting, data: bench.Data, seed: int, lam: float) -> float:
    """The largest difference of the validation curve of :func:`train` from the benchmark's own
    Lightning training (``bench_weight_decay.train_once``) at the same seed and λ."""
    rec = bench.train_once(s, data, seed, weight_decay=lam)
    mine = train(lambda: bench.make_network(s.model), data, seed, lam, s.lr, s.momentum,
                 s.batch_size, s.epochs, track=False)  # fmt: skip
    return max(abs(a - b) for a, b in zip(rec["val_curve"], mine["val_curve"], strict=True))


def table(cells: list[dict[str, Any]]) -> str:
    head = ("| seed | λ | best epoch (−/0/+) | (a) decay path | (b) exact | "
            "(c) FD val, same epoch | (c) FD val, own best | (d) FD test, same epoch | "
            "(d) FD test, own best |")  # fmt: skip
    lines = [head, "|" + "---|" * 9]
    for c in cells:
        lines.append(
            f"| {c['seed']} | {c['lam']:.2g} | {c['best_epoch_minus']}/{c['best_epoch']}/"
            f"{c['best_epoch_plus']} | {c['a_decay_path']:+.4f} | {c['b_exact']:+.4f} | "
            f"{c['c_fd_val_same_epoch']:+.4f} | {c['c_fd_val_own_best']:+.4f} | "
            f"{c['d_fd_test_same_epoch']:+.4f} | {c['d_fd_test_own_best']:+.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lams", type=float, nargs="+", default=[1.3e-4, 2e-3])
    ap.add_argument("--h", type=float, default=0.25, help="the finite difference's step in log λ")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--verdict-file", type=Path, default=None,
                    help="also write GO / NO-GO and the numbers to this text file")  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    s = bench.SETTINGS["digits_small"]
    start = time.perf_counter()
    data0 = bench.make_data(s, bench.DEFAULT_DATA, args.seeds[0])
    lightning_diff = check_against_lightning(s, data0, args.seeds[0], args.lams[0])
    print(f"max |val curve − Lightning's| = {lightning_diff:.2e}", flush=True)
    cells = []
    for seed in args.seeds:
        data = bench.make_data(s, bench.DEFAULT_DATA, seed)
        for lam in args.lams:
            c = step0_cell(s, data, seed, lam, args.h)
            cells.append(c)
            print(table([c]).splitlines()[-1], flush=True)
    v = verdict(cells, args.lams[0])
    text = table(cells)
    print(text)
    print(json.dumps(v, indent=1))
    result = dict(
        benchmark="issue28_forward_step0", setting="digits_small", seeds=args.seeds,
        lams=args.lams, h=args.h, command=" ".join(["python", *sys.argv]),
        lightning_max_val_diff=lightning_diff, verdict=v, table_markdown=text,
        wall_s=time.perf_counter() - start,
        cells=[{k: x for k, x in c.items() if k not in ("base", "plus", "minus")} for c in cells],
        curves=[{k: c[k] for k in ("seed", "lam", "base", "plus", "minus")} for c in cells],
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    if args.verdict_file:
        args.verdict_file.parent.mkdir(parents=True, exist_ok=True)
        args.verdict_file.write_text(f"{'GO' if v['GO'] else 'NO-GO'}\n" + verdict_lines(cells, v))
    return result


def verdict_lines(cells: list[dict[str, Any]], v: dict[str, Any]) -> str:
    lines = ["digits_small, d/d log λ at the base run's best-validation epoch "
             "(negative = more decay lowers the loss); FD h = 0.25 in log λ"]  # fmt: skip
    for c in cells:
        lines.append(
            f"seed {c['seed']} λ {c['lam']:.2g} ep {c['best_epoch']}: (a) decay path "
            f"{c['a_decay_path']:+.4f}  (b) exact {c['b_exact']:+.4f}  (c) FD val same-ep "
            f"{c['c_fd_val_same_epoch']:+.4f} own-best {c['c_fd_val_own_best']:+.4f}  "
            f"(d) FD test same-ep {c['d_fd_test_same_epoch']:+.4f} own-best "
            f"{c['d_fd_test_own_best']:+.4f}"
        )
    lines.append(json.dumps({k: x for k, x in v.items()}))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
