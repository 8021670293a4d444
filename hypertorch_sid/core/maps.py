"""Stochastic fixed-point maps Φ̂(w, λ, ζ) and their vector–Jacobian products (section 2).

A map works on the *current values* of the inner parameters w and hyperparameters λ (tensors the
user's closures read), evaluated on a minibatch ζ. It offers

* :meth:`FixedPointMap.value` — Φ̂(w, λ, ζ), detached;
* :meth:`FixedPointMap.vjp` — (∂₁Φ̂(w,λ,ζ)ᵀ v, ∂₂Φ̂(w,λ,ζ)ᵀ v), the products the adjoint solve
  (eq. backalg) and the hypergradient assembly (eq. gradestim) need;
* :meth:`FixedPointMap.exact_hyper_vjp` — ∂₂Φ̂ᵀ v where it does not depend on ζ (a GD map whose
  ℓ̂ reads λ only through a batch-independent ``regularizer`` R(w, λ), e.g. weight decay), else
  None.

Three maps:

* :class:`GradientDescentMap` — Φ̂ = w − α∇₁ℓ̂(w, λ, ζ), the argmin setting (eq. mainprobopt);
  ∂₁Φ̂ᵀv = v − α∇²₁₁ℓ̂ v and ∂₂Φ̂ᵀv = −α∇²₂₁ℓ̂ v.
* :class:`ProximalGradientMap` — Φ̂ = (w − α∇₁ĝ)/(1 + αc(λ)) for ℓ̂ = ĝ + ½⟨c(λ), w²⟩: the same
  argmin, with the (weight-decay) penalty applied exactly, so α is limited by ĝ alone.
* :class:`ContractionMap` — any user map ``phi(batch) -> list of tensors`` (the general
  fixed-point setting of eq. mainprob).

How ∇²₁₁ℓ̂ v is computed is pluggable (``hvp=``): ``"reverse"`` (reverse-over-reverse, works with
any closure), ``"forward"`` (forward-over-reverse through ``torch.func.jvp``; needs the
``module`` that owns the inner parameters, and is often faster, see ``benchmarks/``), or
:class:`~hypertorch_sid.core.gauss_newton.GaussNewton` (the positive semi-definite Gauss–Newton
matrix in place of the Hessian in the adjoint system: exact for models linear in w).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .autodiff import grad as _grad
from .autodiff import on_graph
from .errors import ConfigurationError
from .gauss_newton import GaussNewton, check_hvp
from .validation import (
    as_tensor_list,
    check_contraction,
    check_dependencies,
    check_positive,
    check_scalar_loss,
    estimate_contraction,
)
from .watch import check_map_output, check_penalty_not_in_loss

if TYPE_CHECKING:  # the map chooses how its step constants are set (double dispatch)
    from .constants import StepConstants
    from .cost import Cost
    from .damping import Damping
    from .estimation import CurvatureEstimate

Tensors = list[Tensor]


class FixedPointMap(ABC):
    """Φ̂(w, λ, ζ): a stochastic contraction in w. Subclasses implement ``value`` and ``vjp``."""

    inner_parameters: Tensors
    hyperparameters: Tensors
    #: δ ≥ 0 of the damped adjoint system (:mod:`~hypertorch_sid.core.damping`); products of
    #: ``vjp`` are those of the damped map Φ̂_δ. Set by the optimizer from its damping strategy.
    damping: float = 0.0
    #: whether I − ∂₁Φ̂ᵀ is symmetric (the GD map: α(∇²₁₁ℓ + δI)), as conjugate gradients need
    symmetric: bool = False

    @abstractmethod
    def value(self, batch: Any) -> Tensors:
        """Φ̂(w, λ, ζ) at the current w, λ, detached."""

    @abstractmethod
    def vjp(
        self, batch: Any, v: Sequence[Tensor], wrt_hyper: bool = False
    ) -> tuple[Tensors, Tensors | None]:
        """(∂₁Φ̂ᵀ v, ∂₂Φ̂ᵀ v if ``wrt_hyper`` else None)."""

    def gradient_step_size(self) -> float | None:
        """α for a GD map (so that w − η(w − Φ̂) is SGD with step ηα), else None."""
        return None

    @property
    def hyper_vjp_is_exact(self) -> bool:
        """Whether :meth:`exact_hyper_vjp` gives ∂₂Φ̂ᵀv (it does not depend on ζ)."""
        return False

    def exact_hyper_vjp(self, v: Sequence[Tensor]) -> Tensors | None:
        """∂₂Φ̂ᵀ v without a minibatch, where it does not depend on ζ; None: it has to be sampled
        (:meth:`vjp` with ``wrt_hyper=True`` on minibatches)."""
        return None

    def adjoint_target(self, grad_w_E: Sequence[Tensor]) -> Tensors:
        """The right-hand side of the adjoint system in the map's coordinates: ∇₁E here,
        S∇₁E for a preconditioned map (:mod:`~hypertorch_sid.core.preconditioning`)."""
        return list(grad_w_E)

    # ---------------------------------------------- what the optimizer asks the map (strategy)
    def set_step(self, alpha: float | None, delta: float) -> None:
        """Take the step constants: δ of the damped map (a general map has no α)."""
        self.damping = delta

    def fit_constants(self, constants: StepConstants) -> None:
        """Set q, δ before the solves: a general map's contraction constant is given."""
        constants.fit_general_map()

    def back_off(self, constants: StepConstants) -> str:
        """``BackOff``: halve the schedules' η (a general map has no α to halve)."""
        return constants.halve_eta()

    def recover(self, constants: StepConstants) -> str:
        """``Recover``: no curvature to re-estimate for a general map: back off."""
        return self.back_off(constants)

    def require_gradient_map(self, what: str) -> None:
        """Raise unless this is a gradient-descent map (``what`` sets its α, L, μ)."""
        raise ConfigurationError(
            f"{what} sets α, L, μ of the gradient-descent map; this optimizer uses a general "
            "fixed_point_map, whose contraction constant is fixed at construction."
        )

    #: positions of the hyperparameters the map does not read (found by
    #: :meth:`check_first_batch`): the outer loss must read them
    unread_hyperparameters: list[int] = []

    def check_first_batch(self, batch: Any, cost: Cost) -> None:
        """Checks of the map on the first batch (none for a general map given as an object)."""
        return None

    def training_loss(self, batch: Any) -> float | None:
        """ℓ̂ on ``batch`` where the map has one (a probe of the inner solve's progress)."""
        return None

    def divergence_remedy(
        self,
        damping: Damping,
        delta: float,
        retries: int,
        estimate: CurvatureEstimate | None,
        retry_hint: str,
    ) -> str:
        """What to change when the adjoint solve diverged."""
        return (
            "The fixed-point map is not a contraction here: give it a smaller step, or retry "
            "with smaller step sizes (on_divergence=BackOff(2))."
        )

    def scale_state(self) -> Tensors | None:
        """The preconditioner's S to save (None: no preconditioner)."""
        return None

    def check_scale_state(self, scale: Tensors | None) -> None:
        """Raise unless a saved S fits this map (a general map has none)."""
        if scale is not None:
            raise ConfigurationError(
                "the saved preconditioner scale must be positive and belongs to a "
                "gradient-descent map: the checkpoint does not belong to this problem."
            )

    def load_scale_state(self, scale: Tensors | None) -> None:
        """Take a saved S (checked by :meth:`check_scale_state`)."""
        return None


