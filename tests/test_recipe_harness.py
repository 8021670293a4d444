"""``benchmarks/recipe_harness.py``: the user-recipe benchmarks' shared harness (session 55), and
the names the recipe scripts keep exporting from where they first stood (a later script imports
them there). No data files and no fits: small tensors only."""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
harness = importlib.import_module("recipe_harness")


def test_noisy_labels_moves_about_35_percent_to_another_class_the_same_way_for_docs_and_tensors():
    y = torch.arange(2000) % 4
    tensors, bad = harness.noisy_labels(TensorDataset(torch.zeros(2000, 1), y), 4, seed=3)
    docs, bad_docs = harness.noisy_labels(harness.Docs([torch.tensor([1])] * 2000, y), 4, seed=3)
    assert torch.equal(bad, bad_docs) and torch.equal(tensors.tensors[1], docs.labels)
    assert 0.3 < bad.float().mean() < 0.4
    assert (tensors.tensors[1][bad] != y[bad]).all() and torch.equal(
        tensors.tensors[1][~bad], y[~bad]
    )


def test_keep_rows_keeps_the_rows_asked_for_in_documents_and_tensors():
    keep = torch.tensor([2, 0])
    docs = harness.keep_rows(
        harness.Docs([torch.tensor([i]) for i in range(3)], torch.arange(3)), keep
    )
    rows = harness.keep_rows(TensorDataset(torch.arange(3.0), torch.arange(3)), keep)
    assert [int(s) for s in docs.seqs] == [2, 0] and docs.labels.tolist() == [2, 0]
    assert rows.tensors[1].tolist() == [2, 0]


def test_auc_is_one_when_every_corrupted_weight_is_lower_and_half_on_ties():
    assert harness.auc(np.array([0.1, 0.2]), np.array([0.5, 0.9])) == 1.0
    assert harness.auc(np.array([0.5, 0.5]), np.array([0.5])) == 0.5
    rec = harness.weights_record(np.array([0.1, 0.9, 0.2]), np.array([True, False, True]))
    assert rec == pytest.approx({"w_bad": 0.15, "w_good": 0.9, "auc": 1.0})


def test_paired_gives_mean_standard_error_and_seeds_worse():
    assert harness.paired([0.1, 0.3, -0.1]) == "+0.1000 ± 0.1155 (2/3)"
    mean, se = harness.mean_se([2.0])
    assert mean == 2.0 and np.isnan(se)


def test_timed_fit_records_the_clock_and_this_packages_warnings_or_the_error():
    record: dict = {}

    def fit():
        warnings.warn("LearnedDataWeights: something to say " + "x" * 50, stacklevel=1)
        warnings.warn("an unrelated warning", stacklevel=1)
        return "model"

    assert harness.timed_fit(record, fit, width=18) == "model"
    assert record["warnings"] == ["LearnedDataWeights"]
    assert record["cpu_s"] >= 0 and record["wall_s"] >= 0 and "error" not in record

    failed: dict = {}
    assert harness.timed_fit(failed, lambda: 1 / 0) is None
    assert failed["error"].startswith("ZeroDivisionError") and "cpu_s" not in failed


def test_records_are_merged_by_key_and_read_in_either_stored_form(tmp_path):
    old = [{"recipe": "a", "arm": "dw", "seed": 0, "x": 1}, {"recipe": "a", "arm": "dw", "seed": 1}]
    new = [{"recipe": "a", "arm": "dw", "seed": 0, "x": 2}]
    merged = harness.merge_records(old, new, harness.recipe_key)
    assert [(r["seed"], r.get("x")) for r in merged] == [(1, None), (0, 2)]
    harness.write_json(tmp_path / "sub" / "bare.json", merged)
    harness.write_json(tmp_path / "wrapped.json", {"command": "c", "records": merged})
    assert harness.read_records(tmp_path / "sub" / "bare.json") == merged
    assert harness.read_records(tmp_path / "wrapped.json") == merged
    assert harness.read_records(tmp_path / "absent.json") == [] == harness.read_records(None)
    assert json.loads((tmp_path / "wrapped.json").read_text())["command"] == "c"


def test_the_recipe_scripts_still_export_the_names_later_scripts_import():
    s50 = importlib.import_module("bench_user_recipes_s50")
    s53 = importlib.import_module("bench_user_recipes_s53")
    for name in ("images", "news", "Docs", "corrupt", "auc", "trainer", "recipe_loader",
                 "package_warnings", "test_loss", "recipe_cli", "NOISE", "bag_collate"):  # fmt: skip
        assert hasattr(s50, name), name
    assert s50.images is harness.images and s53.diabetes is harness.diabetes
    assert s53.shift_targets is harness.shift_targets and s53.split is harness.split
    for module in ("bench_user_recipes_s51", "bench_user_recipes_s54", "bench_imbalanced_s53",
                   "bench_dw_accuracy_s52", "bench_hard_rows_s53"):  # fmt: skip
        assert callable(importlib.import_module(module).main)
