"""Cost of the solvers' residual norm on a large model: float64 copy vs native precision.

Every inner and adjoint step computes ‖Φ̂(w) − w‖ (``solvers.norm``) to detect divergence. On a
20news-sized multinomial logistic regression (W ∈ R^{101631×20}, sparse minibatches of 50
documents with ~80 tokens each, one weight decay per feature) this times, in interleaved rounds:

(a) ``norm_native``   the norm in the tensor's own precision (what ``solvers.norm`` does);
(b) ``norm_float64``  the norm of a float64 copy (what it did before 0.1.0's fix);
(c) ``inner_native``  one ``inner_solve`` step with (a);
(d) ``inner_float64`` one ``inner_solve`` step with (b) patched in.

Run from the repository root::

    # writes benchmarks/results/residual_norm/residual_norm.json
    python benchmarks/bench_residual_norm.py
    python benchmarks/bench_residual_norm.py --quick  # seconds; writes into a temporary folder

``--out PATH`` writes the JSON there instead (a ``--quick`` run never replaces the committed file
unless ``--out`` names it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from hypertorch_sid import BatchStream, ConstantStep, GradientDescentMap, inner_solve
from hypertorch_sid.core import solvers

RESULTS = Path(__file__).resolve().parent / "results" / "residual_norm" / "residual_norm.json"
D, C, BATCH, TOKENS = 101631, 20, 50, 80


def float64_norm(xs: list[torch.Tensor]) -> float:
    per_tensor = [torch.linalg.vector_norm(x.detach(), dtype=torch.float64) for x in xs]
    return float(torch.linalg.vector_norm(torch.stack(per_tensor)))


def sparse_batches(n: int, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(n):
        rows = torch.arange(BATCH).repeat_interleave(TOKENS)
        cols = torch.randint(0, D, (BATCH * TOKENS,), generator=gen)
        vals = torch.rand(BATCH * TOKENS, generator=gen) / TOKENS**0.5
        x = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (BATCH, D)).coalesce()
        out.append((x, torch.randint(0, C, (BATCH,), generator=gen)))
    return out


def timed(fn: Callable[[], object], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 rep (smoke test)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON output (default {RESULTS.relative_to(RESULTS.parents[3])}; "
        "with --quick a temporary folder)",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="bench_residual_norm_")) if args.quick else None
        args.out = RESULTS if folder is None else folder / RESULTS.name
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    rounds, reps, warmup = (2, 1, 1) if args.quick else (15, 10, 3)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    W = (0.01 * torch.randn(D, C, generator=gen)).requires_grad_(True)
    lam = torch.zeros(D, requires_grad=True)

    def loss(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        reg = (lam.exp() * (W * W).sum(1)).sum() / (2 * W.numel())
        return F.cross_entropy(torch.sparse.mm(x, W), y) + reg

    phi = GradientDescentMap(loss, [W], [lam], alpha=10.0)
    stream = BatchStream(sparse_batches(8, gen), "train_batches")
    step = ConstantStep(eta=0.5)
    delta = [torch.randn(D, C, generator=gen)]

    def inner(norm: Callable) -> Callable[[], object]:
        def run() -> object:
            solvers.norm = norm
            try:
                return inner_solve(phi, stream, 1, step)
            finally:
                solvers.norm = native

        return run

    native = solvers.norm
    ops = {
        "norm_native": lambda: native(delta),
        "norm_float64": lambda: float64_norm(delta),
        "inner_native": inner(native),
        "inner_float64": inner(float64_norm),
    }
    for fn in ops.values():  # warm-up
        timed(fn, warmup)
    samples: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(rounds):  # interleaved rounds
        for name, fn in ops.items():
            samples[name].append(timed(fn, reps))
    median = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    ratios = {
        "norm_float64 / norm_native": statistics.median(
            a / b for a, b in zip(samples["norm_float64"], samples["norm_native"])
        ),
        "inner_float64 / inner_native": statistics.median(
            a / b for a, b in zip(samples["inner_float64"], samples["inner_native"])
        ),
    }
    report = {
        "what": "residual norm and one inner step, W 101631x20, sparse batch 50, 1 thread",
        "quick": args.quick,
        "median_ms": median,
        "ratios": ratios,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    for k, v in median.items():
        print(f"{k:15s} {v:8.2f} ms")
    for k, v in ratios.items():
        print(f"{k:30s} {v:6.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
