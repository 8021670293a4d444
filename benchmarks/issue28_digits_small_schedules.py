"""Fixed λ schedules on a setting (what a learned λ could reach): each seed's held-out test loss
of the deployed (best validation epoch) weights under λ(t) set before every training step.

    python benchmarks/issue28_digits_small_schedules.py digits_small \
        const2.5e-3,hold35_2.5e-3,hold35_1e-2,hold50_5e-3,ramp1e-4_1e-2,ramp1e-4_3e-3 \
        0,1,2,3,4,5,6,7,8
"""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_weight_decay as bw  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def sched_fn(name):
    def f(frac):
        if name == "const2.5e-3":
            return 2.5e-3
        if name == "hold35_2.5e-3":
            return 1e-4 if frac < 0.35 else 2.5e-3
        if name == "hold35_1e-2":
            return 1e-4 if frac < 0.35 else 1e-2
        if name == "hold50_5e-3":
            return 1e-4 if frac < 0.5 else 5e-3
        if name == "ramp1e-4_1e-2":
            return 10 ** (-4 + 2 * frac)
        if name == "ramp1e-4_3e-3":
            return 10 ** (-4 + math.log10(30) * frac)
        if name == "const1e-4":
            return 1e-4

    return f


class Sched(bw.Classifier):
    def on_train_batch_start(self, batch, batch_idx):
        frac = self.trainer.global_step / self.trainer.estimated_stepping_batches
        for g in self.trainer.optimizers[0].param_groups:
            g["weight_decay"] = self._f(frac)


setting = sys.argv[1]
names = sys.argv[2].split(",")
seeds = [int(x) for x in sys.argv[3].split(",")]
s = bw.SETTINGS[setting]
res = {}
for seed in seeds:
    data = bw.make_data(s, bw.DEFAULT_DATA, seed)
    for n in names:
        orig = bw.Classifier

        class C(Sched):
            _f = staticmethod(sched_fn(n))

        bw.Classifier = C
        try:
            rec = bw.train_once(s, data, seed, weight_decay=1e-4)
        finally:
            bw.Classifier = orig
        res.setdefault(n, {})[seed] = rec["test_loss"]
        print(seed, n, round(rec["test_loss"], 4), rec["best_epoch"], flush=True)
print(json.dumps(res))
