"""Test problems with known answers (oracles) shared by the test modules."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import Batches, SIDConfig, SIDHyperOptimizer


def import_from(folder: Path, name: str) -> ModuleType:
    """The module ``name`` from ``folder`` outside the package (a benchmark script), without
    leaving ``folder`` on ``sys.path``."""
    sys.path.insert(0, str(folder))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(folder))


@dataclass
class Ridge:
    """Ridge regression: ℓ = ½ mean (Xw − y)² + ½ Σ λᵢ wᵢ², E = ½ mean (X_val w − y_val)².

    λ = exp(log_lam) with one value (``per_feature=False``) or one per feature.
    """

    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    w: Tensor
    log_lam: Tensor

    def lam(self) -> Tensor:
        return self.log_lam.detach().exp().expand(self.X.shape[1])

    def inner_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        X, y = batch
        lam = self.log_lam.exp()
        return 0.5 * ((X @ self.w - y) ** 2).mean() + 0.5 * (lam * self.w**2).sum()

    def outer_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        X, y = batch
        return 0.5 * ((X @ self.w - y) ** 2).mean()

    def w_star(self) -> Tensor:
        n = self.X.shape[0]
        A = self.X.T @ self.X / n + torch.diag(self.lam())
        return torch.linalg.solve(A, self.X.T @ self.y / n)

    def exact_hypergradient(self) -> Tensor:
        """∇f(log λ) = −diag(λ ⊙ w)(XᵀX/n + diag λ)⁻¹ ∇_w E, summed for a scalar λ."""
        n, nv = self.X.shape[0], self.X_val.shape[0]
        lam = self.lam()
        w = self.w_star()
        A = self.X.T @ self.X / n + torch.diag(lam)
        grad_E = self.X_val.T @ (self.X_val @ w - self.y_val) / nv
        g = -(lam * w) * torch.linalg.solve(A, grad_E)
        return g.sum().reshape(self.log_lam.shape) if self.log_lam.numel() == 1 else g

    def train(self) -> tuple[Tensor, Tensor]:
        return (self.X, self.y)

    def val(self) -> tuple[Tensor, Tensor]:
        return (self.X_val, self.y_val)

    def loader(self, batch_size: int, seed: int = 0) -> DataLoader:
        gen = torch.Generator().manual_seed(seed)
        return DataLoader(
            TensorDataset(self.X, self.y), batch_size=batch_size, shuffle=True, generator=gen
        )


def make_ridge(
    n: int = 200,
    d: int = 5,
    per_feature: bool = True,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    log_lam0: float = -1.0,
    device: str = "cpu",
) -> Ridge:
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.randn(d, generator=gen, dtype=dtype)
    X = torch.randn(n, d, generator=gen, dtype=dtype)
    y = X @ w_true + 0.5 * torch.randn(n, generator=gen, dtype=dtype)
    X_val = torch.randn(n, d, generator=gen, dtype=dtype)
    y_val = X_val @ w_true + 0.5 * torch.randn(n, generator=gen, dtype=dtype)
    shape = (d,) if per_feature else (1,)
    log_lam = torch.full(shape, log_lam0, dtype=dtype, device=device)
    log_lam += 0.3 * torch.randn(shape, generator=gen, dtype=dtype).to(device)
    return Ridge(
        X.to(device),
        y.to(device),
        X_val.to(device),
        y_val.to(device),
        torch.zeros(d, dtype=dtype, device=device, requires_grad=True),
        log_lam.requires_grad_(True),
    )


def relative_error(estimate: Tensor, exact: Tensor) -> float:
    return float((estimate - exact).norm() / exact.norm())


SETTINGS = frozenset(f.name for f in dataclasses.fields(SIDConfig))


def split_settings(kwargs: dict) -> tuple[dict, dict]:
    """A test helper's keywords: (the problem's, for SIDHyperOptimizer; SIDConfig fields)."""
    settings = {k: v for k, v in kwargs.items() if k in SETTINGS}
    return {k: v for k, v in kwargs.items() if k not in SETTINGS}, settings


def full_batch_sid(problem: Ridge, steps: int = 400, **kwargs) -> SIDHyperOptimizer:
    """Deterministic SID on ``problem``: full-batch solves with η = 1 and the exact ∂₂Φ; the
    inner loss is the ridge's own unless ``inner_loss=`` is given; SIDConfig fields in
    ``kwargs`` change the config."""
    kwargs.setdefault("inner_loss", problem.inner_loss)
    kwargs, settings = split_settings(kwargs)
    config = SIDConfig(
        inner_steps=steps,
        adjoint_steps=steps,
        step_size="constant",
        eta=1.0,
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )
    return SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        outer_loss=problem.outer_loss,
        full_train_batch=problem.train(),
        **kwargs,
        config=config.replace(**settings),
    )


def sid_on(problem: Any, full_train_batch: Any = None, **settings) -> SIDHyperOptimizer:
    """SID on ``problem`` (its ``log_lam``, ``w``, ``inner_loss`` and ``outer_loss``: a
    :class:`Ridge` or a test's own; no outer optimizer) with ``SIDConfig(**settings)``."""
    return SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        problem.outer_loss,
        full_train_batch=full_train_batch,
        config=SIDConfig(**settings),
    )


def module_sid(
    net: torch.nn.Module, log_lam: Tensor, inner: Any, outer: Any, **settings: Any
) -> SIDHyperOptimizer:
    """SID on ``net``'s parameters (``module=net``) with the one hyperparameter ``log_lam``, the
    losses ``inner`` and ``outer`` and ``SIDConfig(**settings)``."""
    return SIDHyperOptimizer(
        [log_lam], net.parameters(), inner, outer, module=net, config=SIDConfig(**settings)
    )


def ridge_sid(
    problem: Ridge, steps: int = 20, outer: torch.optim.Optimizer | None = None, **kwargs: Any
) -> SIDHyperOptimizer:
    """SID on ``problem`` with ``steps`` inner and adjoint steps and the outer optimizer
    ``outer``; SIDConfig fields in ``kwargs`` change the config, the rest go to
    :class:`SIDHyperOptimizer`."""
    kwargs, settings = split_settings(kwargs)
    return SIDHyperOptimizer(
        [problem.log_lam],
        [problem.w],
        problem.inner_loss,
        problem.outer_loss,
        outer,
        **kwargs,
        config=SIDConfig(inner_steps=steps, adjoint_steps=steps).replace(**settings),
    )


def equal(a: Any, b: Any) -> bool:
    """Deep equality of nested dicts/lists of tensors and numbers (optimizer states)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def symmetric_with_spectrum(eigenvalues: Tensor, generator: torch.Generator) -> Tensor:
    """Q diag(eigenvalues) Qᵀ with Q a random orthogonal matrix (QR of a Gaussian drawn from
    ``generator``, in the eigenvalues' dtype): a symmetric matrix of known spectrum."""
    d = len(eigenvalues)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=eigenvalues.dtype))
    return Q @ torch.diag(eigenvalues) @ Q.T
