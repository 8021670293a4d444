"""20 Newsgroups data-weights recipe (benchmarks/check_20news_recipe.py's data_weights check: 5,657
training documents with 40 % symmetric noise, 500 clean validation documents, MLP 2000-256-20,
Adam 1e-3, 15 epochs): plain, the default drop-in (ForwardMode) and
LearnedDataWeights(directional="forward_difference"), back to back per seed in one process.

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/forward_difference/news20.py
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
out: dict = {"command": " ".join(sys.argv), "runs": {}}
for seed in (0, 1, 2):
    train, val, noisy = noisy_split(X, y, seed)  # the check's own split and noise
    runs = {"plain": plain_scores(train, val, (X_test, y_test), seed)}
    for name, directional in (("drop_in", "forward_mode"), ("drop_in_fd", "forward_difference")):
        runs[name] = drop_in_scores(
            train, val, (X_test, y_test), noisy, seed, directional=directional
        )
    out["runs"][seed] = runs
    print(seed, json.dumps(runs), flush=True)
    (Path(__file__).parent / "news20.json").write_text(json.dumps(out, indent=1))
