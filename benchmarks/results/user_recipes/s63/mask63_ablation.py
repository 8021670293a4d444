"""Session 63 (mask63): which part of the per-batch masks' rule costs ``ohem``'s test loss.
``mask63_probe.py``'s fit (MNIST 2000 images, 30 % wrong labels, OHEM keeping 70 % of each
batch as ``losses * keep``, every default) under one VARIANT of what the weights read once the
mask is detected:

* ``neither``: nothing (the detection's ``RowMasks()``): main's training, bit for bit;
* ``A``: part A only: a masked row's ω enters Σ ω by value only (the training batches' cross
  term and the hyper steps' ``weighted_mean``), but its 0 stays in the sparse gradient;
* ``B``: part B only: the training batches' cross term leaves a masked row (loss and uᵢ
  exactly 0) out of its sparse gradient, Σ ω as in main;
* ``both``: the branch as committed (``ZeroLossMasks``, A and B).

Each seed prints the flags' precision / recall, the test loss / accuracy and the weights'
trajectory, by epoch: Σ ω of the batch over its rows (mean), the kept rows' share of it, the
mean ω of the batch's kept and masked rows, and the mean ω of every clean and corrupted row::

    cd benchmarks/results/user_recipes/s63 && PYTHONPATH=../../../.. OMP_NUM_THREADS=1 \\
        python mask63_ablation.py A seeds=0,1,2,3,4,5 [keep=0.5] [hyper_step]
"""

import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench_user_recipes_s62 as b  # noqa: E402

import hypertorch_sid.core.directional as directional  # noqa: E402
import hypertorch_sid.core.sample_weights as sample_weights  # noqa: E402
from hypertorch_sid import LearnedDataWeights  # noqa: E402
from hypertorch_sid.core.weighted_loss import RowMasks, weighted_loss  # noqa: E402
from hypertorch_sid.lightning.batch_masks import MaskDetection  # noqa: E402

DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"
warnings.simplefilter("ignore")
torch.set_num_threads(1)
VARIANT = sys.argv[1]
SEEDS = next((a[6:] for a in sys.argv[2:] if a.startswith("seeds=")), "0,1,2")
EXTRA = {"cross_term": "hyper_step"} if "hyper_step" in sys.argv[2:] else {}
#: the share of each batch OHEM keeps, ``keep=0.5`` among the arguments (default 0.7)
b.OHEM.KEEP = float(next((a[5:] for a in sys.argv[2:] if a.startswith("keep=")), 0.7))
_stash: dict = {}


def _no_held(losses, weights, normalize=False, hold_normaliser=False, masked=None):
    return weighted_loss(losses, weights, normalize, hold_normaliser)


def _stashed(losses, weights, normalize=False, hold_normaliser=False, masked=None):
    masked = _stash.pop("masked", None) if masked is None else masked
    return weighted_loss(losses, weights, normalize, hold_normaliser, masked)


_masked = directional.TrainingCrossTerm._masked


def _masked_kept_in(self, u, losses):  # part A's mask for Σ ω, no row left out
    _stash["masked"] = _masked(self, u, losses)
    return None


if VARIANT == "neither":
    MaskDetection.row_masks = lambda self: RowMasks()
elif VARIANT == "A":
    directional.TrainingCrossTerm._masked = _masked_kept_in
    directional.weighted_loss = _stashed
elif VARIANT == "B":
    directional.weighted_loss = _no_held
    sample_weights.weighted_loss = _no_held
elif VARIANT != "both":
    raise SystemExit(f"unknown variant {VARIANT!r}: neither, A, B or both")


class OHEM(b.OHEM):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        k = max(1, int(self.KEEP * len(loss)))
        keep = loss.detach() >= loss.detach().topk(k).values[-1]
        if getattr(self, "fresh", False):  # the batch's own step (not a re-run, a hyper step)
            self.keep, self.fresh = keep, False
        return loss * keep


b.OHEM = OHEM


class Trajectory(pl.Callback):
    """By epoch: the batches' Σ ω, the kept rows' share of it, the kept / masked rows' mean ω
    (after the step), and every clean / corrupted row's mean ω at the epoch's end."""

    def __init__(self, cb: LearnedDataWeights, bad: torch.Tensor) -> None:
        self.cb, self.bad, self.rows, self.epochs = cb, bad, [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.fresh = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        omega = self.cb.data_weights()[batch.index]
        keep = pl_module.keep
        self.rows.append(
            [float(omega.sum()), float(omega[keep].sum() / omega.sum()), float(omega[keep].mean()),
             float(omega[~keep].mean())]
        )  # fmt: skip

    def on_train_epoch_end(self, trainer, pl_module):
        omega = self.cb.data_weights()
        mean = torch.tensor(self.rows).mean(0).tolist()
        self.epochs.append(mean + [float(omega[~self.bad].mean()), float(omega[self.bad].mean())])
        self.rows = []


for seed in map(int, SEEDS.split(",")):
    setup = b.Setup("ohem", DATA, seed)
    train, bad = setup.corrupted()
    cb = LearnedDataWeights(**EXTRA)
    trajectory = Trajectory(cb, bad)
    model = setup.fit([cb, trajectory], train, bad, True, setup.own, {"arm": "dw_masked"})
    flagged = torch.zeros(len(train), dtype=torch.bool)
    flagged[cb.flagged()] = True
    test_loss, test_acc = setup.score(model)
    precision = float((flagged & bad).sum()) / max(1, int(flagged.sum()))
    recall = float((flagged & bad).sum()) / int(bad.sum())
    print(
        f"{VARIANT} {' '.join(EXTRA.values())} keep {b.OHEM.KEEP} seed {seed}: flags "
        f"{int(flagged.sum())} P/R {precision:.3f} / {recall:.3f}; test {test_loss:.4f} / "
        f"{test_acc:.4f}",
        flush=True,
    )
    for epoch, row in enumerate(trajectory.epochs):
        print(
            f"  epoch {epoch}: batch Σω {row[0]:.2f} kept share {row[1]:.3f} ω kept "
            f"{row[2]:.3f} masked {row[3]:.3f}; clean {row[4]:.3f} corrupted {row[5]:.3f}",
            flush=True,
        )
