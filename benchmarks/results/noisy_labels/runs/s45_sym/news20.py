"""20 Newsgroups data-weights recipe (benchmarks/check_20news_recipe.py's data-weights check: 5,657
training documents with 40 % symmetric noise, 500 clean validation documents, MLP 2000-256-20,
Adam 1e-3, 15 epochs): LearnedDataWeights() (the default, ExpectedError(q=0.5)) and one session-45
candidate back to back per seed in one process (as ../outer_objective/news20.py).

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/s45_sym/news20.py ARM [seeds; default 0 1 2]
"""

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import drop_in_scores, load, noisy_split  # noqa: E402

from hypertorch_sid.core.config import Batches  # noqa: E402
from hypertorch_sid.core.objectives import ClassRelativeError, ExpectedError  # noqa: E402

#: the candidates of run.sh, as LearnedDataWeights kwargs
ARMS = {
    "q075": {"objective": ExpectedError(0.75)},
    "d2x4": {"batches": Batches(d2=4)},
    "val512": {"val_batch_size": 512},
    "classrel": {"objective": ClassRelativeError(0.5)},
}

torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
ARM = sys.argv[1]
SEEDS = [int(a) for a in sys.argv[2:]] or [0, 1, 2]
out: dict = {"command": " ".join(sys.argv), "arm": ARM, "runs": {}}
for seed in SEEDS:
    train, val, noisy = noisy_split(X, y, seed)  # the check's own split and noise
    runs = {"default": drop_in_scores(train, val, (X_test, y_test), noisy, seed)}
    runs[ARM] = drop_in_scores(train, val, (X_test, y_test), noisy, seed, **ARMS[ARM])
    out["runs"][seed] = runs
    print(seed, json.dumps(runs), flush=True)
    (Path(__file__).parent / "news20" / f"{ARM}.json").write_text(json.dumps(out, indent=1))
