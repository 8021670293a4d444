import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# Small tensors: one intra-op thread avoids OpenMP overhead and makes runs bitwise reproducible.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Files whose tests take the longest (pytest --durations on this 2-core machine: the paper scripts'
# --quick runs, DDP and kill-and-resume subprocesses, the benchmark quick runs, 20news loading).
# They start first, so that under pytest-xdist (scripts/test.sh) no worker is left running one of
# them alone at the end.
SLOW_FIRST = (
    "test_paper_examples.py",
    "test_faults_lightning.py",
    "test_lightning_ddp.py",
    "test_bench_weight_decay.py",
    "test_datasets.py",
    "test_bench_peers.py",
    "test_core_ridge.py",
    "test_schedules.py",
    "test_faults_core.py",
    "test_hooks_ddp_resume_s57.py",
    "test_data_weights_early_stop_s57.py",
    "test_left_s59.py",
)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.split("::")[0].endswith(SLOW_FIRST))  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine (CUDA tests run on a GPU host)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
