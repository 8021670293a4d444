"""``benchmarks/bench_weight_decay.py --quick`` on digits: runs and writes well-formed results.

The benchmark runs in a subprocess (as a user would run it) into a temporary folder; the test
checks the structure of the JSON, not the numbers (a learned run that crashes is a valid,
recorded result). The Optuna part is skipped when ``optuna`` is not installed. The calls that
train nothing new (``--summarise``, ``--resummarize``), those that are refused and the skip of
an absent data set run the script's ``main(argv)`` in the test's process: a launch of Python
and torch per call was most of their time.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_weight_decay.py"
HAS_OPTUNA = importlib.util.find_spec("optuna") is not None

RUN_KEYS = {
    "finished", "error", "best_val_loss", "best_epoch", "test_acc", "test_loss", "val_curve",
    "optimizer_steps", "wall_s", "cpu_s", "weights_finite", "lambda_finite", "finite",
    "lambda_summary", "sid_cost", "warnings",
}  # fmt: skip


def _check_run(rec: dict, epochs: int) -> None:
    assert RUN_KEYS <= set(rec), RUN_KEYS - set(rec)
    assert isinstance(rec["finished"], bool)
    if rec["finished"]:
        assert rec["error"] is None
        assert len(rec["val_curve"]) == epochs
        assert rec["optimizer_steps"] > 0 and rec["wall_s"] > 0 and rec["cpu_s"] > 0
        assert 1 <= rec["best_epoch"] <= epochs
        assert rec["best_val_loss"] == min(v for v in rec["val_curve"] if v is not None)
        assert 0.0 <= rec["test_acc"] <= 1.0
        assert isinstance(rec["finite"], bool)
    else:
        assert isinstance(rec["error"], str) and rec["error"]


def test_quick_digits(tmp_path: Path) -> None:
    out = tmp_path / "wd.json"
    cmd = [
        sys.executable, str(SCRIPT), "--quick", "--settings", "digits_mlp", "--out", str(out),
        # a hyper step every 2 optimizer steps, each run (no budget: the quick run is too short
        # to pay for one at the default's 50 %), so the quick run exercises the callback
        "--learned-kwargs", '{"every_n_steps": 2, "max_overhead": null}',
    ]  # fmt: skip
    if not HAS_OPTUNA:
        cmd += ["--optuna-trials", "0"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| setting | method |" in proc.stdout
    assert out.with_suffix(".png").stat().st_size > 0
    assert out.with_suffix(".md").read_text().startswith("| setting |")

    res = json.loads(out.read_text())  # strict JSON: no NaN
    assert res["benchmark"] == "weight_decay" and res["quick"] is True
    assert res["learned_kwargs"] == {"every_n_steps": 2, "max_overhead": None}
    assert res["threads"] == 1
    assert list(res["settings"]) == ["digits_mlp"]
    s = res["settings"]["digits_mlp"]
    cfg, runs, der = s["config"], s["runs"], s["derived"]
    epochs = cfg["epochs"]
    assert len(cfg["grid"]) == 6 and cfg["grid"] == sorted(cfg["grid"])

    _check_run(runs["no_wd"], epochs)
    assert runs["no_wd"]["finished"] and runs["no_wd"]["weight_decay"] == 0.0
    assert [r["weight_decay"] for r in runs["grid"]] == cfg["grid"]
    for r in runs["grid"]:
        _check_run(r, epochs)
    steps = runs["no_wd"]["optimizer_steps"]
    assert all(r["optimizer_steps"] == steps for r in runs["grid"] if r["finished"])

    for g in ("global", "per_layer", "per_element"):
        r = runs[f"learned_{g}"]
        _check_run(r, epochs)
        assert r["granularity"] == g
        info = der["learned"][g]
        assert isinstance(info["beats_grid"], bool)
        if r["finished"]:
            lam = r["lambda_summary"]
            assert lam["min"] <= lam["mean"] <= lam["max"]
            assert math.isfinite(info["wall_ratio_to_plain"])
            if r["sid_cost"] is not None:  # the callback's counted work, when it exposes it
                assert r["sid_cost"]["hypergradients"] >= 1
        if HAS_OPTUNA:
            assert "optuna_match" in info
            n = info["optuna_trials_to_match"]
            assert n is None or 1 <= n <= res["optuna_trials"]

    grid = der["grid"]
    assert grid["best_weight_decay"] == cfg["grid"][grid["best_index"]]
    assert isinstance(grid["best_at_edge"], bool)
    if HAS_OPTUNA:
        opt = runs["optuna"]
        assert opt["n_trials"] == res["optuna_trials"] == 2
        assert [t["trial"] for t in opt["trials"]] == [1, 2]
        for t in opt["trials"]:
            _check_run(t, epochs)
            lo, hi = opt["search_range"]
            assert lo <= t["weight_decay"] <= hi
        bsf = opt["best_so_far"]
        assert len(bsf) == 2 and bsf[1] <= bsf[0]
    else:
        assert "optuna" not in runs


def test_quick_digits_over_seeds(tmp_path: Path) -> None:
    """``--seeds``: one result per seed (different splits) and a summary over them."""
    out = tmp_path / "wd.json"
    cmd = [
        sys.executable, str(SCRIPT), "--quick", "--settings", "digits_mlp", "--out", str(out),
        "--seeds", "0", "1", "--optuna-trials", "0", "--methods", "no_wd", "grid",
        "learned_global",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    per_seed = [json.loads((tmp_path / f"wd_seed{s}.json").read_text()) for s in (0, 1)]
    assert [r["seed"] for r in per_seed] == [0, 1]
    summary = json.loads((tmp_path / "wd_seeds.json").read_text())
    assert summary["seeds"] == [0, 1]
    rows = summary["settings"]["digits_mlp"]
    hindsight = next(m for m in rows if m.startswith("grid, one λ"))
    assert set(rows) == {"no WD", "grid best (6 trainings)", hindsight, "learned global"}
    assert rows["learned global"]["minus_hindsight"]["n"] == 2
    assert rows[hindsight]["minus_hindsight"] is None
    for row in rows.values():
        vals = [row["seeds"][str(s)]["val"] for s in (0, 1)]
        assert row["mean_val"] == sum(vals) / 2
    plain = [r["settings"]["digits_mlp"]["runs"]["no_wd"]["best_val_loss"] for r in per_seed]
    assert [rows["no WD"]["seeds"][str(s)]["val"] for s in (0, 1)] == plain
    assert rows["learned global"]["beats_grid"].endswith("of 2")
    assert (tmp_path / "wd_seeds.md").read_text().startswith("| setting |")
    # the paired difference to the grid's best, seed by seed
    grid = rows["grid best (6 trainings)"]
    diffs = [rows["no WD"]["seeds"][str(s)]["val"] - grid["seeds"][str(s)]["val"] for s in (0, 1)]
    assert math.isclose(rows["no WD"]["minus_grid"]["mean"], sum(diffs) / 2, abs_tol=1e-12)
    assert rows["no WD"]["minus_grid"]["n"] == 2 and grid["minus_grid"] is None

    # --summarise merges per-seed files from separate runs into the same summary
    merged = tmp_path / "merged.json"
    files = [str(tmp_path / f"wd_seed{s}.json") for s in (1, 0)]
    _main(_bench_module(), ["--summarise", *files, "--out", str(merged)])
    again = json.loads(merged.read_text())
    assert again["seeds"] == [0, 1] and again["sources"] == files
    assert again["table_markdown"] == summary["table_markdown"]
    with pytest.raises(SystemExit, match="seed 1 is in two files"):
        _main(_bench_module(), ["--summarise", files[0], files[0], "--out", str(merged)])


def _main(module, argv: list[str]):
    """``module.main(argv)`` in this process; the logger levels and ``sys.path`` entries it sets
    are restored after."""
    names = ("pytorch_lightning", "lightning", "lightning_fabric", "hypertorch_sid")
    levels = {name: logging.getLogger(name).level for name in names}
    path = list(sys.path)
    try:
        return module.main(argv)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        sys.path[:] = path


def _bench_module():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module("bench_weight_decay")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_paired_difference_by_hand() -> None:
    """mean ± s.e. and the Student-t 95 % interval of a − b, written out."""
    bench = _bench_module()
    d = bench.paired_difference([1.0, 2.0, 4.0], [0.0, 0.0, 1.0])  # differences 1, 2, 3
    se = 1.0 / math.sqrt(3)  # sample standard deviation 1
    assert d["n"] == 3 and math.isclose(d["mean"], 2.0) and math.isclose(d["se"], se)
    half = 4.302652729911275 * se  # t_{0.975, 2}
    assert math.isclose(d["low"], 2.0 - half) and math.isclose(d["high"], 2.0 + half)
    one = bench.paired_difference([1.0], [0.5])
    assert one["mean"] == 0.5 and math.isnan(one["se"]) and math.isnan(one["low"])
    assert bench._paired_text(one) == "+0.5000"


def test_hindsight_grid_value_by_hand() -> None:
    """The best single grid value over the seeds is the one of lowest *mean*, not the one that
    was best most often; its row sits under the grid's best, and learned runs are paired
    with it."""
    bench = _bench_module()

    def setting(vals: dict[float, float], learned: float) -> dict:
        def fixed(v: float, **kw) -> dict:
            return dict(best_val_loss=v, test_loss=v + 1, test_acc=0.5, wall_s=2.0,
                        finished=True, **kw)  # fmt: skip

        return {"runs": {
            "no_wd": fixed(1.0),
            "grid": [fixed(v, weight_decay=wd) for wd, v in vals.items()],
            "learned_global": dict(finished=True, best_val_loss=learned, test_loss=learned + 1,
                                   test_acc=0.5, wall_s=3.0)},
            "derived": {"plain_wall_s": 2.0,
                        "grid": dict(best_val_loss=min(vals.values()), test_loss=0.0,
                                     test_acc=0.5, wall_ratio_to_plain=6.0),
                        "learned": {"global": {"beats_grid": False}}}}  # fmt: skip

    # 1e-3 is best on two seeds of three but 1e-4 has the lowest mean (0.5 against 0.6)
    per_seed = {
        0: {"settings": {"s": setting({1e-4: 0.52, 1e-3: 0.50}, 0.53)}},
        1: {"settings": {"s": setting({1e-4: 0.49, 1e-3: 0.48}, 0.47)}},
        2: {"settings": {"s": setting({1e-4: 0.49, 1e-3: 0.82}, 0.50)}},
    }
    h = bench.hindsight_records(per_seed, "s")
    assert h["weight_decay"] == 1e-4
    assert [h["seeds"][s]["val"] for s in (0, 1, 2)] == [0.52, 0.49, 0.49]
    assert h["seeds"][0]["ratio"] == 1.0
    assert bench.hindsight_records({0: per_seed[0]}, "s") is None  # one seed: the grid best
    rows = bench.seed_summary(per_seed)["settings"]["s"]
    names = list(rows)
    assert (
        names[1].startswith("grid best") and names[2] == "grid, one λ = 1.0e-04 (best in hindsight)"
    )
    assert rows["learned global"]["max_ratio_fixed"] == 1.5  # 3 s against a median of 2 s
    d = rows["learned global"]["minus_hindsight"]
    assert math.isclose(d["mean"], (0.01 - 0.02 + 0.01) / 3)
    assert math.isclose(rows[names[2]]["minus_grid"]["mean"], (0.02 + 0.01 + 0.0) / 3)


def test_fixed_median_time_by_hand() -> None:
    """The yardstick of "× one plain training": the median of the fixed-decay trainings timed in
    this run; reused ones (timed in another run) and failed ones do not count."""
    bench = _bench_module()

    def rec(wall: float, finished: bool = True) -> dict:
        return {"wall_s": wall, "cpu_s": wall / 2, "finished": finished, "best_val_loss": wall,
                "test_acc": 0.5, "test_loss": 1.0}  # fmt: skip

    runs = {"no_wd": rec(1.0), "grid": [rec(2.0), rec(3.0), rec(9.0), rec(50.0, False)]}
    assert bench.fixed_median_time(runs, None) == 2.5  # median of 1, 2, 3, 9
    assert bench.fixed_median_time(runs, {"methods": ["grid"]}) == 1.0
    assert math.isnan(bench.fixed_median_time(runs, {"methods": ["grid", "no_wd"]}))
    assert bench.fixed_median_time(runs, None, "cpu_s") == 1.25  # the CPU times, halved here
    del runs["no_wd"]["cpu_s"]  # a file from before CPU time was recorded
    assert math.isnan(bench.fixed_median_time(runs, None, "cpu_s"))
    runs["no_wd"]["cpu_s"] = 0.5
    der = bench.derive(bench.SETTINGS["digits_mlp"], {**runs, "learned_global": {
        "finished": True, "finite": True, "best_val_loss": 0.1, "wall_s": 5.0}}, None)  # fmt: skip
    assert der["learned"]["global"]["wall_ratio_to_fixed_median"] == 2.0
    assert der["learned"]["global"]["wall_ratio_to_plain"] == 5.0
    assert math.isnan(der["learned"]["global"]["cpu_ratio_to_fixed_median"])  # none recorded


ORDERS = REPO / "benchmarks" / "bench_weight_decay_orders.py"


def _orders_module():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_weight_decay_orders", ORDERS)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return mod


def test_orders_summary_by_hand() -> None:
    """σ pooled within seeds and the paired difference to the grid's pick, written out."""
    mod = _orders_module()

    def rec(v: float) -> dict:
        return {"finished": True, "best_val_loss": v, "test_loss": v + 1}

    res = {
        "seeds": {
            "0": {"grid_best": 0.9, "runs": {
                "no_wd": [rec(1.0), rec(1.2)], "grid_pick": [rec(0.9), rec(1.0)],
                "learned_global": [rec(0.8), rec(1.1)]}},
            "1": {"grid_best": 0.7, "runs": {
                "no_wd": [rec(2.0), rec(2.4), rec(2.2)], "grid_pick": [rec(1.0), rec(1.0), rec(1.0)],
                "learned_global": [rec(1.0), rec(0.9), rec(1.3)]}},
        }
    }  # fmt: skip
    sm = mod.summarize(res, ["no_wd", "grid_pick", "learned_global"])
    # deviations from each seed's mean: ±0.1 (seed 0), −0.2, +0.2, 0 (seed 1); dof = 1 + 2
    assert math.isclose(sm["sigma"], math.sqrt((0.01 * 2 + 0.04 * 2) / 3))
    assert math.isclose(sm["grid_best_min_of_6"], 0.8)
    g = sm["methods"]["learned_global"]
    d = [-0.1, 0.1, 0.0, -0.1, 0.3]
    assert g["pairs"] == 5 and g["wins"] == 3
    assert math.isclose(g["minus_pick"], sum(d) / 5)
    mean = sum(d) / 5
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 4 / 5)
    assert math.isclose(g["minus_pick_se"], se)
    # test loss = val loss + 1 here: the same paired differences
    assert math.isclose(g["test_minus_pick"], g["minus_pick"])
    assert math.isclose(g["test_minus_pick_se"], se)
    assert math.isclose(sm["methods"]["no_wd"]["mean_test_loss"], 1 + 8.8 / 5)
    assert "minus_pick" not in sm["methods"]["grid_pick"]
    # fresh-order runs at or below their seed's grid best (0.9, then 0.7)
    assert g["reach_grid_best"] == 1 and sm["methods"]["grid_pick"]["reach_grid_best"] == 1
    assert sm["methods"]["no_wd"]["reach_grid_best"] == 0


