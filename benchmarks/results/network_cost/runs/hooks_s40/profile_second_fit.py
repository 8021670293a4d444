"""Where the drop-in's hooks cost goes on digits_small: cProfile of the SECOND fit of each arm in
one process (the first fit with the drop-in pays its lazy imports), an empty ``pl.Callback`` against
the drop-in with every hook and no hyper step; the 30 functions whose time grew most.

    cd benchmarks/results/network_cost/runs/hooks_s40/../../../../..  # the repo root
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
        benchmarks/results/network_cost/runs/hooks_s40/profile_second_fit.py
"""

import cProfile
import pstats
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_weight_decay as B  # noqa: E402

torch.set_num_threads(1)
s = B.SETTINGS["digits_small"]
data = B.make_data(s, B.DEFAULT_DATA, 0)
B.train_once(B.replace(s, epochs=1), data, 0)
init = B.pl.Trainer.__init__
HOOKS = {"granularity": "per_layer", "learned_kwargs": {"every_n_steps": 100000}}


class Empty(B.pl.Callback):
    pass


def with_empty(self, *a, callbacks=None, **kw):  # noqa: ANN001
    init(self, *a, callbacks=[*(callbacks or []), Empty()], **kw)


def prof(f):  # noqa: ANN001, ANN201
    pr = cProfile.Profile()
    pr.enable()
    f()
    pr.disable()
    st = pstats.Stats(pr).stats
    return {k: v[2] for k, v in st.items()}, {k: v[0] for k, v in st.items()}


B.pl.Trainer.__init__ = with_empty
B.train_once(s, data, 0)
e, ec = prof(lambda: B.train_once(s, data, 0))
B.pl.Trainer.__init__ = init
B.train_once(s, data, 0, **HOOKS)
h, hc = prof(lambda: B.train_once(s, data, 0, **HOOKS))
print("total empty", sum(e.values()), "hooks", sum(h.values()))
d = sorted(((h.get(k, 0) - e.get(k, 0), k) for k in set(h) | set(e)), reverse=True)
for v, k in d[:30]:
    print(f"{v:+.4f} {hc.get(k, 0):6d} {ec.get(k, 0):6d} {k[0][-50:]}:{k[1]}({k[2]})")
