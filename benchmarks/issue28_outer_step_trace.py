"""Issue 28, the outer step: record the default's hypergradients and λ at every hyper step.

Runs ``bench_weight_decay.py --settings S --seed N --methods learned_per_layer --optuna-trials 0
--threads 1 --out OUT.json`` with the outer Adam (the one built at lr 0.3; the training's own
optimizer is left alone) replaced by a subclass that appends, at each step, the hypergradient of
every learned tensor and then ρ = log λ after the step (one list per tensor); writes them to
``OUT_hypergradients.json`` (one entry per hyper step: ``[g_1, …, g_m, [ρ_1, …, ρ_m]]``)::

    python benchmarks/issue28_outer_step_trace.py mnist_mlp 0 \
        benchmarks/results/weight_decay/runs/outer_step/trace/mnist_mlp_seed0

(The stored traces were made with the drop-in's budget on: each is one draw of the run's
timing-dependent hyper-step schedule.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
RECORD: list[list[list[float]]] = []
_Adam = torch.optim.Adam


class _RecordingAdam(_Adam):
    def __init__(self, params, lr=1e-3, **kw):  # type: ignore[no-untyped-def]
        super().__init__(params, lr=lr, **kw)
        self._outer = abs(lr - 0.3) < 1e-12  # the drop-in's outer lr

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        if not self._outer:
            return super().step(closure)
        ps = [p for g in self.param_groups for p in g["params"]]
        RECORD.append([p.grad.flatten().tolist() for p in ps if p.grad is not None])
        out = super().step(closure)
        RECORD[-1].append([p.detach().flatten().tolist() for p in ps])
        return out


def main() -> None:
    setting, seed, out = sys.argv[1:4]
    torch.optim.Adam = _RecordingAdam  # type: ignore[misc]
    import bench_weight_decay

    bench_weight_decay.main(
        ["--settings", setting, "--seed", seed, "--methods", "learned_per_layer",
         "--optuna-trials", "0", "--threads", "1", "--out", out + ".json"]
    )  # fmt: skip
    Path(out + "_hypergradients.json").write_text(json.dumps(RECORD))


if __name__ == "__main__":
    main()
