"""What Lightning's logging costs inside the hyper steps: digits_small under the default, 2 fits;
CPU time of the hyper steps (``_budgeted_hyper_step``), of the callback's ``_log`` and of the
``LightningModule.log`` calls in it (three keys per hyper step: the monitor's and the progress
bar's).

    cd benchmarks/results/network_cost/runs/slowdown_s40
    PYTHONPATH=../../../../.. OMP_NUM_THREADS=1 python log_cost.py
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # benchmarks/
import bench_weight_decay as B  # noqa: E402

from hypertorch_sid.lightning.callback import HyperOptimizationCallback  # noqa: E402

T: dict[str, list[float]] = {"hyper steps": [], "_log": [], "LightningModule.log": []}


def timed(owner: type, name: str, key: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            T[key].append(time.process_time() - start)

    setattr(owner, name, wrapper)


def main() -> None:
    torch.set_num_threads(1)
    s = B.SETTINGS["digits_small"]
    data = B.make_data(s, B.DEFAULT_DATA, 0)
    B.train_once(B.replace(s, epochs=1), data, 0)  # warm-up, untimed
    timed(HyperOptimizationCallback, "_budgeted_hyper_step", "hyper steps")
    timed(HyperOptimizationCallback, "_log", "_log")
    timed(B.pl.LightningModule, "log", "LightningModule.log")
    for _ in range(2):
        for times in T.values():
            times.clear()
        B.train_once(s, data, 0, granularity="per_layer")
        hyper = sum(T["hyper steps"])
        print(" | ".join(f"{k}: {len(v)} calls, {sum(v):.4f} s ({sum(v) / hyper:.1%})"
                         for k, v in T.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
