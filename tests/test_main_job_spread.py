"""``benchmarks/main_job_spread.py``: one run of the main job's learned arm without a budget records
every due hyper step, the λ path and its constants (what the docs' trace reads); no timing or
test loss is asserted beyond being finite."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "main_job_spread.py"
spec = importlib.util.spec_from_file_location("main_job_spread", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_one_unbudgeted_run_records_every_hyper_step_and_its_constants(tmp_path, monkeypatch):
    out = tmp_path / "none.json"
    argv = ["main_job_spread.py", "--runs", "1", "--max-overhead", "none", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert run["hyper_steps"] == list(range(20, 401, 20))  # max_overhead=None: all 20 due
    assert all(math.isfinite(p["lam_mean"]) and p["L"] > 0 for p in run["path"])
    assert math.isfinite(run["test_loss"]) and result["max_overhead"] == "none"


def test_the_arms_build_the_budgets_they_name():
    assert bench.budget("default") == {} and bench.budget("none") == {"max_overhead": None}
    assert type(bench.budget("planned")["max_overhead"]).__name__ == "PlannedBudget"
    assert bench.budget("0.25") == {"max_overhead": 0.25}
