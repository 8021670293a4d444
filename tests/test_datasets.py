"""Tests for ``examples/datasets.py`` (the examples' data loaders, not part of the package).

The MNIST, Fashion-MNIST and 20 Newsgroups tests use the offline copies in ``../shared/data``
(or ``$HYPERTORCH_SID_DATA``) and are skipped when those are absent. All derived files go to a
per-session temporary cache folder, so the tests do not depend on ``~/.cache`` state.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import datasets as ds  # noqa: E402  (examples/datasets.py)

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
NEWS20_TRAIN_COUNTS = [480, 584, 591, 590, 578, 593, 585, 594, 598, 597]
NEWS20_TRAIN_COUNTS += [600, 595, 591, 594, 593, 599, 546, 564, 465, 377]
NEWS20_TEST_COUNTS = [319, 389, 394, 392, 385, 395, 390, 396, 398, 397]
NEWS20_TEST_COUNTS += [399, 396, 393, 396, 394, 398, 364, 376, 310, 251]
N_NEWS20_FEATURES = 130107


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``HYPERTORCH_SID_CACHE`` at a temporary folder shared by the whole session."""
    cache = tmp_path_factory.mktemp("hypertorch_sid_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ds.CACHE_ENV_VAR, str(cache))
        yield cache


def _data_dir(subdir: str, files: tuple[str, ...]) -> Path:
    root = ds.default_data_root()
    where = f"${ds.DATA_ENV_VAR}/{subdir}" if os.environ.get(ds.DATA_ENV_VAR) else subdir
    if root is None:
        pytest.skip(f"../shared/data/{subdir} not found: no data root (set ${ds.DATA_ENV_VAR})")
    missing = [f for f in files if not (root / subdir / f).is_file()]
    if missing:
        pytest.skip(f"../shared/data/{subdir} not found: {where} lacks {', '.join(missing)}")
    return root


def _assert_disjoint_rows(*parts: torch.Tensor) -> None:
    """Distinct row sets: no row of one part equals a row of another (hash of the bytes)."""
    seen: dict[int, int] = {}
    for k, X in enumerate(parts):
        for row in X.numpy():
            h = hash(row.tobytes())
            assert seen.setdefault(h, k) == k


# --------------------------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------------------------


def test_default_data_root_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ds.DATA_ENV_VAR, str(tmp_path))
    assert ds.default_data_root() == tmp_path
    monkeypatch.delenv(ds.DATA_ENV_VAR)
    root = ds.default_data_root()
    expected = Path(ds.__file__).resolve().parents[2] / "shared" / "data"
    assert Path(ds.__file__).resolve().parent.name == "examples"
    assert root == (expected if expected.is_dir() else None)


def test_use_data_root_sets_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ds.DATA_ENV_VAR, "")  # restored after the test
    ds.use_data_root(None)
    assert os.environ[ds.DATA_ENV_VAR] == ""
    ds.use_data_root(tmp_path / "d")
    assert ds.default_data_root() == (tmp_path / "d").resolve()


def test_not_in_the_installed_package() -> None:
    import importlib.util

    assert importlib.util.find_spec("hypertorch_sid.datasets") is None
    assert importlib.util.find_spec("hypertorch_sid.cli") is None
    assert importlib.util.find_spec("hypertorch_sid.__main__") is None


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ds.CACHE_ENV_VAR, str(tmp_path / "c"))
    assert ds.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(ds.CACHE_ENV_VAR)
    assert ds.default_cache_dir() == Path.home() / ".cache" / "hypertorch_sid"


# --------------------------------------------------------------------------------------------
# Digits (always available)
# --------------------------------------------------------------------------------------------


def test_digits_odd_even_shapes_and_labels() -> None:
    s = ds.load_digits_odd_even()
    assert (s.n_train, s.n_val, s.n_test) == (898, 449, 450)
    assert s.n_features == 64 and s.n_classes == 2
    for X, y in [(s.X_train, s.y_train), (s.X_val, s.y_val), (s.X_test, s.y_test)]:
        assert X.dtype == torch.float32 and y.dtype == torch.int64
        assert X.shape[1] == 64
        assert float(X.min()) >= 0.0 and float(X.max()) <= 1.0
        assert set(y.unique().tolist()) == {0, 1}
    assert float(s.X_train.max()) == 1.0
    # stratified by digit, so the odd fraction is close to that of the whole set (~0.5)
    for y in (s.y_train, s.y_val, s.y_test):
        assert abs(float(y.float().mean()) - 0.5) < 0.03


