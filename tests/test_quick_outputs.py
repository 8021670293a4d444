"""``--quick`` smoke runs never overwrite the committed full-protocol results.

Without ``--out``, the paper scripts and ``benchmarks/bench_residual_norm.py`` write full runs to
``results/`` / ``benchmarks/results/`` and quick runs to a fresh temporary folder; ``--out`` wins
in both cases. Only the residual-norm benchmark is run (a few seconds); the paper scripts' option
handling is checked without running them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

import _paper_common as common  # noqa: E402
import datasets  # noqa: E402  (examples/datasets.py)

PAPER_OUTPUTS = ["news20.json", "mnist_binary.json", "mnist_multiclass.json"]


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.mark.parametrize("name", PAPER_OUTPUTS)
def test_paper_quick_run_writes_to_a_temporary_folder(name: str) -> None:
    args = common.parse_args("t", name, argv=["--quick"])
    assert args.out.name == name
    assert REPO not in args.out.resolve().parents
    assert args.out.parent.is_dir() and not any(args.out.parent.iterdir())
    args.out.parent.rmdir()


@pytest.mark.parametrize("name", PAPER_OUTPUTS)
def test_paper_full_run_writes_results_and_out_wins(name: str, tmp_path: Path) -> None:
    assert common.parse_args("t", name, argv=[]).out == REPO / "results" / name
    for extra in ([], ["--quick"]):
        args = common.parse_args("t", name, argv=[*extra, "--out", str(tmp_path / "x.json")])
        assert args.out == tmp_path / "x.json"


def test_paper_data_option_sets_the_data_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(datasets.DATA_ENV_VAR, "")  # restored after the test
    common.parse_args("t", "x.json", argv=["--quick", "--data", str(tmp_path)])
    assert os.environ[datasets.DATA_ENV_VAR] == str(tmp_path.resolve())
    assert datasets.default_data_root() == tmp_path.resolve()


def test_weight_decay_example_quick_plot_goes_to_a_temporary_folder() -> None:
    import weight_decay_tuning

    out = Path(weight_decay_tuning.parse(["--quick"]).out)
    assert out.name == "weight_decay_tuning.png" and REPO not in out.resolve().parents
    out.parent.rmdir()
    assert weight_decay_tuning.parse([]).out == os.path.join(".", "weight_decay_tuning.png")


def test_bench_residual_norm_quick_keeps_committed_json(tmp_path: Path) -> None:
    committed = REPO / "benchmarks" / "results" / "residual_norm" / "residual_norm.json"
    before = _digest(committed)
    script = REPO / "benchmarks" / "bench_residual_norm.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wrote = Path(proc.stdout.strip().splitlines()[-1].removeprefix("wrote "))
    assert wrote.is_file() and wrote.name == "residual_norm.json"
    assert REPO not in wrote.resolve().parents
    assert _digest(committed) == before
    wrote.unlink()
    wrote.parent.rmdir()