def test_orders_quick(tmp_path: Path) -> None:
    """``bench_weight_decay_orders.py --quick``: R fresh batch orders per seed and method."""
    out = tmp_path / "orders.json"
    cmd = [
        sys.executable, str(ORDERS), "--quick", "--orders", "2", "--seeds", "0", "1",
        "--methods", "no_wd", "grid_pick", "learned_global", "--out", str(out),
        "--learned-kwargs", '{"every_n_steps": 2, "max_overhead": null}',
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["benchmark"] == "weight_decay_orders" and res["orders"] == 2
    s = res["settings"]["digits_mlp"]
    epochs = s["config"]["epochs"]
    for seed in (0, 1):
        sd = s["seeds"][str(seed)]
        for m in ("no_wd", "grid_pick", "learned_global"):
            runs = sd["runs"][m]
            assert [r["order"] for r in runs] == [1000 * (seed + 1) + 1, 1000 * (seed + 1) + 2]
            for r in runs:
                _check_run(r, epochs)
        curves = [r["val_curve"] for r in sd["runs"]["no_wd"]]
        assert curves[0] != curves[1]  # another batch order, another training
        assert sd["runs"]["learned_global"][0]["sid_cost"]["hypergradients"] >= 1
    sm = s["summary"]
    assert math.isfinite(sm["sigma"]) and sm["methods"]["learned_global"]["pairs"] == 4
    assert out.with_suffix(".md").read_text().startswith("| setting |")
    assert out.with_suffix(".png").stat().st_size > 0
    table = out.with_suffix(".md").read_text()
    out.with_suffix(".md").unlink()
    _main(_orders_module(), ["--resummarize", str(out)])
    assert out.with_suffix(".md").read_text() == table  # the summary is a function of the runs


def test_reuse_retrains_only_the_given_methods(tmp_path: Path) -> None:
    """``--reuse``: the grid's trainings come from the earlier file, unchanged; no WD and the
    learned run are retrained (the same numbers: deterministic); another setting is refused."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    base = [sys.executable, str(SCRIPT), "--quick", "--settings", "digits_mlp",
            "--optuna-trials", "0", "--learned-kwargs", '{"every_n_steps": 2, "max_overhead": null}']  # fmt: skip
    run = functools.partial(subprocess.run, cwd=REPO, capture_output=True, text=True, timeout=600)
    proc = run([*base, "--methods", "no_wd", "grid", "learned_global", "--out", str(first)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run([*base, "--methods", "no_wd", "learned_global", "--out", str(second),
                "--reuse", str(first)])  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = (json.loads(p.read_text())["settings"]["digits_mlp"] for p in (first, second))
    assert b["reused"] == {
        "from": str(first), "methods": ["grid"], "plain_wall_s": a["runs"]["no_wd"]["wall_s"]
    }  # fmt: skip
    assert b["runs"]["grid"] == a["runs"]["grid"]  # copied, wall times included
    # timed against the plain training of the run they come from
    assert (
        b["derived"]["grid"]["wall_ratio_to_plain"] == a["derived"]["grid"]["wall_ratio_to_plain"]
    )
    for m in ("no_wd", "learned_global"):
        assert b["runs"][m]["val_curve"] == a["runs"][m]["val_curve"]  # retrained, deterministic
        assert b["runs"][m]["wall_s"] != a["runs"][m]["wall_s"]
    assert b["derived"]["grid"]["best_val_loss"] == a["derived"]["grid"]["best_val_loss"]
    assert b["derived"]["learned"]["global"]["beats_grid"] is not None
    with pytest.raises(SystemExit, match=r"trained digits_mlp otherwise \(epochs\)"):
        _main(_bench_module(), [*base[2:], "--methods", "no_wd", "--epochs", "1",
                                "--out", str(tmp_path / "c.json"), "--reuse", str(first)])  # fmt: skip


def test_orders_reuse_retrains_only_the_learned_runs(tmp_path: Path) -> None:
    """``bench_weight_decay_orders.py --reuse``: no WD and the grid's pick copied, the summary
    over all methods as before."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    base = [sys.executable, str(ORDERS), "--quick", "--orders", "2", "--seeds", "0",
            "--learned-kwargs", '{"every_n_steps": 2, "max_overhead": null}']  # fmt: skip
    run = functools.partial(subprocess.run, cwd=REPO, capture_output=True, text=True, timeout=600)
    proc = run([*base, "--methods", "no_wd", "grid_pick", "learned_global", "--out", str(first)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run([*base, "--methods", "learned_global", "--out", str(second), "--reuse", str(first)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = (json.loads(p.read_text()) for p in (first, second))
    assert b["methods"] == ["no_wd", "grid_pick", "learned_global"]
    assert b["reused_from"] == str(first)
    sa, sb = (r["settings"]["digits_mlp"] for r in (a, b))
    for m in ("no_wd", "grid_pick"):
        assert sb["seeds"]["0"]["runs"][m] == sa["seeds"]["0"]["runs"][m]
    learned = [
        [r["val_curve"] for r in s["seeds"]["0"]["runs"]["learned_global"]] for s in (sa, sb)
    ]
    assert learned[0] == learned[1]  # retrained on the same orders: the same trainings
    assert sb["summary"] == sa["summary"]
    with pytest.raises(SystemExit, match="on other orders"):
        _main(_orders_module(), [*base[2:], "--orders", "3", "--methods", "learned_global",
                                 "--out", str(tmp_path / "c.json"), "--reuse", str(first)])  # fmt: skip


def _fake_setting(seed: int) -> dict:
    """A tiny result of one seed: the grid's and Optuna's validation losses pick a training whose
    test loss is *not* the lowest of the search (what a user deploys is the validation pick)."""

    def fixed(wd: float, val: float, test: float, wall: float = 2.0) -> dict:
        return dict(weight_decay=wd, best_val_loss=val, test_loss=test, test_acc=None if test is None else 1 - test,
                    wall_s=wall, finished=True)  # fmt: skip

    bump = 0.01 * seed
    grid = [fixed(1e-4, 0.50, 0.40 + bump), fixed(1e-3, 0.45, 0.48 + bump, 3.0),
            fixed(1e-2, 0.60, 0.30 + bump)]  # fmt: skip
    optuna = [fixed(3e-4, 0.55, 0.50 + bump), fixed(2e-3, None, None),  # a failed trial
              fixed(5e-3, 0.44, 0.44 + bump)]  # fmt: skip
    optuna[1]["finished"] = False
    return {"runs": {
        "no_wd": fixed(0.0, 0.70, 0.60 + bump),
        "grid": grid,
        "optuna": {"trials": optuna},
        "learned_per_layer": dict(finished=True, best_val_loss=0.46, test_loss=0.45 + bump,
                                  test_acc=0.55, wall_s=3.0),
        "learned_global": dict(finished=True, best_val_loss=0.47, test_loss=0.52 + 2 * bump,
                               test_acc=0.5, wall_s=5.0)},
        "derived": {}}  # fmt: skip


def test_deployment_summary_by_hand() -> None:
    """What a search deploys is its pick on validation data, scored on the test set; the learned
    rows are paired with it seed by seed, timed against the fixed-decay trainings of their run,
    and "Optuna trials to match" counts trials until Optuna's pick-so-far has a test loss at or
    below the learned run's."""
    bench = _bench_module()
    trials = _fake_setting(0)["runs"]["optuna"]["trials"]
    assert bench.search_pick(trials)["weight_decay"] == 5e-3
    assert bench.search_pick(trials, 2)["weight_decay"] == 3e-4  # the failed trial never wins
    assert bench.optuna_trials_to_match(trials, 0.50) == 1
    assert bench.optuna_trials_to_match(trials, 0.45) == 3
    assert bench.optuna_trials_to_match(trials, 0.43) is None

    per_seed = {s: {"settings": {"s": _fake_setting(s)}} for s in (0, 1, 2)}
    summary = bench.deployment_summary(per_seed)
    rows = summary["settings"]["s"]
    assert list(rows) == [
        "no WD",
        "grid pick",
        bench.ORACLE,
        "Optuna pick",
        "learned global",
        "learned per_layer",
    ]
    grid, opt = rows["grid pick"], rows["Optuna pick"]
    assert [grid["seeds"][s]["test_loss"] for s in (0, 1, 2)] == [0.48, 0.49, 0.50]
    assert grid["seeds"][0]["weight_decay"] == 1e-3 and opt["seeds"][0]["weight_decay"] == 5e-3
    assert math.isclose(grid["mean_cost"], 7.0 / 2.0)  # 2 + 3 + 2 s over their median, 2 s
    assert math.isclose(opt["mean_cost"], 2.0)  # two finished trials of 2 s
    # the median fixed-decay training of the run (no WD and the grid: 2, 2, 3, 2 s) is 2 s
    layer, glob = rows["learned per_layer"], rows["learned global"]
    assert math.isclose(layer["mean_cost"], 1.5) and math.isclose(glob["mean_cost"], 2.5)
    d = layer["minus_grid"]
    assert d["n"] == 3 and math.isclose(d["mean"], -0.03) and d["se"] < 1e-12
    assert math.isclose(layer["minus_optuna"]["mean"], 0.01)
    assert math.isclose(glob["minus_grid"]["mean"], 0.04 + 0.01)  # 0.52 - 0.48, + seed bumps
    assert layer["optuna_trials_to_match"] == {0: 3, 1: 3, 2: 3}  # Optuna's pick: 0.44 (+bump)
    assert glob["optuna_trials_to_match"] == {0: 1, 1: 1, 2: 1}
    assert rows["no WD"]["minus_grid"]["mean"] > 0  # the searches' picks beat no weight decay
    # per layer: below the grid's pick, above Optuna's (by 0.01 on every seed: significant)
    assert layer["goal"] == "missed: significantly worse than the Optuna pick"
    assert glob["goal"].startswith("missed: significantly worse than the grid pick")
    assert glob["goal"].endswith("costs 2.50× > 1.5×")
    assert "| s | learned per_layer (default) | 3 |" in summary["table_markdown"]
    assert "| 3, 3, 3 |" in summary["table_markdown"]
    # the best constant λ on the test set (1e-2: 0.30 + bump) against the grid's pick (0.48 + bump)
    oracle = rows[bench.ORACLE]
    assert {r["weight_decay"] for r in oracle["seeds"].values()} == {1e-2}
    assert math.isclose(oracle["minus_grid"]["mean"], -0.18) and oracle["goal"] == ""
    goal = summary["goal_markdown"].splitlines()
    assert len(goal) == 3 and goal[2].startswith("| s | -0.0300 ± 0.0000")
    assert "-0.1800 ± 0.0000 [-0.1800, -0.1800] (3) (λ = 1.0e-02)" in goal[2]
    assert goal[2].endswith("| 3, 3, 3 | missed: significantly worse than the Optuna pick |")
    del per_seed[2]["settings"]["s"]["runs"]["optuna"]["trials"][2]  # Optuna not matched on seed 2
    match = bench.deployment_summary(per_seed)["settings"]["s"]["learned per_layer"]
    assert match["optuna_trials_to_match"][2] is None


def test_deployment_verdict_where_searches_do_not_pay() -> None:
    """Where the searches' own choice does not beat no weight decay, the goal asks only "never
    significantly worse, and cheap": a tie meets it."""
    bench = _bench_module()
    tie = dict(n=3, mean=0.001, se=0.002, low=-0.005, high=0.007)
    row = {"minus_grid": tie, "minus_optuna": None, "mean_cost": 1.4}
    refs = {"grid pick": dict(key="grid", beats_no_wd=False),
            "Optuna pick": dict(key="optuna", beats_no_wd=False)}  # fmt: skip
    assert bench.deployment_verdict(row, refs) == "met"
    refs["grid pick"]["beats_no_wd"] = True
    assert bench.deployment_verdict(row, refs) == "missed: not below the grid pick"


def test_summarise_takes_a_file_made_from_another_with_reuse(tmp_path: Path) -> None:
    """A per-seed file that added Optuna's trials to an earlier one (``--reuse``) replaces that
    setting of the earlier file; the same setting from an unrelated file is refused."""
    bench = _bench_module()

    def complete(res: dict) -> dict:  # the fields the seeds table reads, as a run writes them
        runs = res["runs"]
        for rec in [
            runs["no_wd"],
            *runs["grid"],
            runs["learned_global"],
            runs["learned_per_layer"],
        ]:
            rec.setdefault("finite", True)
        opt = runs.get("optuna")
        if opt:
            pick = bench.search_pick(opt["trials"])
            opt.update(n_trials=len(opt["trials"]), best_so_far=[1.0] * len(opt["trials"]),
                       total_wall_s=6.0, **{k: pick[k] for k in ("best_val_loss", "test_loss",
                                                                  "test_acc")})  # fmt: skip
        setting = bench.replace(bench.SETTINGS["digits_mlp"], grid=[1e-4, 1e-3, 1e-2])
        res["derived"] = bench.derive(setting, runs, res.get("reused"))
        return res

    base = _fake_setting(0)
    del base["runs"]["optuna"]
    base = complete(base)
    first = tmp_path / "wd_seed0.json"
    first.write_text(json.dumps({"seed": 0, "settings": {"s": base, "t": base}}))
    added = complete({**_fake_setting(0), "reused": {"from": f"elsewhere/{first.name}",
                                                      "methods": ["no_wd", "grid", "learned_global",
                                                                  "learned_per_layer"],
                                                      "plain_wall_s": 2.0}})  # fmt: skip
    second = tmp_path / "wd_optuna_seed0.json"
    second.write_text(json.dumps({"seed": 0, "settings": {"s": added}}))
    summary = bench.summarise([first, second], tmp_path / "sum.json", "test")
    rows = summary["deployment"]["settings"]
    assert "Optuna pick" in rows["s"] and "Optuna pick" not in rows["t"]
    md = (tmp_path / "sum.md").read_text()
    assert md.startswith("| setting |") and bench.DEPLOYMENT_HEADING in md
    # a third file retrained the default alone from the first (a budget: its in-run overhead is
    # its cost): it replaces that run and keeps the second's Optuna trials
    retrained = _fake_setting(0)
    del retrained["runs"]["optuna"]
    retrained["runs"]["learned_per_layer"].update(test_loss=0.30, budget={"overhead": 0.42})
    retrained = complete({**retrained, "reused": {"from": first.name, "plain_wall_s": 2.0,
                                                  "methods": ["no_wd", "grid", "learned_global"]}})  # fmt: skip
    third = tmp_path / "wd_final_seed0.json"
    third.write_text(json.dumps({"seed": 0, "settings": {"s": retrained}}))
    rows = bench.summarise([first, second, third], tmp_path / "sum.json", "test")["deployment"]
    layer = rows["settings"]["s"]["learned per_layer"]
    assert "Optuna pick" in rows["settings"]["s"] and layer["seeds"][0]["test_loss"] == 0.30
    assert math.isclose(layer["mean_cost"], 1.42)
    # siblings made from the same file, without it: the retrained default and Optuna's trials
    retrained["reused"]["from"] = f"elsewhere/{first.name}"
    third.write_text(json.dumps({"seed": 0, "settings": {"s": retrained}}))
    rows = bench.summarise([third, second], tmp_path / "sum.json", "test")["deployment"]
    assert "Optuna pick" in rows["settings"]["s"]
    assert rows["settings"]["s"]["learned per_layer"]["seeds"][0]["test_loss"] == 0.30
    other = tmp_path / "other_seed0.json"
    other.write_text(json.dumps({"seed": 0, "settings": {"s": base}}))
    try:
        bench.summarise([first, other], tmp_path / "sum.json", "test")
    except SystemExit as err:
        assert "seed 0 is in two files" in str(err) and "with s," in str(err)
    else:
        raise AssertionError("the same setting of a seed twice was not refused")


def test_summarise_takes_retrained_runs_of_the_same_seeds_and_data(tmp_path: Path) -> None:
    """``--retrained``: the default retrained alone on the summarised files' seeds and data
    (another ``max_overhead``, no ``--reuse``) replaces their default's run, its cost the budget's
    in-run overhead; the searches' picks stay; a file on other data is refused."""
    bench = _bench_module()
    setting = bench.replace(bench.SETTINGS["digits_mlp"], grid=[1e-4, 1e-3, 1e-2])
    cfg = {"n_train": 100, "lr": 0.1, "grid": setting.grid, "learned_kwargs": {}}
    base = {**_fake_setting(0), "config": cfg}
    del base["runs"]["optuna"]
    for rec in [base["runs"]["no_wd"], *base["runs"]["grid"], base["runs"]["learned_global"],
                base["runs"]["learned_per_layer"]]:  # fmt: skip
        rec["finite"] = True
    base["derived"] = bench.derive(setting, base["runs"])
    first = tmp_path / "wd_seed0.json"
    first.write_text(json.dumps({"seed": 0, "settings": {"s": base}}))
    layer = dict(finished=True, finite=True, best_val_loss=0.46, test_loss=0.30, test_acc=0.7,
                 wall_s=3.0, budget={"overhead": 0.5})  # fmt: skip
    new = {"runs": {"learned_per_layer": layer},
           "config": {**cfg, "learned_kwargs": {"max_overhead": 0.5}}}  # fmt: skip
    retrained = tmp_path / "s_budget0.5_seed0.json"
    retrained.write_text(json.dumps({"seed": 0, "settings": {"s": new}}))
    summary = bench.summarise([first], tmp_path / "sum.json", "test", [retrained])
    rows = summary["deployment"]["settings"]["s"]
    assert rows["learned per_layer"]["seeds"][0]["test_loss"] == 0.30
    assert math.isclose(rows["learned per_layer"]["mean_cost"], 1.5)
    assert rows["grid pick"]["seeds"][0]["test_loss"] == 0.48  # the search's pick stays
    assert rows["learned global"]["seeds"][0]["test_loss"] == 0.52
    assert str(retrained) in summary["sources"]
    new["config"]["n_train"] = 200
    retrained.write_text(json.dumps({"seed": 0, "settings": {"s": new}}))
    try:
        bench.summarise([first], tmp_path / "sum.json", "test", [retrained])
    except SystemExit as err:
        assert "another data, model or training" in str(err)
    else:
        raise AssertionError("a retrained run on other data was not refused")


def test_news_mlp_without_its_data_is_skipped_with_a_reason(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--settings news_mlp`` where 20 Newsgroups is absent (no archive, no cache): the setting
    is skipped with the reason and the fix, the other settings still run."""
    out = tmp_path / "wd.json"
    argv = [
        "--quick", "--settings", "news_mlp", "digits_mlp",
        "--methods", "no_wd", "--optuna-trials", "0", "--out", str(out),
        "--news-data", str(tmp_path / "absent"),
    ]  # fmt: skip
    monkeypatch.setenv("HYPERTORCH_SID_CACHE", str(tmp_path / "cache"))
    _main(_bench_module(), argv)
    stdout = capsys.readouterr().out
    assert "news_mlp skipped: no " in stdout and "--news-data" in stdout
    assert list(json.loads(out.read_text())["settings"]) == ["digits_mlp"]
