"""``CurvatureProbe``: how a curvature strategy reads ∇²₁₁ℓ̂ at the current w.

A :class:`~hypertorch_sid.core.estimation.Curvature` strategy decides *when* and *what* to
estimate (before the first solve, at w_t, after a divergence); the probe does the reading for it,
on the optimizer's data and with its bookkeeping:

* :meth:`CurvatureProbe.batches` — the minibatches an estimate reads (or the full batch);
* :meth:`CurvatureProbe.lanczos` — L, λ_min by Lanczos (:func:`estimate_curvature`) in the
  module's solve mode, averaged across processes, its products counted in the cost;
* :meth:`CurvatureProbe.precondition` / :meth:`CurvatureProbe.set_scale` — the diagonal P = S²
  of the GD map from the preconditioner strategy; a change of S moves the warm-start v into the
  new coordinates (z = S⁻¹w) through ``on_rescale``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .batches import BatchStream, batch_size
from .config import SIDConfig
from .cost import Cost
from .estimation import CurvatureEstimate, EstimatedCurvature, estimate_curvature
from .maps import GradientDescentMap
from .modes import frozen_mode

log = logging.getLogger("hypertorch_sid")

Tensors = list[Tensor]


class CurvatureProbe:
    """Reads the curvature of the GD map ``phi`` for a curvature strategy (module docstring).

    ``stream`` (the training minibatches) and ``hyper_step`` (the Lanczos seed) are set by the
    optimizer at each hypergradient.
    """

    def __init__(
        self,
        phi: GradientDescentMap,
        config: SIDConfig,
        cost: Cost,
        *,
        module: torch.nn.Module | None,
        full_batch: Any,
        mean: Callable[[Tensor], Tensor] | None,
        on_rescale: Callable[[Tensors | None, Tensors | None], None],
    ) -> None:
        self.phi, self.config, self.cost = phi, config, cost
        self.module, self.full_batch, self.mean = module, full_batch, mean
        self.on_rescale = on_rescale
        self.stream: BatchStream | None = None
        self.hyper_step = 0

    @property
    def alpha_given(self) -> float | None:
        """α as configured (P applies only where α, L, μ are all estimated)."""
        return self.config.alpha

    @property
    def scale(self) -> Tensors | None:
        """S of the preconditioned map (None: P = I)."""
        return self.phi.scale

    def batches(self, curvature: EstimatedCurvature) -> list[Any]:
        """The batches an estimate reads: ``curvature.batches`` fresh minibatches, or the full
        batch where those would read as many samples or ``batches="full"`` asks for it (20
        Lanczos products on the full batch cost 20 epochs: more than a whole solve at n = 5000
        in ``benchmarks/bench_peers.py``)."""
        if curvature.batches == "full":
            return [self.full_batch]
        assert self.stream is not None
        full = self.full_batch
        batches: list[Any] = []
        samples = 0
        for _ in range(int(curvature.batches)):
            batches.append(next(self.stream))
            samples += batch_size(batches[-1])
            if full is not None and samples >= batch_size(full):
                return [full]
        return batches

    def lanczos(
        self, batches: list[Any], iters: int, mu: float | None, mu_floor: float
    ) -> CurvatureEstimate:
        """L, λ_min at the current w, λ by Lanczos (:func:`estimate_curvature`), cost counted."""
        phi: Any = self.phi
        if self.mean is not None:  # Lanczos on the global (averaged) Hessian
            phi = _GlobalHessian(self.phi, self.mean)
        with frozen_mode(self.module, self.config.mode):  # no BatchNorm statistics update
            est = estimate_curvature(
                phi, batches, iters, mu=mu, mu_floor=mu_floor, seed=self.hyper_step
            )
        n = sum(batch_size(b) for b in batches)
        self.cost.curvature_samples += n * est.iterations
        self.cost.curvature_products += len(batches) * est.iterations
        self.cost.samples += n * est.iterations
        if est.uncertain and not est.convex:
            log.warning(
                "hypertorch_sid: the sign of lambda_min is uncertain (%.3g ± %.2g after %d Lanczos "
                "steps); raise EstimatedCurvature(iters=...) for a firmer estimate.",
                est.lambda_min,
                est.lambda_min_error,
                est.iterations,
            )
        return est

    def precondition(self, batches: list[Any]) -> None:
        """P = D⁻¹ of the GD map from the preconditioner strategy, on the estimate's batches."""
        self.set_scale(None)
        if self.config.mode == "train" and _has_batchnorm(self.module):
            log.info(
                "hypertorch_sid: no preconditioner: BatchNorm in train mode has no per-sample map"
            )
            return
        with frozen_mode(self.module, self.config.mode):
            D = self.config.preconditioner.diagonal(self.phi, batches)
        if D is None:
            return
        values = D.values
        if self.mean is not None:  # one P on every process
            values = [self.mean(d) for d in values]
        self.cost.curvature_samples += D.samples
        self.cost.samples += D.samples
        self.set_scale([d.rsqrt() for d in values])

    def set_scale(self, scale: Tensors | None) -> None:
        """S of the preconditioned map; the warm-start v follows (``on_rescale(old, new)``)."""
        self.on_rescale(self.phi.scale, scale)
        self.phi.scale = scale


def _has_batchnorm(module: torch.nn.Module | None) -> bool:
    return module is not None and any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()
    )


class _GlobalHessian:
    """Hessian–vector products averaged across processes: one curvature estimate everywhere."""

    def __init__(self, phi: GradientDescentMap, mean: Callable[[Tensor], Tensor]) -> None:
        self.phi, self.mean = phi, mean
        self.inner_parameters = phi.inner_parameters

    def hessian_vector_product(self, batch: Any, v: Any) -> Tensors:
        return [self.mean(h) for h in self.phi.hessian_vector_product(batch, v)]
