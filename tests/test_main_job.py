"""The main job (examples/lightning_digits.py) runs end to end on a short training: three ways,
a table, a JSON, the figure and the hyper steps' figure."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_main_job_short_run(tmp_path, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    import lightning_digits

    out, fig = tmp_path / "main.json", tmp_path / "main.png"
    argv = ["--epochs", "3", "--n-train", "200", "--grid", "1e-3", "1e-2", "--logs", str(tmp_path)]
    argv += ["--max-overhead", "none"]  # 21 steps: too few for the default budget's hyper steps
    lightning_digits.main([*argv, "--out", str(out), "--figure", str(fig)])
    printed = capsys.readouterr().out
    for row in ("no weight decay", "grid of 2, pick", "LearnedWeightDecay() (1 training)"):
        assert row in printed
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"no_wd", "grid_pick", "learned"}
    assert result["runs"]["grid_pick"]["weight_decay"] in (1e-3, 1e-2)
    for run in result["runs"].values():
        assert 0 < run["test_acc"] <= 1 and run["test_loss"] > 0 and run["seconds"] > 0
    assert set(result["learned_lambda_per_layer"]) == {"net.0", "net.2", "net.4"}
    assert fig.stat().st_size > 10_000
    assert (tmp_path / "main_hyper_steps.png").stat().st_size > 10_000
    assert "```text" in out.with_suffix(".txt").read_text()


def test_main_job_with_the_default_budget_also_prints_the_unbudgeted_run(tmp_path, capsys):
    """The default's row and, beside it, the same without a budget (every due hyper step)."""
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    import lightning_digits

    out, fig = tmp_path / "main.json", tmp_path / "main.png"
    argv = ["--epochs", "3", "--n-train", "200", "--grid", "1e-3", "--logs", str(tmp_path)]
    result = lightning_digits.main([*argv, "--out", str(out), "--figure", str(fig)])
    printed = capsys.readouterr().out
    assert "LearnedWeightDecay() (1 training)" in printed
    assert "the same, max_overhead=None" in printed
    assert set(result["runs"]) == {"no_wd", "grid_pick", "learned", "learned_every_step"}


def test_main_job_writes_outside_the_tracked_files():
    """A user's run of ``bash scripts/main.sh`` leaves the README's committed run
    (``results/lightning_digits.*``) as it is: its outputs and logs go under ``results/tmp/``,
    which git ignores."""
    import lightning_digits

    repo = Path(__file__).resolve().parents[1]
    args = lightning_digits.parse_args([])
    ignored = [line.strip().rstrip("/") for line in (repo / ".gitignore").read_text().splitlines()]
    assert "results/tmp" in ignored
    for path in (args.out, args.figure, args.logs):
        assert path.resolve().is_relative_to(repo / "results" / "tmp"), path
