"""The README's main job runs end to end and SID's λ is a sane, finite result."""

import json
import math

from hypertorch_sid.cli import main


def test_main_job_runs_and_is_competitive_with_grid_search(tmp_path, capsys):
    out = tmp_path / "r.json"
    results = main(["--outer-steps", "15", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    sid, grid = results["sid"], results["grid_search"]
    assert all(math.isfinite(v) for v in sid.values())
    assert 0 < sid["lambda_min"] <= sid["lambda_max"]
    # SID starts at λ = exp(-4) per pixel; tuning must lower the validation loss
    assert sid["val_loss"] < sid["val_loss_first_step"]
    assert grid["val_loss"] < 0.5
    assert sid["test_acc"] > 0.8
    assert "grid search" in capsys.readouterr().out
