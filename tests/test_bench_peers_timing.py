"""Smoke test of benchmarks/bench_peers_timing.py: quick mode on synthetic data."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_quick_run_writes_json_and_figure(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import bench_peers_timing
    finally:
        sys.path.remove(str(BENCH))
    report = bench_peers_timing.main(["--quick", "--repeats", "2", "--out", str(tmp_path)])
    saved = json.loads(Path(report["json_path"]).read_text())
    assert Path(report["json_path"]).with_suffix(".png").stat().st_size > 1000
    methods = {r["method"] for r in saved["rows"]}
    library = {name for name in bench_peers_timing.CASES if name.startswith("SID")}
    assert library <= methods  # (torchopt's row only where it is installed)
    for row in saved["rows"]:
        assert len(row["seconds"]) == 2 and row["seconds_median"] > 0
        assert math.isfinite(row["rel_error"]) and row["epochs"] > 0
    assert "| method | ≤ 0.1: ep, median s |" in saved["markdown"]
