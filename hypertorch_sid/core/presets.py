"""The paper's SID variants as named presets (section 5 and the appendix's method table).

| preset               | % epochs (LL, LS) | algorithm (LL, LS)   |
|----------------------|-------------------|----------------------|
| ``batch``            | 50, 50            | GD, GD               |
| ``stoch_const``      | 50, 50            | SGD const, SGD const |
| ``stoch_dec``        | 50, 50            | SGD dec, SGD dec     |
| ``stoch_batch``      | 50, 50            | SGD dec, GD          |
| ``batch_stoch``      | 50, 50            | GD, SGD dec          |
| ``batch_75_25``      | 75, 25            | GD, GD               |
| ``stoch_const_75_25``| 75, 25            | SGD const, SGD const |
| ``stoch_dec_75_25``  | 75, 25            | SGD dec, SGD dec     |

(The appendix's table lists "SGD const" for *Stoch dec*; section 5 defines it with decreasing
steps, which is what ``stoch_dec`` does.) Step counts follow the appendix's rule

    t = round(%LL/100 × total epochs × n_tr / batch size LL),  k likewise with %LS,

where GD's batch is the whole training set (one step = one epoch). GD uses η = 1, SGD const η = 1,
SGD dec η_t = β/(γ + t) with the theory's β, γ.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Batches, SIDConfig
from .errors import ConfigurationError
from .preconditioning import NoPreconditioner
from .solvers import FixedPointIteration, LastIterate


@dataclass(frozen=True)
class Solver:
    """How one subproblem is solved: full-batch (GD) or minibatch, and the step-size schedule."""

    full_batch: bool
    step_size: str  # "constant" or "decreasing"


GD = Solver(full_batch=True, step_size="constant")
SGD_CONST = Solver(full_batch=False, step_size="constant")
SGD_DEC = Solver(full_batch=False, step_size="decreasing")


@dataclass(frozen=True)
class Preset:
    """A named SID variant: split of the epoch budget and the solver of each subproblem."""

    name: str
    inner_share: float
    inner: Solver
    adjoint: Solver

    def steps(self, total_epochs: float, n_train: int, batch_size: int) -> tuple[int, int]:
        """(t, k) by the appendix's rule for a budget of ``total_epochs`` epochs."""
        if total_epochs <= 0 or n_train <= 0 or batch_size <= 0:
            raise ConfigurationError(
                "total_epochs, n_train and batch_size must be positive, got "
                f"{total_epochs}, {n_train}, {batch_size}."
            )

        def count(share: float, solver: Solver) -> int:
            size = n_train if solver.full_batch else batch_size
            return max(1, round(share * total_epochs * n_train / size))

        return count(self.inner_share, self.inner), count(1 - self.inner_share, self.adjoint)

    def config(
        self, total_epochs: float, n_train: int, batch_size: int, base: SIDConfig | None = None
    ) -> SIDConfig:
        """The :class:`~hypertorch_sid.core.config.SIDConfig` this preset stands for (on
        ``base``'s other settings; change any with ``.replace(...)``).

        t, k by :meth:`steps`; each solve's schedule and batch source; η = 1 for constant steps;
        the paper's (unpreconditioned) map, its last inner iterate and its fixed-point iteration
        for the adjoint.
        """
        t, k = self.steps(total_epochs, n_train, batch_size)
        base = base if base is not None else SIDConfig()
        constant = "constant" in (self.inner.step_size, self.adjoint.step_size)
        return base.replace(
            preconditioner=NoPreconditioner(),
            inner_solver=LastIterate(),
            adjoint_solver=FixedPointIteration(),
            inner_steps=t,
            adjoint_steps=k,
            step_size=self.inner.step_size,
            adjoint_step_size=self.adjoint.step_size,
            batches=Batches(
                inner="full" if self.inner.full_batch else "stochastic",
                adjoint="full" if self.adjoint.full_batch else "stochastic",
                d2=base.batches.d2,
            ),
            eta=1.0 if constant else base.eta,
        )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("batch", 0.5, GD, GD),
        Preset("stoch_const", 0.5, SGD_CONST, SGD_CONST),
        Preset("stoch_dec", 0.5, SGD_DEC, SGD_DEC),
        Preset("stoch_batch", 0.5, SGD_DEC, GD),
        Preset("batch_stoch", 0.5, GD, SGD_DEC),
        Preset("batch_75_25", 0.75, GD, GD),
        Preset("stoch_const_75_25", 0.75, SGD_CONST, SGD_CONST),
        Preset("stoch_dec_75_25", 0.75, SGD_DEC, SGD_DEC),
    ]
}


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (see the module docstring for the list)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}."
        ) from None
