"""Smoke test of benchmarks/bench_peers.py: quick mode on synthetic data (no MNIST needed).

The peers (torchopt, betty-ml, higher) are optional: their part is skipped when not installed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_peers
    finally:
        sys.path.remove(str(BENCH))
    return bench_peers


@pytest.fixture(scope="module")
def quick_report(bench, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench_peers")
    argv = ["--quick", "--synthetic", "--features", "50", "--n", "200", "--budgets", "2", "20"]
    report = bench.main([*argv, "--no-peers", "--out", str(out)])
    return report, out


def test_quick_json_structure(bench, quick_report):
    report, out = quick_report
    saved = json.loads(Path(report["json_path"]).read_text())
    assert Path(report["json_path"]).parent == out
    assert Path(report["json_path"]).with_suffix(".png").exists()
    assert saved["quick"] is True and saved["config"]["budgets"] == [2, 20]
    methods = saved["accuracy"]["methods"]
    assert {bench.DEFAULTS, bench.DEFAULTS_ONE_SHOT, "SID decreasing (0.1 default)"} <= set(methods)
    for name, res in methods.items():
        assert res["package"] == "hypertorch_sid", name
        assert [r["budget"] for r in res["rows"]] == [2.0, 20.0], name
        for row in res["rows"]:
            assert {"epochs", "seconds", "rel_error"} <= set(row), (name, row)
            assert math.isfinite(row["rel_error"]) and row["epochs"] > 0
    scaling = saved["scaling"]
    assert [r["hyperparameters"] for r in scaling["hyperparameters"]] == [1, 10, 1000]
    assert all(r["seconds_per_step"] > 0 and r["peak_mib"] >= 0 for r in scaling["hyperparameters"])
    assert {r["n_train"] for r in scaling["n_train"]} == {200, 800}
    assert saved["markdown"].startswith("| method |")


def test_library_error_decreases_with_budget(bench, quick_report):
    report, _ = quick_report
    for name, res in report["accuracy"]["methods"].items():
        errs = [r["rel_error"] for r in res["rows"]]
        assert errs[-1] < errs[0], (name, errs)
    # the epochs counted include the library's curvature estimation: never below the budget
    for row in report["accuracy"]["methods"][bench.DEFAULTS_ONE_SHOT]["rows"]:
        assert row["epochs"] >= row["budget"]


@pytest.mark.parametrize("package", ["torchopt", "betty", "higher"])
def test_peers_run(bench, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (optional: pip install -e .[bench])")
    torch.set_num_threads(1)
    train, val = bench.synthetic_odd_even(100, 100, seed=0, d=20)
    ctx = bench.make_context(train, val, batch_size=20, seed=0)
    ran = 0
    for pkg, name, factory in bench.peer_methods():
        if pkg != package:
            continue
        res = factory(ctx, 10.0)
        err = bench.rel_error(res["g"], ctx.truth)
        assert math.isfinite(err) and res["samples"] > 0, name
        ran += 1
    assert ran >= 1


def test_reach_picks_the_cheapest_budget_meeting_each_target(bench, quick_report):
    rows = [
        {"epochs": 10, "seconds": 1.0, "rel_error": 0.3},
        {"epochs": 20, "seconds": 2.0, "rel_error": 0.05},
        {"epochs": 50, "seconds": 5.0, "rel_error": 0.002},
        {"epochs": 5, "error": "failed"},
    ]
    assert bench.reach(rows, 1e-1)["epochs"] == 20
    assert bench.reach(rows, 1e-2)["seconds"] == 5.0
    assert bench.reach(rows, 1e-3) is None
    table = bench.reach_table({"m": {"rows": rows}, "peer": {"skipped": "not installed"}})
    assert table[2] == "| m | 20, 2.0 | 50, 5.0 | not reached |" and len(table) == 3
    assert "| method | ≤ 0.1: ep, s |" in quick_report[0]["markdown"]
