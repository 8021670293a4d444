"""Where in the fit the training intervals get dearer: digits_small, the drop-in with every hook
but no hyper step and the default, 4 repeats each in one process; every interval between
training steps as the budget measures it (CPU, the callback's charged work taken out). Per fit:
the intervals that hold a validation loop (>= 4 ms) right after a hyper step and elsewhere, the
ordinary steps 1-5 after a hyper step, the later ones, and the median of steps 2-19 (before the
first hyper step, at step 20): the plain step an in-fit estimate would compare against.

    cd benchmarks/results/network_cost/runs/slowdown_s40
    PYTHONPATH=../../../../.. OMP_NUM_THREADS=1 python positions.py 4
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # benchmarks/
import bench_weight_decay as B  # noqa: E402

from hypertorch_sid.core.budget import OverheadBudget  # noqa: E402

REC: list[tuple[float, int]] = []
_done = OverheadBudget.training_step_done


def _recording_done(self: OverheadBudget) -> None:
    now = self.clock()
    if self._mark is not None:
        REC.append((now - self._mark - self._added_since_mark, self.hyper_steps))
    _done(self)


def summary(name: str, hyper_steps: int | None) -> str:
    x = np.array([a for a, _ in REC])
    h = np.array([b for _, b in REC])
    after = np.r_[False, h[1:] != h[:-1]]  # the first interval after a hyper step
    pos, p = np.zeros(len(x), int), 99
    for i in range(len(x)):
        p = 0 if after[i] else p + 1
        pos[i] = p
    val, ordinary = x >= 4e-3, x < 4e-3
    near = ordinary & (pos >= 1) & (pos <= 5) & (h > 0)
    late = ordinary & ((pos >= 6) | (h == 0))
    ms = 1e3

    def mean(m: np.ndarray) -> str:
        return f"{x[m].mean() * ms:.3f}" if m.any() else "-"

    return (
        f"{name:8s} hyper steps {hyper_steps} | ms: validation intervals after a hyper step "
        f"{mean(val & after)} (n {(val & after).sum()}), other {mean(val & ~after)} | ordinary "
        f"steps 1-5 after {mean(near)} (n {near.sum()}), later {mean(late)} | median of steps "
        f"2-19 {np.median(x[2:20][ordinary[2:20]]) * ms:.3f} | sum {x.sum():.4f} s"
    )


def main() -> None:
    torch.set_num_threads(1)
    OverheadBudget.training_step_done = _recording_done
    s = B.SETTINGS["digits_small"]
    data = B.make_data(s, B.DEFAULT_DATA, 0)
    B.train_once(B.replace(s, epochs=1), data, 0)  # warm-up, untimed
    for _ in range(int(sys.argv[1])):
        for name, kw in (("hooks", {"every_n_steps": 100000}), ("default", {})):
            REC.clear()
            r = B.train_once(s, data, 0, granularity="per_layer", learned_kwargs=kw)
            print(summary(name, r.get("hyper_steps")), flush=True)


if __name__ == "__main__":
    main()
