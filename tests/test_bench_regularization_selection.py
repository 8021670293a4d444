"""The MNIST odd/even data of benchopt's regularisation-selection dataset (the seed paper's problem,
``benchmarks/benchopt/make_mnist_oddeven.py``): split, scaling and labels on tiny synthetic arrays
(seconds, no benchopt, no JAX), and the same split as ``examples/datasets.py::mnist_odd_even``
on the real MNIST when ``../shared/data/mnist`` is there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from problems import import_from

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builder():
    return import_from(ROOT / "benchmarks" / "benchopt", "make_mnist_oddeven")


def _synthetic(n, rng):
    return rng.integers(0, 256, (n, 784), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)


def test_split_sizes_scaling_labels(builder):
    rng = np.random.default_rng(0)
    images, digits = _synthetic(50, rng)
    test_images, test_digits = _synthetic(7, rng)
    out = builder.odd_even_split(images, digits, test_images, test_digits, 20, 10, seed=3)
    assert {k: v.shape for k, v in out.items()} == {
        "X_train": (20, 784), "y_train": (20,), "X_val": (10, 784), "y_val": (10,),
        "X_test": (7, 784), "y_test": (7,),
    }  # fmt: skip
    perm = np.random.default_rng(3).permutation(50)
    np.testing.assert_allclose(out["X_train"], images[perm[:20]] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(out["X_val"], images[perm[20:30]] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(out["y_train"], np.where(digits[perm[:20]] % 2, 1.0, -1.0))
    np.testing.assert_array_equal(out["y_test"], np.where(test_digits % 2, 1.0, -1.0))
    assert all(v.dtype == np.float32 for v in out.values())
    assert out["X_train"].min() >= 0 and out["X_train"].max() <= 1


def test_split_rejects_sizes_beyond_the_data(builder):
    images, digits = _synthetic(10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_train \\+ n_val <= 10"):
        builder.odd_even_split(images, digits, images, digits, 8, 5)


def test_same_split_as_the_examples_on_real_mnist(builder):
    mnist = ROOT.parent / "shared" / "data" / "mnist"
    if not (mnist / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"{mnist} not found: the real-data check needs the MNIST IDX files")
    datasets = import_from(ROOT / "examples", "datasets")
    m = import_from(ROOT / "benchmarks" / "benchopt", "make_mnist_pkl").build(mnist)
    out = builder.odd_even_split(
        m["training_images"], m["training_labels"], m["test_images"], m["test_labels"], 300, 200
    )
    ref = datasets.mnist_odd_even(300, 200, seed=0)
    np.testing.assert_allclose(out["X_train"], ref.X_train.numpy(), atol=1e-6)
    np.testing.assert_allclose(out["X_val"], ref.X_val.numpy(), atol=1e-6)
    np.testing.assert_array_equal(out["y_val"], 2.0 * ref.y_val.numpy() - 1.0)
    np.testing.assert_array_equal(out["y_test"], 2.0 * ref.y_test.numpy() - 1.0)