def map_tensors(
    who: str,
    inner_parameters: Sequence[Tensor] | Tensor,
    hyperparameters: Sequence[Tensor] | Tensor,
) -> tuple[Tensors, Tensors]:
    """A map's w and λ as lists of tensors, read as :class:`~hypertorch_sid.SIDHyperOptimizer`
    reads them (:func:`~hypertorch_sid.core.validation.as_tensor_list`): a bare tensor is one
    tensor. ``list(tensor)`` split it into its rows, views no loss reads, so a standalone
    ``GradientDescentMap(loss, w, lam, alpha)`` gave Φ̂ = 0 for every row (session 61). No λ
    (``[]``) is taken: a map built for its Hessian products alone."""
    inner = as_tensor_list(inner_parameters, f"{who}: inner_parameters")
    if not isinstance(hyperparameters, Tensor) and not list(hyperparameters):
        return inner, []
    return inner, as_tensor_list(hyperparameters, f"{who}: hyperparameters")


class GradientDescentMap(FixedPointMap):
    """Φ̂(w, λ, ζ) = w − α ∇₁ℓ̂(w, λ, ζ) for an inner loss ℓ̂ (eq. mainprobopt).

    With ``damping`` δ > 0 the Jacobian products are those of the damped map
    ∂₁Φ̂_δ = I − α(∇²₁₁ℓ̂ + δI) (the GD map of ℓ̂ + δ/2‖w − w̄‖² at w̄ = w), see
    :mod:`~hypertorch_sid.core.damping`.

    With a diagonal ``scale`` S (P = S², set by the optimizer from its preconditioner) the map is
    Φ̂ = w − αP∇₁ℓ̂, same fixed points; its products are taken in the coordinates z = S⁻¹w, where
    ∂₁Φ̂ᵀv = v − αS∇²₁₁ℓ̂Sv is symmetric, ∂₂Φ̂ᵀv = −α∇²₂₁ℓ̂ Sv and the adjoint right-hand side is
    S∇₁E (:mod:`~hypertorch_sid.core.preconditioning`).

    Parameters
    ----------
    inner_loss:
        ``inner_loss(batch) -> scalar`` computing ℓ̂(w, λ; ζ) from the current w and λ.
    inner_parameters, hyperparameters:
        The tensors w and λ that ``inner_loss`` reads.
    alpha:
        The step α; 2/(L+μ) gives the best contraction constant (Corollary 4.3).
    hvp:
        ``"reverse"`` or ``"forward"`` (forward-over-reverse, needs ``module``), or
        ``GaussNewton(outputs, output_loss, regularizer)`` for the adjoint system's products
        (the curvature estimates then use reverse-mode exact products).
    module:
        The ``nn.Module`` whose parameters are ``inner_parameters`` (needed for ``hvp="forward"``).
    regularizer:
        ``regularizer() -> scalar``: R(w, λ), when λ enters ℓ̂ only through it:
        ℓ̂(w, λ; ζ) = ℓ(w; ζ) + R(w, λ) with ℓ not reading λ (weight decay R = ½Σλᵢ‖wᵢ‖²). Then
        ∂₂Φ̂ᵀv = −α∇²₂₁R Sv for every ζ, and :meth:`exact_hyper_vjp` computes it from R alone:
        no forward pass through the data, and no sampling noise in eq. gradestim's cross term.
        ``inner_loss`` still includes R. (:func:`~hypertorch_sid.core.solvers.check_exact_hyper_vjp`
        verifies the claim on a minibatch.)
    """

    def __init__(
        self,
        inner_loss: Callable[[Any], Tensor],
        inner_parameters: Sequence[Tensor],
        hyperparameters: Sequence[Tensor],
        alpha: float,
        hvp: str | GaussNewton = "reverse",
        module: torch.nn.Module | None = None,
        regularizer: Callable[[], Tensor] | None = None,
    ) -> None:
        if regularizer is not None and not callable(regularizer):
            raise ConfigurationError(
                "regularizer must be a callable regularizer() -> scalar R(w, λ), the only part of "
                "inner_loss that reads λ."
            )
        self.regularizer = regularizer
        self.inner_loss = inner_loss
        self.inner_parameters, self.hyperparameters = map_tensors(
            type(self).__name__, inner_parameters, hyperparameters
        )
        # a standalone map (its products, estimate_curvature) took any α: −0.1 climbs ℓ̂,
        # 0 is the identity, NaN poisons every product, True read as 1.0 (session 61)
        self.alpha = check_positive(f"{type(self).__name__}: alpha", alpha)
        #: the Gauss–Newton products of the adjoint system (None: exact Hessian products)
        self.gauss_newton = check_hvp(hvp)
        self._gauss_newton_checked = False
        if hvp == "forward":
            if module is None:
                raise ConfigurationError(
                    "hvp='forward' needs module=<the nn.Module owning the inner parameters> "
                    "(forward-over-reverse swaps its parameters through torch.func)."
                )
            self._functional = _FunctionalLoss(module, inner_loss, self.inner_parameters)
        self.hvp = hvp
        #: the inner parameters' names in ``module`` (None without one), for the errors
        self.names = _names_in(module, self.inner_parameters)
        self.damping = 0.0
        self.symmetric = type(self) is GradientDescentMap
        #: S = P^{1/2} of the preconditioned map (None: P = I)
        self.scale: Tensors | None = None

    def set_step(self, alpha: float | None, delta: float) -> None:
        """Take α (None: keep the current one) and δ."""
        if alpha is not None:
            self.alpha = alpha
        self.damping = delta

    def fit_constants(self, constants: StepConstants) -> None:
        """α, q, δ from the curvature of ℓ̂ (given, or estimated: Cor. 4.3)."""
        constants.fit_gradient_map()

    def back_off(self, constants: StepConstants) -> str:
        """``BackOff``: halve α."""
        return constants.halve_alpha()

    def recover(self, constants: StepConstants) -> str:
        """``Recover``: re-estimate L, λ_min at the current w, then halve α or raise δ."""
        return constants.recover()

    def require_gradient_map(self, what: str) -> None:
        """A gradient-descent map: its α, L, μ can be set."""

    def check_first_batch(self, batch: Any, cost: Cost) -> None:
        """ℓ̂ reads every inner parameter and at least one hyperparameter."""
        self.unread_hyperparameters = check_dependencies(
            self.loss, batch, self.inner_parameters, self.hyperparameters, self.names
        )

    def training_loss(self, batch: Any) -> float | None:
        with torch.no_grad():
            return float(self.loss(batch))

    def divergence_remedy(
        self,
        damping: Damping,
        delta: float,
        retries: int,
        estimate: CurvatureEstimate | None,
        retry_hint: str,
    ) -> str:
        """The damping strategy says (δ, what the curvature estimate saw)."""
        return damping.remedy(delta, retries, estimate, retry_hint)

    def scale_state(self) -> Tensors | None:
        return [s.clone() for s in self.scale] if self.scale is not None else None

    def check_scale_state(self, scale: Tensors | None) -> None:
        if scale is not None and not all(bool((s > 0).all()) for s in scale):
            raise ConfigurationError(
                "the saved preconditioner scale must be positive and belongs to a "
                "gradient-descent map: the checkpoint does not belong to this problem."
            )

    def load_scale_state(self, scale: Tensors | None) -> None:
        like = self.inner_parameters
        self.scale = (
            [s.to(device=w.device, dtype=w.dtype) for s, w in zip(scale, like)]
            if scale is not None
            else None
        )

    def scaled(self, v: Sequence[Tensor]) -> Tensors:
        """S v (v itself when unpreconditioned)."""
        if self.scale is None:
            return list(v)
        return [s * x for s, x in zip(self.scale, v)]

    def adjoint_target(self, grad_w_E: Sequence[Tensor]) -> Tensors:
        return self.scaled(grad_w_E)

    def gradient_step_size(self) -> float:
        return self.alpha

    def loss(self, batch: Any) -> Tensor:
        loss = self.inner_loss(batch)
        check_scalar_loss("inner_loss", loss, "the minibatch training objective")
        return loss.reshape(())

    def smooth_loss(self, batch: Any) -> Tensor:
        """The loss the map takes gradient steps on: ℓ̂ here (ĝ for the proximal map)."""
        return self.loss(batch)

    def gradient(self, batch: Any) -> Tensors:
        """∇₁ℓ̂(w, λ, ζ) (of :meth:`smooth_loss`)."""
        return _grad(self.smooth_loss(batch), self.inner_parameters)

    def value(self, batch: Any) -> Tensors:
        g = self.gradient(batch)
        with torch.no_grad():
            step = self.scaled(self.scaled(g))  # P∇₁ℓ̂
            return [w.detach() - self.alpha * gi for w, gi in zip(self.inner_parameters, step)]

    def curvature_product(self, batch: Any, v: Sequence[Tensor]) -> Tensors:
        """The curvature of the adjoint system: S∇²₁₁ℓ̂S v, or SGS v with Gauss–Newton products G
        (``hvp=GaussNewton``). The curvature estimates (α, δ) keep the exact Hessian: the inner
        solve iterates the true gradient map."""
        gauss_newton = self.gauss_newton
        if gauss_newton is None:
            return self.hessian_vector_product(batch, v)
        if not self._gauss_newton_checked:
            gauss_newton.check(batch, self.smooth_loss(batch))
            self._gauss_newton_checked = True
        return self.scaled(gauss_newton.product(batch, self.inner_parameters, self.scaled(v)))

    def hessian_vector_product(self, batch: Any, v: Sequence[Tensor]) -> Tensors:
        """S∇²₁₁ℓ̂(w, λ, ζ)S v of :meth:`smooth_loss` (S = I unpreconditioned; symmetric: also
        the transposed product)."""
        v = self.scaled(v)
        if self.hvp == "forward":
            return self.scaled(self._functional.hvp(batch, v))
        g = _grad(self.smooth_loss(batch), self.inner_parameters, create_graph=True)
        return self.scaled(_grad(g, self.inner_parameters, grad_outputs=v))

    @property
    def hyper_vjp_is_exact(self) -> bool:
        return self.regularizer is not None

    def exact_hyper_vjp(self, v: Sequence[Tensor]) -> Tensors | None:
        """∂₂Φ̂ᵀv = −α ∂_λ⟨∇₁R(w, λ), Sv⟩ when only ``regularizer`` R reads λ, else None."""
        if self.regularizer is None:
            return None
        r = self.regularizer()
        if not isinstance(r, Tensor) or r.numel() != 1:
            raise ConfigurationError("regularizer() must return a scalar tensor R(w, λ).")
        g = _grad(r.reshape(()), self.inner_parameters, create_graph=True)
        read = [(gi, vi) for gi, vi in zip(g, self.scaled(v)) if gi.requires_grad]  # R's w only
        if not read:
            return [torch.zeros_like(h) for h in self.hyperparameters]
        d2 = _grad(
            [gi for gi, _ in read], self.hyperparameters, grad_outputs=[vi for _, vi in read]
        )
        return [-self.alpha * h.detach() for h in d2]

    def vjp(
        self, batch: Any, v: Sequence[Tensor], wrt_hyper: bool = False
    ) -> tuple[Tensors, Tensors | None]:
        keep = 1 - self.alpha * self.damping  # v − α(H + δ)v = (1 − αδ)v − αHv
        if not wrt_hyper:
            hv = self.curvature_product(batch, v)
            return [keep * vi - self.alpha * h for vi, h in zip(v, hv)], None
        g = _grad(self.loss(batch), self.inner_parameters, create_graph=True)
        if self.gauss_newton is not None:  # ∂₁ by Gauss–Newton products, ∂₂ exact
            d2 = _grad(g, self.hyperparameters, grad_outputs=self.scaled(v))
            return self.vjp(batch, v)[0], [-self.alpha * h for h in d2]
        inputs = self.inner_parameters + self.hyperparameters
        g, gv = on_graph(g, self.scaled(v))
        raw = torch.autograd.grad(g, inputs, grad_outputs=gv, allow_unused=True)
        n = len(self.inner_parameters)
        self.check_still_read([r is not None for r in raw[n:]])
        prods = [torch.zeros_like(x) if r is None else r for x, r in zip(inputs, raw)]
        d1 = [keep * vi - self.alpha * h for vi, h in zip(v, self.scaled(prods[:n]))]
        d2 = [-self.alpha * h for h in prods[n:]]
        return d1, d2

    def check_still_read(self, reached: Sequence[bool]) -> None:
        """A clear error where ∂²ℓ̂/∂w∂λ reaches none of the hyperparameters the first hyper
        step's check found it reading (session 60: ``p.log_lam = torch.full(...)`` between
        two hyper steps of a loop, so that ``inner_loss`` reads the new tensor while the
        optimizer holds the old one: the old one's implicit hypergradient was exactly 0 and
        the new one never moved, without a word)."""
        read = [i for i in range(len(reached)) if i not in self.unread_hyperparameters]
        if read and not any(reached[i] for i in read):
            raise ConfigurationError(
                "inner_loss no longer reads the hyperparameters it read at the first hyper step "
                f"(positions {read}): the tensors given to SIDHyperOptimizer were probably "
                "replaced since (e.g. problem.log_lam = torch.full(...), or a model built "
                "again), so inner_loss reads new tensors while the optimizer moves the old ones. "
                "Change a hyperparameter in place instead: with torch.no_grad(): "
                "log_lam.fill_(-2.0) (or .copy_(new)); or build a new SIDHyperOptimizer over "
                "the new tensors."
            )


