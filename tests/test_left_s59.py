"""The dense hypergradient of a user's outer optimizer under DDP has the sparse path's scale
(session 59).

``tests/test_dense_ddp_s59.py`` fits with ``Adam``, which is (almost) blind to the gradient's
scale: a dense gradient summed twice, or averaged where it should be summed, moves the ranks
identically and still separates the corrupted rows. Here the outer step is plain ``SGD`` (its
step is the gradient times lr) and the same 2-process DDP fit runs twice: with the row-sparse
gradients all-gathered (``sparse_grad=True``) and with the dense one summed across ranks (the
path a user's optimizer gets). The two must give the same weights up to float rounding.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning_problems import end_ddp_worker, trainer
from test_data_weights_lightning import NOISY, Classifier, Data, callback
from torch import Tensor


def _worker(out: Path, sparse: bool) -> None:
    """One DDP rank: the drop-in with a plain ``SGD`` outer step, row-sparse or dense."""
    torch.set_num_threads(1)
    cb = callback(
        val_batch_size=30,
        outer_optimizer=functools.partial(torch.optim.SGD, lr=20.0),
        cross_term="training",
        max_overhead=None,
        sparse_grad=True if sparse else None,
    )
    t = trainer([cb], devices=2, strategy="ddp", max_epochs=6)
    t.fit(Classifier(), datamodule=Data())
    torch.save(cb.data_weights(), out / f"{sparse}_rank{t.global_rank}.pt")
    end_ddp_worker()


def _fit(out: Path, sparse: bool) -> tuple[Tensor, Tensor]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
    cmd += ["--sparse"] if sparse else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return tuple(torch.load(out / f"{sparse}_rank{r}.pt") for r in (0, 1))


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_the_dense_ddp_gradient_moves_the_weights_as_the_sparse_one(tmp_path):
    dense0, dense1 = _fit(tmp_path, sparse=False)
    sparse0, sparse1 = _fit(tmp_path, sparse=True)
    assert torch.equal(dense0, dense1) and torch.equal(sparse0, sparse1)
    assert dense0[:NOISY].mean() < dense0[NOISY:].mean() - 0.1
    assert (sparse0 - 0.5).abs().max() > 0.3
    # measured 2e-5 (float32 rounding of the sums); a dense gradient summed twice gives 0.15
    assert (dense0 - sparse0).abs().max() < 1e-3, (dense0 - sparse0).abs().max()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True)
    parser.add_argument("--sparse", action="store_true")
    args = parser.parse_args()
    _worker(args.worker, args.sparse)
