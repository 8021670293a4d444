"""``benchmarks/issue28_beat_table.py``: an arm's test loss is the run its arm trained, never a
learned run that ``--reuse`` copied into the same file (session 45's per-element arm read the
stored per-layer run that way and reported per element 0.0131 worse on 20 Newsgroups than it
was). Fake result files, written through the benchmark's own ``reuse_runs``; no training."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "issue28_beat_table.py"
spec = importlib.util.spec_from_file_location("issue28_beat_table", SCRIPT)
beat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(beat)
bench = beat.sys.modules["bench_weight_decay"]

SETTING = "news_mlp"
CONFIG = {k: 1 for k in bench._SAME_TRAINING}


def arm_file(folder: Path, arm: str, seed: int, trained: dict[str, float]) -> None:
    """A result file as ``issue28_beat_run_arm.sh`` writes it: the stored file's runs (no decay,
    per layer, global) copied with ``--reuse``, then the arm's own trainings (``trained``)."""
    stored = folder / "stored.json"
    copied = ("no_wd", "learned_per_layer", "learned_global")
    runs_stored = {m: {"test_loss": 9.0, "wall_s": 1.0, "lambda_by_slot": {}} for m in copied}
    record = {"config": CONFIG, "runs": runs_stored}
    stored.write_text(json.dumps({"settings": {SETTING: record}}))
    runs: dict = {}
    reused = bench.reuse_runs(str(stored), SETTING, CONFIG, set(trained), runs)
    runs.update({m: {"test_loss": loss, "lambda_by_slot": {}} for m, loss in trained.items()})
    name = f"weight_decay_{arm}_{SETTING}_{beat.base_of(seed)}_seed{seed}.json"
    (folder / name).write_text(json.dumps({"settings": {SETTING: {"runs": runs,
                                                                   "reused": reused}}}))  # fmt: skip


def test_the_arm_reads_the_method_it_trained_not_a_reused_one(tmp_path):
    arm_file(tmp_path, "elem", 0, {"learned_per_element": 1.5})
    assert beat.variant("elem", SETTING, 0, tmp_path)["test_loss"] == 1.5
    arm_file(tmp_path, "glob", 0, {"learned_global": 2.5})
    assert beat.variant("glob", SETTING, 0, tmp_path)["test_loss"] == 2.5
    arm_file(tmp_path, "ctl", 3, {"learned_per_layer": 3.5})
    assert beat.variant("ctl", SETTING, 3, tmp_path)["test_loss"] == 3.5
    assert beat.variant("ctl", SETTING, 4, tmp_path) is None  # no file: missing


def test_a_file_that_trained_two_learned_methods_names_the_one_to_read(tmp_path):
    arm_file(tmp_path, "both", 0, {"learned_per_layer": 1.0, "learned_per_element": 2.0})
    with pytest.raises(ValueError, match="trained 2 learned methods"):
        beat.variant("both", SETTING, 0, tmp_path)
    assert beat.variant("both", SETTING, 0, tmp_path, "learned_per_element")["test_loss"] == 2.0
    assert beat.variant("both", SETTING, 0, tmp_path, "learned_per_layer")["test_loss"] == 1.0
    arm_file(tmp_path, "elem", 0, {"learned_per_element": 1.5})
    with pytest.raises(ValueError, match="did not train learned_per_layer"):
        beat.variant("elem", SETTING, 0, tmp_path, "learned_per_layer")  # a copied run


def test_the_table_pairs_the_arm_with_its_control_on_the_trained_runs(tmp_path):
    deployment = tmp_path / "deployment.json"
    refs = {r: {"seeds": {str(n): {"test_loss": 1.0} for n in range(2)}} for r in beat.REFERENCES}
    deployment.write_text(json.dumps({"deployment": {"settings": {SETTING: refs}}}))
    for n, (elem, ctl) in enumerate([(1.2, 1.3), (1.1, 1.25)]):
        arm_file(tmp_path, "elem", n, {"learned_per_element": elem})
        arm_file(tmp_path, "ctl", n, {"learned_per_layer": ctl})
    _, data = beat.table("elem", [SETTING], None, tmp_path, (deployment,), "ctl")
    assert data[SETTING]["test_loss"] == [1.2, 1.1]
    assert data[SETTING]["control"]["difference"]["mean"] == pytest.approx(-0.125)