class ProximalGradientMap(GradientDescentMap):
    """Φ̂(w, λ, ζ) = prox_{αR_λ}(w − α∇₁ĝ(w, λ, ζ)) = (w − α∇₁ĝ) / (1 + α c(λ)) for an inner
    loss with a weighted L2 penalty, ℓ̂ = ĝ(w, λ; ζ) + ½ Σᵢ ⟨cᵢ(λ), wᵢ ⊙ wᵢ⟩ (weight decay).

    Same fixed points as the GD map of ℓ (w = Φ(w) ⟺ ∇₁g + c ⊙ w = 0), so the same w(λ) and
    hypergradient (eq. gradfv2), but the penalty is applied exactly (implicitly): α only has to
    contract the data term. For ĝ convex and L_g-smooth, α ≤ 2/L_g and c ≥ c_min > 0 give
    ‖∂₁Φ‖ ≤ max(|1 − αμ_g|, |1 − αL_g|) / (1 + α c_min) < 1 however large λ grows, while the GD map
    needs α < 2/(L_g + max c) — a tiny α once a few coefficients are large (per-feature decay).

    Products: with u = v / (1 + αc),  ∂₁Φ̂ᵀv = u − α∇²₁₁ĝ u  and
    ∂₂Φ̂ᵀv = ∂_λ⟨(w − α∇₁ĝ) / (1 + αc(λ)), v⟩ (through c and through ĝ if it reads λ).

    Parameters
    ----------
    data_loss:
        ``data_loss(batch) -> scalar``: ĝ(w, λ; ζ), the minibatch objective *without* the penalty.
    penalty:
        ``penalty() -> list of tensors``: the coefficients cᵢ(λ) ≥ 0, one per inner parameter,
        each broadcastable to it (a scalar, a per-row column, or the parameter's shape);
        differentiable in λ.
    inner_parameters, hyperparameters, alpha, hvp, module:
        As for :class:`GradientDescentMap` (the Hessian products are those of ĝ).
    """

    def __init__(
        self,
        data_loss: Callable[[Any], Tensor],
        penalty: Callable[[], Sequence[Tensor]],
        inner_parameters: Sequence[Tensor],
        hyperparameters: Sequence[Tensor],
        alpha: float,
        hvp: str | GaussNewton = "reverse",
        module: torch.nn.Module | None = None,
    ) -> None:
        if not callable(penalty):
            raise ConfigurationError(
                "penalty must be a callable penalty() -> list of coefficient tensors c_i(λ)."
            )
        super().__init__(data_loss, inner_parameters, hyperparameters, alpha, hvp, module)
        self.penalty = penalty

    def coefficients(self) -> Tensors:
        """cᵢ(λ), checked: one per inner parameter, broadcastable to it, finite and ≥ 0."""
        c = self.penalty()
        c = [c] if isinstance(c, Tensor) else list(c)
        if len(c) != len(self.inner_parameters) or not all(isinstance(x, Tensor) for x in c):
            raise ConfigurationError(
                f"penalty() returned {len(c)} item(s) for {len(self.inner_parameters)} inner "
                "parameter(s): return one coefficient tensor c_i(λ) per inner parameter "
                "(torch.zeros(()) for an unpenalised one)."
            )
        for i, (ci, w) in enumerate(zip(c, self.inner_parameters)):
            if not _broadcasts_to(ci.shape, w.shape):
                raise ConfigurationError(
                    f"penalty coefficient {i} has shape {tuple(ci.shape)}, which does not "
                    f"broadcast to its parameter's shape {tuple(w.shape)}."
                )
            if not bool(torch.isfinite(ci).all()) or bool((ci < 0).any()):
                raise ConfigurationError(
                    f"penalty coefficient {i} has negative or non-finite entries: c_i(λ) must be "
                    "finite and ≥ 0 (parameterise it as exp(λ) or softplus(λ))."
                )
        return c

    def loss(self, batch: Any) -> Tensor:
        """The whole ℓ̂ = ĝ + ½ Σᵢ ⟨cᵢ, wᵢ²⟩."""
        reg = sum((c * w * w).sum() for c, w in zip(self.coefficients(), self.inner_parameters))
        return self.smooth_loss(batch) + 0.5 * reg

    def check_first_batch(self, batch: Any, cost: Cost) -> None:
        """As the GD map's, and the penalty is not inside ĝ too (a doubled penalty)."""
        super().check_first_batch(batch, cost)
        check_penalty_not_in_loss(
            self.smooth_loss, self.penalty, batch, self.inner_parameters, self.hyperparameters
        )

    def smooth_loss(self, batch: Any) -> Tensor:
        """ĝ(w, λ; ζ), the data term: gradients and Hessian products (what α must contract)
        are of ĝ alone."""
        return super().loss(batch)

    def value(self, batch: Any) -> Tensors:
        g = self.gradient(batch)
        with torch.no_grad():
            Pg, Pc = self.scaled(self.scaled(g)), self._scaled_coefficients()
            return [
                (w.detach() - self.alpha * gi) / (1 + self.alpha * ci)
                for w, gi, ci in zip(self.inner_parameters, Pg, Pc)
            ]

    def _scaled_coefficients(self) -> Tensors:
        """P c(λ) (c(λ) unpreconditioned), differentiable in λ."""
        c = self.coefficients()
        if self.scale is None:
            return c
        return [s * s * ci for s, ci in zip(self.scale, c)]

    def vjp(
        self, batch: Any, v: Sequence[Tensor], wrt_hyper: bool = False
    ) -> tuple[Tensors, Tensors | None]:
        keep = 1 - self.alpha * self.damping  # prox map of ĝ + δ/2‖w − w̄‖²: (I − α(H + δ))u
        if not wrt_hyper:
            with torch.no_grad():
                u = [vi / (1 + self.alpha * ci) for vi, ci in zip(v, self._scaled_coefficients())]
            hu = self.curvature_product(batch, u)
            return [keep * ui - self.alpha * h for ui, h in zip(u, hu)], None
        # ⟨Φ̂_z, v⟩ = ⟨Φ̂_w, S⁻¹v⟩ with Φ̂_w = (keep·w + αδw̄ − αP∇₁ĝ)/(1 + αPc); ∂_z = S ∂_w
        g = self.scaled(
            self.scaled(_grad(self.smooth_loss(batch), self.inner_parameters, create_graph=True))
        )
        w = self.inner_parameters
        out = [
            (keep * wi + self.alpha * self.damping * wi.detach() - self.alpha * gi)
            / (1 + self.alpha * ci)
            for wi, gi, ci in zip(w, g, self._scaled_coefficients())
        ]
        v_w = list(v) if self.scale is None else [x / s for x, s in zip(v, self.scale)]
        if self.gauss_newton is not None:  # ∂₁ by Gauss–Newton products, ∂₂ exact
            return self.vjp(batch, v)[0], _grad(out, self.hyperparameters, grad_outputs=v_w)
        prods = _grad(out, self.inner_parameters + self.hyperparameters, grad_outputs=v_w)
        n = len(self.inner_parameters)
        return self.scaled(prods[:n]), prods[n:]


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


