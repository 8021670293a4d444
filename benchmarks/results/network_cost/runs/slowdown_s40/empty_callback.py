"""What any Lightning callback costs on digits_small: 5 repeats of a plain fit (no callback), the
same with an empty ``pl.Callback`` (Lightning dispatches every hook to it), and the drop-in with
every hook but no hyper step (``every_n_steps=100000``); CPU time of ``trainer.fit``.

    cd benchmarks/results/network_cost/runs/slowdown_s40
    PYTHONPATH=../../../../.. OMP_NUM_THREADS=1 python empty_callback.py
"""

import statistics as st
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # benchmarks/
import bench_weight_decay as B  # noqa: E402

torch.set_num_threads(1)
s = B.SETTINGS["digits_small"]
data = B.make_data(s, B.DEFAULT_DATA, 0)
B.train_once(B.replace(s, epochs=1), data, 0)
init = B.pl.Trainer.__init__


class Empty(B.pl.Callback):
    pass


def with_empty(self, *args, callbacks=None, **kw):  # noqa: ANN001
    init(self, *args, callbacks=[*(callbacks or []), Empty()], **kw)


res = {"none": [], "empty": [], "hooks": []}
for _ in range(5):
    res["none"].append(B.train_once(s, data, 0)["cpu_s"])
    B.pl.Trainer.__init__ = with_empty
    res["empty"].append(B.train_once(s, data, 0)["cpu_s"])
    B.pl.Trainer.__init__ = init
    res["hooks"].append(
        B.train_once(s, data, 0, granularity="per_layer", learned_kwargs={"every_n_steps": 100000})[
            "cpu_s"
        ]
    )
for k, v in res.items():
    print(
        k,
        [round(x, 3) for x in v],
        f"median {st.median(v):.4f}",
        f"x none {st.median(v) / st.median(res['none']):.4f}",
    )
