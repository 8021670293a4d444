"""Session 59 (left59): a user's dense outer optimizer under DDP has the sparse path's scale;
λ named on neither side that a load cannot check are named in a warning.

A test fitting with ``Adam`` (which is almost blind to the gradient's scale: a dense gradient
summed twice, or averaged where it should be summed, moves the ranks identically and still
separates the corrupted rows) would miss a wrong scale. Here the outer step is plain ``SGD`` (its
step is the gradient times lr) and the same 2-process DDP fit runs twice: with the row-sparse
gradients all-gathered (``sparse_grad=True``) and with the dense one summed across ranks (the
path a user's optimizer gets). The two must give the same weights up to float rounding.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_problems import end_ddp_worker, trainer
from test_data_weights_lightning import NOISY, Classifier, Data, callback
from torch import Tensor

from hypertorch_sid import ConfigurationError, SIDConfig, SIDHyperOptimizer

F64 = torch.float64


def _worker(out: Path) -> None:
    """One DDP rank: the drop-in with a plain ``SGD`` outer step, dense then row-sparse: two fits
    in one process group (one launch of the two ranks instead of two)."""
    torch.set_num_threads(1)
    for sparse in (False, True):
        cb = callback(
            val_batch_size=30,
            outer_optimizer=functools.partial(torch.optim.SGD, lr=20.0),
            cross_term="training",
            max_overhead=None,
            sparse_grad=True if sparse else None,
        )
        t = trainer([cb], devices=2, strategy="ddp", max_epochs=6)
        t.fit(Classifier(), datamodule=Data())
        torch.save(cb.data_weights(), out / f"{sparse}_rank{t.global_rank}.pt")
    end_ddp_worker()


def _fit(out: Path) -> dict[bool, tuple[Tensor, Tensor]]:
    """sparse → the data weights of ranks 0 and 1."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {
        sparse: tuple(torch.load(out / f"{sparse}_rank{r}.pt") for r in (0, 1))
        for sparse in (False, True)
    }


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_the_dense_ddp_gradient_moves_the_weights_as_the_sparse_one(tmp_path):
    fits = _fit(tmp_path)
    (dense0, dense1), (sparse0, sparse1) = fits[False], fits[True]
    assert torch.equal(dense0, dense1) and torch.equal(sparse0, sparse1)
    assert dense0[:NOISY].mean() < dense0[NOISY:].mean() - 0.1
    assert (sparse0 - 0.5).abs().max() > 0.3
    # measured 2e-5 (float32 rounding of the sums); a dense gradient summed twice gives 0.15
    assert (dense0 - sparse0).abs().max() < 1e-3, (dense0 - sparse0).abs().max()


def _pair(order: tuple[str, str], shapes: dict[str, int], named: bool) -> SIDHyperOptimizer:
    """λ_a decays w[:2], λ_b w[2:] (each of ``shapes[name]`` entries), given in ``order``,
    unnamed or as ``(name, tensor)`` pairs; two hyper steps taken so the state holds moments."""
    lam = {n: torch.full((k,), -0.5 * i, dtype=F64, requires_grad=True)
           for i, (n, k) in enumerate(shapes.items())}  # fmt: skip
    w = torch.zeros(4, dtype=F64, requires_grad=True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g, dtype=F64), torch.randn(100, generator=g, dtype=F64)

    def fit(b: Any) -> Tensor:
        return 0.5 * ((b[0] @ w - b[1]) ** 2).mean()

    def inner(b: Any) -> Tensor:
        per = torch.cat([lam[n].exp().expand(2) for n in ("a", "b")])
        return fit(b) + 0.5 * (per * w**2).sum()

    tensors = [lam[n] for n in order]
    given = [(n, lam[n]) for n in order] if named else tensors
    hopt = SIDHyperOptimizer(
        given, [w], inner, fit, torch.optim.Adam(tensors, lr=0.1),
        config=SIDConfig(inner_steps=3, adjoint_steps=3),
    )  # fmt: skip
    batches = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 80, 20)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            hopt.step(batches, (x[80:], y[80:]))
    return hopt


def test_unnamed_lambdas_of_one_shape_load_by_position_with_a_warning_naming_them():
    """Equal-shaped λ named on neither side cannot be told apart: the load takes them by
    position and says so (which positions, how to have the order checked)."""
    shapes = {"a": 2, "b": 2}
    state = _pair(("a", "b"), shapes, named=False).state_dict()
    other = _pair(("b", "a"), shapes, named=False)
    with pytest.warns(
        UserWarning, match=r"by position only \(positions \[0, 1\] of shape \(2,\)\)"
    ):
        other.load_state_dict(state)
    # what the warning is about: the swapped run holds the saved values position by position
    assert all(torch.equal(h, s) for h, s in zip(other.hyperparameters, state["hyperparameters"]))


@pytest.mark.parametrize("shapes, named", [({"a": 1, "b": 2}, False), ({"a": 2, "b": 2}, True)])
def test_a_load_it_can_check_gives_no_position_warning(shapes, named):
    """Distinct shapes (checked by shape) or names (checked by name): nothing to warn of."""
    state = _pair(("a", "b"), shapes, named=named).state_dict()
    same = _pair(("a", "b"), shapes, named=named)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.load_state_dict(state)


def test_named_lambdas_of_one_shape_in_another_order_are_refused():
    """The fix the warning names: with (name, tensor) pairs the swap is refused."""
    shapes = {"a": 2, "b": 2}
    state = _pair(("a", "b"), shapes, named=True).state_dict()
    with pytest.raises(ConfigurationError, match="another order"):
        _pair(("b", "a"), shapes, named=True).load_state_dict(state)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True)
    args = parser.parse_args()
    _worker(args.worker)
