"""Session 52: where eq. shrinkfall acts. Runs bench_weight_decay.py's learned per-layer arm with
ShrinkFallRprop (or the default, ARM=ctl) on one setting and seed and prints, per hyper step, the
training step, λ per slot before and after the step, S(λ) per slot (eq. shrinkshare) and the
slots eq. shrinkfall lowered.

usage (from the repository root): PYTHONPATH=$PWD python trace.py SETTING SEED [ARM]
  ARM: fall (ShrinkFallRprop(), the default) | ctl (TrustRprop, the drop-in's default)
"""

import json
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
import bench_weight_decay  # noqa: E402

from hypertorch_sid.core import outer_step  # noqa: E402

setting, seed = sys.argv[1], sys.argv[2]
arm = sys.argv[3] if len(sys.argv) > 3 else "fall"
KW = {
    "fall": {"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.ShrinkFallRprop",
                                 "init_args": {}}},
    "ctl": {},
}[arm]  # fmt: skip
calls = {"n": 0}
observed = {}
_observe = outer_step.ShrinkFallRprop.observe_shrink


def observe_shrink(self, steps, readings):  # noqa: ANN001
    observed["steps"], observed["share"] = (
        steps,
        [outer_step.shrink_share(r, 1.0, 1) * 0 for r in readings[0]],
    )
    observed["readings"] = readings[0]
    _observe(self, steps, readings)


_step = outer_step.TrustRprop.step


def step(self, closure=None):  # noqa: ANN001
    before = [p.detach().clone() for g in self.param_groups for p in g["params"]]
    out = _step(self, closure)
    after = [p.detach() for g in self.param_groups for p in g["params"]]
    calls["n"] += 1
    lam0 = [math.exp(x) for x in before[0].tolist()]
    lam1 = [math.exp(x) for x in after[0].tolist()]
    share = ""
    if observed.get("readings"):
        R = observed["steps"]
        share = " S=" + " ".join(f"{outer_step.shrink_share(r, l, R):.3f}"
                                 for r, l in zip(observed["readings"], lam0))  # fmt: skip
        observed.clear()
    fell = getattr(self, "fell", [])
    print(f"hyper {calls['n']:2d} R={R if share else '-'} λ {' '.join(f'{x:.2e}' for x in lam0)}"
          f" → {' '.join(f'{x:.2e}' for x in lam1)}{share} fell={fell}", flush=True)  # fmt: skip
    return out


R = None
outer_step.ShrinkFallRprop.observe_shrink = observe_shrink
outer_step.TrustRprop.step = torch.no_grad()(step)
with tempfile.TemporaryDirectory() as tmp:
    sys.argv = ["bench_weight_decay.py", "--settings", setting, "--seeds", seed, "--methods",
                "learned_per_layer", "--optuna-trials", "0", "--threads", "1",
                "--learned-kwargs", json.dumps(KW), "--out", f"{tmp}/t.json"]  # fmt: skip
    bench_weight_decay.main()
    r = json.loads(Path(f"{tmp}/t_seed{seed}.json").read_text())
    run = r["settings"][setting]["runs"]["learned_per_layer"]
    print(f"test loss {run['test_loss']:.4f}  λ by slot {run['lambda_by_slot']}")
