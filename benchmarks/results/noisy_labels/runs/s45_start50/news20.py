"""20 Newsgroups data-weights recipe (benchmarks/check_20news_recipe.py's data-weights check: 5,657
training documents with 40 % symmetric noise, 500 clean validation documents, MLP 2000-256-20,
Adam 1e-3, 15 epochs), as ../s45_sym/news20.py: LearnedDataWeights() with one arm's kwargs per
seed. ``default`` is LearnedDataWeights() as it stands (its stored runs: the ``default`` of
../s45_sym/news20/q075.json); ``start50`` adds start_step=50.

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/s45_start50/news20.py ARM [seeds; default 0 1 2]
"""

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import drop_in_scores, load, noisy_split  # noqa: E402

#: LearnedDataWeights kwargs per arm
ARMS: dict[str, dict] = {"default": {}, "start50": {"start_step": 50}}

torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
ARM = sys.argv[1]
SEEDS = [int(a) for a in sys.argv[2:]] or [0, 1, 2]
out: dict = {"command": " ".join(sys.argv), "arm": ARM, "runs": {}}
for seed in SEEDS:
    train, val, noisy = noisy_split(X, y, seed)  # the check's own split and noise
    out["runs"][seed] = drop_in_scores(train, val, (X_test, y_test), noisy, seed, **ARMS[ARM])
    print(seed, json.dumps(out["runs"][seed]), flush=True)
    (Path(__file__).parent / "news20" / f"{ARM}.json").write_text(json.dumps(out, indent=1))
