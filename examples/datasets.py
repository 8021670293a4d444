"""Data sets of the examples and benchmarks (not part of the installed ``hypertorch_sid``).

The scripts in ``examples/`` import this module as ``datasets`` (their folder is on ``sys.path``
when they run; the tests add it). The data root (the folder holding ``mnist/``,
``fashion-mnist/`` and ``20news/``) is looked up, in this order, from

1. an explicit ``root=`` argument,
2. the environment variable ``HYPERTORCH_SID_DATA`` (the scripts' ``--data`` option sets it,
   see :func:`use_data_root`),
3. ``../shared/data`` relative to the repository root (the parent of this ``examples/`` folder).

Derived files (decompressed IDX files, scikit-learn's 20 Newsgroups caches) are written to the
cache folder: the environment variable ``HYPERTORCH_SID_CACHE`` or ``~/.cache/hypertorch_sid``.
When the local files are missing, the loaders fall back to the regular torchvision /
scikit-learn downloads into that cache folder.

MNIST and Fashion-MNIST need torchvision (the ``examples`` extra); the digits and 20 Newsgroups
need scikit-learn.
"""

from __future__ import annotations

import codecs
import os
import pickle
import shutil
import tarfile
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch import Tensor

__all__ = [
    "DATA_ENV_VAR",
    "CACHE_ENV_VAR",
    "BinarySplit",
    "Split",
    "default_data_root",
    "default_cache_dir",
    "use_data_root",
    "load_digits_odd_even",
    "load_mnist",
    "load_fashion_mnist",
    "mnist_odd_even",
    "mnist_multiclass_halves",
    "load_20news_vectorized",
    "news20_split",
    "to_loader",
]

DATA_ENV_VAR = "HYPERTORCH_SID_DATA"
CACHE_ENV_VAR = "HYPERTORCH_SID_CACHE"

_IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
_NEWS20_ARCHIVE = "20news-bydate.tar.gz"
_NEWS20_TRAIN_FOLDER = "20news-bydate-train"
_NEWS20_TEST_FOLDER = "20news-bydate-test"
# File name scikit-learn's ``fetch_20newsgroups`` reads from ``data_home``
# (``_pkl_filepath(data_home, "20news-bydate.pkz")`` inserts the ``_py3`` suffix). This name and
# the file's format (a zlib-compressed pickle of ``dict(train=Bunch, test=Bunch)``) are
# scikit-learn's private cache, reproduced by ``_build_20news_sklearn_cache``; see its docstring.
_NEWS20_SKLEARN_CACHE = "20news-bydate_py3.pkz"
_EXAMPLES_DIR = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------------------------


def default_data_root() -> Path | None:
    """Return the folder that holds the offline copies of the benchmark data sets.

    Returns
    -------
    pathlib.Path or None
        The value of the environment variable ``HYPERTORCH_SID_DATA`` if it is set (even if the
        folder does not exist), otherwise ``../shared/data`` relative to the repository root
        (the parent of this ``examples/`` folder) if that folder exists, otherwise ``None``.
    """
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    candidate = _EXAMPLES_DIR.parent.parent / "shared" / "data"
    if candidate.is_dir():
        return candidate
    return None


def use_data_root(root: str | os.PathLike[str] | None) -> None:
    """Make ``root`` the data root of every loader in this process (the scripts' ``--data``).

    Sets ``HYPERTORCH_SID_DATA``, so that subprocesses see it too; ``None`` leaves the
    environment unchanged.
    """
    if root is not None:
        os.environ[DATA_ENV_VAR] = str(Path(root).expanduser().resolve())


def default_cache_dir() -> Path:
    """Return the folder where derived data files are cached.

    Returns
    -------
    pathlib.Path
        ``HYPERTORCH_SID_CACHE`` if set, else ``~/.cache/hypertorch_sid``. The folder is not
        created by this function.
    """
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hypertorch_sid"


def _resolve_root(root: str | os.PathLike[str] | None) -> Path | None:
    if root is not None:
        return Path(root).expanduser()
    return default_data_root()


