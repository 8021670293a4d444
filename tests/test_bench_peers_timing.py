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
    assert (
        "| method | ≤ 0.1: fewest epochs (ep, s) | ≤ 0.1: fewest s (ep, s) |" in saved["markdown"]
    )


def test_summary_tells_the_fewest_epochs_from_the_fewest_seconds():
    """A larger budget can be faster (Automatic switches to CG): both are reported."""
    sys.path.insert(0, str(BENCH))
    try:
        import bench_peers_timing
    finally:
        sys.path.remove(str(BENCH))
    rows = [
        {"method": "m", "epochs": 18.0, "seconds_median": 1.0, "rel_error": 0.08},
        {"method": "m", "epochs": 23.0, "seconds_median": 0.6, "rel_error": 0.09},
        {"method": "m", "epochs": 40.0, "seconds_median": 1.1, "rel_error": 0.009},
    ]
    assert bench_peers_timing.first_reaching(rows, "m", 0.1)["epochs"] == 18
    assert bench_peers_timing.first_reaching(rows, "m", 0.1, "seconds_median")["epochs"] == 23
    line = bench_peers_timing.summary(rows, ["m"]).splitlines()[-1]
    assert line == "| m | 18, 1.00 | 23, 0.60 | 40, 1.10 | 40, 1.10 |"
