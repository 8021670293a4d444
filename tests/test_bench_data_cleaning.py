"""The benchopt data-cleaning driver (``benchmarks/bench_data_cleaning.py``) and the ``mnist.pkl``
builder (``benchmarks/benchopt/make_mnist_pkl.py``) on tiny synthetic data: seconds, no benchopt,
no JAX, no MNIST."""

from __future__ import annotations

import gzip
import pickle
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
    assert dc.sid_file(*dc._sid_params("SID[outer_beta1=0.0]"), 0.9, 3) == (
        "sid_drop_in_lr1.0_b10.0_p0.9_seed3.npz"
    )
    assert dc.sid_file(*dc._sid_params("SID[random_state=1]"), 0.5, 1) == (
        "sid_drop_in_lr1.0_p0.5_seed1.npz"
    )
    entry = "SID[outer_objective=mean_loss,random_state=2]"
    assert dc.method_of(entry) == "SID (defaults, E=mean_loss)"
    assert (
        dc.sid_file(*dc._sid_params(entry), 0.7, 2) == "sid_drop_in_lr1.0_Emean_loss_p0.7_seed2.npz"
    )
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
