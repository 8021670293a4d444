"""Gauss–Newton curvature products: a positive semi-definite stand-in for ∇²₁₁ℓ̂ on networks.

For a loss that is a convex output loss L(z; ζ) of the model's outputs z = f(w; ζ),
ℓ̂(w) = L(f(w; ζ); ζ), the Hessian splits as

    ∇²₁₁ℓ̂ v = Jᵀ ∇²_z L J v  +  Σ_o (∂L/∂z_o) ∇²f_o v,        J = ∂f/∂w,

and the generalised Gauss–Newton matrix G = Jᵀ∇²_zL J keeps the first term only. G is positive
semi-definite whenever L is convex in z (cross-entropy, squared error, logistic), so the adjoint
system α(G + δI)v = ∇₁E of the GD map is well posed without the shift past negative curvature
that :mod:`~hypertorch_sid.core.damping` needs for the exact Hessian. For a model linear in w
(f = Xw) the second term vanishes and G is the Hessian: every convex oracle (ridge, logistic
regression) is solved exactly. On a network G differs from ∇²₁₁ℓ̂, so the hypergradient is the
implicit one of the locally linearised model (the outputs' linearisation at w_t), not of ℓ̂;
the optimizer says so in its log.

G replaces the Hessian in the adjoint system only (:meth:`GradientDescentMap.curvature_product`).
The curvature estimates that set α and the damping δ keep the exact Hessian, because the inner
solve iterates the true gradient map w − α∇₁ℓ̂: measured on digits MLPs (ReLU and tanh, 3 seeds
each), α from the Gauss–Newton spectrum, which misses the negative curvature, was up to 9× the
one from the Hessian's, and the inner solve collapsed (ReLU: validation loss ln 10) or diverged
(tanh) on all 6 runs.

Each product costs one forward pass through f and three backward passes (J v by the
double-vector–Jacobian trick, ∇²_zL on the outputs, Jᵀ), about an exact Hessian–vector product.
A batch-independent ``regularizer`` R(w, λ) in the loss (weight decay ½Σλᵢ‖wᵢ‖² inside
``inner_loss``) keeps its exact Hessian: the product is (G + ∇²R)v, symmetric, so conjugate
gradients apply. The first product checks that L(f(w; ζ); ζ) + R(w, λ) is the loss the map
differentiates (for the proximal map, ``penalty=``: its data term ĝ, with no regularizer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .autodiff import grad
from .errors import ConfigurationError
from .validation import class_given

Tensors = list[Tensor]


def _as_list(z: Tensor | Sequence[Tensor]) -> Tensors:
    return [z] if isinstance(z, Tensor) else list(z)


def _grads(
    outputs: Sequence[Tensor],
    inputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor],
    create_graph: bool = False,
) -> Tensors:
    """The graph is kept: the outputs' graph serves J v, then Jᵀ(∇²_zL J v)."""
    return grad(outputs, inputs, grad_outputs, create_graph=create_graph, retain_graph=True)


