"""Session 63 (mask63; session 62's ``mask62_probe.py`` with the test score), ``ohem``'s data
weights under a per-batch mask: the share of clean rows ``flagged()`` names by quartile of the
final model's training loss (easiest first), the flags' precision / recall against the moved
labels, the mean weight of the clean rows by quartile, and the held-out test loss / accuracy.
Arguments: ``KEEP`` (0.7: OHEM's mask, the ``dw_masked`` arm; 1.0: every row kept) and
optionally ``forward_mode`` (the cross term by dual numbers) or ``hyper_step``
(``cross_term='hyper_step'``: only the hyper steps' own batches move the weights), and
``seeds=3,4,5`` (default 0, 1, 2). The package
measured is the one on ``PYTHONPATH`` (this branch, or main for the code before the fix):

    cd benchmarks/results/user_recipes/s63 && for keep in 0.7 1.0; do \\
        PYTHONPATH=../../../.. OMP_NUM_THREADS=1 python mask63_probe.py $keep; done
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
extra = {"directional": "forward_mode"} if "forward_mode" in sys.argv[2:] else {}
#: the seeds, ``seeds=3,4,5`` among the arguments (default 0, 1, 2)
SEEDS = next((a[6:] for a in sys.argv[2:] if a.startswith("seeds=")), "0,1,2")
if "hyper_step" in sys.argv[2:]:  # only the hyper steps' own batches move the weights
    extra["cross_term"] = "hyper_step"
for seed in map(int, SEEDS.split(",")):
    setup = b.Setup("ohem", DATA, seed)
    train, bad = setup.corrupted()
    cb = LearnedDataWeights(**extra)
    model = setup.fit([cb], train, bad, True, setup.own, {"arm": "dw_masked"})
    flagged = torch.zeros(len(train), dtype=torch.bool)
    flagged[cb.flagged()] = True
    omega = cb.data_weights()
    model.eval()
    with torch.no_grad():
        x, y = train.tensors
        loss = F.cross_entropy(model(x), y, reduction="none")
    clean = ~bad
    bucket = torch.bucketize(loss, torch.quantile(loss[clean], torch.tensor([0.25, 0.5, 0.75])))
    rates = [round(float(flagged[clean & (bucket == k)].float().mean()), 3) for k in range(4)]
    means = [round(float(omega[clean & (bucket == k)].mean()), 3) for k in range(4)]
    test_loss, test_acc = setup.score(model)
    precision = float((flagged & bad).sum()) / max(1, int(flagged.sum()))
    recall = float((flagged & bad).sum()) / int(bad.sum())
    arm = " ".join(a for a in sys.argv[2:] if not a.startswith("seeds="))
    print(
        f"KEEP {b.OHEM.KEEP} {arm} seed {seed}: clean rows flagged by quartile {rates}; noisy "
        f"{round(float(flagged[bad].float().mean()), 3)}; flags {int(flagged.sum())} P/R "
        f"{precision:.3f} / {recall:.3f}; clean ω by quartile {means}, noisy "
        f"{float(omega[bad].mean()):.3f}; test {test_loss:.4f} / {test_acc:.4f}"
    )
