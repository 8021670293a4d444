"""Build the ``mnist.pkl`` that benchmark_bilevel's ``datasets/mnist.py`` reads, offline.

That dataset downloads the four MNIST IDX archives and pickles a dict of uint8 arrays when no
``mnist.pkl`` is in the working folder. This script writes the same dict from local copies
(default ``../shared/data/mnist`` relative to the repository root), so the benchmark runs
without internet:

    training_images (60000, 784) uint8   training_labels (60000,) uint8
    test_images     (10000, 784) uint8   test_labels     (10000,) uint8

Usage: ``python benchmarks/benchopt/make_mnist_pkl.py [--mnist-dir DIR] [--out mnist.pkl]``
"""

from __future__ import annotations

import argparse
import gzip
import pickle
from pathlib import Path

import numpy as np

FILES = {
    "training_images": "train-images-idx3-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "training_labels": "train-labels-idx1-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "mnist"


def read_idx(path: Path, images: bool) -> np.ndarray:
    """One gzip IDX file as the benchmark reads it (header skipped, images flattened)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    offset = 16 if images else 8
    magic = int.from_bytes(raw[:4], "big")
    if magic != (2051 if images else 2049):
        raise ValueError(f"{path} is not an IDX {'image' if images else 'label'} file.")
    shape = (-1, 28 * 28) if images else (-1,)
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(*shape)


def build(mnist_dir: Path) -> dict[str, np.ndarray]:
    """The dict ``datasets/mnist.py::download_mnist`` pickles."""
    missing = [f for f in FILES.values() if not (mnist_dir / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{mnist_dir} lacks {missing}: pass --mnist-dir to the folder of the MNIST IDX .gz "
            "files."
        )
    return {key: read_idx(mnist_dir / f, "images" in key) for key, f in FILES.items()}


def write(mnist_dir: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        pickle.dump(build(mnist_dir), f)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--out", type=Path, default=Path("mnist.pkl"))
    args = parser.parse_args()
    print("wrote", write(args.mnist_dir, args.out))


if __name__ == "__main__":
    main()
