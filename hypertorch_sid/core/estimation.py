"""Estimates of L (smoothness) and μ (strong convexity) of ℓ(·, λ) by power iteration.

L = λ_max(∇²₁₁ℓ) and μ = λ_min(∇²₁₁ℓ) are what the theory's step sizes need (α = 2/(L+μ),
Corollary 4.3). With minibatch Hessian–vector products averaged over a few batches:

* power iteration on H gives L;
* power iteration on L·I − H gives L − μ, hence μ.

The estimate of μ is floored at ``mu_floor × L`` (a non-convex or barely convex loss otherwise
gives μ ≤ 0 and an undefined contraction constant); the floor is reported when used.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .maps import GradientDescentMap

log = logging.getLogger("hypertorch_sid")


@dataclass(frozen=True)
class CurvatureEstimate:
    """Result of :func:`estimate_curvature`: L, μ and whether μ hit its floor."""

    L: float
    mu: float
    mu_floored: bool
    iterations: int


def _dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    return sum((x * y).sum() for x, y in zip(a, b))


def _normalise(v: Sequence[Tensor]) -> list[Tensor]:
    n = torch.sqrt(_dot(v, v)).clamp_min(1e-30)
    return [x / n for x in v]


def _power_iteration(matvec: Any, like: Sequence[Tensor], iters: int, seed: int) -> float:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    v = [torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device) for x in like]
    v = _normalise(v)
    eig = 0.0
    for _ in range(iters):
        hv = matvec(v)
        eig = float(_dot(v, hv))
        v = _normalise(hv)
    return eig


def estimate_curvature(
    phi: GradientDescentMap,
    batches: Sequence[Any],
    iters: int = 20,
    mu: float | None = None,
    mu_floor: float = 1e-4,
    seed: int = 0,
) -> CurvatureEstimate:
    """Estimate L and μ of ℓ at the current w, λ from Hessian–vector products on ``batches``.

    Parameters
    ----------
    phi: the gradient-descent map whose inner loss is ℓ̂.
    batches: minibatches whose averaged Hessian stands for ∇²₁₁ℓ.
    iters: power iterations for each eigenvalue.
    mu: a known μ (e.g. the smallest weight decay); then only L is estimated.
    mu_floor: μ is at least ``mu_floor × L``.
    """
    params = phi.inner_parameters

    def hessian(v: Sequence[Tensor]) -> list[Tensor]:
        acc = [torch.zeros_like(x) for x in v]
        for b in batches:
            for a, h in zip(acc, phi.hessian_vector_product(b, v)):
                a.add_(h.detach(), alpha=1.0 / len(batches))
        return acc

    L = abs(_power_iteration(hessian, params, iters, seed))
    if not math.isfinite(L) or L <= 0:
        L = 1.0
        log.warning("hypertorch_sid: Hessian power iteration gave no positive L; using L = 1.")
    floored = False
    if mu is None:

        def shifted(v: Sequence[Tensor]) -> list[Tensor]:
            return [L * x - h for x, h in zip(v, hessian(v))]

        mu = L - _power_iteration(shifted, params, iters, seed + 1)
        if not math.isfinite(mu) or mu < mu_floor * L:
            mu, floored = mu_floor * L, True
    log.info(
        "hypertorch_sid: estimated L = %.4g, mu = %.4g%s by %d power iterations on %d batches",
        L,
        mu,
        " (floored)" if floored else "",
        iters,
        len(batches),
    )
    return CurvatureEstimate(L=L, mu=float(mu), mu_floored=floored, iterations=iters)
