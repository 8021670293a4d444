"""Weight decay as a hyperparameter container: λ by granularity and parameterisation.

The inner loss of weight-decay tuning is ℓ̂(w, λ; ζ) = g(w; ζ) + ½ Σ_p Σ_i c_{p,i}(λ) w_{p,i}², with
c = P ⊙ λ (P a fixed per-tensor scale, 1 for plain L2, an optimizer's preconditioner for decoupled
decay). :class:`WeightDecay` holds the learned tensors (the hyperparameters of
:class:`~hypertorch_sid.SIDHyperOptimizer`), maps each decayed tensor to its λ slot, and gives the
penalty, its coefficients c(λ) (the ``penalty=`` of the proximal map) and the projection onto Λ —
usable from a plain ``SIDHyperOptimizer`` as from :class:`~hypertorch_sid.LearnedWeightDecay`::

    decay = WeightDecay(model.named_parameters(), 1e-4, granularity="per_layer")
    hopt = SIDHyperOptimizer(
        decay.hyperparameters, model.parameters(),
        inner_loss=lambda b: F.cross_entropy(model(b[0]), b[1]) + decay.penalty(),
        outer_loss=..., outer_optimizer=torch.optim.Adam(decay.hyperparameters, lr=0.05),
        config=SIDConfig(feasible_set=FeasibleSet(project=lambda hs: decay.project())),
    )

Granularity (which tensors share a λ): ``"global"`` (one λ), ``"per_group"`` (one per group key
given with the tensor, e.g. an optimizer's parameter group), ``"per_layer"`` (one per owning
module: the name without its last component), ``"per_tensor"``, ``"per_element"`` (λ shaped like
each tensor). Parameterisation (how λ is learned): :class:`LogDecay` (λ = exp ρ, λ > 0 always) or
:class:`ProjectedDecay` (λ learned directly and projected onto λ ≥ 0).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import ConfigurationError

Tensors = list[Tensor]


class Parameterization(ABC):
    """λ = T(ρ): how the learned tensor ρ gives the decay λ."""

    @abstractmethod
    def initial(self, lam: float) -> float:
        """ρ₀ for the initial decay λ₀."""

    @abstractmethod
    def transform(self, rho: Tensor) -> Tensor:
        """λ = T(ρ)."""

    @abstractmethod
    def clamp(self, rho: Tensor, upper: float) -> None:
        """Keep T(ρ) in [0, upper], in place."""


class LogDecay(Parameterization):
    """λ = exp(ρ): positive by construction; the outer step moves log λ (scale-free)."""

    def initial(self, lam: float) -> float:
        if not lam > 0:
            raise ConfigurationError(f"the log parameterisation needs λ₀ > 0, got {lam!r}.")
        return math.log(lam)

    def transform(self, rho: Tensor) -> Tensor:
        return rho.exp()

    def clamp(self, rho: Tensor, upper: float) -> None:
        if math.isfinite(upper):
            rho.clamp_(max=math.log(upper))

    def __repr__(self) -> str:
        return "LogDecay()"


class ProjectedDecay(Parameterization):
    """λ = ρ, projected onto [0, upper] after each outer step."""

    def initial(self, lam: float) -> float:
        if not lam >= 0:
            raise ConfigurationError(f"the projected parameterisation needs λ₀ ≥ 0, got {lam!r}.")
        return lam

    def transform(self, rho: Tensor) -> Tensor:
        return rho

    def clamp(self, rho: Tensor, upper: float) -> None:
        rho.clamp_(min=0, max=upper if math.isfinite(upper) else None)

    def __repr__(self) -> str:
        return "ProjectedDecay()"


PARAMETERIZATIONS: dict[str, Callable[[], Parameterization]] = {
    "log": LogDecay,
    "projection": ProjectedDecay,
}


def _layer(name: str, group: str) -> str:
    return name.rpartition(".")[0] or "(root)"


#: granularity → the slot key of a tensor (name, group key); None: one λ per element
GRANULARITIES: dict[str, Callable[[str, str], str] | None] = {
    "global": lambda name, group: "all",
    "per_group": lambda name, group: group,
    "per_layer": _layer,
    "per_tensor": lambda name, group: name,
    "per_element": None,
}


@dataclass
class Decayed:
    """One decayed tensor: its name, its group key and the λ slot it reads."""

    name: str
    param: Tensor
    group: str
    slot: int


class WeightDecay:
    """λ over named tensors by granularity and parameterisation (see the module docstring).

    Parameters
    ----------
    named_parameters:
        ``(name, tensor)`` or ``(name, tensor, group_key)`` triples (``model.named_parameters()``);
        the group key is what ``"per_group"`` shares a λ by (default: ``"all"``).
    weight_decay:
        The initial λ₀ of every slot.
    granularity:
        One of :data:`GRANULARITIES`.
    parameterization:
        ``"log"``, ``"projection"`` or a :class:`Parameterization`.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, Tensor] | tuple[str, Tensor, str]],
        weight_decay: float,
        granularity: str = "global",
        parameterization: str | Parameterization = "log",
    ) -> None:
        if granularity not in GRANULARITIES:
            raise ConfigurationError(
                f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}."
            )
        self.parameterization = as_parameterization(parameterization)
        if (
            isinstance(weight_decay, bool)
            or not isinstance(weight_decay, (int, float))
            or not math.isfinite(weight_decay)
        ):
            raise ConfigurationError(f"weight_decay must be a finite number, got {weight_decay!r}.")
        fill = self.parameterization.initial(float(weight_decay))
        self.granularity = granularity
        key = GRANULARITIES[granularity]
        slots: dict[str, int] = {}
        self.entries: list[Decayed] = []
        for item in named_parameters:
            name, param = item[0], item[1]
            group = item[2] if len(item) > 2 else "all"  # type: ignore[misc]
            slot = (
                len(self.entries) if key is None else slots.setdefault(key(name, group), len(slots))
            )
            self.entries.append(Decayed(name, param, group, slot))
        if not self.entries:
            raise ConfigurationError("WeightDecay needs at least one tensor to decay.")
        #: names of the λ slots (all but per-element granularity)
        self.slot_names = list(slots)
        like = self.entries[0].param
        if key is None:
            self.hyperparameters: Tensors = [
                torch.full_like(e.param, fill, memory_format=torch.contiguous_format)
                .detach()
                .requires_grad_(True)
                for e in self.entries
            ]
        else:
            self.hyperparameters = [
                torch.full(
                    (len(slots),), fill, dtype=like.dtype, device=like.device
                ).requires_grad_(True)
            ]

    @torch.no_grad()
    def carry_from(self, old: WeightDecay) -> int:
        """Take the learned values from ``old`` for the tensors both decay (the same tensor
        objects, the same granularity and parameterisation): a new fit that decays more tensors
        keeps what the last one learned for the others. Returns the number of values carried."""
        if old.granularity != self.granularity or type(old.parameterization) is not type(
            self.parameterization
        ):
            return 0
        before = {id(e.param): e.slot for e in old.entries}
        carried: set[int] = set()
        for e in self.entries:
            slot = before.get(id(e.param))
            if slot is None or e.slot in carried:
                continue
            if self.per_element:
                self.hyperparameters[e.slot].copy_(old.hyperparameters[slot])
            else:
                self.hyperparameters[0][e.slot] = old.hyperparameters[0][slot]
            carried.add(e.slot)
        return len(carried)

    @property
    def per_element(self) -> bool:
        return GRANULARITIES[self.granularity] is None

    def lambda_of(self, entry: Decayed) -> Tensor:
        """λ of one decayed tensor (a scalar, or shaped like it per element); differentiable."""
        T = self.parameterization.transform
        if self.per_element:
            return T(self.hyperparameters[entry.slot])
        return T(self.hyperparameters[0])[entry.slot]

    def values(self) -> dict[str, Tensor]:
        """The current λ of every decayed tensor, by name (detached)."""
        with torch.no_grad():
            return {e.name: self.lambda_of(e).detach().clone() for e in self.entries}

    def by_group(self) -> dict[str, Tensor]:
        """λ by slot, flattened (detached): one value per layer / group / tensor, or every value
        of a tensor per element; empty for a single global λ (``summary()`` holds it)."""
        with torch.no_grad():
            T = self.parameterization.transform
            if self.per_element:
                return {e.name: T(self.hyperparameters[e.slot]).flatten() for e in self.entries}
            if len(self.slot_names) < 2:
                return {}
            lam = T(self.hyperparameters[0])
            return {name: lam[i : i + 1] for i, name in enumerate(self.slot_names)}

    def summary(self) -> Tensor:
        """Every λ, flattened (detached)."""
        with torch.no_grad():
            T = self.parameterization.transform
            return torch.cat([T(r).flatten() for r in self.hyperparameters])

    def coefficients_by_entry(self, scales: Sequence[Tensor | float] | None = None) -> Tensors:
        """c = P ⊙ λ of each decayed tensor (P = ``scales``, default 1)."""
        scales = scales if scales is not None else [1.0] * len(self.entries)
        return [s * self.lambda_of(e) for e, s in zip(self.entries, scales)]

    def penalty(self, scales: Sequence[Tensor | float] | None = None) -> Tensor:
        """½ Σ_p ⟨c_p, w_p²⟩ with c = P ⊙ λ: differentiable in w and λ."""
        terms = [
            0.5 * (c * e.param.pow(2)).sum()
            for e, c in zip(self.entries, self.coefficients_by_entry(scales))
        ]
        return torch.stack(terms).sum()

    def coefficients(
        self, inner_parameters: Sequence[Tensor], scales: Sequence[Tensor | float] | None = None
    ) -> Tensors:
        """c(λ) for every inner parameter (0 for undecayed ones): the proximal map's penalty."""
        by_param = {
            id(e.param): c for e, c in zip(self.entries, self.coefficients_by_entry(scales))
        }
        return [
            by_param.get(id(p), torch.zeros((), dtype=p.dtype, device=p.device))
            for p in inner_parameters
        ]

    @torch.no_grad()
    def project(self, upper: Sequence[float] | None = None) -> None:
        """λ onto [0, upper_e] for each decayed tensor e (default: no upper bound): P_Λ."""
        bounds: dict[int, float] = {}
        for i, e in enumerate(self.entries):
            u = upper[i] if upper is not None else math.inf
            bounds[e.slot] = min(bounds.get(e.slot, math.inf), u)
        for slot, bound in bounds.items():
            rho = self.hyperparameters[slot] if self.per_element else self.hyperparameters[0][slot]
            self.parameterization.clamp(rho, bound)


def as_parameterization(value: str | Parameterization) -> Parameterization:
    """A :class:`Parameterization` from its name (``"log"``, ``"projection"``) or itself."""
    if isinstance(value, Parameterization):
        return value
    if isinstance(value, str) and value in PARAMETERIZATIONS:
        return PARAMETERIZATIONS[value]()
    raise ConfigurationError(
        f"parameterization must be 'log', 'projection' or a Parameterization, got {value!r}."
    )
