"""20 Newsgroups data-weights recipe (as ``../outer_objective/news20.py``: 5,657 training documents,
40 % symmetric noise, 500 clean validation documents, MLP 2000-256-20, Adam 1e-3, 15 epochs): plain,
the default ``LearnedDataWeights()`` and ``LearnedDataWeights(every_n_steps=N)`` (``every=N``) /
``LearnedDataWeights(adjoint_steps=K)`` (``k=K``) back to back per seed in one process.

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/sym_screen/news20.py [every=N] [k=K] SEED [SEED ...]
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import TensorDataset

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import Net, fit, load, scores  # noqa: E402

from hypertorch_sid import IndexedDataset, LearnedDataWeights  # noqa: E402

torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
OPTION = {"every": "every_n_steps", "k": "adjoint_steps"}
GIVEN = [a.split("=") for a in sys.argv[1:] if "=" in a]
SEEDS = [int(a) for a in sys.argv[1:] if "=" not in a]
ARMS = [("default", {})] + [(f"{key}{value}", {OPTION[key]: int(value)}) for key, value in GIVEN]
NAME = f"news20_{'_'.join(name for name, _ in ARMS[1:])}_seeds{'_'.join(map(str, SEEDS))}.json"
out: dict = {"command": " ".join(sys.argv), "runs": {}}
for seed in SEEDS:
    gen = np.random.default_rng(seed)  # the check's own split and noise
    perm = gen.permutation(len(y))
    tr, va = perm[: len(y) // 2], perm[len(y) // 2 : len(y) // 2 + 500]
    noisy = torch.tensor(gen.random(len(tr)) < 0.4)
    y_noisy = y[tr].clone()
    y_noisy[noisy] = torch.tensor(gen.integers(0, 20, int(noisy.sum())))
    train, val = TensorDataset(X[tr], y_noisy), TensorDataset(X[va], y[va])
    runs = {}
    pl.seed_everything(seed, verbose=False)
    model = Net()
    cpu = fit(model, train, val, 15, [])
    runs["plain"] = {**scores(model, X_test, y_test), "cpu": cpu}
    for name, kwargs in ARMS:
        pl.seed_everything(seed, verbose=False)
        cb, model = LearnedDataWeights(**kwargs), Net(per_sample=True)
        cpu = fit(model, IndexedDataset(train), val, 15, [cb])
        runs[name] = {**scores(model, X_test, y_test), "cpu": cpu}
        flagged, bad = set(cb.flagged().tolist()), set(torch.nonzero(noisy).ravel().tolist())
        runs[name]["precision"] = len(flagged & bad) / max(len(flagged), 1)
        runs[name]["recall"] = len(flagged & bad) / len(bad)
    out["runs"][seed] = runs
    print(seed, json.dumps(runs), flush=True)
    (Path(__file__).parent / NAME).write_text(json.dumps(out, indent=1))