class ContractionMap(FixedPointMap):
    """A user-given stochastic contraction Φ̂(w, λ, ζ) (the general setting of eq. mainprob).

    Parameters
    ----------
    phi:
        ``phi(batch) -> list of tensors`` shaped like ``inner_parameters``: Φ̂ at the current w, λ,
        differentiable in both. Its fixed point w(λ) is what the inner solve computes.
    """

    def __init__(
        self,
        phi: Callable[[Any], Sequence[Tensor]],
        inner_parameters: Sequence[Tensor],
        hyperparameters: Sequence[Tensor],
    ) -> None:
        self.phi = phi
        self.inner_parameters, self.hyperparameters = map_tensors(
            type(self).__name__, inner_parameters, hyperparameters
        )

    def _evaluate(self, batch: Any) -> Tensors:
        out = self.phi(batch)
        out = [out] if isinstance(out, Tensor) else list(out)
        shapes = [tuple(o.shape) for o in out]
        expected = [tuple(w.shape) for w in self.inner_parameters]
        if shapes != expected:
            raise ConfigurationError(
                f"the fixed-point map returned tensors of shapes {shapes}, but the inner "
                f"parameters have shapes {expected}: phi(batch) must return one tensor per inner "
                "parameter, shaped like it."
            )
        return out

    def value(self, batch: Any) -> Tensors:
        return [o.detach() for o in self._evaluate(batch)]

    def check_first_batch(self, batch: Any, cost: Cost) -> None:
        """The map differentiates (not computed under ``no_grad``); an undamped user map must
        contract: q by 10 power iterations on ``batch``."""
        check_map_output(self._evaluate(batch), "fixed_point_map(batch)")
        if self.damping != 0:
            return
        q = estimate_contraction(
            lambda b, v: self.vjp(b, v)[0], self.inner_parameters, [batch], iters=10
        )
        check_contraction(q, "fixed_point_map")
        cost.curvature_products += 10

    def vjp(
        self, batch: Any, v: Sequence[Tensor], wrt_hyper: bool = False
    ) -> tuple[Tensors, Tensors | None]:
        """Products of Φ̂, or of the damped Φ̂_δ = (Φ̂ + δw̄)/(1 + δ) when ``damping`` δ > 0."""
        out = self._evaluate(batch)
        inputs = self.inner_parameters + (self.hyperparameters if wrt_hyper else [])
        prods = _grad(out, inputs, grad_outputs=list(v))
        if self.damping:
            prods = [p / (1 + self.damping) for p in prods]
        n = len(self.inner_parameters)
        return prods[:n], (prods[n:] if wrt_hyper else None)


