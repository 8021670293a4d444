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

import torch

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import drop_in_scores, load, noisy_split, plain_scores  # noqa: E402

torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
OPTION = {"every": "every_n_steps", "k": "adjoint_steps"}
GIVEN = [a.split("=") for a in sys.argv[1:] if "=" in a]
SEEDS = [int(a) for a in sys.argv[1:] if "=" not in a]
ARMS = [("default", {})] + [(f"{key}{value}", {OPTION[key]: int(value)}) for key, value in GIVEN]
NAME = f"news20_{'_'.join(name for name, _ in ARMS[1:])}_seeds{'_'.join(map(str, SEEDS))}.json"
out: dict = {"command": " ".join(sys.argv), "runs": {}}
for seed in SEEDS:
    train, val, noisy = noisy_split(X, y, seed)  # the check's own split and noise
    runs = {"plain": plain_scores(train, val, (X_test, y_test), seed)}
    for name, kwargs in ARMS:
        runs[name] = drop_in_scores(train, val, (X_test, y_test), noisy, seed, **kwargs)
    out["runs"][seed] = runs
    print(seed, json.dumps(runs), flush=True)
    (Path(__file__).parent / NAME).write_text(json.dumps(out, indent=1))
