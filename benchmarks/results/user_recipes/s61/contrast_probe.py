"""Session 61 probe (not a test): would a contrast check separate a regression's good flags from
poor ones?

J = the share of the flagged rows whose last-visit training loss exceeds the q-quantile of the
clean validation rows' losses (the final model) − the same share of the kept rows, for
``noisy_reg`` (session 61) and ``diabetes_mse`` (session 53), ``LearnedDataWeights(objective=
"mean_loss")``, seeds 0-2. From the repository root::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/results/user_recipes/s61/contrast_probe.py

prints one JSON line per fit (kept in ``contrast_probe.jsonl``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
import bench_user_recipes_s53 as s53  # noqa: E402
import bench_user_recipes_s61 as s61  # noqa: E402

from hypertorch_sid import LearnedDataWeights  # noqa: E402

CAUGHT: dict = {}


class Capture(LearnedDataWeights):
    """The drop-in, keeping itself and the module at the fit's end."""

    def on_train_end(self, trainer, pl_module):
        super().on_train_end(trainer, pl_module)
        CAUGHT["cb"], CAUGHT["model"] = self, pl_module


def contrast(setup, bad: torch.Tensor) -> dict:
    cb, model = CAUGHT["cb"], CAUGHT["model"]
    flags = cb.flagged()
    last = cb.problem._last_loss.cpu()
    seen = torch.isfinite(last)
    flagged = torch.zeros(len(last), dtype=torch.bool)
    flagged[flags] = True
    model.eval()
    x, y = setup.val.tensors
    with torch.no_grad():
        val = model.per_sample_loss(model(x), y).reshape(len(y), -1).mean(1)
    row = {
        "n_flagged": int(flagged.sum()), "precision": float(bad[flagged].float().mean()),
        "recall": float(flagged[bad].float().mean()),
    }  # fmt: skip
    for q in (0.9, 0.95, 0.99):
        tau = float(val.quantile(q))
        s_low = float((last[flagged & seen] > tau).float().mean())
        s_kept = float((last[~flagged & seen] > tau).float().mean())
        row[f"J{q}"], row[f"s{q}"] = round(s_low - s_kept, 3), (round(s_low, 3), round(s_kept, 3))
    return row


#: ../shared/data beside the repository (this file is benchmarks/results/user_recipes/s61/)
DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    s61.LearnedDataWeights = Capture
    s53.LearnedDataWeights = Capture
    for bench, name in ((s61, "noisy_reg"), (s53, "diabetes_mse")):
        for seed in (0, 1, 2):
            setup = bench.Setup(name, DATA, seed)
            setup.run("dw")
            bad = (setup.corrupted() if bench is s61 else setup.noisy_train())[1]
            print(json.dumps({"recipe": name, "seed": seed, **contrast(setup, bad)}), flush=True)


if __name__ == "__main__":
    main()
