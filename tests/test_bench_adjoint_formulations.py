"""``benchmarks/bench_adjoint_formulations.py --quick``: every formulation runs and is reported.

Structure only (the numbers are the benchmark's): each candidate has a row per seed, hyper steps
were attempted, and the markdown table names every formulation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_adjoint_formulations.py"


def test_quick_run_reports_every_formulation(tmp_path):
    out = tmp_path / "af.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)], check=True, cwd=REPO
    )
    result = json.loads(out.read_text())
    per = result["settings"]["digits_mlp"]
    assert len(per["no_wd"]) == 1
    assert len(per["formulations"]) == 7  # Gauss–Newton included
    for label, rows in per["formulations"].items():
        assert len(rows) == 1 and label in result["table_markdown"]
        row = rows[0]
        assert row["attempted"] >= 2
        assert 0 <= row["accepted"] <= row["attempted"]
        if row["finished"]:
            assert row["best_val_loss"] > 0
    assert out.with_suffix(".png").exists()
