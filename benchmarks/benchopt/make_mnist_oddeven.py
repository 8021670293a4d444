"""Build ``mnist_oddeven.npz``, the data of ``datasets/mnist_oddeven.py`` (the seed paper's problem
as a dataset of benchopt's bilevel benchmark), offline from local MNIST IDX files.

The split is the project's ``examples/datasets.py::mnist_odd_even`` (the paper's section 5):
``n_train`` and ``n_val`` disjoint images drawn from the 60000 MNIST training images by
``numpy.random.default_rng(seed).permutation``, the 10000 test images as the test set, pixels
scaled to ``[0, 1]`` (÷ 255, no centring), labels ``+1`` for odd and ``-1`` for even digits
(the paper's ψ(y xᵀw) convention; the benchmark's ``log_sigmoid(y xᵀw)``).

Usage: ``python benchmarks/benchopt/make_mnist_oddeven.py [--mnist-dir DIR] [--out FILE]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_mnist_pkl import DEFAULT_DIR, build  # noqa: E402


def odd_even_split(
    images: np.ndarray,
    digits: np.ndarray,
    test_images: np.ndarray,
    test_digits: np.ndarray,
    n_train: int = 5000,
    n_val: int = 5000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The paper's split of uint8 images (N, 784) and digits (N,): float32 pixels in [0, 1],
    float32 labels ±1 (odd = +1)."""
    n = images.shape[0]
    if n_train <= 0 or n_val <= 0 or n_train + n_val > n:
        raise ValueError(f"need 0 < n_train, 0 < n_val and n_train + n_val <= {n}")
    perm = np.random.default_rng(seed).permutation(n)[: n_train + n_val]
    idx = {"train": perm[:n_train], "val": perm[n_train:]}

    def x(a):
        return (np.asarray(a, np.float32) / 255.0).reshape(len(a), -1)

    def y(d):
        return np.where(np.asarray(d) % 2 == 1, 1.0, -1.0).astype(np.float32)

    out = {f"X_{k}": x(images[i]) for k, i in idx.items()}
    out.update({f"y_{k}": y(digits[i]) for k, i in idx.items()})
    out.update(X_test=x(test_images), y_test=y(test_digits))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--out", type=Path, default=Path("mnist_oddeven.npz"))
    parser.add_argument("--n-train", type=int, default=5000)
    parser.add_argument("--n-val", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    m = build(args.mnist_dir)
    data = odd_even_split(
        m["training_images"], m["training_labels"], m["test_images"], m["test_labels"],
        args.n_train, args.n_val, args.seed,
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print("wrote", args.out, {k: v.shape for k, v in data.items()})


if __name__ == "__main__":
    main()