class _FunctionalLoss:
    """ℓ̂ as a pure function of the module's inner parameters, for torch.func transforms.

    The user's closure calls ``module(...)``; ``torch.func.functional_call`` on a wrapper that holds
    the module swaps the parameters for the duration of the call.

    Two things make this safe for any closure and any module:

    * **Buffers.** A training-mode forward updates buffers in place (BatchNorm's running mean,
      variance and ``num_batches_tracked``), and torch.func forbids in-place writes to tensors
      captured from outside a transform. Every call therefore swaps in *clones* of the buffers
      made inside the transformed function: the clones absorb the update and the module's own
      buffers are never changed (train mode still normalises by batch statistics, eval mode reads
      the running ones).
    * **Direct reads.** Only reads that go through the module see the swapped tensors: a closure
      that holds the parameter objects itself (``params = list(model.parameters())`` captured
      once, then a penalty over ``params``) would have those terms silently left out of the
      Hessian. The first product checks, with one forward/backward pass, that the loss does not
      depend on the original tensors, and raises :class:`ConfigurationError` if it does.
    """

    def __init__(
        self, module: torch.nn.Module, inner_loss: Callable[[Any], Tensor], params: Tensors
    ) -> None:
        names = {id(p): n for n, p in module.named_parameters()}
        missing = [i for i, p in enumerate(params) if id(p) not in names]
        if missing:
            raise ConfigurationError(
                "hvp='forward' needs every inner parameter to be a parameter of `module`; "
                f"inner parameters at positions {missing} are not."
            )
        self.wrapper = _CallClosure(module, inner_loss)
        self.names = ["module." + names[id(p)] for p in params]
        self.params = list(params)
        self._checked = False

    def _call(self, batch: Any, flat: Sequence[Tensor]) -> Tensor:
        """ℓ̂ with the inner parameters replaced by ``flat`` and the buffers by fresh clones."""
        from torch.func import functional_call

        swapped = {n: b.clone() for n, b in self.wrapper.named_buffers()}
        swapped.update(zip(self.names, flat))
        return functional_call(self.wrapper, swapped, (batch,))

    def _check_direct_reads(self, batch: Any) -> None:
        """Raise if ℓ̂ still depends on the original parameter tensors once they are swapped out."""
        watched = [(i, p) for i, p in enumerate(self.params) if p.requires_grad]
        with torch.enable_grad():
            out = self._call(batch, [p.detach().clone() for p in self.params])
            if not watched or not out.requires_grad:
                return
            grads = torch.autograd.grad(out, [p for _, p in watched], allow_unused=True)
        leaked = [i for (i, _), g in zip(watched, grads) if g is not None]
        if leaked:
            raise ConfigurationError(
                "hvp='forward': inner_loss reads the inner parameters at positions "
                f"{leaked} directly, not through `module` (e.g. a penalty over a parameter list "
                "captured once). Forward-over-reverse swaps the parameters inside the module only, "
                "so those terms would be missing from the Hessian. Read them at call time "
                "(`module.parameters()` / `module.named_parameters()` inside inner_loss) or use "
                "hvp='reverse'."
            )

    def hvp(self, batch: Any, v: Sequence[Tensor]) -> Tensors:
        from torch.func import grad, jvp

        if not self._checked:
            self._check_direct_reads(batch)
            self._checked = True

        def grad_loss(*flat: Tensor) -> tuple[Tensor, ...]:
            return grad(lambda f: self._call(batch, f))(flat)

        primals = tuple(p.detach() for p in self.params)
        tangents = tuple(vi.detach() for vi in v)
        _, hv = jvp(grad_loss, primals, tangents)
        return [h.detach() for h in hv]  # like the reverse form: no graph to λ kept


