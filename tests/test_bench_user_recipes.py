"""``benchmarks/bench_user_recipes.py``: pytorch/examples' two MNIST networks as re-typed there,
one tiny fit per configuration on fake images (no MNIST needed) and the table and figure from
its records; no timing is asserted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_user_recipes.py"
spec = importlib.util.spec_from_file_location("bench_user_recipes", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("recipe", sorted(bench.RECIPES))
def test_each_network_returns_log_probabilities_of_ten_classes(recipe):
    net = bench.RECIPES[recipe][0]().eval()
    out = net(torch.randn(4, 1, 28, 28))
    assert out.shape == (4, 10)
    torch.testing.assert_close(out.exp().sum(1), torch.ones(4))


def fake(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def test_a_tiny_fit_of_each_configuration_gives_the_table_and_the_figure(tmp_path):
    data = {"train": fake(128, 0), "val": fake(64, 1), "test": fake(64, 2)}
    records = [bench.run_one("lstm", c, 0, data, 1) for c in ("plain", "default")]
    plain, default = records
    assert plain["steps"] == default["steps"] == 2 and plain["fit_cpu_s"] > 0
    assert "lam" not in plain and set(default["lam"]) >= {"net.fc2.weight", "net.rnn.weight_ih_l0"}
    assert default["hyper_steps_due"] == 0 and default["hyper_steps"] == 0
    out = tmp_path / "r.json"
    bench.write(records, "cmd", 1, out)
    assert "| lstm |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").is_file()
    assert json.loads(out.read_text())["summary"]["lstm"]["cpu_ratio"]["each"]
