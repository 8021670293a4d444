"""Session 57 diagnosis (a copy of session 53's deployed.py): λ at the deployed checkpoint. For
digits_small, seeds 0-8, runs the default (ctl) and ReachRprop (reach; arms.json) once each, one after the other per seed, and records
per hyper step the training step and λ per slot, the best validation epoch (the deployed
weights: 10 steps an epoch) and the test loss. Writes deployed.json and prints, per arm, the
geometric mean over seeds of the mean λ in effect at the deployed checkpoint and at the end.

usage (from the repository root): PYTHONPATH=$PWD python deployed.py
"""

import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
import bench_weight_decay  # noqa: E402

from hypertorch_sid.core import budget, outer_step  # noqa: E402

ARMS = json.loads((here / "arms.json").read_text())
SETTING, STEPS_PER_EPOCH = "digits_small", 10
trace: list = []
where = {"step": 0}
_start, _step = budget.OverheadBudget.start_hyper_step, outer_step.TrustRprop.step


def start_hyper_step(self):  # noqa: ANN001, ANN201
    where["step"] = self.training_steps + 1
    _start(self)


def step(self, closure=None):  # noqa: ANN001, ANN201
    out = _step(self, closure)
    lam = [math.exp(x) for x in self.param_groups[0]["params"][0].detach().tolist()]
    trace.append((where["step"], lam))
    return out


budget.OverheadBudget.start_hyper_step = start_hyper_step
outer_step.TrustRprop.step = torch.no_grad()(step)


def fit(arm: str, seed: int) -> dict:
    trace.clear()
    with tempfile.TemporaryDirectory() as tmp:
        kw = json.dumps(ARMS[arm])
        sys.argv = ["bench_weight_decay.py", "--settings", SETTING, "--seeds", str(seed),
                    "--methods", "learned_per_layer", "--optuna-trials", "0", "--threads", "1",
                    "--learned-kwargs", kw, "--out", f"{tmp}/t.json"]  # fmt: skip
        bench_weight_decay.main()
        r = json.loads(Path(f"{tmp}/t_seed{seed}.json").read_text())
    run = r["settings"][SETTING]["runs"]["learned_per_layer"]
    best = run["best_epoch"] * STEPS_PER_EPOCH
    before = [lam for s, lam in trace if s <= best]
    at_best = statistics.fmean(before[-1]) if before else 1e-4  # λ₀ before any hyper step
    return dict(test_loss=run["test_loss"], best_step=best, trace=list(trace),
                lambda_at_best=at_best, lambda_end=statistics.fmean(trace[-1][1]),
                hyper_steps_before_best=len(before))  # fmt: skip


DEPLOYED = here.parents[1] / "weight_decay_deployment_9seeds_final_s43.json"
picks = json.loads(DEPLOYED.read_text())["deployment"]["settings"][SETTING]["grid pick"]["seeds"]
grid = [picks[str(n)]["weight_decay"] for n in range(9)]
print(f"grid pick λ per seed {grid}, geometric mean {statistics.geometric_mean(grid):.2g}")
out = {arm: {} for arm in ARMS}
for seed in range(9):
    for arm in ARMS:
        out[arm][seed] = fit(arm, seed)
(here / "deployed.json").write_text(json.dumps(out, indent=1))
for arm, runs in out.items():
    rs = list(runs.values())
    geo = {k: statistics.geometric_mean([max(r[k], 1e-300) for r in rs])
           for k in ("lambda_at_best", "lambda_end")}  # fmt: skip
    print(
        f"{arm}: test {statistics.fmean(r['test_loss'] for r in rs):.4f}, best step "
        f"{[r['best_step'] for r in rs]}, hyper steps before it "
        f"{[r['hyper_steps_before_best'] for r in rs]}, λ at best (geo) "
        f"{geo['lambda_at_best']:.2g}, λ at end (geo) {geo['lambda_end']:.2g}"
    )