class _CallClosure(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, fn: Callable[[Any], Tensor]) -> None:
        super().__init__()
        self.module = module
        self._fn = fn

    def forward(self, batch: Any) -> Tensor:
        return self._fn(batch).reshape(())


class AveragedMap(FixedPointMap):
    """Φ̂ averaged across processes: ``mean`` (e.g. an all-reduce) applied to every product.

    With each process drawing its own minibatch, the average of the per-process Φ̂ and of their
    vector–Jacobian products is Φ̂ on the union of the minibatches (the global batch), so data
    parallel SID computes the same hypergradient as one process on the global batches.
    """

    def __init__(self, phi: FixedPointMap, mean: Callable[[Tensor], Tensor]) -> None:
        self.phi, self.mean = phi, mean
        self.inner_parameters = phi.inner_parameters
        self.hyperparameters = phi.hyperparameters

    def value(self, batch: Any) -> Tensors:
        return [self.mean(x) for x in self.phi.value(batch)]

    def vjp(
        self, batch: Any, v: Sequence[Tensor], wrt_hyper: bool = False
    ) -> tuple[Tensors, Tensors | None]:
        d1, d2 = self.phi.vjp(batch, v, wrt_hyper)
        return [self.mean(x) for x in d1], (None if d2 is None else [self.mean(x) for x in d2])

    def gradient_step_size(self) -> float | None:
        return self.phi.gradient_step_size()

    @property
    def hyper_vjp_is_exact(self) -> bool:
        return self.phi.hyper_vjp_is_exact

    def exact_hyper_vjp(self, v: Sequence[Tensor]) -> Tensors | None:
        """Not averaged: it reads no data, so it is the same on every process."""
        return self.phi.exact_hyper_vjp(v)

    def adjoint_target(self, grad_w_E: Sequence[Tensor]) -> Tensors:
        return self.phi.adjoint_target(grad_w_E)

    @property  # type: ignore[override]
    def damping(self) -> float:
        return self.phi.damping

    @property  # type: ignore[override]
    def symmetric(self) -> bool:
        return self.phi.symmetric


