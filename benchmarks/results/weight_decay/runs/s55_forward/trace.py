"""Session 55: per hyper step of one fit, the training step, the hypergradient per λ slot (in
log λ; + says less decay) and λ after the outer step (arm fwd: hypergradient=ForwardSensitivity(),
ctl: the default; both without a budget). Then the held-out test loss.

usage (from the repository root): PYTHONPATH=$PWD python trace.py SETTING SEED [fwd|ctl]
"""

import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import bench_weight_decay  # noqa: E402

from hypertorch_sid.lightning.weight_decay import LearnedWeightDecay  # noqa: E402

FWD = {"class_path": "hypertorch_sid.core.forward_sensitivity.ForwardSensitivity"}
setting, seed = sys.argv[1], sys.argv[2]
arm = sys.argv[3] if len(sys.argv) > 3 else "fwd"
kwargs = {"max_overhead": None, **({"hypergradient": FWD} if arm == "fwd" else {})}
_apply = LearnedWeightDecay._adjust_hypergradient


def adjust(self, trainer, pl_module, hypergrad):  # noqa: ANN001, ANN201
    out = _apply(self, trainer, pl_module, hypergrad)
    lam = [math.exp(x) for x in self.problem.decay.hyperparameters[0].detach().tolist()]
    g = " ".join(f"{x:+.1e}" for x in out[0].tolist())
    print(
        f"step {trainer.global_step:4d}  dE/dlogλ {g}  λ before {' '.join(f'{x:.1e}' for x in lam)}"
    )
    return out


LearnedWeightDecay._adjust_hypergradient = adjust
with tempfile.TemporaryDirectory() as tmp:
    sys.argv = ["bench_weight_decay.py", "--settings", setting, "--seeds", seed, "--methods",
                "learned_per_layer", "--optuna-trials", "0", "--threads", "1",
                "--learned-kwargs", json.dumps(kwargs), "--out", f"{tmp}/t.json"]  # fmt: skip
    bench_weight_decay.main()
    r = json.loads(Path(f"{tmp}/t_seed{seed}.json").read_text())
    run = r["settings"][setting]["runs"]["learned_per_layer"]
    print(f"test loss {run['test_loss']:.4f} best epoch {run['best_epoch']}")
