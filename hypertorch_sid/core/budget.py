"""A compute budget for hyper steps: at most ``max_overhead`` × the plain training's cost.

A hyper step (adjoint solve, ∂₂Φ̂ᵀv, outer step, now and then a curvature estimate) costs a
multiple of a training step that depends on the model and the device: measured here, 2.5–4× a
step for an adjoint product on an MLP and a CNN, more on an LSTM (its Hessian–vector products are
dear). A fixed "every n steps" therefore gives a different overhead on every network. The budget
measures instead, and spaces the hyper steps so that

    Σ cost(hyper steps) ≤ max_overhead · Σ cost(training steps)                    (eq. budget)

holds whenever a hyper step starts: a hyper step runs when it is due *and* the credit
``max_overhead · spent_training − spent_hyper`` is not negative; a hyper step dearer than the
credit (the first, with its curvature estimate; a refresh; a Recover retry) is paid back by the
training steps after it before the next one runs. At any time the spent share exceeds
``max_overhead`` by at most the last hyper step's cost over the training's. Where the fit's
length is known, a hyper step also waits unless the steps that remain can pay back its predicted
cost (the mean of the hyper steps after the first: ``credit + max_overhead · remaining · mean
step ≥ predicted``), so that the fit's *final* share stays within ``max_overhead`` when hyper
steps cost alike; the first two hyper steps run when due. (Waiting until the
credit covers a *predicted* cost instead, measured: on a Fashion-MNIST CNN with
``max_overhead=0.25`` the first hyper step's one-off curvature estimate made every prediction so
dear that only that one hyper step ran.) ``max_overhead=None`` (:class:`NoBudget`) runs every due
hyper step.

The cost is whatever the ``clock`` reads: wall time by default (``time.perf_counter``), a count of
products in tests (CI asserts the plan against counted products, never against timings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .errors import ConfigurationError
from .validation import is_real


class Budget:
    """When a due hyper step may run, and what the hyper steps have cost so far."""

    def training_step_done(self) -> None:
        """The training ran one more step (called once per optimizer step)."""

    def allows(self, remaining_steps: int | None = None) -> bool:
        """Whether a due hyper step fits the budget now (``remaining_steps``: the training steps
        left in the fit, where known)."""
        return True

    def start_hyper_step(self) -> None:
        """A hyper step begins (its cost is measured until :meth:`end_hyper_step`)."""

    def end_hyper_step(self) -> None:
        """The hyper step ended."""

    @contextmanager
    def added_work(self) -> Iterator[None]:
        """Work the callback adds outside its hyper steps (applying λ to the gradients, the step
        size probe, building at train start): charged to the hyper steps, not the training."""
        yield

    @property
    def overhead(self) -> float:
        """Σ cost(hyper steps) / Σ cost(training steps) so far (nan before any training)."""
        return math.nan

    def state_dict(self) -> dict[str, float]:
        """The accounting so far (kept in the callback's checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore a checkpointed budget."""


class NoBudget(Budget):
    """Every due hyper step runs (the callback's default)."""


@dataclass
class OverheadBudget(Budget):
    """Hyper steps within ``max_overhead`` × the training's cost (eq. budget).

    Parameters
    ----------
    max_overhead: the largest ratio Σ hyper-step cost / Σ training cost (0.5: a training with
        learned λ costs at most 1.5 plain ones, the hyper steps' own share).
    clock: a monotonic reading of cost (seconds by default).
    """

    max_overhead: float = 0.5
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    #: cost of the training steps so far (the time between steps, hyper steps excluded)
    spent_training: float = field(default=0.0, init=False)
    #: cost of the hyper steps so far
    spent_hyper: float = field(default=0.0, init=False)
    hyper_steps: int = field(default=0, init=False)
    skipped: int = field(default=0, init=False)
    #: the part of ``spent_hyper`` spent outside hyper steps (:meth:`added_work`)
    spent_added: float = field(default=0.0, init=False)
    #: training steps counted; the first hyper step's cost (with its one-off curvature
    #: estimate), and the latest's
    training_steps: int = field(default=0, init=False)
    first_hyper: float = field(default=0.0, init=False)
    last_hyper: float = field(default=0.0, init=False)
    _mark: float | None = field(default=None, init=False, repr=False)
    _added_since_mark: float = field(default=0.0, init=False, repr=False)
    _hyper_start: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        value = self.max_overhead
        if not is_real(value) or not value > 0:
            raise ConfigurationError(
                f"max_overhead must be a number > 0 (0.5: at most 50 % more compute than the "
                f"plain training), got {value!r}; pass max_overhead=None for no budget."
            )
        if not callable(self.clock):
            raise ConfigurationError("OverheadBudget: clock must be a callable () -> float.")

    def training_step_done(self) -> None:
        now = self.clock()
        if self._mark is not None:
            self.spent_training += max(now - self._mark - self._added_since_mark, 0.0)
            self.training_steps += 1
        self._mark, self._added_since_mark = now, 0.0

    @property
    def mean_hyper_step(self) -> float:
        """The mean cost of the hyper steps so far (0 before the first)."""
        return self.spent_hyper / self.hyper_steps if self.hyper_steps else 0.0

    @property
    def credit(self) -> float:
        """max_overhead · Σ training cost − Σ hyper-step cost (eq. budget's slack)."""
        return self.max_overhead * self.spent_training - self.spent_hyper

    def allows(self, remaining_steps: int | None = None) -> bool:
        """Not in debt (eq. budget), and — where the fit's remaining steps are known — the
        next hyper step (:attr:`predicted`) can still be paid back by them:
        ``credit + max_overhead · remaining · mean step ≥ predicted`` (so the last hyper steps
        of a fit do not overdraw what no step is left to pay back)."""
        ok = self.credit >= 0.0
        if ok and remaining_steps is not None and self.hyper_steps >= 2 and self.training_steps:
            step = self.spent_training / self.training_steps
            ok = self.credit + self.max_overhead * remaining_steps * step >= self.predicted
        self.skipped += not ok
        return ok

    @property
    def predicted(self) -> float:
        """The next hyper step's predicted cost: the mean of those after the first (whose
        one-off curvature estimate and checks would overstate it); 0 before two ran."""
        n = self.hyper_steps - 1
        return (self.spent_hyper - self.spent_added - self.first_hyper) / n if n > 0 else 0.0

    def start_hyper_step(self) -> None:
        self._hyper_start = self.clock()

    def end_hyper_step(self) -> None:
        if self._hyper_start is None:
            return
        now = self.clock()
        self.last_hyper = now - self._hyper_start
        if not self.hyper_steps:
            self.first_hyper = self.last_hyper
        self.spent_hyper += self.last_hyper
        self.hyper_steps += 1
        self._hyper_start = None
        self._mark, self._added_since_mark = now, 0.0  # the hyper step's time is not training

    @contextmanager
    def added_work(self) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - start
            self.spent_hyper += spent
            self.spent_added += spent
            self._added_since_mark += spent

    @property
    def overhead(self) -> float:
        return self.spent_hyper / self.spent_training if self.spent_training > 0 else math.nan

    def state_dict(self) -> dict[str, float]:
        return dict(spent_training=self.spent_training, spent_hyper=self.spent_hyper,
                    hyper_steps=self.hyper_steps, skipped=self.skipped,
                    spent_added=self.spent_added, training_steps=self.training_steps,
                    first_hyper=self.first_hyper, last_hyper=self.last_hyper)  # fmt: skip

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue the accounting of a checkpoint (a resumed fit keeps what it spent); an
        entry that is not a finite number ≥ 0 raises ConfigurationError, changing nothing."""
        check_budget_state(state)
        self.spent_training = float(state.get("spent_training", 0.0))
        self.spent_hyper = float(state.get("spent_hyper", 0.0))
        self.hyper_steps = int(state.get("hyper_steps", 0))
        self.skipped = int(state.get("skipped", 0))
        self.spent_added = float(state.get("spent_added", 0.0))
        self.training_steps = int(state.get("training_steps", 0))
        self.first_hyper = float(state.get("first_hyper", 0.0))
        self.last_hyper = float(state.get("last_hyper", 0.0))
        self._mark, self._added_since_mark = None, 0.0


_BUDGET_KEYS = (
    "spent_training", "spent_hyper", "hyper_steps", "skipped", "spent_added", "training_steps",
    "first_hyper", "last_hyper",
)  # fmt: skip


def check_budget_state(state: object) -> None:
    """A budget's saved accounting: a dict of finite numbers ≥ 0 under the known keys."""
    if not isinstance(state, dict) or any(
        key not in _BUDGET_KEYS or not is_real(value) or not math.isfinite(value) or value < 0
        for key, value in state.items()
    ):
        raise ConfigurationError(
            f"the checkpoint's budget state must be a dict of finite numbers >= 0 under "
            f"{list(_BUDGET_KEYS)}, got {state!r}: it is corrupted."
        )


def make_budget(max_overhead: float | None | Budget) -> Budget:
    """``max_overhead`` as a :class:`Budget`: None → :class:`NoBudget`, a number →
    :class:`OverheadBudget`, a Budget as it is."""
    if max_overhead is None:
        return NoBudget()
    if isinstance(max_overhead, Budget):
        return max_overhead
    return OverheadBudget(max_overhead)
