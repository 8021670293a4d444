"""The benchopt data-cleaning driver (``benchmarks/bench_data_cleaning.py``) and the ``mnist.pkl``
builder (``benchmarks/benchopt/make_mnist_pkl.py``) on tiny synthetic data: seconds, no benchopt,
no JAX, no MNIST."""

from __future__ import annotations

import gzip
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from problems import import_from

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def dc():
    return import_from(BENCH, "bench_data_cleaning")


@pytest.fixture(scope="module")
def builder():
    return import_from(BENCH / "benchopt", "make_mnist_pkl")


def _write_idx(path: Path, array: np.ndarray, images: bool) -> None:
    magic = (2051 if images else 2049).to_bytes(4, "big")
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(magic + dims + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_mnist(tmp_path: Path, builder) -> tuple[Path, dict]:
    rng = np.random.default_rng(0)
    arrays = {
        "training_images": rng.integers(0, 256, (120, 28, 28)),
        "training_labels": rng.integers(0, 10, 120),
        "test_images": rng.integers(0, 256, (30, 28, 28)),
        "test_labels": rng.integers(0, 10, 30),
    }
    for key, fname in builder.FILES.items():
        _write_idx(tmp_path / fname, arrays[key], "images" in key)
    return tmp_path, arrays


def test_mnist_pkl_has_the_format_the_benchmark_reads(tiny_mnist, builder, tmp_path) -> None:
    folder, arrays = tiny_mnist
    out = builder.write(folder, tmp_path / "out" / "mnist.pkl")
    with open(out, "rb") as f:
        mnist = pickle.load(f)
    assert set(mnist) == set(builder.FILES)
    assert mnist["training_images"].shape == (120, 784)
    assert mnist["test_images"].shape == (30, 784)
    assert mnist["training_labels"].shape == (120,)
    assert all(a.dtype == np.uint8 for a in mnist.values())
    np.testing.assert_array_equal(
        mnist["training_images"], arrays["training_images"].reshape(120, 784)
    )
    np.testing.assert_array_equal(mnist["test_labels"], arrays["test_labels"])


def test_mnist_pkl_refuses_missing_or_wrong_files(tiny_mnist, builder, tmp_path) -> None:
    folder, _ = tiny_mnist
    with pytest.raises(FileNotFoundError, match="--mnist-dir"):
        builder.build(tmp_path / "nowhere")
    images = folder / builder.FILES["training_images"]
    labels = folder / builder.FILES["training_labels"]
    images.write_bytes(labels.read_bytes())
    with pytest.raises(ValueError, match="not an IDX image file"):
        builder.build(folder)


def test_problem_split_and_corruption(dc, tiny_mnist, builder) -> None:
    pytest.importorskip("sklearn")
    folder, _ = tiny_mnist
    mnist = builder.build(folder)
    a = dc.load_problem(mnist, 0.7)
    b = dc.load_problem(mnist, 0.7)
    assert a["X_train"].shape == (60, 784) and a["X_val"].shape == (60, 784)
    assert a["X_test"].shape == (30, 784)
    np.testing.assert_array_equal(a["y_train"], b["y_train"])  # fixed RandomState(32)
    np.testing.assert_array_equal(a["corrupted"], a["y_train"] != a["y_clean"])
    assert a["corrupted"].sum() <= a["resampled"].sum()
    assert np.allclose(a["X_train"].mean(0), 0, atol=1e-9)  # StandardScaler fitted on train


def test_weighted_objective_gradient_matches_finite_differences(dc) -> None:
    rng = np.random.default_rng(1)
    X, y, w = rng.normal(size=(12, 5)), rng.integers(0, 3, 12), rng.uniform(size=12)
    z = rng.normal(size=15)
    _, grad = dc._weighted_objective(z, X, y, w, 0.2, 3)
    eps = 1e-6
    fd = np.array(
        [
            (
                dc._weighted_objective(z + eps * e, X, y, w, 0.2, 3)[0]
                - dc._weighted_objective(z - eps * e, X, y, w, 0.2, 3)[0]
            )
            / (2 * eps)
            for e in np.eye(15)
        ]
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)


def test_flagging_precision_recall(dc) -> None:
    corrupted = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    weights = np.array([0.0, 0.1, 0.9, 0.2, 1.0, 1.0, 1.0, 1.0])  # mean 0.65
    f = dc.flagging(weights, corrupted)
    assert f["precision"] == pytest.approx(2 / 3)  # flagged: 0.0, 0.1, 0.2
    assert f["recall"] == pytest.approx(2 / 3)
    assert f["precision_at_k"] == pytest.approx(2 / 3)  # 3 lowest
    assert f["average_precision"] == pytest.approx((1 + 1 + 3 / 4) / 3)  # ranks 1, 2, 4
    assert f["mean_weight_corrupted"] == pytest.approx(1 / 3)


def test_flagging_reports_the_library_flags_with_the_benchmark_start(dc) -> None:
    """``flagged_*``: ``SampleWeights.flagged()`` (the two-component split) with ω₀ = σ(−2):
    a low bump below the start is flagged; the same bump above the start is not."""
    rng = np.random.default_rng(0)
    corrupted = np.arange(200) < 60
    x = np.where(corrupted, -8 + 0.5 * rng.standard_normal(200), 3 + 2 * rng.standard_normal(200))
    f = dc.flagging(1 / (1 + np.exp(-x)), corrupted)
    assert f["flagged_precision"] == 1.0 and f["flagged_recall"] == 1.0
    above = dc.flagging(1 / (1 + np.exp(-(x + 7))), corrupted)  # low bump at −1 > x₀ = −2
    assert above["flagged_recall"] == 0.0


def _rows(solver: str, p: float, times, errors):
    return [
        dict(
            solver_name=solver,
            p_dataset_ratio=p,
            stop_val=i,
            time=t,
            objective_test_accuracy=e,
            objective_value=e,
            samples=100 * (i + 1),
        )
        for i, (t, e) in enumerate(zip(times, errors))
    ]


def test_summary_table_and_figure(dc, tmp_path) -> None:
    records = (
        _rows(
            "SOBA[batch_size=64,eval_freq=512,random_state=1]",
            0.9,
            [0, 1, 2, 50],
            [0.9, 0.3, 0.2, 0.1],
        )
        + _rows(
            "SOBA[batch_size=64,eval_freq=512,random_state=2]", 0.9, [0, 1, 2], [0.9, 0.3, 0.22]
        )
        + _rows(
            "SID[batch_size=64,regime=drop_in,inner_lr=1.0,random_state=1]",
            0.9,
            [0, 1.5, 3],
            [0.9, 0.25, 0.19],
        )
        + _rows(
            "SID[batch_size=64,random_state=2]",
            0.9,
            [0, 0.5, 3],
            [0.9, 0.2, 0.18],
        )
    )
    runs = dc.curves(records)
    assert set(runs) == {(0.9, "SOBA"), (0.9, "SID (defaults)")}
    base = {"0.9": {"perfect weights": {"test_error": 0.17}, "unweighted": {"test_error": 0.24}}}
    s = dc.summarise(runs, budget=10.0, baselines_=base)["0.9"]
    soba, sid = s["methods"]["SOBA"], s["methods"]["SID (defaults)"]
    assert soba["final_median"] == pytest.approx(0.21)  # the t = 50 point is over budget
    assert (soba["final_min"], soba["final_max"]) == (0.2, 0.22)
    assert s["best_peer"] == "SOBA" and s["target"] == pytest.approx(0.21)
    assert sid["time_to_best_peer_median"] == pytest.approx((3 + 0.5) / 2)
    assert sid["gap_to_perfect_points"] == pytest.approx(1.5)
    # within 0.5 point of the perfect weights (≤ 0.175): no SID seed; SOBA seed 1 only after
    # the budget (t = 50), seed 2 never
    assert s["near_perfect_target"] == pytest.approx(0.175)
    assert sid["time_to_near_perfect_median"] == float("inf")
    assert soba["time_to_near_perfect_median"] == float("inf")
    # its own final median, 0.21: SOBA seed 1 at t = 2 (0.2), seed 2 never within the budget
    # (0.22) -> median of (2, inf); SID's 0.185: seed 2 at t = 3, seed 1 never -> inf
    assert soba["time_to_own_final_median"] == float("inf")
    assert sid["time_to_own_final_median"] == float("inf")
    base_near = {"0.9": {"perfect weights": {"test_error": 0.176}}}  # ≤ 0.181: SID seed 2 only
    s_near = dc.summarise(runs, budget=10.0, baselines_=base_near)["0.9"]["methods"]
    assert s_near["SID (defaults)"]["time_to_near_perfect_median"] == float("inf")
    base_near = {"0.9": {"perfect weights": {"test_error": 0.186}}}  # ≤ 0.191: both, at 3 s
    s_near = dc.summarise(runs, budget=10.0, baselines_=base_near)["0.9"]["methods"]
    assert s_near["SID (defaults)"]["time_to_near_perfect_median"] == pytest.approx(3.0)
    assert s_near["SID (defaults)"]["samples_to_near_perfect_median"] == pytest.approx(300)
    assert dc.time_to_reach(runs[(0.9, "SOBA")][2], 0.1) == float("inf")
    md = dc.markdown({"0.9": s}, 10.0)
    # samples: 100 per evaluation; SID reaches 0.21 at its 2nd (seed 2) and 3rd (seed 1) one
    assert sid["samples_to_best_peer_median"] == pytest.approx(250)
    assert sid["samples_at_budget_median"] == pytest.approx(300)
    # at the 300 samples SID read: SOBA seed 1's 3rd evaluation, seed 2's 3rd
    assert s["equal_samples"] == 300 and soba["error_at_equal_samples_median"] == pytest.approx(
        0.21
    )
    assert np.isnan(dc.error_at_samples(runs[(0.9, "SOBA")][1], 50))  # the start is not counted
    assert dc.error_at_samples(runs[(0.9, "SOBA")][1], 100) == pytest.approx(0.9)
    assert "| SID (defaults) | 0.1850 [0.1800, 0.1900] | +1.50 | 1.8 | 3e+02 | 2.5e+02 |" in md
    pytest.importorskip("matplotlib")
    png = dc.plot(runs, {"0.9": s}, tmp_path / "fig.png", 10.0)
    assert png.stat().st_size > 1000


def test_sid_labels(dc) -> None:
    assert dc.method_of("SID[batch_size=64,inner_lr=1.0,regime=drop_in]") == "SID (defaults)"
    assert dc.method_of("SID[random_state=1]") == "SID (defaults)"
    assert dc.method_of("SID[inner_lr=0.1,random_state=2]") == "SID (defaults, SGD lr=0.1)"
    assert dc.method_of("SID[outer_beta1=0.0,random_state=2]") == "SID (defaults, outer β₁=0)"
    # E is part of the problem: the default (the benchmark's f) is written in every file name
    assert dc.sid_file(*dc._sid_params("SID[outer_beta1=0.0]"), 0.9, 3) == (
        "sid_drop_in_lr1.0_b10.0_Ef_p0.9_seed3.npz"
    )
    assert dc.sid_file(*dc._sid_params("SID[random_state=1]"), 0.5, 1) == (
        "sid_drop_in_lr1.0_Ef_p0.5_seed1.npz"
    )
    full = "SID[batch_size=256,inner_lr=1.0,normalize=false,outer_beta1=default,{},random_state=2]"
    f_row = full.format("outer_objective=f")  # benchopt's solver_name: every parameter
    drop_in = full.format("outer_objective=drop_in")
    old = full.format("outer_objective=default")  # sessions 41-46: the drop-in's E, no tag
    assert dc.method_of(f_row) == "SID (defaults)"
    assert dc.method_of(drop_in) == dc.method_of(old) == "SID (defaults, E=drop-in's default)"
    names = {dc.sid_file(*dc._sid_params(e), 0.7, 2) for e in (f_row, drop_in, old)}
    assert names == {
        "sid_drop_in_lr1.0_Ef_p0.7_seed2.npz",
        "sid_drop_in_lr1.0_Edrop_in_p0.7_seed2.npz",
        "sid_drop_in_lr1.0_p0.7_seed2.npz",
    }
    entry = "SID[outer_objective=mean_loss,random_state=2]"
    assert dc.method_of(entry) == "SID (defaults, E=mean_loss)"
    assert (
        dc.sid_file(*dc._sid_params(entry), 0.7, 2) == "sid_drop_in_lr1.0_Emean_loss_p0.7_seed2.npz"
    )


def test_sid_flagging_reads_each_objective_from_its_file_name(dc, tmp_path) -> None:
    """The flags of each SID file land under the label of the objective its tag names: the
    default f (``_Ef``), the drop-in's E (``_Edrop_in``, with and without ``_norm``)."""
    corrupted = np.arange(40) < 10
    logits = np.where(corrupted, -6.0, 4.0)
    for tag in ("Ef", "Edrop_in", "Edrop_in_norm", "Emean_loss_norm"):
        np.savez(tmp_path / f"sid_drop_in_lr1.0_{tag}_p0.9_seed1.npz", logits=logits)
    np.savez(tmp_path / "sid_drop_in_lr1.0_Ef_p0.9_seed2.npz", logits=-logits)  # all wrong
    flags = dc.sid_flagging(tmp_path, {"0.9": {"corrupted": corrupted}})["0.9"]
    norm = ", self-normalised Σωℓ/Σω: not the benchmark's g"
    assert set(flags) == {
        "SID (defaults), seed 1",
        "SID (defaults), seed 2",
        "SID (defaults, E=drop-in's default), seed 1",
        f"SID (defaults, E=drop-in's default{norm}), seed 1",
        f"SID (defaults, E=mean_loss{norm}), seed 1",
    }
    assert flags["SID (defaults), seed 1"]["recall"] == 1.0
    assert flags["SID (defaults), seed 2"]["recall"] == 0.0


def test_time_to_target_counts_only_evaluations_within_the_budget(dc) -> None:
    """Time (and samples) to a test error, median over seeds: the first evaluation at or below
    the target within the budget; a seed that gets there only after the budget has not."""
    seeds = {
        1: dict(
            time=np.array([0.0, 2.0, 5.0, 9.0]),
            samples=np.array([0.0, 10.0, 20.0, 30.0]),
            test_error=np.array([0.9, 0.30, 0.16, 0.15]),
        ),
        2: dict(
            time=np.array([0.0, 1.0, 4.0, 11.0]),
            samples=np.array([0.0, 5.0, 15.0, 40.0]),
            test_error=np.array([0.9, 0.20, 0.17, 0.15]),
        ),
        3: dict(
            time=np.array([0.0, 3.0, 10.5]),
            samples=np.array([0.0, 8.0, 50.0]),
            test_error=np.array([0.9, 0.40, 0.10]),
        ),
    }
    # ≤ 0.17: seed 1 at 5 s (20 samples), seed 2 at 4 s (15), seed 3 only after the budget
    assert dc.time_to_target_median(seeds, 0.17, budget=10.0) == pytest.approx(5.0)
    assert dc.time_to_target_median(seeds, 0.17, 10.0, "samples") == pytest.approx(20.0)
    assert dc.time_to_reach(seeds[3], 0.17, budget=10.0) == float("inf")
    assert dc.time_to_reach(seeds[3], 0.17) == pytest.approx(10.5)  # no budget: counted
    # ≤ 0.15: seed 1 at 9 s, seed 2 after the budget, seed 3 after it: not reached
    assert dc.time_to_target_median(seeds, 0.15, 10.0) == float("inf")
    assert dc.time_to_target_median(seeds, 0.15, 12.0) == pytest.approx(10.5)
    assert dc.method_of("SID[regime=algorithm1,random_state=2]") == (
        "SID (Algorithm 1, SIDConfig())"
    )
    assert dc.method_of("SOBA[batch_size=64,step_size=1.0]") == "SOBA"


def test_best_params_are_read_renamed_and_seeded(dc, tmp_path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "datacleaning0_7_best_params.yml").write_text(
        "solver:\n"
        "  - SABA[batch_size=64,eval_freq=512,framework=none,init_memory=zero,"
        "outer_ratio=0.0001,step_size=0.01,random_state=[1, 2, 3],framework=none]\n"
        "  - SOBA[batch_size=64,eval_freq=512,framework=none,outer_ratio=0.0001,step_size=1.0,"
        "random_state=[1, 2],framework=none]\n"
    )
    assert dc.best_params(0.7, ["SABA"], tmp_path) == [
        "SABA[batch_size=64,eval_freq=512,mode_init_memory=zero,outer_ratio=0.0001,step_size=0.01]"
    ]
    text = dc.write_config(
        tmp_path / "c.yml", [0.7], ["SOBA"], ["regime=drop_in"], [1, 2], 40, tmp_path
    ).read_text()
    assert (
        "  - SOBA[batch_size=64,eval_freq=512,outer_ratio=0.0001,step_size=1.0,random_state=[1, 2]]"
        in text
    )
    assert "  - SID[regime=drop_in,random_state=[1, 2]]" in text and "timeout: 40" in text
    with pytest.raises(SystemExit, match="MRBO"):
        dc.best_params(0.7, ["MRBO"], tmp_path)


def test_exact_hypergradient_matches_finite_differences(dc) -> None:
    """``descend``'s full-batch hypergradient ∇ₓ f(z*(x)) against central differences of
    f(z*(x)) with z* re-solved by L-BFGS (float64, a tiny 3-class problem)."""
    rng = np.random.default_rng(0)
    n, d, k = 40, 5, 3
    problem = dict(
        X_train=rng.standard_normal((n, d)),
        y_train=rng.integers(0, k, n),
        X_val=rng.standard_normal((25, d)),
        y_val=rng.integers(0, k, 25),
    )
    x = rng.standard_normal(n)

    def f(x):
        w = 1 / (1 + np.exp(-x))
        z = dc.fit_weighted(problem["X_train"], problem["y_train"], w, n_classes=k)
        return dc.val_loss(z, problem["X_val"], problem["y_val"]), z

    _, z = f(x)
    h = dc.exact_hypergradient(problem, x, z)
    eps = 1e-4
    for i in (0, 7, 23):
        e = np.zeros(n)
        e[i] = eps
        fd = (f(x + e)[0] - f(x - e)[0]) / (2 * eps)
        assert h[i] == pytest.approx(fd, rel=1e-3, abs=1e-8)


@pytest.fixture
def sid_solver(monkeypatch):
    """``benchmarks/benchopt/solvers/sid.py`` imported without benchopt and JAX (neither is in
    the project's environment): ``BaseSolver`` a plain class, ``jax.numpy`` an empty module."""
    import contextlib
    import importlib.util
    import types

    fake = {name: types.ModuleType(name) for name in ("benchopt", "jax", "jax.numpy")}
    fake["benchopt"].BaseSolver = object
    fake["benchopt"].safe_import_context = contextlib.nullcontext
    criterion = types.ModuleType("benchopt.stopping_criterion")
    criterion.SufficientProgressCriterion = lambda **kwargs: None
    fake["benchopt.stopping_criterion"] = criterion
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("_sid_solver", BENCH / "benchopt/solvers/sid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _benchmark_functions(n=30, m=12, d=4, k=3, seed=0):
    """``f_inner`` / ``f_outer`` closing over their data as ``datasets/mnist.py``'s do."""
    import types

    rng = np.random.default_rng(seed)
    X_train, X_val = rng.standard_normal((n, d)), rng.standard_normal((m, d))
    y_train, y_val = np.eye(k)[rng.integers(0, k, n)], np.eye(k)[rng.integers(0, k, m)]
    self = types.SimpleNamespace(reg=0.2, ratio=0.9, n_features=d, n_classes=k)

    def f_inner(z, x, index):
        return X_train, y_train, self

    def f_outer(z, index):
        return X_val, y_val

    return f_inner, f_outer, np.zeros(d * k), -2 * np.ones(n)


@pytest.mark.parametrize(
    ("outer_objective", "objective", "tag"),
    [("f", "MeanLoss", "Ef"), ("drop_in", "ExpectedError", "Edrop_in")],
)
def test_sid_solver_minimises_the_benchmark_f_by_default(
    sid_solver, tmp_path, monkeypatch, outer_objective, objective, tag
) -> None:
    """The solver's default outer objective is the benchmark's f (the mean validation CE, E =
    ``MeanLoss``); ``outer_objective=drop_in`` is ``LearnedDataWeights()``'s own default E
    (``ExpectedError``); every other setting is the drop-in's; each writes its own file."""
    assert sid_solver.Solver.parameters["outer_objective"] == ["f"]
    solver = sid_solver.Solver()
    for key, values in sid_solver.Solver.parameters.items():
        setattr(solver, key, values[0])
    solver.outer_objective = outer_objective
    f_inner, f_outer, z0, x0 = _benchmark_functions()
    solver.set_objective(f_inner, f_outer, 30, 12, z0, x0)
    assert solver.tag == f"sid_drop_in_lr1.0_{tag}_p0.9_seed1"
    kwargs = solver._outer_objective_kwargs()
    method = sid_solver.DropIn(
        solver.X_train, solver.y_train, solver.X_val, solver.y_val, solver.z0, solver.x0,
        solver.reg, 8, 1.0, 1, **kwargs,
    )  # fmt: skip
    assert type(method.objective).__name__ == objective
    drop_in = sid_solver.LearnedDataWeights(normalize=False)  # the solver settings: the drop-in's
    assert (method.every, method.start) == (drop_in.every_n_steps, max(drop_in.start_step, 1))
    assert type(method.sid.outer_optimizer) is type(drop_in.outer_optimizer([torch_param()]))
    monkeypatch.setenv("SID_BENCH_OUT", str(tmp_path))
    calls = iter([True, True, False])
    solver.run(lambda: next(calls))  # two evaluations (a hyper step at step 80), then the file
    saved = np.load(tmp_path / f"{solver.tag}.npz")
    assert saved["samples"][-1] > saved["samples"][1] > 0 and saved["logits"].shape == (30,)


def test_sid_solver_refuses_the_ambiguous_old_objective_value(sid_solver) -> None:
    solver = sid_solver.Solver()
    solver.outer_objective = "default"
    with pytest.raises(ValueError, match="outer_objective=f .* outer_objective=drop_in"):
        solver._outer_objective_kwargs()


def torch_param():
    import torch

    return torch.nn.Parameter(torch.zeros(2))