def test_digits_labels_match_sklearn() -> None:
    from sklearn.datasets import load_digits

    X, digit = load_digits(return_X_y=True)
    s = ds.load_digits_odd_even(dtype=torch.float64)
    lookup = {row.tobytes(): d for row, d in zip(X / 16.0, digit, strict=True)}
    for Xp, yp in [(s.X_train, s.y_train), (s.X_val, s.y_val), (s.X_test, s.y_test)]:
        for row, label in zip(Xp.numpy(), yp.tolist(), strict=True):
            assert lookup[row.tobytes()] % 2 == label


def test_digits_no_overlap_and_covers_all() -> None:
    from sklearn.datasets import load_digits

    s = ds.load_digits_odd_even(dtype=torch.float64)
    X = load_digits().data / 16.0
    # Some digit images are duplicated in the data set; compare multisets of rows instead.
    rows = sorted(r.tobytes() for part in (s.X_train, s.X_val, s.X_test) for r in part.numpy())
    assert rows == sorted(r.tobytes() for r in X)
    assert s.n_train + s.n_val + s.n_test == X.shape[0]


def test_digits_determinism_by_seed() -> None:
    a = ds.load_digits_odd_even(seed=3)
    b = ds.load_digits_odd_even(seed=3)
    c = ds.load_digits_odd_even(seed=4)
    for k in ("X_train", "y_train", "X_val", "y_val", "X_test", "y_test"):
        assert torch.equal(a[k], b[k])
    assert not torch.equal(a.X_train, c.X_train)


def test_digits_custom_sizes_and_no_test() -> None:
    s = ds.load_digits_odd_even(n_train=100, n_val=200, seed=1)
    assert (s.n_train, s.n_val, s.n_test) == (100, 200, 1497)
    s = ds.load_digits_odd_even(n_train=1000, n_val=797)
    assert s.X_test is None and s.y_test is None and s.n_test == 0
    with pytest.raises(ValueError, match="invalid sizes"):
        ds.load_digits_odd_even(n_train=1000, n_val=1000)


def test_split_mapping_interface() -> None:
    s = ds.load_digits_odd_even()
    d = dict(s)
    assert list(d) == [
        "X_train",
        "y_train",
        "X_val",
        "y_val",
        "X_test",
        "y_test",
        "n_features",
        "n_classes",
    ]
    assert d["X_train"] is s.X_train and s["n_classes"] == 2 and "X_val" in s
    assert ds.BinarySplit is ds.Split
    with pytest.raises(KeyError):
        s["nope"]
    s64 = s.to(dtype=torch.float64)
    assert s64.X_train.dtype == torch.float64 and s64.y_train.dtype == torch.int64
    assert "Tensor(898, 64)" in repr(s)
    with pytest.raises(ValueError, match="rows but"):
        ds.Split(
            X_train=s.X_train,
            y_train=s.y_val,
            X_val=s.X_val,
            y_val=s.y_val,
            n_features=64,
            n_classes=2,
        )


def test_to_loader_seeded() -> None:
    X = torch.arange(20.0).reshape(10, 2)
    y = torch.arange(10)

    def batches(seed: int) -> list[list[int]]:
        return [yb.tolist() for _, yb in ds.to_loader(X, y, batch_size=4, seed=seed)]

    first = batches(0)
    assert first == batches(0)
    assert sorted(i for b in first for i in b) == list(range(10))
    assert [len(b) for b in first] == [4, 4, 2]
    assert first != batches(1) or first != batches(2)
    ordered = [yb.tolist() for _, yb in ds.to_loader(X, y, batch_size=4, shuffle=False)]
    assert ordered == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(TypeError):
        ds.to_loader(X.to_sparse(), y, batch_size=4)


# --------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_root() -> Path:
    return _data_dir("mnist", ds._IDX_FILES)


