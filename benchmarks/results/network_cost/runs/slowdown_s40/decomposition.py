"""Where digits_small's CPU beyond 1.5x goes: per repeat, a plain fit (no callback), the drop-in
with every hook but no hyper step (``every_n_steps=100000``), the default, and the plain fit again
(CPU time of ``trainer.fit``; ratios over the two plain fits' mean). For each learned fit: the
budget's training intervals (``spent_training``), what it charged (``spent_hyper``, of it the
work added outside hyper steps), and the rest (fit CPU outside both; a plain fit's is ~0.01 s).

    cd benchmarks/results/network_cost/runs/slowdown_s40
    PYTHONPATH=../../../../.. OMP_NUM_THREADS=1 python decomposition.py 3
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # benchmarks/
import bench_weight_decay as B  # noqa: E402

torch.set_num_threads(1)
s = B.SETTINGS["digits_small"]
data = B.make_data(s, B.DEFAULT_DATA, 0)
B.train_once(B.replace(s, epochs=1), data, 0)  # warm-up, untimed
for _ in range(int(sys.argv[1])):
    p = B.train_once(s, data, 0)["cpu_s"]
    h = B.train_once(s, data, 0, granularity="per_layer", learned_kwargs={"every_n_steps": 100000})
    d = B.train_once(s, data, 0, granularity="per_layer")
    p2 = B.train_once(s, data, 0)["cpu_s"]
    plain = (p + p2) / 2
    for name, r in (("hooks", h), ("default", d)):
        b = r["budget"]
        rest = r["cpu_s"] - b["spent_training"] - b["spent_hyper"]
        steps = b["spent_training"]
        print(
            f"{name:8s} plain {plain:.3f} s | fit {r['cpu_s']:.3f} s = "
            f"x{r['cpu_s'] / plain:.3f} | training intervals {steps:.3f} s "
            f"(x{steps / plain:.3f} the plain fit) | charged {b['spent_hyper']:.3f} s "
            f"(added work {b['spent_added']:.3f}) | rest {rest:.3f} s | "
            f"hyper steps {r['hyper_steps']}",
            flush=True,
        )
