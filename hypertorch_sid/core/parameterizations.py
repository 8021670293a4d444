"""How a logit becomes a data weight, ωᵢ = T(x)ᵢ (eq. weighted): sigmoid (the literature's
choice), softmax over the data set, or a shared function of the loss."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .errors import ConfigurationError
from .lazy_adam import _two_betas
from .normalisers import Normaliser, SoftmaxNormaliser
from .validation import as_strategy

if TYPE_CHECKING:
    from .sample_weights import SampleWeights

Tensors = list[Tensor]


# ---------------------------------------------------------------------- parameterisations
class WeightParameterization(ABC):
    """ω = T(x): how the learned logits x give the weights ω ≥ 0 (elementwise on the rows
    read, apart from a normaliser that is held fixed within a hyper step)."""

    #: the supremum of ω (1 for a sigmoid's weights): a flag threshold above it flags every row
    largest: float = math.inf

    @abstractmethod
    def logit(self, weight: float, n: int) -> float:
        """x₀ for the initial weight ω₀ (the same for every row)."""

    @abstractmethod
    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        """ω of the gathered rows ``x`` (differentiable in ``x``); ``index`` says which rows
        they are and ``losses`` their per-sample losses now (read by a parameterisation with a
        shared term, :class:`SharedLossWeights`; ignored by the per-row ones)."""

    def refresh(self, family: SampleWeights) -> None:
        """Update any state of the parameterisation after x changed (called after each outer
        step; a normaliser over all rows is a :meth:`normaliser`, kept by the family)."""
        return None

    def normaliser(self, family: SampleWeights) -> Normaliser | None:
        """The statistic of all n logits that :meth:`rows` reads (log Z of softmax weights), or
        None: the family keeps it across outer steps."""
        return None

    def bind(self, family: SampleWeights) -> None:
        """Size any state of the parameterisation for ``family`` (called by its constructor)."""
        return None

    @property
    def hyperparameters(self) -> Tensors:
        """Learned tensors of the parameterisation itself, beside the logits (none here)."""
        return []

    def effective_logits(self, family: SampleWeights) -> Tensor:
        """The logit each row's weight is now the σ/softmax of (detached): x itself here
        (:meth:`SampleWeights.logits_of`)."""
        return family.logits_of().detach()

    def param_groups(self, hyperparameters: Tensors) -> list[dict[str, Any]]:
        """The outer optimizer's parameter groups over ``family.hyperparameters``: one here
        (the optimizer's own settings for every tensor)."""
        return [{"params": list(hyperparameters)}]


class SigmoidWeights(WeightParameterization):
    """ωᵢ = σ(xᵢ) ∈ (0, 1): each row independent (the literature's choice)."""

    largest = 1.0

    def logit(self, weight: float, n: int) -> float:
        if not 0 < weight < 1:
            raise ConfigurationError(
                f"the sigmoid parameterisation needs an initial weight in (0, 1), got {weight!r}."
            )
        return math.log(weight / (1 - weight))

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        return self.sigma(x)

    def sigma(self, x: Tensor) -> Tensor:
        """ω = σ(x), differentiated as the sigmoid (:class:`NaturalSigmoidWeights` changes how)."""
        return torch.sigmoid(x)

    def __repr__(self) -> str:
        return "SigmoidWeights()"


class _SigmoidInWeightCoordinates(torch.autograd.Function):
    """ω = σ(x) forward; backward hands ∂Φ/∂ω to x unchanged (no σ'(x) factor)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        return torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad


class NaturalSigmoidWeights(SigmoidWeights):
    """ωᵢ = σ(xᵢ) as :class:`SigmoidWeights`, stepped along the natural gradient of the logit:

        xᵢ ← xᵢ − lr · Adam(∂Φ/∂ωᵢ),   ∂Φ/∂ωᵢ = (∂Φ/∂xᵢ) / σ'(xᵢ),                (eq. natsig)

    the gradient in ω (the Fisher metric of the Bernoulli σ(x) is σ'(x), so this is x's natural
    gradient, and the step is mirror descent on ω ∈ (0, 1) with the Bernoulli entropy as mirror
    map). With the plain sigmoid the hypergradient of a row carries σ'(xᵢ), which falls from ¼
    at x = 0 to 0.05 at x = −3: a corrupted example's logit slows down as it falls, although its
    evidence (uᵢ − ū) does not weaken, and with the row's Adam scale dominated by its first,
    larger hypergradients it stops near ω ≈ 0.1 (docs/data_weights.md, the diagnosis). In ω's
    coordinates each visit moves the logit by its evidence relative to that row's earlier
    evidence: steps shrink only where the evidence does (a clean example the network fits).

    The gradient the logits receive (``logits.grad``, any hypergradient through
    :meth:`SampleWeights.weights`) is therefore ∂Φ/∂ω, not ∂Φ/∂x.
    """

    def sigma(self, x: Tensor) -> Tensor:
        """ω = σ(x), with ∂Φ/∂ω handed to x unchanged (eq. natsig)."""
        return _SigmoidInWeightCoordinates.apply(x)

    def __repr__(self) -> str:
        return "NaturalSigmoidWeights()"


class SoftmaxWeights(WeightParameterization):
    """ωᵢ = n·exp(xᵢ − log Z), log Z = logsumexp(x): weights that average 1 over the data set.

    log Z follows the logits after every outer step (:class:`SoftmaxNormaliser`: one pass over
    the n logits with dense gradients, O(rows moved) with row-sparse ones) and is held fixed
    within a hyper step: the exact gradient also moves every row j outside the minibatch, by
    −pⱼ·c with pⱼ = exp(xⱼ)/Z ≈ 1/n and c a scalar of the batch, a term of order 1/n per row
    that is dropped (it would make every hyper step cost O(n)).
    """

    def logit(self, weight: float, n: int) -> float:
        if weight != 1.0:
            raise ConfigurationError(
                f"softmax-normalised weights average 1 over the data set; the initial weight must "
                f"be 1.0, got {weight!r}."
            )
        return 0.0

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        return family.n * torch.exp(x - family.log_normaliser)

    def normaliser(self, family: SampleWeights) -> Normaliser:
        return SoftmaxNormaliser(family)

    def __repr__(self) -> str:
        return "SoftmaxWeights()"


def hinge_basis(z: Tensor) -> Tensor:
    """φ(z) = (z, max(z, 0)): a slope, and another above the batch's mean loss."""
    return torch.stack([z, z.clamp_min(0)], -1)


def biased_hinge_basis(z: Tensor) -> Tensor:
    """φ(z) = (1, z, max(z, 0)): :func:`hinge_basis` and a shared offset of every logit."""
    return torch.stack([torch.ones_like(z), z, z.clamp_min(0)], -1)


class SharedLossWeights(WeightParameterization):
    """ωᵢ = σ(xᵢ + θᵀφ(zᵢ)): the per-sample logit plus a small function of the example's
    current loss whose few parameters θ every example's hypergradient trains:

        ωᵢ = σ(xᵢ + θᵀφ(zᵢ)),   zᵢ = clip((ℓᵢ − ℓ̄_ζ) / s_ζ, ±3),                (eq. sharedloss)

    φ = ``basis`` (default :func:`hinge_basis`, φ(z) = (z, max(z, 0)); or
    :func:`biased_hinge_basis`, which adds a constant),

    with ℓ̄_ζ, s_ζ the mean and standard deviation of the losses over the minibatch ζ (so θ
    reads where an example's loss sits among its batch, whatever the training's stage), the
    losses detached (a feature of the example, not a path for the training's gradient), θ₀ = 0.
    x keeps the per-row part (each row ~one hypergradient per epoch); θ gets the sum over every
    row read of ∂Φ̂/∂(xᵢ + sᵢ) · φ(zᵢ), i.e. the statistical strength of all examples (a
    Meta-Weight-Net-like term, Shu et al. 2019, learned by SID like any hyperparameter). With
    θ = 0 it is :class:`SigmoidWeights`.

    ``lr`` and ``betas``: the outer step on θ (the data-weights drop-in gives θ its own
    :class:`LazyAdam` group with them; each row of x keeps the drop-in's). A row's last z is
    kept (O(n) storage), so :meth:`SampleWeights.values` and the flags read ω at the example's
    last visit.
    """

    largest = 1.0

    def __init__(
        self,
        lr: float = 0.005,
        betas: tuple[float, float] = (0.9, 0.999),
        clip: float = 3.0,
        basis: Callable[[Tensor], Tensor] = hinge_basis,
    ) -> None:
        if not 0 < lr < math.inf or not clip > 0:
            raise ConfigurationError(
                f"SharedLossWeights: lr (finite) and clip must be > 0, got lr={lr!r}, "
                f"clip={clip!r}."
            )
        if not callable(basis):
            raise ConfigurationError("SharedLossWeights: basis must be a callable z -> φ(z).")
        try:  # θ's own LazyAdam group: β₁ = 1 divided by 1 − β₁ᵗ = 0 (session 53)
            betas = _two_betas(betas)
        except ConfigurationError as err:
            raise ConfigurationError(f"SharedLossWeights: {err}") from None
        self.lr, self.betas, self.clip, self.basis = float(lr), betas, float(clip), basis
        #: the number of basis functions, dim φ
        self.features = int(basis(torch.zeros(1)).shape[-1])
        self.theta: Tensor | None = None
        self.last_z: Tensor | None = None

    def logit(self, weight: float, n: int) -> float:
        return SigmoidWeights().logit(weight, n)

    def bind(self, family: SampleWeights) -> None:
        x = family.logits
        if self.theta is None or self.theta.dtype != x.dtype:
            self.theta = torch.zeros(self.features, dtype=x.dtype, device=x.device)
            self.theta.requires_grad_(True)
        elif self.theta.device != x.device:  # the fit moved the logits: θ follows, kept
            self.theta.data = self.theta.data.to(x.device)
        if self.last_z is None or self.last_z.shape != x.shape:
            self.last_z = torch.zeros_like(x.detach())
        self.last_z = self.last_z.to(x.device)

    def param_groups(self, hyperparameters: Tensors) -> list[dict[str, Any]]:
        """x with the optimizer's settings, θ with its own ``lr`` and ``betas``."""
        shared = {id(t) for t in self.hyperparameters}
        rows = [h for h in hyperparameters if id(h) not in shared]
        own = [h for h in hyperparameters if id(h) in shared]
        groups: list[dict[str, Any]] = [{"params": rows}]
        if own:
            groups.append({"params": own, "lr": self.lr, "betas": self.betas})
        return groups

    @property
    def hyperparameters(self) -> Tensors:
        return [] if self.theta is None else [self.theta]

    def standardised(self, losses: Tensor) -> Tensor:
        """z of eq. sharedloss: the batch-standardised, clipped, detached losses."""
        ell = losses.detach().reshape(-1).to(self.theta.dtype)  # type: ignore[union-attr]
        if ell.numel() < 2:
            return torch.zeros_like(ell)
        z = (ell - ell.mean()) / ell.std().clamp_min(1e-8)
        return z.clamp(-self.clip, self.clip)

    def shift(self, z: Tensor) -> Tensor:
        """s_θ(z) = θᵀφ(z) (differentiable in θ)."""
        theta = self.theta
        assert theta is not None, "bind the parameterisation first"
        return self.basis(z.to(theta.dtype)) @ theta

    def rows(
        self,
        x: Tensor,
        family: SampleWeights,
        index: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        if index is None:  # x is already an effective logit (e.g. a flag rule's component mean)
            return torch.sigmoid(x)
        if losses is None:  # the rows' last visit
            z = self.last_z.index_select(0, index)  # type: ignore[union-attr]
        else:
            z = self.standardised(losses)
            with torch.no_grad():
                self.last_z.index_copy_(0, index, z.to(self.last_z.dtype))  # type: ignore[union-attr]
        return torch.sigmoid(x + self.shift(z).to(x.dtype))

    def effective_logits(self, family: SampleWeights) -> Tensor:
        with torch.no_grad():
            x = family.logits_of().detach()
            return x + self.shift(self.last_z).to(x.dtype)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (
            f"SharedLossWeights(lr={self.lr:g}, betas={self.betas}, clip={self.clip:g}, "
            f"basis={getattr(self.basis, '__name__', self.basis)})"
        )


PARAMETERIZATIONS: dict[str, Callable[[], WeightParameterization]] = {
    "sigmoid": SigmoidWeights,
    "softmax": SoftmaxWeights,
    "shared_loss": SharedLossWeights,
    "natural_sigmoid": NaturalSigmoidWeights,
}


def as_weight_parameterization(value: str | WeightParameterization) -> WeightParameterization:
    """A :class:`WeightParameterization` from its name (``"sigmoid"``, ``"softmax"``) or itself."""
    return as_strategy("parameterization", value, WeightParameterization, PARAMETERIZATIONS)
