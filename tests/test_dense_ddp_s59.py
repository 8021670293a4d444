"""LearnedDataWeights with a user's dense outer optimizer under DDP (session 59).

Session 58 made the drop-in hand an outer optimizer that takes no sparse gradient (``torch.optim
.Adam``, an Rprop) a dense hypergradient, zero off the batch's rows, and sum it across ranks
under DDP; only the one-process path was tested. Here a 2-process DDP fit with ``Adam`` and the
training cross term must keep both ranks' weights identical (each rank moves every row by the
summed gradient, or they drift apart), separate the corrupted examples from the clean ones, and
equal a rerun bit for bit.
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


def _worker(out: Path, tag: str) -> None:
    """One DDP rank: the drop-in with a dense ``Adam`` outer step; each rank saves its weights."""
    torch.set_num_threads(1)
    cb = callback(
        val_batch_size=30,
        outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1),
        cross_term="training",
        max_overhead=None,
    )
    t = trainer([cb], devices=2, strategy="ddp", max_epochs=6)
    t.fit(Classifier(), datamodule=Data())
    torch.save(cb.data_weights(), out / f"{tag}_rank{t.global_rank}.pt")
    end_ddp_worker()


def _fit(out: Path, tag: str) -> tuple[Tensor, Tensor]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out), "--tag", tag]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return tuple(torch.load(out / f"{tag}_rank{r}.pt") for r in (0, 1))


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_a_dense_outer_optimizer_under_ddp_keeps_the_ranks_identical(tmp_path):
    w0, w1 = _fit(tmp_path, "a")
    assert torch.equal(w0, w1)  # a gradient not summed across ranks moves each rank's rows apart
    assert torch.isfinite(w0).all()
    assert w0[:NOISY].mean() < w0[NOISY:].mean() - 0.1
    again, _ = _fit(tmp_path, "b")
    assert torch.equal(w0, again)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    args = parser.parse_args()
    _worker(args.worker, args.tag)
