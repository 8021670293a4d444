"""20 Newsgroups data weights (check_20news_recipe's recipe, 40 % symmetric noise) under
KeptEvidenceError, every validation batch's q* and ESS(0.5)/|V| recorded; pairs with
runs/outer_objective/news20_seeds012345_q0.5.json (the default, same split and seed).

PYTHONPATH=$PWD OMP_NUM_THREADS=1 python \
    benchmarks/results/noisy_labels/runs/kept_evidence_s40/news20.py 0 1 2
"""

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_20news_recipe import drop_in_scores, load, noisy_split  # noqa: E402

from hypertorch_sid.core.objectives import KeptEvidenceError  # noqa: E402


class Recorded(KeptEvidenceError):
    """KeptEvidenceError that also records ESS(q_max)/|V| per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.ess: list[float] = []

    def choose_q(self, losses: torch.Tensor) -> torch.Tensor:
        w = torch.exp(-self.q_max * losses.detach().double())
        self.ess.append(float(w.sum() ** 2 / (w * w).sum() / w.numel()))
        return super().choose_q(losses)


torch.set_num_threads(1)
X, y, X_test, y_test = load(REPO.parent / "shared" / "data")
seeds = [int(a) for a in sys.argv[1:]] or [0]
out: dict = {"command": " ".join(sys.argv), "runs": {}}
for seed in seeds:
    train, val, noisy = noisy_split(X, y, seed)
    objective = Recorded()
    scores = drop_in_scores(train, val, (X_test, y_test), noisy, seed, objective=objective)
    qs = [float(q) for q in objective.qs]
    out["runs"][seed] = {"kept_evidence": scores, "q_star": [min(qs), max(qs)],
                         "ess_share_at_0.5": [min(objective.ess), max(objective.ess)]}  # fmt: skip
    print(seed, json.dumps(out["runs"][seed]), flush=True)
    (HERE / "news20.json").write_text(json.dumps(out, indent=1))
