"""``benchmarks/bench_network_cost.py``: one tiny timed run per configuration (the records the
summary needs) and its ratio table on fake records; no timing is asserted."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_network_cost.py"
spec = importlib.util.spec_from_file_location("bench_network_cost", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("network", ["MLP", "LSTM"])
def test_a_tiny_run_of_each_configuration_records_what_the_table_needs(network):
    records = [bench.run_one(network, c, 0, 0.5, 25, 128) for c in bench.CONFIGS]
    for r in records:
        assert r["steps"] == 25 and r["fit_s"] > 0 and r["fit_cpu_s"] > 0
    for r in records[1:]:
        assert set(r["phases"]) == set(bench.PhaseTimer.PARTS) and r["hyper_steps_due"] == 1
        assert math.isfinite(r["overhead"]) and r["budget"]["spent_training"] > 0
    unbudgeted = records[1]  # (a 25-step fit's budget may pay for no hyper step: none required)
    assert unbudgeted["cost"]["hypergradients"] >= 1
    assert unbudgeted["phases"]["curvature"] > 0 and unbudgeted["phases"]["adjoint"] > 0
    summary = bench.summarise(records, 0.5)
    assert {"unbudgeted", "default"} <= set(summary[network])
    assert network in bench.markdown(summary, 0.5)
    assert records[0]["load"] >= 0  # the machine's load is kept with each fit


def test_ratios_are_per_repeat_against_that_repeats_plain_fit():
    def rec(config, repeat, cpu):
        extra = {} if config == "plain" else {
            "overhead": 0.5, "budget": {"hyper_steps": 2, "spent_training": 1.0},
            "phases": dict.fromkeys(bench.PhaseTimer.PARTS, 0.1),
            "cost": {"jacobian_vector_products": 4}, "steps": 10,
        }  # fmt: skip
        return {"network": "MLP", "config": config, "repeat": repeat, "fit_s": cpu,
                "fit_cpu_s": cpu, **extra}  # fmt: skip

    records = [rec("plain", 0, 1.0), rec("unbudgeted", 0, 3.0), rec("default", 0, 1.5),
               rec("plain", 1, 2.0), rec("unbudgeted", 1, 4.0), rec("default", 1, 3.0)]  # fmt: skip
    d = bench.summarise(records, 0.5)["MLP"]
    assert d["unbudgeted"]["ratios"] == [3.0, 2.0] and d["default"]["ratios"] == [1.5, 1.5]
    assert (d["unbudgeted"]["ratio_min"], d["unbudgeted"]["ratio_max"]) == (2.0, 3.0)
    assert "2.50 [2.00, 3.00]" in bench.markdown(bench.summarise(records, 0.5), 0.5)