@pytest.fixture(scope="module")
def mnist(mnist_root: Path) -> dict[str, torch.Tensor]:
    X, y = ds.load_mnist(train=True)
    X_test, y_test = ds.load_mnist(train=False)
    return {"X": X, "y": y, "X_test": X_test, "y_test": y_test}


def test_mnist_shapes_range_counts(mnist: dict[str, torch.Tensor]) -> None:
    assert mnist["X"].shape == (60000, 784) and mnist["X_test"].shape == (10000, 784)
    for X in (mnist["X"], mnist["X_test"]):
        assert X.dtype == torch.float32
        assert float(X.min()) == 0.0 and float(X.max()) == 1.0
    assert mnist["y"].dtype == torch.int64
    assert torch.bincount(mnist["y"]).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(mnist["y_test"]).tolist() == MNIST_TEST_COUNTS


def test_mnist_staged_in_cache(mnist: dict[str, torch.Tensor], _session_cache: Path) -> None:
    raw = _session_cache / "MNIST" / "raw"
    for name in ds._IDX_FILES:
        assert (raw / name).is_file()
        assert (raw / name.removesuffix(".gz")).is_file()


def test_mnist_explicit_root(mnist_root: Path, mnist: dict[str, torch.Tensor]) -> None:
    X, y = ds.load_mnist(root=mnist_root, train=False)
    assert torch.equal(X, mnist["X_test"]) and torch.equal(y, mnist["y_test"])


def test_mnist_odd_even(mnist: dict[str, torch.Tensor]) -> None:
    s = ds.mnist_odd_even(seed=0)
    assert (s.n_train, s.n_val, s.n_test) == (5000, 5000, 10000)
    assert s.n_features == 784 and s.n_classes == 2
    assert torch.equal(s.X_test, mnist["X_test"])
    assert torch.equal(s.y_test, mnist["y_test"] % 2)
    for y in (s.y_train, s.y_val):
        assert set(y.unique().tolist()) == {0, 1}
        assert 0.45 < float(y.float().mean()) < 0.55
    _assert_disjoint_rows(s.X_train, s.X_val)
    # labels belong to the drawn images
    lookup = {r.tobytes(): int(d) for r, d in zip(mnist["X"].numpy(), mnist["y"], strict=True)}
    for r, label in zip(s.X_train[:500].numpy(), s.y_train[:500].tolist(), strict=True):
        assert lookup[r.tobytes()] % 2 == label
    again = ds.mnist_odd_even(seed=0)
    other = ds.mnist_odd_even(seed=1, n_train=100, n_val=50)
    assert torch.equal(again.X_train, s.X_train) and torch.equal(again.y_val, s.y_val)
    assert (other.n_train, other.n_val) == (100, 50)
    assert not torch.equal(other.X_train, s.X_train[:100])


def test_mnist_multiclass_halves(mnist: dict[str, torch.Tensor]) -> None:
    s = ds.mnist_multiclass_halves(seed=0)
    assert (s.n_train, s.n_val, s.n_test) == (30000, 30000, 10000)
    assert s.n_classes == 10 and s.n_features == 784
    counts = torch.bincount(s.y_train, minlength=10) + torch.bincount(s.y_val, minlength=10)
    assert counts.tolist() == MNIST_TRAIN_COUNTS
    # the two halves are a partition of the training set
    full = np.sort(mnist["X"].numpy().view(np.dtype((np.void, 784 * 4))).ravel())
    both = torch.cat([s.X_train, s.X_val]).numpy().view(np.dtype((np.void, 784 * 4))).ravel()
    assert np.array_equal(np.sort(both), full)
    assert torch.equal(ds.mnist_multiclass_halves(seed=0).y_train, s.y_train)


def test_fashion_mnist() -> None:
    _data_dir("fashion-mnist", ds._IDX_FILES)
    X, y = ds.load_fashion_mnist(train=True)
    X_test, y_test = ds.load_fashion_mnist(train=False)
    assert X.shape == (60000, 784) and X_test.shape == (10000, 784)
    assert float(X.min()) == 0.0 and float(X.max()) == 1.0
    assert torch.bincount(y).tolist() == [6000] * 10
    assert torch.bincount(y_test).tolist() == [1000] * 10