def _names_in(module: torch.nn.Module | None, params: Sequence[Tensor]) -> list[str] | None:
    """Each of ``params``' name in ``module`` (``"tensor i"`` for one it does not hold), or
    None without a module."""
    if module is None:
        return None
    names = {id(p): n for n, p in module.named_parameters()}
    return [names.get(id(p), f"tensor {i}") for i, p in enumerate(params)]


def build_map(
    fixed_point_map: FixedPointMap | Callable[[Any], Sequence[Tensor]] | None,
    inner_loss: Callable[[Any], Tensor] | None,
    penalty: Callable[[], Sequence[Tensor]] | None,
    regularizer: Callable[[], Tensor] | None,
    inner_parameters: Sequence[Tensor],
    hyperparameters: Sequence[Tensor],
    *,
    alpha: float | None,
    hvp: str | GaussNewton,
    module: torch.nn.Module | None,
) -> FixedPointMap:
    """The map of :class:`~hypertorch_sid.SIDHyperOptimizer`'s arguments: the GD map of
    ``inner_loss`` (proximal with ``penalty``), or ``fixed_point_map`` (an object or a callable).

    α may still be unknown (None): it is fixed (or estimated) at the first hypergradient.
    """
    if fixed_point_map is None:
        if inner_loss is None or not callable(inner_loss):
            raise ConfigurationError(
                "give inner_loss(batch) (for the gradient-descent map) or fixed_point_map."
            )
        step = alpha if alpha is not None else 1.0
        if penalty is not None:
            if regularizer is not None:
                raise ConfigurationError(
                    "penalty (the proximal map's c(λ), left out of inner_loss) and regularizer "
                    "(the λ-dependent part of inner_loss) exclude each other: give one."
                )
            return ProximalGradientMap(
                inner_loss, penalty, inner_parameters, hyperparameters, alpha=step, hvp=hvp,
                module=module,
            )  # fmt: skip
        return GradientDescentMap(
            inner_loss, inner_parameters, hyperparameters, alpha=step, hvp=hvp, module=module,
            regularizer=regularizer,
        )  # fmt: skip
    if regularizer is not None:
        raise ConfigurationError(
            "regularizer is the λ-dependent part of inner_loss (the gradient-descent map); "
            "it cannot be combined with fixed_point_map."
        )
    if penalty is not None:
        raise ConfigurationError(
            "penalty builds the proximal gradient map; it cannot be combined with "
            "fixed_point_map (put the penalty inside your map instead)."
        )
    if isinstance(fixed_point_map, FixedPointMap):
        _check_given_map(fixed_point_map, inner_parameters, hyperparameters, alpha)
        return fixed_point_map
    if callable(fixed_point_map):
        return ContractionMap(fixed_point_map, inner_parameters, hyperparameters)
    raise ConfigurationError("fixed_point_map must be a FixedPointMap or a callable.")


