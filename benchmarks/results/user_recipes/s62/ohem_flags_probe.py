"""Session 62, ``ohem``'s data weights: the share of clean rows ``flagged()`` names, by quartile of
the final model's training loss (easiest first), under OHEM's per-batch mask (``KEEP`` 0.7, the
``dw_masked`` arm) against the same fit with every row kept (``KEEP`` 1.0).

    cd benchmarks/results/user_recipes/s62 && for keep in 0.7 1.0; do \
        PYTHONPATH=../../../.. OMP_NUM_THREADS=1 python ohem_flags_probe.py $keep; done
"""

import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench_user_recipes_s62 as b  # noqa: E402

from hypertorch_sid import LearnedDataWeights  # noqa: E402

#: the shared data, from the repository root's parent
DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"
warnings.simplefilter("ignore")
torch.set_num_threads(1)
b.OHEM.KEEP = float(sys.argv[1])
for seed in (0, 1, 2):
    setup = b.Setup("ohem", DATA, seed)
    train, bad = setup.corrupted()
    cb = LearnedDataWeights()
    model = setup.fit([cb], train, bad, True, setup.own, {"arm": "dw_masked"})
    flagged = torch.zeros(len(train), dtype=torch.bool)
    flagged[cb.flagged()] = True
    model.eval()
    with torch.no_grad():
        x, y = train.tensors
        loss = F.cross_entropy(model(x), y, reduction="none")
    clean = ~bad
    bucket = torch.bucketize(loss, torch.quantile(loss[clean], torch.tensor([0.25, 0.5, 0.75])))
    rates = [round(float(flagged[clean & (bucket == k)].float().mean()), 3) for k in range(4)]
    noisy = round(float(flagged[bad].float().mean()), 3)
    print(f"KEEP {b.OHEM.KEEP} seed {seed}: clean rows flagged by quartile {rates}; noisy {noisy}")
