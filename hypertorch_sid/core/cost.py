"""Cost accounting: what a hypergradient costs in samples and derivative evaluations."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Cost:
    """Running totals of the work done by the SID solves.

    Attributes
    ----------
    samples: training samples read by the inner and adjoint solves and the ∂₂Φ̂ term.
    inner_samples, adjoint_samples: the same, split by solve (the paper's LL / LS epochs).
    gradient_evals: evaluations of ∇₁ℓ̂ (or of Φ̂) — one per inner step.
    jacobian_vector_products: vector–Jacobian products ∂Φ̂ᵀv of the adjoint solve and the ∂₂Φ̂ term
        (Hessian–vector products for the GD map; the name is kept for saved states).
    curvature_samples, curvature_products: samples read and Hessian–vector products made by the
        curvature estimates (Lanczos); included in ``samples``.
    validation_samples: samples read to compute ∇E.
    hypergradients: hypergradients computed.
    """

    samples: int = 0
    inner_samples: int = 0
    adjoint_samples: int = 0
    gradient_evals: int = 0
    jacobian_vector_products: int = 0
    curvature_samples: int = 0
    curvature_products: int = 0
    validation_samples: int = 0
    hypergradients: int = 0

    def epochs(self, n_train: int) -> float:
        """Passes over a training set of ``n_train`` samples (the paper's budget unit)."""
        return self.samples / n_train

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def load(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))