def _check_given_map(
    phi: FixedPointMap,
    inner_parameters: Sequence[Tensor],
    hyperparameters: Sequence[Tensor],
    alpha: float | None,
) -> None:
    """A map object given as ``fixed_point_map`` must be over the optimizer's own tensors, and a
    gradient-descent map's α is the config's (session 60: a map built over another model's
    tensors, or before a model was rebuilt, gave the hypergradient of that model's problem
    without a word; ``GradientDescentMap(..., alpha=0.01)`` ran at the estimated α = 10.2)."""
    for what, mine, given in (
        ("inner_parameters", inner_parameters, phi.inner_parameters),
        ("hyperparameters", hyperparameters, phi.hyperparameters),
    ):
        if [id(t) for t in mine] != [id(t) for t in given]:
            raise ConfigurationError(
                f"fixed_point_map {type(phi).__name__} was built over other {what} than the "
                f"ones given to SIDHyperOptimizer ({len(given)} tensor(s) against {len(mine)}, "
                "not the same objects in the same order): its products would be those of "
                "another problem (another model, or a model built again since). Build the map "
                f"over the same tensors, e.g. {type(phi).__name__}(..., inner_parameters, "
                "hyperparameters, ...) with the lists passed to SIDHyperOptimizer."
            )
    step = phi.gradient_step_size()
    if step is not None and (alpha is None or not math.isclose(step, alpha, rel_tol=1e-12)):
        raise ConfigurationError(
            f"fixed_point_map {type(phi).__name__}(alpha={step:g}): SIDHyperOptimizer sets the "
            "map's step α from its config, so alpha would be "
            + (
                "replaced by the estimate 2/(L + μ) at the first hypergradient"
                if alpha is None
                else f"replaced by config alpha={alpha:g}"
            )
            + f". Pass config=SIDConfig(alpha={step:g}, ...) to keep it (or leave α to the "
            "estimate with inner_loss= and no fixed_point_map)."
        )
