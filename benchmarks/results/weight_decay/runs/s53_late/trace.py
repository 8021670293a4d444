"""Session 53: where the hyper steps run and where λ goes, per hyper step, for one setting, seed
and arm (ctl: the default; late: LateBudget(0.5) with every_n_steps=10, run.sh's arm). Prints
per hyper step the training step it ran after and λ per slot after it, then the test loss.

usage (from the repository root): PYTHONPATH=$PWD python trace.py SETTING SEED [ARM]
"""

import json
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
import bench_weight_decay  # noqa: E402

from hypertorch_sid.core import budget, outer_step  # noqa: E402

ARMS = json.loads((Path(__file__).parent / "arms.json").read_text())
setting, seed = sys.argv[1], sys.argv[2]
arm = sys.argv[3] if len(sys.argv) > 3 else "late"
where = {"step": 0}
_start = budget.OverheadBudget.start_hyper_step


def start_hyper_step(self):  # noqa: ANN001, ANN201
    where["step"] = self.training_steps + 1
    _start(self)


_step = outer_step.TrustRprop.step


def step(self, closure=None):  # noqa: ANN001, ANN201
    out = _step(self, closure)
    lam = [math.exp(x) for x in self.param_groups[0]["params"][0].detach().tolist()]
    print(f"step {where['step']:4d}  λ {' '.join(f'{x:.1e}' for x in lam)}", flush=True)
    return out


budget.OverheadBudget.start_hyper_step = start_hyper_step
outer_step.TrustRprop.step = torch.no_grad()(step)
with tempfile.TemporaryDirectory() as tmp:
    sys.argv = ["bench_weight_decay.py", "--settings", setting, "--seeds", seed, "--methods",
                "learned_per_layer", "--optuna-trials", "0", "--threads", "1",
                "--learned-kwargs", json.dumps(ARMS[arm]), "--out", f"{tmp}/t.json"]  # fmt: skip
    bench_weight_decay.main()
    r = json.loads(Path(f"{tmp}/t_seed{seed}.json").read_text())
    run = r["settings"][setting]["runs"]["learned_per_layer"]
    print(f"test loss {run['test_loss']:.4f} overhead {run.get('sid_cost', {})}")
