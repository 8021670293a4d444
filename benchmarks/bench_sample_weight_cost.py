"""What does a hyper step cost as the number n of per-sample weights grows (10³ … 10⁶)?

One ``SIDHyperOptimizer`` step on a weighted logistic model (784 → 10, batch 64; a data set of n
examples, sample i = a fixed pool's sample i mod 1000 with its own weight xᵢ): t = 5 inner steps,
k = 5 adjoint steps, J = 1 batch for the cross term ∂₂Φ̂ᵀv, α fixed (no curvature estimate), then
the outer step with

* ``sgd``        ``torch.optim.SGD`` on the row-sparse hypergradient (``SampleWeights(n,
                 sparse_grad=True)``): only the batch's rows move;
* ``adam``       ``torch.optim.Adam`` on the dense hypergradient (it refuses sparse ones): every
                 row keeps moving by its momentum after its batch (n rows change per step) and
                 its update passes over all n several times;
* ``lazy_adam``  :class:`~hypertorch_sid.core.sample_weights.LazyAdam` on the row-sparse
                 hypergradient: only the rows read move, O(rows) arithmetic;
* ``mean_logit`` ``LazyAdam`` as above on ``SampleWeights(n, gauge="mean_logit")`` (the
                 self-normalised loss, ``normalize=True``; the gauge the Lightning drop-in picks
                 for real-valued targets): the mean logit is held at x₀ after every outer step;
* ``softmax``    ``LazyAdam`` as above on ``SampleWeights(n, "softmax")``: the normaliser
                 log Z = logsumexp(x) follows the logits after every outer step.

``--dense`` gives every optimizer the dense n-vector hypergradient (``sparse_grad=False``, the
family's default): ``sgd`` and ``lazy_adam`` then pass over n (LazyAdam scans for the non-zero
rows) and ``SIDHyperOptimizer``'s checks read all n rows.

Measured per n and optimizer (median over ``--steps`` steps after 3 warm-up steps): the
hypergradient's time (inner + adjoint + cross term: the rows are gathered with ``index_select``,
whose backward is sparse, or with ``--dense`` an ``index_add`` into an n-vector), the outer
step's time (``apply``: optimizer and
SIDHyperOptimizer's own checks), and the storage of the weights + optimizer state (bytes). Each n
runs in its own process, which also reports its peak resident memory.

Outputs: JSON (``--out``, default
``benchmarks/results/sample_weight_cost/sample_weight_cost.json``) and a PNG next
to it.

Usage (from the repository root)::

    python benchmarks/bench_sample_weight_cost.py                 # n = 1e3, 1e4, 1e5, 1e6
    python benchmarks/bench_sample_weight_cost.py --sizes 1000 1000000 --steps 10
    python benchmarks/bench_sample_weight_cost.py --device cuda   # on a GPU (peak GPU memory too)
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypertorch_sid import (  # noqa: E402
    FeasibleSet,
    Indexed,
    LazyAdam,
    SampleWeights,
    SIDConfig,
    SIDHyperOptimizer,
)

#: optimizers that take the row-sparse hypergradient (the others get the dense one)
SPARSE = {"sgd", "lazy_adam", "mean_logit", "softmax"}

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=1.0),
    "adam": lambda params: torch.optim.Adam(params, lr=0.1),
    "lazy_adam": lambda params: LazyAdam(params, lr=0.1),
    "mean_logit": lambda params: LazyAdam(params, lr=0.1),
    "softmax": lambda params: LazyAdam(params, lr=0.1),
}

#: the family each run learns: (parameterization, gauge, weighted_mean's normalize)
FAMILIES = {
    "mean_logit": ("sigmoid", "mean_logit", True),
    "softmax": ("softmax", "batch", False),
}


def measure(
    n: int, optimizer: str, steps: int, batch: int = 64, dense: bool = False, device: str = "cpu"
) -> dict[str, Any]:
    torch.manual_seed(0)
    pool_X = torch.randn(1000, 784).to(device)
    pool_y = torch.randint(0, 10, (1000,)).to(device)
    parameterization, gauge, normalize = FAMILIES.get(optimizer, ("sigmoid", "batch", False))
    weights = SampleWeights(
        n,
        parameterization,
        sparse_grad=optimizer in SPARSE and not dense,
        device=device,
        gauge=gauge,
    )
    W = torch.zeros(784, 10, device=device, requires_grad=True)
    gen = torch.Generator().manual_seed(1)
    cuda = torch.device(device).type == "cuda"

    def clock() -> float:  # after the device's queued work (CUDA is asynchronous)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def batches():
        while True:
            idx = torch.randint(0, n, (batch,), generator=gen).to(device)
            yield Indexed(idx, (pool_X[idx % 1000], pool_y[idx % 1000]))

    def inner(b):
        idx, (X, y) = b
        losses = F.cross_entropy(X @ W, y, reduction="none")
        return weights.weighted_mean(losses, idx, normalize) + 1e-3 * (W**2).sum()

    def outer(b):
        X, y = b
        return F.cross_entropy(X @ W, y)

    hopt = SIDHyperOptimizer(
        weights.hyperparameters,
        [W],
        inner,
        outer,
        OPTIMIZERS[optimizer](weights.hyperparameters),
        config=SIDConfig(
            inner_steps=5,
            adjoint_steps=5,
            alpha=0.01,
            step_size="constant",
            eta=1.0,
            feasible_set=FeasibleSet(project=weights.projection),
        ),
    )
    stream, val = batches(), (pool_X[:256], pool_y[:256])
    grad_s, apply_s = [], []
    moved = torch.zeros(n, dtype=torch.bool, device=device)  # the rows a hypergradient named
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in range(steps + 3):
        t0 = clock()
        g = hopt.hypergradient(stream, val)
        t1 = clock()
        hopt.apply(g)
        t2 = clock()
        rows = g[0].coalesce().indices()[0] if g[0].is_sparse else torch.nonzero(g[0]).flatten()
        moved[rows] = True
        if step >= 3:
            grad_s.append(t1 - t0)
            apply_s.append(t2 - t1)
    state = [x for s in hopt.outer_optimizer.state.values() for x in s.values()]
    storage = weights.logits.element_size() * n + sum(
        x.numel() * x.element_size() for x in state if isinstance(x, torch.Tensor)
    )
    return {
        "n": n, "optimizer": optimizer, "sparse_grad": weights.sparse_grad,
        "hypergradient_ms": 1e3 * statistics.median(grad_s),
        "outer_step_ms": 1e3 * statistics.median(apply_s),
        "hyper_step_ms": 1e3 * statistics.median(a + b for a, b in zip(grad_s, apply_s)),
        "storage_bytes": storage, "rows_moved": int(moved.sum()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "device": device,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }  # fmt: skip


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name in OPTIMIZERS:
        rows = [r for r in results["runs"] if r["optimizer"] == name]
        ns = [r["n"] for r in rows]
        axes[0].plot(ns, [r["hyper_step_ms"] for r in rows], "o-", label=name)
        axes[1].plot(ns, [r["outer_step_ms"] for r in rows], "o-", label=name)
        axes[2].plot(ns, [r["storage_bytes"] / 2**20 for r in rows], "o-", label=name)
    titles = ("hyper step (ms)", "of which the outer step (ms)", "weights + optimizer state (MiB)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log")
        ax.set_xlabel("n (per-sample weights)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")  # dense Adam's pass over n beside the sparse steps' fraction of a ms
    axes[2].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    p.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dense", action="store_true", help="dense hypergradients for every optimizer")
    p.add_argument("--device", default="cpu", help="where the weights and the model live (cuda)")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # n optimizer: in a child process
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks/results/sample_weight_cost/sample_weight_cost.json",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        one = measure(int(args.one[0]), args.one[1], args.steps, dense=args.dense,
                      device=args.device)  # fmt: skip
        print(json.dumps(one))
        return {}
    runs = []
    for name in args.optimizers:
        for n in args.sizes:
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(n), name, "--steps", str(args.steps),
                 "--device", args.device]
                + ["--dense"] * args.dense,
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            mib = r["storage_bytes"] / 2**20
            print(f"{name:9s} n={n:>8d} hyper step {r['hyper_step_ms']:7.2f} ms (outer "
                  f"{r['outer_step_ms']:6.2f} ms) storage {mib:7.2f} MiB "
                  f"rows moved {r['rows_moved']} peak RSS {r['peak_rss_mb']:.0f} MB",
                  flush=True)  # fmt: skip
    results = {
        "command": "python benchmarks/bench_sample_weight_cost.py "
        + " ".join(argv or sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": 1,
            "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