def test_mnist_fallback_uses_torchvision_download(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without local files, torchvision is asked to download into the cache folder."""
    import torchvision.datasets

    calls: list[tuple[str, bool, bool]] = []

    class FakeMNIST:
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            calls.append((root, train, download))
            self.data = torch.zeros(3, 28, 28, dtype=torch.uint8)
            self.targets = torch.tensor([1, 2, 3])

    monkeypatch.setattr(torchvision.datasets, "MNIST", FakeMNIST)
    monkeypatch.setenv(ds.CACHE_ENV_VAR, str(tmp_path / "cache"))
    X, y = ds.load_mnist(root=tmp_path / "empty", train=False)
    assert calls == [(str(tmp_path / "cache"), False, True)]
    assert X.shape == (3, 784) and y.tolist() == [1, 2, 3]
    assert not (tmp_path / "cache" / "MNIST").exists()


# --------------------------------------------------------------------------------------------
# 20 Newsgroups
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def news20() -> tuple[object, np.ndarray, object, np.ndarray]:
    _data_dir("20news", ("20news-bydate.tar.gz",))
    return ds.load_20news_vectorized()


def test_20news_vectorized(
    news20: tuple[object, np.ndarray, object, np.ndarray], _session_cache: Path
) -> None:
    import scipy.sparse as sp

    X_train, y_train, X_test, y_test = news20
    assert sp.issparse(X_train) and X_train.format == "csr" and X_train.dtype == np.float64
    assert X_train.shape == (11314, N_NEWS20_FEATURES)
    assert X_test.shape == (7532, N_NEWS20_FEATURES)
    assert np.bincount(y_train).tolist() == NEWS20_TRAIN_COUNTS
    assert np.bincount(y_test).tolist() == NEWS20_TEST_COUNTS
    for X in (X_train, X_test):
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        np.testing.assert_allclose(norms, 1.0, rtol=1e-10)
        assert X.data.min() > 0
    home = _session_cache / "scikit_learn_data"
    assert (home / "20news-bydate_py3.pkz").is_file()
    assert (home / "20newsgroup_vectorized_py3.pkl").is_file()
    assert not list(home.glob("20news_extract_*"))


def _torch_csr_to_scipy(t: torch.Tensor) -> object:
    import scipy.sparse as sp

    return sp.csr_matrix(
        (t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy()), shape=t.shape
    )


def _row_keys(X: object) -> np.ndarray:
    """Sorted ``(row sum, column-index-weighted row sum)`` pairs, one per row."""
    w = np.arange(1, X.shape[1] + 1, dtype=np.float64)
    keys = np.stack([np.asarray(X.sum(1)).ravel(), X @ w], axis=1)
    return keys[np.lexsort(keys.T[::-1])]


def test_20news_split(news20: tuple[object, np.ndarray, object, np.ndarray]) -> None:
    import scipy.sparse as sp

    X, _, X_test, y_test = news20
    s = ds.news20_split(seed=0)
    assert (s.n_train, s.n_val, s.n_test) == (5657, 5657, 7532)
    assert s.n_features == N_NEWS20_FEATURES and s.n_classes == 20
    for part in (s.X_train, s.X_val, s.X_test):
        assert part.layout == torch.sparse_csr and part.dtype == torch.float32
    # stratified: per-class counts of the two halves differ by at most one
    c_train = torch.bincount(s.y_train, minlength=20)
    c_val = torch.bincount(s.y_val, minlength=20)
    assert (c_train + c_val).tolist() == NEWS20_TRAIN_COUNTS
    assert int((c_train - c_val).abs().max()) <= 1
    # the test part equals the scipy test matrix
    test_back = _torch_csr_to_scipy(s.X_test)
    assert abs(test_back - X_test.astype(np.float32)).max() < 1e-7
    assert torch.equal(s.y_test, torch.as_tensor(y_test))
    # train + val rows are a partition of the training matrix (compare sorted rows)
    both = sp.vstack([_torch_csr_to_scipy(s.X_train), _torch_csr_to_scipy(s.X_val)]).tocsr()
    assert both.nnz == X.nnz
    np.testing.assert_array_equal(_row_keys(both), _row_keys(X.astype(np.float32)))
    other = ds.news20_split(seed=1)
    assert not torch.equal(other.y_train, s.y_train)