# --------------------------------------------------------------------------------------------
# Split container
# --------------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False, kw_only=True)
class Split:
    """Train / validation / test split of a supervised data set.

    The object behaves like a read-only mapping of its field names (``split["X_train"]``,
    ``dict(split)``, ``f(**split)``) and like a dataclass (``split.X_train``).

    Parameters
    ----------
    X_train, y_train : torch.Tensor
        Training features ``(n_train, n_features)`` (dense or sparse CSR) and labels
        ``(n_train,)`` (``int64`` class indices).
    X_val, y_val : torch.Tensor
        Validation features and labels (the outer / hyperparameter objective).
    X_test, y_test : torch.Tensor or None, optional
        Held-out test features and labels, or ``None`` when there is no test set.
    n_features : int
        Number of input features.
    n_classes : int
        Number of classes (2 for binary problems, whose labels are 0/1).
    """

    X_train: Tensor
    y_train: Tensor
    X_val: Tensor
    y_val: Tensor
    X_test: Tensor | None = None
    y_test: Tensor | None = None
    n_features: int
    n_classes: int

    def __post_init__(self) -> None:
        if (self.X_test is None) != (self.y_test is None):
            raise ValueError("X_test and y_test must both be given or both be None")
        for name in ("train", "val", "test"):
            X = getattr(self, f"X_{name}")
            y = getattr(self, f"y_{name}")
            if X is None:
                continue
            if X.shape[0] != y.shape[0]:
                raise ValueError(
                    f"X_{name} has {X.shape[0]} rows but y_{name} has {y.shape[0]} entries"
                )
            if X.ndim != 2 or X.shape[1] != self.n_features:
                raise ValueError(
                    f"X_{name} has shape {tuple(X.shape)}, expected (*, {self.n_features})"
                )

    # Mapping-like interface -----------------------------------------------------------------
    def keys(self) -> list[str]:
        """Return the field names (so that ``dict(split)`` and ``**split`` work)."""
        return [f.name for f in fields(self)]

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def items(self) -> list[tuple[str, Any]]:
        """Return ``(name, value)`` pairs of all fields."""
        return [(k, getattr(self, k)) for k in self.keys()]

    def values(self) -> list[Any]:
        """Return the values of all fields."""
        return [getattr(self, k) for k in self.keys()]

    def as_dict(self) -> dict[str, Any]:
        """Return a shallow ``dict`` copy of the fields."""
        return dict(self.items())

    # Convenience ---------------------------------------------------------------------------
    @property
    def n_train(self) -> int:
        """Number of training examples."""
        return int(self.X_train.shape[0])

    @property
    def n_val(self) -> int:
        """Number of validation examples."""
        return int(self.X_val.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test examples (0 when there is no test set)."""
        return 0 if self.X_test is None else int(self.X_test.shape[0])

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Split:
        """Return a copy with all tensors moved to ``device``.

        Parameters
        ----------
        device : torch.device or str, optional
            Target device.
        dtype : torch.dtype, optional
            Floating dtype for the feature matrices (labels keep their dtype).

        Returns
        -------
        Split
            A new split; tensors already matching are shared, not copied.
        """

        def move(t: Tensor | None, is_feature: bool) -> Tensor | None:
            if t is None:
                return None
            if is_feature and dtype is not None:
                t = t.to(dtype=dtype)
            return t.to(device) if device is not None else t

        return Split(
            X_train=move(self.X_train, True),
            y_train=move(self.y_train, False),
            X_val=move(self.X_val, True),
            y_val=move(self.y_val, False),
            X_test=move(self.X_test, True),
            y_test=move(self.y_test, False),
            n_features=self.n_features,
            n_classes=self.n_classes,
        )

    def __repr__(self) -> str:
        def desc(t: Tensor | None) -> str:
            if t is None:
                return "None"
            layout = "" if t.layout == torch.strided else f", layout={t.layout}"
            return f"Tensor{tuple(t.shape)}[{t.dtype}{layout}]"

        parts = [
            f"{f.name}={desc(getattr(self, f.name))}"
            for f in fields(self)
            if f.name.startswith(("X_", "y_"))
        ]
        parts += [f"n_features={self.n_features}", f"n_classes={self.n_classes}"]
        return f"Split({', '.join(parts)})"


#: Alias of :class:`Split` (binary problems use the same container with ``n_classes=2``).
BinarySplit = Split


# --------------------------------------------------------------------------------------------
# scikit-learn digits
# --------------------------------------------------------------------------------------------


def load_digits_odd_even(
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Split:
    """Binary odd-vs-even task on scikit-learn's bundled 8x8 digits (no download).

    Parameters
    ----------
    n_train : int, optional
        Number of training examples; default half of the 1797 samples (898).
    n_val : int, optional
        Number of validation examples; default half of the remainder (449). The rest forms
        the test set (450 by default; ``None`` if nothing is left).
    seed : int, default=0
        Seed of the random split, which is stratified by digit.
    dtype : torch.dtype, default=torch.float32
        Dtype of the features.

    Returns
    -------
    Split
        Features scaled to ``[0, 1]`` (pixel values divided by 16), 64 features, labels
        ``1`` for odd and ``0`` for even digits (``int64``), ``n_classes=2``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, digit = load_digits(return_X_y=True)
    X = X.astype(np.float64) / 16.0
    n = X.shape[0]
    if n_train is None:
        n_train = n // 2
    if n_val is None:
        n_val = (n - n_train) // 2
    n_test = n - n_train - n_val
    if n_train <= 0 or n_val <= 0 or n_test < 0:
        raise ValueError(f"invalid sizes n_train={n_train}, n_val={n_val} for {n} samples")

    idx = np.arange(n)
    idx_train, idx_rest = train_test_split(
        idx, train_size=n_train, stratify=digit, random_state=seed
    )
    if n_test > 0:
        idx_val, idx_test = train_test_split(
            idx_rest, train_size=n_val, stratify=digit[idx_rest], random_state=seed
        )
    else:
        idx_val, idx_test = idx_rest, None

    Xt = torch.as_tensor(X, dtype=dtype)
    y = torch.as_tensor(digit % 2, dtype=torch.int64)

    def take(ix: np.ndarray | None) -> tuple[Tensor | None, Tensor | None]:
        if ix is None:
            return None, None
        ix_t = torch.as_tensor(np.sort(ix))
        return Xt[ix_t].contiguous(), y[ix_t].contiguous()

    X_train, y_train = take(idx_train)
    X_val, y_val = take(idx_val)
    X_test, y_test = take(idx_test)
    return Split(
        X_train=X_train,
        y_train=y_train,
        X_val=X_val,
        y_val=y_val,
        X_test=X_test,
        y_test=y_test,
        n_features=X.shape[1],
        n_classes=2,
    )


# --------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST (torchvision)
# --------------------------------------------------------------------------------------------


def _stage_idx_files(src_dir: Path, raw_dir: Path) -> bool:
    """Copy the four IDX ``.gz`` files from ``src_dir`` into ``raw_dir`` if all exist there."""
    sources = [src_dir / name for name in _IDX_FILES]
    if not all(p.is_file() for p in sources):
        return False
    raw_dir.mkdir(parents=True, exist_ok=True)
    for src in sources:
        dst = raw_dir / src.name
        if dst.is_file() and dst.stat().st_size == src.stat().st_size:
            continue
        tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    return True


def _load_torchvision_idx(
    cls_name: str,
    subdir: str,
    root: str | os.PathLike[str] | None,
    train: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    import torchvision.datasets

    cls = getattr(torchvision.datasets, cls_name)
    cache = default_cache_dir()
    data_root = _resolve_root(root)
    staged = data_root is not None and _stage_idx_files(
        data_root / subdir, cache / cls_name / "raw"
    )
    try:
        # With the files staged, download=True only checks the MD5s and decompresses.
        ds = cls(str(cache), train=train, download=True)
    except RuntimeError as err:
        if staged:
            raise
        where = "no data root" if data_root is None else f"{data_root / subdir} not found"
        raise RuntimeError(
            f"{cls_name} could not be downloaded ({where}); place the four IDX .gz files in "
            f"<data root>/{subdir}/ or set {DATA_ENV_VAR}"
        ) from err
    X = ds.data.reshape(ds.data.shape[0], -1).to(dtype).div_(255.0)
    y = torch.as_tensor(ds.targets, dtype=torch.int64)
    return X, y


def load_mnist(
    root: str | os.PathLike[str] | None = None,
    train: bool = True,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Load the MNIST training or test set through ``torchvision.datasets.MNIST``.

    The IDX files in ``<root>/mnist/`` are copied to ``<cache>/MNIST/raw/`` and decompressed
    there by torchvision (its MD5 check passes, so nothing is downloaded). Without local
    files, torchvision downloads the data into the cache folder.

    Parameters
    ----------
    root : str or path-like, optional
        Data root holding ``mnist/``; default :func:`default_data_root`.
    train : bool, default=True
        Training set (60000 images) if true, else test set (10000 images).
    dtype : torch.dtype, default=torch.float32
        Dtype of the features.

    Returns
    -------
    X : torch.Tensor
        ``(N, 784)`` pixels scaled to ``[0, 1]``.
    y : torch.Tensor
        ``(N,)`` ``int64`` labels 0-9.
    """
    return _load_torchvision_idx("MNIST", "mnist", root, train, dtype)


def load_fashion_mnist(
    root: str | os.PathLike[str] | None = None,
    train: bool = True,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Load Fashion-MNIST through ``torchvision.datasets.FashionMNIST``.

    Same behaviour as :func:`load_mnist`, with the files taken from ``<root>/fashion-mnist/``
    and staged in ``<cache>/FashionMNIST/raw/``.

    Parameters
    ----------
    root : str or path-like, optional
        Data root holding ``fashion-mnist/``; default :func:`default_data_root`.
    train : bool, default=True
        Training set (60000 images) if true, else test set (10000 images).
    dtype : torch.dtype, default=torch.float32
        Dtype of the features.

    Returns
    -------
    X : torch.Tensor
        ``(N, 784)`` pixels scaled to ``[0, 1]``.
    y : torch.Tensor
        ``(N,)`` ``int64`` labels 0-9.
    """
    return _load_torchvision_idx("FashionMNIST", "fashion-mnist", root, train, dtype)


def mnist_odd_even(
    n_train: int = 5000,
    n_val: int = 5000,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> Split:
    """Binary odd-vs-even MNIST task with small training and validation sets.

    Parameters
    ----------
    n_train, n_val : int, default=5000
        Sizes of the training and validation sets, drawn without replacement (hence disjoint)
        from the 60000 MNIST training images.
    seed : int, default=0
        Seed of the draw (``numpy.random.default_rng``).
    root : str or path-like, optional
        Data root holding ``mnist/``; default :func:`default_data_root`.
    dtype : torch.dtype, default=torch.float32
        Dtype of the features.

    Returns
    -------
    Split
        784 features in ``[0, 1]``, labels ``1`` for odd and ``0`` for even digits (``int64``);
        the test set is the full MNIST test set (10000 images).
    """
    X, digit = load_mnist(root, train=True, dtype=dtype)
    X_test, digit_test = load_mnist(root, train=False, dtype=dtype)
    n = X.shape[0]
    if n_train <= 0 or n_val <= 0 or n_train + n_val > n:
        raise ValueError(f"need 0 < n_train, 0 < n_val and n_train + n_val <= {n}")
    perm = torch.as_tensor(np.random.default_rng(seed).permutation(n)[: n_train + n_val])
    idx_train, idx_val = perm[:n_train], perm[n_train:]
    y = digit % 2
    return Split(
        X_train=X[idx_train],
        y_train=y[idx_train],
        X_val=X[idx_val],
        y_val=y[idx_val],
        X_test=X_test,
        y_test=digit_test % 2,
        n_features=X.shape[1],
        n_classes=2,
    )


def mnist_multiclass_halves(
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> Split:
    """Ten-class MNIST with the training set shuffled and cut into two halves.

    Parameters
    ----------
    seed : int, default=0
        Seed of the shuffle (``numpy.random.default_rng``).
    root : str or path-like, optional
        Data root holding ``mnist/``; default :func:`default_data_root`.
    dtype : torch.dtype, default=torch.float32
        Dtype of the features.

    Returns
    -------
    Split
        30000 training and 30000 validation images, the 10000 test images, 784 features in
        ``[0, 1]``, ``int64`` labels 0-9, ``n_classes=10``.
    """
    X, y = load_mnist(root, train=True, dtype=dtype)
    X_test, y_test = load_mnist(root, train=False, dtype=dtype)
    n = X.shape[0]
    perm = torch.as_tensor(np.random.default_rng(seed).permutation(n))
    half = n // 2
    idx_train, idx_val = perm[:half], perm[half:]
    return Split(
        X_train=X[idx_train],
        y_train=y[idx_train],
        X_val=X[idx_val],
        y_val=y[idx_val],
        X_test=X_test,
        y_test=y_test,
        n_features=X.shape[1],
        n_classes=10,
    )


# --------------------------------------------------------------------------------------------
# 20 Newsgroups (scikit-learn)
# --------------------------------------------------------------------------------------------


def _build_20news_sklearn_cache(archive: Path, data_home: Path) -> None:
    """Write scikit-learn's ``20news-bydate_py3.pkz`` from a local ``20news-bydate.tar.gz``.

    What this is: a workaround for offline machines. ``fetch_20newsgroups`` has no option to
    read a local archive, only its own cache file, so this writes that cache file the way
    scikit-learn's private ``sklearn.datasets._twenty_newsgroups._download_20newsgroups`` does
    after its download: extract, ``load_files`` both splits with its default shuffle
    (``random_state=0``), pickle and zlib-compress. The file name and format are scikit-learn
    internals (unchanged from 1.2 to the version in ``.venv``), not a public API: if a future
    scikit-learn changes them, ``fetch_20newsgroups_vectorized`` fails to read the file; delete
    ``<cache>/scikit_learn_data`` and let scikit-learn download the data instead.
    """
    from sklearn.datasets import load_files

    data_home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="20news_extract_", dir=data_home) as tmp:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(path=tmp, filter="data")
            else:  # pragma: no cover - Python without extraction filters
                tar.extractall(path=tmp)
        cache = dict(
            train=load_files(Path(tmp) / _NEWS20_TRAIN_FOLDER, encoding="latin1"),
            test=load_files(Path(tmp) / _NEWS20_TEST_FOLDER, encoding="latin1"),
        )
        compressed = codecs.encode(pickle.dumps(cache), "zlib_codec")
        target = data_home / _NEWS20_SKLEARN_CACHE
        partial = Path(tmp) / (_NEWS20_SKLEARN_CACHE + ".partial")
        partial.write_bytes(compressed)
        os.replace(partial, target)


def load_20news_vectorized(
    root: str | os.PathLike[str] | None = None,
    data_home: str | os.PathLike[str] | None = None,
) -> tuple[Any, np.ndarray, Any, np.ndarray]:
    """Load 20 Newsgroups as scikit-learn's ``fetch_20newsgroups_vectorized`` features.

    If ``<root>/20news/20news-bydate.tar.gz`` exists and scikit-learn's cache file is not yet
    in ``data_home``, the archive is extracted and ``20news-bydate_py3.pkz`` is written there
    (the file scikit-learn itself would write after downloading). Then
    ``fetch_20newsgroups_vectorized`` is called, which vectorises the documents once and keeps
    the result in ``data_home`` (``20newsgroup_vectorized_py3.pkl``), so later calls are fast.
    Without the archive, scikit-learn downloads the data.

    Parameters
    ----------
    root : str or path-like, optional
        Data root holding ``20news/``; default :func:`default_data_root`.
    data_home : str or path-like, optional
        scikit-learn data folder for the caches; default ``<cache>/scikit_learn_data``, with
        ``<cache>`` from :func:`default_cache_dir`.

    Returns
    -------
    X_train : scipy.sparse.csr_matrix
        ``(11314, 130107)`` ``float64`` token counts with rows scaled to unit L2 norm.
    y_train : numpy.ndarray
        ``(11314,)`` labels 0-19 (alphabetical newsgroup order).
    X_test : scipy.sparse.csr_matrix
        ``(7532, 130107)`` test features, same vocabulary.
    y_test : numpy.ndarray
        ``(7532,)`` test labels.
    """
    from sklearn.datasets import fetch_20newsgroups_vectorized

    home = Path(data_home) if data_home is not None else default_cache_dir() / "scikit_learn_data"
    home.mkdir(parents=True, exist_ok=True)
    have_cache = (home / _NEWS20_SKLEARN_CACHE).is_file()
    if not have_cache:
        data_root = _resolve_root(root)
        archive = None if data_root is None else data_root / "20news" / _NEWS20_ARCHIVE
        if archive is not None and archive.is_file():
            _build_20news_sklearn_cache(archive, home)
            have_cache = True
    kwargs: dict[str, Any] = dict(data_home=str(home), download_if_missing=not have_cache)
    X_train, y_train = fetch_20newsgroups_vectorized(subset="train", return_X_y=True, **kwargs)
    X_test, y_test = fetch_20newsgroups_vectorized(subset="test", return_X_y=True, **kwargs)
    X_train = X_train.tocsr()
    X_test = X_test.tocsr()
    X_train.sort_indices()
    X_test.sort_indices()
    return X_train, np.asarray(y_train), X_test, np.asarray(y_test)


def _scipy_csr_to_torch(X: Any, dtype: torch.dtype, sparse: bool) -> Tensor:
    X = X.tocsr()
    if not sparse:
        return torch.as_tensor(X.toarray(), dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.as_tensor(X.indptr, dtype=torch.int64),
            torch.as_tensor(X.indices, dtype=torch.int64),
            torch.as_tensor(X.data, dtype=dtype),
            size=X.shape,
            check_invariants=False,
        )


def news20_split(
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    *,
    sparse: bool = True,
    dtype: torch.dtype = torch.float32,
    data_home: str | os.PathLike[str] | None = None,
) -> Split:
    """Twenty-class 20 Newsgroups with the training set halved into train / validation.

    Parameters
    ----------
    seed : int, default=0
        ``random_state`` of the stratified ``train_test_split(test_size=0.5)``.
    root : str or path-like, optional
        Data root holding ``20news/``; default :func:`default_data_root`.
    sparse : bool, default=True
        Return ``torch.sparse_csr`` feature matrices (``int64`` indices). With ``False`` they
        are dense, about 9.8 GB in ``float32`` for the three parts together.
    dtype : torch.dtype, default=torch.float32
        Dtype of the feature values.
    data_home : str or path-like, optional
        Passed to :func:`load_20news_vectorized`.

    Returns
    -------
    Split
        5657 training and 5657 validation documents, the 7532 test documents,
        130107 features (unit-L2 rows), ``int64`` labels 0-19, ``n_classes=20``.
    """
    from sklearn.model_selection import train_test_split

    if not sparse:
        warnings.warn(
            "news20_split(sparse=False) builds dense (n, 130107) matrices, about 0.5 MB per "
            "document in float32 (roughly 10 GB in total)",
            ResourceWarning,
            stacklevel=2,
        )
    X, y, X_test, y_test = load_20news_vectorized(root=root, data_home=data_home)
    idx_train, idx_val = train_test_split(
        np.arange(X.shape[0]), test_size=0.5, stratify=y, random_state=seed
    )
    idx_train = np.sort(idx_train)
    idx_val = np.sort(idx_val)

    def labels(v: np.ndarray) -> Tensor:
        return torch.as_tensor(v, dtype=torch.int64)

    return Split(
        X_train=_scipy_csr_to_torch(X[idx_train], dtype, sparse),
        y_train=labels(y[idx_train]),
        X_val=_scipy_csr_to_torch(X[idx_val], dtype, sparse),
        y_val=labels(y[idx_val]),
        X_test=_scipy_csr_to_torch(X_test, dtype, sparse),
        y_test=labels(y_test),
        n_features=X.shape[1],
        n_classes=int(max(y.max(), y_test.max())) + 1,
    )


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def to_loader(
    X: Tensor,
    y: Tensor,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    *,
    drop_last: bool = False,
) -> torch.utils.data.DataLoader:
    """Wrap dense tensors in a reproducibly shuffled ``DataLoader``.

    Parameters
    ----------
    X : torch.Tensor
        Dense features, first dimension indexes examples.
    y : torch.Tensor
        Labels with the same first dimension.
    batch_size : int
        Mini-batch size.
    shuffle : bool, default=True
        Reshuffle every epoch.
    seed : int, default=0
        Seed of the ``torch.Generator`` driving the shuffle, so that two loaders built with
        the same seed yield the same batches.
    drop_last : bool, default=False
        Drop the last incomplete batch.

    Returns
    -------
    torch.utils.data.DataLoader
        Loader over ``TensorDataset(X, y)`` yielding ``(X_batch, y_batch)``.
    """
    if X.layout != torch.strided:
        raise TypeError(f"to_loader needs a dense X, got layout {X.layout}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, y),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        drop_last=drop_last,
    )
