"""Issue 28, part 3: probes behind docs/per_element_decay.md's "how noisy a seed is".

One training of a ``bench_weight_decay.py`` setting and seed (no warm-up training before it, so
its numbers differ from the benchmark's own for the same seed), one of:

* ``per_layer``: learned per-layer decay from ``--init`` (λ₀): the chaos in λ₀;
* ``shrunk_c0``: ``elements="shrunk"`` with every James–Stein factor forced to 0 (the deviations
  never move: per-layer decay up to the order of float sums);
* ``shrunk_trace``: ``elements="shrunk"``, printing (hyper step, tensor size, c, b/n) of every
  deviation tensor's step.

Usage (the session's runs; Fashion MLP, seed 2: 0.5025, 0.5230 from λ₀ = 1.0001e-4, 0.5200)::

    python benchmarks/issue28_shrunk_probe.py per_layer fashion_mlp 2 --init 1e-4
    python benchmarks/issue28_shrunk_probe.py per_layer fashion_mlp 2 --init 1.0001e-4
    python benchmarks/issue28_shrunk_probe.py shrunk_c0 fashion_mlp 2
    python benchmarks/issue28_shrunk_probe.py shrunk_trace fashion_mlp 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as bench  # noqa: E402

from hypertorch_sid.core import decay  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=("per_layer", "shrunk_c0", "shrunk_trace"))
    p.add_argument("setting", choices=list(bench.SETTINGS))
    p.add_argument("seed", type=int)
    p.add_argument("--init", type=float, default=1e-4, help="λ₀ (default 1e-4)")
    args = p.parse_args()
    s = bench.SETTINGS[args.setting]
    root = bench.DEFAULT_FASHION if s.data == "fashion" else bench.DEFAULT_DATA
    data = bench.make_data(s, root, args.seed)
    kwargs: dict = {"max_overhead": 100}  # as the session ran it (equal to None here)
    granularity = "per_layer"
    if args.probe != "per_layer":
        granularity, kwargs["elements"] = "per_element", "shrunk"
        shrinkage = decay.shrinkage

        def patched(*a, **k):
            c = 0.0 if args.probe == "shrunk_c0" else shrinkage(*a, **k)
            if args.probe == "shrunk_trace":
                print((a[3], a[0].numel(), round(c, 3), round(a[4], 4)))
            return c

        decay.shrinkage = patched
    rec = bench.train_once(
        s, data, args.seed, granularity=granularity, learned_init=args.init, learned_kwargs=kwargs
    )
    print(args.probe, "test loss", rec["test_loss"], "best val", rec["best_val_loss"])
    print("λ", rec["lambda_summary"])


if __name__ == "__main__":
    main()
