"""The budgets' cost in one process: a plain training, the default with ``PlannedBudget(0.5)``,
with ``OverheadBudget(0.5)``, and the plain training again, back to back on one seed (CPU time;
the ratio over the two plain trainings' mean), with each run's in-run share and hyper steps.

    python benchmarks/issue28_budget_cost_pairs.py news_mlp 0 1
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as B  # noqa: E402

from hypertorch_sid.core.budget import OverheadBudget, PlannedBudget  # noqa: E402


def main(setting: str, seeds: list[int]) -> None:
    torch.set_num_threads(1)
    s = B.SETTINGS[setting]
    roots = {"fashion": B.DEFAULT_FASHION, "news": B.DEFAULT_NEWS}
    for seed in seeds:
        data = B.make_data(s, roots.get(s.data, B.DEFAULT_DATA), seed)
        B.train_once(B.replace(s, epochs=1), data, seed)  # warm-up, untimed
        a = B.train_once(s, data, seed)
        runs = {
            name: B.train_once(s, data, seed, granularity="per_layer",
                               learned_kwargs={"max_overhead": cls(0.5)})
            for name, cls in (("planned", PlannedBudget), ("overhead", OverheadBudget))
        }  # fmt: skip
        a2 = B.train_once(s, data, seed)
        plain = (a["cpu_s"] + a2["cpu_s"]) / 2
        text = " | ".join(
            f"{n} {r['cpu_s'] / plain:.2f}x (in-run 1+{r['budget']['overhead']:.2f}, "
            f"{r['hyper_steps']} hyper steps)"
            for n, r in runs.items()
        )
        print(f"{setting} seed {seed}: plain CPU {a['cpu_s']:.2f}/{a2['cpu_s']:.2f} | {text}")


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]])
