"""Where the drop-in's extra CPU goes on a short fit: the training steps' cost as the budget
measures it (the time between training steps, the callback's charged work taken out), in a plain
fit (a callback that only marks the steps) and with ``LearnedWeightDecay`` (default or with
``--learned-kwargs``), back to back in one process; per fit: CPU time, the median step, the sum of
the steps (the budget's ``spent_training``) and the callback's charged work per step.

    python benchmarks/issue28_step_intervals.py digits_small 0 --repeats 3 \\
        --arms plain '{"every_n_steps": 100000}' default
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as B  # noqa: E402

from hypertorch_sid.core.budget import OverheadBudget  # noqa: E402

STEPS: list[tuple[float, float]] = []  # (step cost, charged per-step work since the last step)
_done = OverheadBudget.training_step_done


def _recording_done(self: OverheadBudget) -> None:
    now = self.clock()
    if self._mark is not None:
        per_step = self.spent_per_step - getattr(self, "_seen_per_step", 0.0)
        STEPS.append((now - self._mark - self._added_since_mark, per_step))
    self._seen_per_step = self.spent_per_step
    _done(self)


class Marker(B.pl.Callback):
    """The budget's step accounting alone, in a plain fit."""

    def __init__(self) -> None:
        self.budget = OverheadBudget(0.5)
        self.budget.use_device("cpu")

    def on_train_start(self, trainer, module) -> None:  # noqa: ANN001
        self.budget.training_step_done()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.budget.training_step_done()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("setting")
    p.add_argument("seed", type=int)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=["plain", "default"])
    a = p.parse_args()
    torch.set_num_threads(1)
    OverheadBudget.training_step_done = _recording_done
    s = B.SETTINGS[a.setting]
    roots = {"fashion": B.DEFAULT_FASHION, "news": B.DEFAULT_NEWS}
    data = B.make_data(s, roots.get(s.data, B.DEFAULT_DATA), a.seed)
    B.train_once(B.replace(s, epochs=1), data, a.seed)  # warm-up, untimed
    init = B.pl.Trainer.__init__

    def with_marker(self, *args, callbacks=None, **kw) -> None:  # noqa: ANN001
        init(self, *args, callbacks=[*(callbacks or []), Marker()], **kw)

    out: dict[str, list[tuple[float, float, float, float]]] = {arm: [] for arm in a.arms}
    for _ in range(a.repeats):
        for arm in a.arms:
            STEPS.clear()
            if arm == "plain":
                B.pl.Trainer.__init__ = with_marker
                r = B.train_once(s, data, a.seed)
                B.pl.Trainer.__init__ = init
            else:
                kw = {} if arm == "default" else json.loads(arm)
                r = B.train_once(s, data, a.seed, granularity="per_layer", learned_kwargs=kw)
            cost = [c for c, _ in STEPS]
            row = (r["cpu_s"], st.median(cost), sum(cost), st.mean(w for _, w in STEPS))
            out[arm].append(row)
            print(f"{arm:32s} CPU {row[0]:.3f} s | median step {row[1] * 1e3:.3f} ms | steps "
                  f"{row[2]:.3f} s | charged per step {row[3] * 1e6:.0f} us | hyper steps "
                  f"{r.get('hyper_steps')}", flush=True)  # fmt: skip
    plain = out.get("plain")
    for arm, rows in out.items():
        cpu, step, total = (st.mean(r[i] for r in rows) for i in range(3))
        ratio = f" | × plain: CPU {cpu / st.mean(r[0] for r in plain):.3f}, steps " \
            f"{total / st.mean(r[2] for r in plain):.3f}" if plain else ""  # fmt: skip
        print(f"mean {arm:27s} CPU {cpu:.3f} s | median step {step * 1e3:.3f} ms | steps "
              f"{total:.3f} s{ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
