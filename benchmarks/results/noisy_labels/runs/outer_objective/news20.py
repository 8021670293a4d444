"""20 Newsgroups data-weights recipe (benchmarks/check_20news_recipe.py's data_weights check: 5,657
training documents with 40 % symmetric noise, 500 clean validation documents, MLP 2000-256-20,
Adam 1e-3, 15 epochs): plain, LearnedDataWeights(objective="mean_loss") (E = the validation cross
entropy, the default until this version) and objective="expected_error" (ExpectedError, eq.
softerr), back to back per seed in one process.

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/outer_objective/news20.py [seeds; default 0 1 2]
"""

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import drop_in_scores, load, noisy_split, plain_scores  # noqa: E402

from hypertorch_sid.core.objectives import ExpectedError  # noqa: E402

torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
out: dict = {"command": " ".join(sys.argv), "runs": {}}
# e.g. news20.py 3 4 5; news20.py q=0.5 0 1 2 3 4 5 (ExpectedError(q=0.5) only)
Q = [float(a[2:]) for a in sys.argv[1:] if a.startswith("q=")]
SEEDS = [int(a) for a in sys.argv[1:] if not a.startswith("q=")] or [0, 1, 2]
NAME = "news20.json" if SEEDS == [0, 1, 2] else f"news20_seeds{''.join(map(str, SEEDS))}.json"
ARMS = (("mean_loss", "mean_loss"), ("expected_error", "expected_error"))
if Q:
    NAME = NAME.replace(".json", f"_q{Q[0]:g}.json")
    ARMS = ((f"expected_error_q{Q[0]:g}", ExpectedError(Q[0])),)
for seed in SEEDS:
    train, val, noisy = noisy_split(X, y, seed)  # the check's own split and noise
    runs = {"plain": plain_scores(train, val, (X_test, y_test), seed)}
    for name, objective in ARMS:
        runs[name] = drop_in_scores(train, val, (X_test, y_test), noisy, seed, objective=objective)
    out["runs"][seed] = runs
    print(seed, json.dumps(runs), flush=True)
    (Path(__file__).parent / NAME).write_text(json.dumps(out, indent=1))
