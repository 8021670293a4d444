"""Session 62 (mask62): rows masked at every visit (labels -100) on the careless-user toy, every
fifth row's label moved (the unlabelled excepted), 8 epochs: their weights against the moved and
clean rows', and the share of each that ``flagged()`` names, under both cross terms. From the
repository root (PYTHONPATH: this branch, or main for the code before the fix):

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 \\
        python benchmarks/results/user_recipes/s62/mask62_unlabelled_toy.py
"""

import sys
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from lightning_problems import TOY_X, TOY_Y, ToyClassifier, trainer  # noqa: E402

from hypertorch_sid import IndexedDataset, LearnedDataWeights  # noqa: E402

labels = TOY_Y.clone()
labels[::6] = -100
noisy = torch.zeros(len(TOY_Y), dtype=torch.bool)
noisy[1::5] = True
noisy[::6] = False
g = torch.Generator().manual_seed(1)
labels[noisy] = (labels[noisy] + 1 + torch.randint(0, 2, (int(noisy.sum()),), generator=g)) % 3
train = DataLoader(IndexedDataset(TensorDataset(TOY_X, labels)), batch_size=24, shuffle=True)
val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
masked = labels == -100
clean = ~masked & ~noisy
for cross_term in ("training", "hyper_step"):
    torch.manual_seed(0)
    cb = LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None, cross_term=cross_term)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=8).fit(ToyClassifier("none"), train, val)
        rows = cb.flagged()
    w = cb.data_weights()
    flagged = torch.zeros(len(TOY_Y), dtype=torch.bool)
    flagged[rows] = True
    share = {k: float(flagged[m].float().mean()) for k, m in (("m", masked), ("n", noisy))}
    print(
        f"{cross_term}: {len(rows)} flagged; ω masked {float(w[masked].mean()):.3f} "
        f"(min {float(w[masked].min()):.3f} max {float(w[masked].max()):.3f}) noisy "
        f"{float(w[noisy].mean()):.3f} clean {float(w[clean].mean()):.3f}; flagged: masked "
        f"{share['m']:.2f} noisy {share['n']:.2f} clean {float(flagged[clean].float().mean()):.2f}"
    )
    for c in caught:
        said = str(c.message)
        if "flagged" in said or "exactly 0" in said:
            print("  warned:", said[:200])