@dataclass(frozen=True)
class GaussNewton:
    """Generalised Gauss–Newton products G v = Jᵀ∇²_zL J v, passed as ``hvp=GaussNewton(...)``.

    Parameters
    ----------
    outputs:
        ``outputs(batch) -> z`` (a tensor or a list of tensors): the model's outputs on the batch
        at the current w, differentiable in w (e.g. ``lambda b: model(b[0])``).
    output_loss:
        ``output_loss(z, batch) -> scalar``: the loss of those outputs, convex in z (e.g.
        ``lambda z, b: F.cross_entropy(z, b[1])``).
    regularizer:
        ``regularizer() -> scalar``: the rest of the loss, R(w, λ), not depending on the batch
        (e.g. the weight decay inside ``inner_loss``); its Hessian is added exactly. None where
        the loss is the output loss alone (the proximal map's data term).
    rtol:
        Relative tolerance of the check that ``output_loss(outputs(batch), batch)`` +
        ``regularizer()`` is the map's loss, made on the first product.
    """

    outputs: Callable[[Any], Tensor | Sequence[Tensor]]
    output_loss: Callable[[Any, Any], Tensor]
    regularizer: Callable[[], Tensor] | None = None
    rtol: float = 1e-4

    def __post_init__(self) -> None:
        if not callable(self.outputs) or not callable(self.output_loss):
            raise ConfigurationError(
                "GaussNewton(outputs, output_loss) needs two callables: outputs(batch) -> model "
                "outputs z, and output_loss(z, batch) -> scalar, convex in z."
            )
        if self.regularizer is not None and not callable(self.regularizer):
            raise ConfigurationError(
                "GaussNewton regularizer must be a callable regularizer() -> scalar R(w, λ)."
            )

    def product(self, batch: Any, params: Sequence[Tensor], v: Sequence[Tensor]) -> Tensors:
        """(Jᵀ ∇²_zL(z) J + ∇²R) v at the current w (detached)."""
        gv = self._output_product(batch, params, v)
        if self.regularizer is None:
            return gv
        with torch.enable_grad():
            r = self.regularizer().reshape(())
            dr = _grads([r], params, [torch.ones_like(r)], create_graph=True)
            rv = _grads(dr, params, list(v))
        return [g + h.detach() for g, h in zip(gv, rv)]

    def _output_product(self, batch: Any, params: Sequence[Tensor], v: Sequence[Tensor]) -> Tensors:
        """Jᵀ ∇²_zL(z) J v."""
        with torch.enable_grad():
            out = self.outputs(batch)
            z = _as_list(out)
            # J v: Jᵀu is linear in u, so ∂⟨Jᵀu, v⟩/∂u = J v (the double-vjp trick)
            u = [torch.zeros_like(zi, requires_grad=True) for zi in z]
            jtu = _grads(z, params, u, create_graph=True)
            jv = _grads(jtu, u, list(v))
            # ∇²_zL (J v) on detached outputs: cheap, the network is not traversed
            zd = [zi.detach().requires_grad_(True) for zi in z]
            loss = self.output_loss(zd[0] if isinstance(out, Tensor) else zd, batch)
            gz = _grads([loss], zd, [torch.ones_like(loss)], create_graph=True)
            hjv = _grads(gz, zd, jv)
            return [g.detach() for g in _grads(z, params, hjv)]

    def check(self, batch: Any, smooth_loss: Tensor) -> None:
        """Raise unless output_loss(outputs(batch), batch) + regularizer() is the map's loss on
        ``batch``."""
        with torch.no_grad():
            value = float(self.output_loss(self.outputs(batch), batch))
            if self.regularizer is not None:
                value += float(self.regularizer())
        expected = float(smooth_loss.detach())
        if not math.isclose(value, expected, rel_tol=self.rtol, abs_tol=1e-12):
            raise ConfigurationError(
                f"GaussNewton: output_loss(outputs(batch), batch) + regularizer() = {value:.6g}, "
                f"but the loss the map differentiates is {expected:.6g} on the same batch. "
                "Gauss–Newton replaces the Hessian of that loss, so the two must be the same: "
                "pass the rest of inner_loss (e.g. its weight decay) as regularizer=, or give "
                "the weight decay as penalty= (the proximal map), and make output_loss compute "
                "the training's loss (same reduction, same targets)."
            )


def linearised_note(hvp: object) -> str | None:
    """What the log says about the hypergradient where ``hvp`` is Gauss–Newton, else None."""
    if not isinstance(hvp, GaussNewton):
        return None
    return (
        "Gauss-Newton curvature: the linearised model's hypergradient (exact only for a model "
        "linear in w)"
    )


def check_hvp(hvp: object) -> GaussNewton | None:
    """``hvp`` is ``"reverse"``, ``"forward"`` or a :class:`GaussNewton`; returns the latter."""
    if isinstance(hvp, GaussNewton):
        return hvp
    if hvp not in ("reverse", "forward"):
        raise ConfigurationError(
            "hvp must be 'reverse' or 'forward' (or GaussNewton(outputs, output_loss)), got "
            f"{hvp!r}." + class_given(hvp, GaussNewton)
        )
    return None
