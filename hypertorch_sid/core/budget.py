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
minimum cost (``credit + max_overhead · remaining · mean step ≥ predicted``), so that the fit's
*final* share stays within ``max_overhead``. ``max_overhead=None`` (:class:`NoBudget`) runs every
due hyper step.

**A hard ceiling within a hyper step.** A hyper step's cost is not known in advance: its curvature
estimate (Lanczos, 2 batches × 10 products in the drop-in) alone cost 21–103 training steps on
the network matrix, more than a 100–200-step fit's whole allowance at ``max_overhead=0.5``. So
each hyper step is given an :class:`Allowance` (:meth:`OverheadBudget.allowance`): a deadline on
the clock, ``now + ceiling`` with ``ceiling = credit + max_overhead · remaining · mean step`` (what
the fit can still pay back; ``credit`` plus one predicted hyper step where the fit's length is
unknown), and a share of it (``curvature_share``) for the curvature estimate. The core asks it
before each expensive piece: another Lanczos iteration (at least :data:`MIN_LANCZOS`), the
adjoint steps (at least one), a curvature refresh (else the previous estimate is reused), a
retry after a divergence (else the hyper step is given up, λ unchanged). A hyper
step starts only if its predicted minimum ``fixed + products · cost(one product)`` fits the
ceiling; the product's cost is measured once, by timing one Hessian–vector product, before the
first hyper step is committed to, then re-measured from every Lanczos iteration and adjoint solve.

**One-off work before a hyper step.** A caller whose next hyper step needs work first that no
hyper step repeats — ``LearnedWeightDecay``'s scale-invariance probe: up to 1 + 4 forward passes
per λ group, 4.24 s of CPU on MobileNetV3-small (88 groups) against a 6–7 s fit, which the plan
of the first hyper step did not see (the one hyper step it allowed spent the fit's whole allowance
twice over: fits 1.7–2.2× a plain one) — predicts its cost (timing what it must, as added work)
and announces it (:meth:`Budget.expect_one_off`): until the work has run, the known-length
ceiling is net of it, so a hyper step is allowed only where what the fit can still spend pays
for the work *and* the hyper step's predicted minimum after it; a fit that cannot runs neither,
and :meth:`Budget.starved` says so, naming the one-off work's cost. The work itself runs as
one-off :meth:`Budget.added_work` just before the hyper step (charged to the hyper steps, not
inside one, so it does not inflate the measured fixed part of the hyper steps after it).

The cost is whatever the ``clock`` reads: the process's CPU time where the training runs on the
CPU (``time.process_time``: compute, whatever else a shared machine runs — measured with wall time
on a loaded 2-core machine, the training's wall time in one fit ran 3–31 % above the plain fit's,
and the budget granted that as allowance: a CPU-time ratio of 1.53–1.58 at ``max_overhead=0.5``
on an MLP), wall time on an accelerator (``time.perf_counter``; :meth:`Budget.use_device`), a
given ``clock`` always; a count of products in tests (CI asserts the plan against counted
products, never against timings).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import InitVar, dataclass, field

import torch

from .errors import ConfigurationError
from .validation import is_real, number_fix


class HyperWork:
    """The hyper work of every callback of one fit, read on one ``clock``: what each budget's
    Σ training cost (eq. budget) leaves out. With two callbacks in one fit (``LearnedWeightDecay``
    beside ``LearnedDataWeights``), what runs between two of one callback's training steps holds
    the other's hyper steps too; counted as training, they raised the first one's allowance by
    its share of them (budgets multiplied: 2.7–2.8× a plain CPU training, against 1.9–2.0× for the
    data weights alone). Intervals nest across callbacks (a hyper step that runs the other
    callback's wrapped training step): only the outermost counts."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        #: the hyper work of every callback so far
        self.spent = 0.0
        self._depth = 0
        self._start = 0.0

    def begin(self, now: float) -> None:
        """Hyper work starts at the clock reading ``now``."""
        if self._depth == 0:
            self._start = now
        self._depth += 1

    def end(self, now: float) -> None:
        """The work begun last ends at ``now``."""
        self._depth -= 1
        if self._depth == 0:
            self.spent += max(now - self._start, 0.0)


class Budget:
    """When a due hyper step may run, and what the hyper steps have cost so far."""

    #: the reading of cost (seconds by default)
    clock: Callable[[], float] = staticmethod(time.perf_counter)
    #: the fit's shared hyper work (:meth:`share_work`); None: this budget's alone
    work: HyperWork | None = None
    _synchronize: Callable[[], None] | None = None

    def use_device(self, kind: str) -> None:
        """The training runs on a device of this kind (``"cpu"``, ``"cuda"`` ...): what the
        clock reads, unless one was given, and what a hyper step's readings wait for."""
        self._synchronize = _synchronizer(kind)

    def share_work(self, work: HyperWork | None) -> None:
        """Record this callback's hyper work in ``work``, the fit's, where the other callbacks'
        budgets read it (None: this budget's own again). Without a budget of its own, the hyper
        work is timed only for the others, on their clock."""
        self.work = work
        if work is not None:
            self.clock = work.clock

    def training_step_done(self) -> None:
        """The training ran one more step (called once per optimizer step)."""

    def synchronized_clock(self) -> float:
        """The clock, read after the device's queued work is done (an accelerator's)."""
        if self._synchronize is not None:
            self._synchronize()
        return self.clock()

    def allows(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> bool:
        """Whether a due hyper step fits the budget now (``remaining_steps``: the training steps
        left in the fit, where known; ``products``: the fewest Hessian–vector products the hyper
        step can be made with; ``due_left``: the hyper steps still due in the fit, this one
        included, where known)."""
        return True

    def needs_product_cost(self) -> bool:
        """Whether the cost of one product must be measured (:meth:`note_product_cost`) before
        a hyper step can be planned."""
        return False

    def note_product_cost(self, cost: float) -> None:
        """One Hessian–vector product cost ``cost`` (timed on this model and device)."""

    def allowance(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> Allowance:
        """What the next hyper step may spend (:class:`Allowance`: unlimited without a budget)."""
        return UNLIMITED

    def reads_time(self) -> bool:
        """Whether its decisions read a clock of time (CPU or wall seconds), so that two fits
        from the same seed can run different hyper steps (False: no budget, or a clock given,
        e.g. a count of products)."""
        return False

    def plans_costs(self) -> bool:
        """Whether this budget plans from measured costs: a cost announced to it
        (:meth:`expect_one_off`) can change its decisions, so it is worth measuring (False: no
        budget, every due hyper step runs)."""
        return False

    def expect_one_off(self, cost: float) -> None:
        """One-off work of at most ``cost`` (predicted on this budget's clock) must run before
        the next hyper step (e.g. ``LearnedWeightDecay``'s scale-invariance probe): :meth:`allows`
        lets that hyper step run only where the fit pays for the work and the hyper step's
        predicted minimum after it. The caller runs the work under :meth:`added_work` (charged
        as it is spent) once the hyper step is allowed, then calls ``expect_one_off(0)``."""

    def start_hyper_step(self) -> None:
        """A hyper step begins (its cost is measured until :meth:`end_hyper_step`)."""
        if self.work is not None:
            self.work.begin(self.synchronized_clock())

    def end_hyper_step(self, products: int = 0) -> None:
        """The hyper step ended, having made ``products`` Hessian–vector products."""
        if self.work is not None:
            self.work.end(self.synchronized_clock())

    def added_work(self, every_step: bool = False) -> AbstractContextManager[None]:
        """Work the callback adds outside its hyper steps (its hooks at every training step:
        applying λ to the gradients, deciding whether a hyper step is due and allowed; once: the
        step size probe, building at train start, timing a product): charged to the hyper steps,
        not the training. ``every_step``: work every remaining training step will add too,
        reserved from what those steps pay back; one-off work (the rest) is not. Added work may
        nest: a one-off piece inside a hook that runs at every step is charged as one-off."""
        return _NOTHING if self.work is None else _SharedWork(self.work)

    @property
    def overhead(self) -> float:
        """Σ cost(hyper steps) / Σ cost(training steps) so far (nan before any training)."""
        return math.nan

    def starved(self, due: int, products: int = 0) -> str | None:
        """Why none of the ``due`` hyper steps of a fit ran (None: some ran, or none was due,
        or nothing limits them); ``products``: the fewest a hyper step can be made with."""
        return None

    def state_dict(self) -> dict[str, float]:
        """The accounting so far (kept in the callback's checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore a checkpointed budget."""


#: the fewest Lanczos iterations a curvature estimate under a budget makes (with 2, the Ritz
#: values and their residual bounds already bracket the extreme eigenvalues' neighbourhoods)
MIN_LANCZOS = 2


class Allowance:
    """What one hyper step may spend, asked by the core before each expensive piece.

    This one (:data:`UNLIMITED`, no budget) always says "as planned".
    """

    def curvature_batches(self, planned: int) -> int:
        """The minibatches a curvature estimate averages (``planned``: the strategy's)."""
        return planned

    def lanczos_continues(self, started: float | None, done: int, products: int) -> bool:
        """Whether Lanczos may make another iteration after ``done`` (each ``products``
        Hessian–vector products), begun at clock reading ``started``."""
        return True

    def clock_reading(self) -> float | None:
        """The clock now (None: no clock)."""
        return None

    def affords(self, products: int) -> bool:
        """Whether what is left pays for ``products`` more products (a scheduled curvature
        refresh, else the previous estimate is kept; a retry after a divergence, else the hyper
        step is given up)."""
        return True

    def adjoint_steps(self, planned: int, after: int = 0) -> int:
        """The adjoint steps this hyper step makes (``planned``: k; ``after``: the products
        still to come after the solve)."""
        return planned

    def adjoint_done(self, started: float | None, steps: int) -> None:
        """The adjoint solve, begun at clock reading ``started``, made ``steps`` products."""


UNLIMITED = Allowance()


#: a max_overhead at or above this is read as a percentage written where a fraction belongs
PERCENT_LIKE = 10.0


@dataclass
class Deadline(Allowance):
    """A hyper step's allowance under :class:`OverheadBudget`: end by clock reading ``end``,
    its curvature estimate by ``curvature_end``; ``fixed``: what the hyper step costs besides
    its products (the validation gradient, the outer step, the checks)."""

    budget: OverheadBudget
    end: float
    curvature_end: float
    fixed: float

    @property
    def product(self) -> float:
        return self.budget.product_cost

    def clock_reading(self) -> float | None:
        return self.budget.clock()

    def _room(self, until: float) -> float:
        """Products that fit before ``until``, the fixed rest of the hyper step kept."""
        if self.product <= 0:
            return math.inf
        return (until - self.budget.clock() - self.fixed) / self.product

    def curvature_batches(self, planned: int) -> int:
        """As many batches as leave :data:`MIN_LANCZOS` iterations in the curvature's share."""
        room = (self.curvature_end - self.budget.clock()) / max(self.product, 1e-300)
        return max(1, min(planned, int(room // MIN_LANCZOS)))

    def lanczos_continues(self, started: float | None, done: int, products: int) -> bool:
        if started is None or done < MIN_LANCZOS:
            if started is not None and done:
                self.budget.note_product_cost((self.budget.clock() - started) / (done * products))
            return True
        now = self.budget.clock()
        per_iteration = (now - started) / done
        self.budget.note_product_cost(per_iteration / max(products, 1))
        return now + per_iteration <= self.curvature_end

    def affords(self, products: int) -> bool:
        return self._room(self.end) >= products

    def adjoint_steps(self, planned: int, after: int = 0) -> int:
        room = self._room(self.end) - after
        return planned if room >= planned else max(1, min(planned, int(room)))

    def adjoint_done(self, started: float | None, steps: int) -> None:
        if started is not None and steps > 0:
            self.budget.note_product_cost((self.budget.clock() - started) / steps)


@dataclass
class PlannedDeadline(Deadline):
    """A hyper step's allowance under :class:`PlannedBudget`: its part by ``end``, and a
    refresh or a retry after a divergence — dear work a hyper step cannot plan for — afforded
    while it fits by ``spare_end`` (a share of all the fit can still spend); granting one moves
    ``end`` to cover its products (eq. budgetplan takes it from the shares still due)."""

    spare_end: float = 0.0

    def affords(self, products: int) -> bool:
        if self._room(self.spare_end) < products:
            return False
        self.end = max(self.end, self.budget.clock() + self.fixed + products * self.product)
        return True


class NoBudget(Budget):
    """Every due hyper step runs (the callback's default)."""


@dataclass
class OverheadBudget(Budget):
    """Hyper steps within ``max_overhead`` × the training's cost (eq. budget).

    Parameters
    ----------
    max_overhead: the largest ratio Σ hyper-step cost / Σ training cost (0.5: a training with
        learned λ costs at most 1.5 plain ones, the hyper steps' own share).
    clock: a monotonic reading of cost; by default seconds of CPU time where the training runs on
        the CPU, of wall time elsewhere (:meth:`use_device`; wall time until it is called).
    who: the name a refused or percent-like ``max_overhead`` is said in (``"LearnedWeightDecay: "``
        where a callback built it from its number; by default the budget's own class, e.g.
        ``"PlannedBudget: "``; session 62 said a user's ``PlannedBudget(-1)`` nameless).
    """

    max_overhead: float = 0.5
    clock: Callable[[], float] = field(default=None, repr=False)  # type: ignore[assignment]
    #: the share of a hyper step's ceiling its curvature estimate may spend
    curvature_share: float = 1 / 3
    #: cost of the training steps so far (the time between steps, hyper steps excluded)
    spent_training: float = field(default=0.0, init=False)
    #: cost of the hyper steps so far
    spent_hyper: float = field(default=0.0, init=False)
    hyper_steps: int = field(default=0, init=False)
    skipped: int = field(default=0, init=False)
    #: the part of ``spent_hyper`` spent outside hyper steps (:meth:`added_work`)
    spent_added: float = field(default=0.0, init=False)
    #: of it, the work added at every training step (``added_work(every_step=True)``: applying
    #: λ): work every remaining step will add too
    spent_per_step: float = field(default=0.0, init=False)
    #: training steps counted; the first hyper step's cost (with its one-off curvature
    #: estimate), and the latest's
    training_steps: int = field(default=0, init=False)
    first_hyper: float = field(default=0.0, init=False)
    last_hyper: float = field(default=0.0, init=False)
    #: the measured cost of one Hessian–vector product (0: not yet measured) and of a hyper
    #: step's part besides its products
    product_cost: float = field(default=0.0, init=False)
    fixed_cost: float = field(default=0.0, init=False)
    #: the predicted cost of one-off work announced to run before the next hyper step and not
    #: yet run (:meth:`expect_one_off`; 0: none)
    one_off: float = field(default=0.0, init=False)
    _mark: float | None = field(default=None, init=False, repr=False)
    #: the hyper work's reading (:attr:`work`, this budget's and, in a shared fit, the other
    #: callbacks') at the mark: what ran since then is not training
    _work_mark: float = field(default=0.0, init=False, repr=False)
    _hyper_start: float | None = field(default=None, init=False, repr=False)
    _open: list[float] = field(default_factory=list, init=False, repr=False)
    who: InitVar[str] = ""

    def __post_init__(self, who: str) -> None:
        who = who or f"{type(self).__name__}: "
        value = self.max_overhead
        if not is_real(value) or not 0 < value < math.inf:  # inf: a raw NaN error at the fit
            fix = number_fix("max_overhead", value, float, lambda x: x > 0)  # YAML's '0.5'
            raise ConfigurationError(
                f"{who}max_overhead must be a number > 0 and finite (0.5: at most 50 % more "
                f"compute than the plain training), got {value!r}{fix}; "
                "pass max_overhead=None for no budget."
            )
        if value >= PERCENT_LIKE:  # max_overhead=50 meant as 50 %: 51× the training allowed
            warnings.warn(
                f"{who}max_overhead={value!r} allows the hyper steps {value:g}× the "
                f"plain training's compute ({100 * value:g} % more): it is a fraction, 0.5 for "
                f"50 % more. Pass max_overhead={value / 100:g} if you meant {value:g} %, or "
                "max_overhead=None for no budget.",
                UserWarning,
                stacklevel=3,
            )
        self._clock_given = self.clock is not None
        if not self._clock_given:
            self.clock = time.perf_counter
        if not callable(self.clock):
            raise ConfigurationError("OverheadBudget: clock must be a callable () -> float.")
        share = self.curvature_share
        if not is_real(share) or not 0 < share <= 1:
            raise ConfigurationError(
                f"OverheadBudget: curvature_share must be a number in (0, 1], got {share!r}."
            )
        self.share_work(None)

    def reads_time(self) -> bool:
        return not self._clock_given

    def use_device(self, kind: str) -> None:
        """CPU time on the CPU, wall time on an accelerator (a given clock is kept). Call it
        before the accounting starts: the readings of two clocks do not mix. An accelerator
        runs its work asynchronously: a hyper step's start and end and the product's timing
        wait for it (:meth:`synchronized_clock`), so the queued training work is charged to
        the training and the hyper step's own to it (the readings at every training step do
        not wait: the training keeps its overlap)."""
        if not self._clock_given:
            self.clock = time.process_time if kind == "cpu" else time.perf_counter
        super().use_device(kind)
        if self.work is not None and self.work.clock is not self.clock:
            self.share_work(None)  # its own, on the new clock

    def share_work(self, work: HyperWork | None) -> None:
        """Time this budget's hyper work in ``work`` (the fit's, on this budget's clock; a
        reading of another clock is not joined), and leave everything recorded in it out of the
        training (None: its own work only)."""
        if work is not None and work is self.work:
            return
        if work is None or work.clock is not self.clock:
            work = HyperWork(self.clock)
        self.work, self._work_mark = work, work.spent

    def training_step_done(self) -> None:
        now, hyper = self.clock(), self.work.spent
        if self._mark is not None:
            self.spent_training += max(now - self._mark - (hyper - self._work_mark), 0.0)
            self.training_steps += 1
        self._mark, self._work_mark = now, hyper

    @property
    def mean_hyper_step(self) -> float:
        """The mean cost of the hyper steps so far (0 before the first)."""
        return self.spent_hyper / self.hyper_steps if self.hyper_steps else 0.0

    @property
    def credit(self) -> float:
        """max_overhead · Σ training cost − Σ hyper-step cost (eq. budget's slack)."""
        return self.max_overhead * self.spent_training - self.spent_hyper

    @property
    def mean_training_step(self) -> float:
        """The mean cost of a training step so far (0 before the first)."""
        return self.spent_training / self.training_steps if self.training_steps else 0.0

    def needs_product_cost(self) -> bool:
        return self.product_cost <= 0.0

    def plans_costs(self) -> bool:
        return True

    def expect_one_off(self, cost: float) -> None:
        """Announce (``cost`` > 0) or clear (0) the one-off work before the next hyper step; a
        cost that is not a finite number ≥ 0 raises ConfigurationError."""
        if not is_real(cost) or not math.isfinite(cost) or cost < 0:
            raise ConfigurationError(
                f"expect_one_off: the predicted cost must be a finite number >= 0 (on the "
                f"budget's clock; 0 once the work has run), got {cost!r}."
            )
        self.one_off = float(cost)

    def note_product_cost(self, cost: float) -> None:
        """A measured product cost, averaged with the last reading (1:1)."""
        if math.isfinite(cost) and cost > 0:
            old = self.product_cost
            self.product_cost = cost if old <= 0 else 0.5 * (old + cost)

    def predicted(self, products: int) -> float:
        """A hyper step's predicted cost with ``products`` Hessian–vector products: the fixed
        part measured on the hyper steps so far plus the products at their measured cost. Before
        the first the fixed part is taken as two training steps and two products (its
        validation gradient, checks and outer step: measured 1.5–1.8 s on ResNet-18, 12–14
        training steps; two training steps alone let it overdraw by one product)."""
        fixed = self.fixed_cost
        if not self.hyper_steps:
            fixed = 2.0 * (self.mean_training_step + self.product_cost)
        return fixed + products * self.product_cost

    def ceiling(self, remaining_steps: int | None, products: int = 0) -> float:
        """The most the next hyper step may cost: the credit, plus what the ``remaining_steps``
        of the fit pay back (max_overhead · remaining · mean step, less the work the callback adds
        at every step, e.g. applying λ), less the one-off work announced to run before it
        (:attr:`one_off`) — or, where the fit's length is unknown, one predicted hyper step (paid
        back before the next, as is one-off work before it)."""
        if remaining_steps is None:
            return max(self.credit, 0.0) + self.predicted(products)
        per_step = self.spent_per_step / self.training_steps if self.training_steps else 0.0
        payback = max(self.max_overhead * self.mean_training_step - per_step, 0.0)
        return self.credit - self.one_off + remaining_steps * payback

    def allows(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> bool:
        """Not in debt (eq. budget), and — where the fit's remaining steps are known — the
        next hyper step's predicted minimum (``products`` products), and the one-off work
        announced before it, can still be paid back by them: ``credit − one_off + max_overhead ·
        remaining · mean step ≥ predicted`` (so a fit's last hyper steps, and a first one dearer
        than a short fit's whole allowance, do not overdraw what no step is left to pay back)."""
        ok = self.credit >= 0.0
        if ok and remaining_steps is not None and self.training_steps:
            ok = self.ceiling(remaining_steps, products) >= self.predicted(products)
        self.skipped += not ok
        return ok

    def allowance(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> Allowance:
        """The next hyper step's :class:`Deadline`: the :meth:`ceiling` from now, and
        ``curvature_share`` of it for a curvature estimate."""
        return self._deadline(self.ceiling(remaining_steps, products))

    def _deadline(self, ceiling: float) -> Deadline:
        """A :class:`Deadline` spending at most ``ceiling`` from now."""
        now, ceiling = self.clock(), max(ceiling, 0.0)
        fixed = self.predicted(0)
        curvature = max(self.curvature_share * ceiling, 0.0)
        return Deadline(self, now + ceiling, now + curvature, fixed)

    def start_hyper_step(self) -> None:
        self._hyper_start = self.synchronized_clock()
        self.work.begin(self._hyper_start)

    def end_hyper_step(self, products: int = 0) -> None:
        if self._hyper_start is None:
            return
        now = self.synchronized_clock()
        self.work.end(now)
        self.last_hyper = now - self._hyper_start
        if not self.hyper_steps:
            self.first_hyper = self.last_hyper
        fixed = max(self.last_hyper - products * self.product_cost, 0.0)
        # the fixed part: the first hyper step's (with its one-off checks) until a second, then
        # the mean of those after the first
        n = self.hyper_steps - 1
        self.fixed_cost = fixed if n <= 0 else (n * self.fixed_cost + fixed) / (n + 1)
        self.spent_hyper += self.last_hyper
        self.hyper_steps += 1
        self._hyper_start = None
        # the hyper step's time is not training
        self._mark, self._work_mark = now, self.work.spent

    def added_work(self, every_step: bool = False) -> AbstractContextManager[None]:
        """Nested: the inner work is charged as its own kind (one-off inside a hook that runs
        at every step stays one-off), the outer gets the rest; the total is the outer's."""
        return _AddedWork(self, every_step)

    def _charge(self, elapsed: float, every_step: bool) -> None:
        """Added work that took ``elapsed``, of which the work nested in it is charged already."""
        spent = elapsed - self._open.pop()
        if self._open:
            self._open[-1] += elapsed
        self.spent_hyper += spent
        self.spent_added += spent
        if every_step:
            self.spent_per_step += spent

    @property
    def overhead(self) -> float:
        return self.spent_hyper / self.spent_training if self.spent_training > 0 else math.nan

    def starved(self, due: int, products: int = 0) -> str | None:
        """A fit too short (or a model whose products are too dear) for the budget to pay for
        one hyper step: say so, with what one would have cost in training steps."""
        if self.hyper_steps or due <= 0:
            return None
        step = self.mean_training_step

        def steps(cost: float) -> str:
            return f"{cost / step:.0f}" if step > 0 else "more"

        first = f"one hyper step here costs about {steps(self.predicted(products))} training steps"
        if self.one_off > 0:
            first += (
                f", and the one-off work before the first (e.g. the scale-invariance probe) "
                f"about {steps(self.one_off)} more"
            )
        return (
            f"the compute budget (max_overhead={self.max_overhead:g}) allowed none of the {due} "
            f"hyper step{'s' * (due > 1)} due in this fit, so λ was not learned (it kept its "
            f"initial value): {first}, more than {self.max_overhead:g}× this fit's "
            f"{self.training_steps} steps can pay for. Train longer, raise "
            f"max_overhead, or pass max_overhead=None (every due hyper step runs)."
        )

    def state_dict(self) -> dict[str, float]:
        return dict(spent_training=self.spent_training, spent_hyper=self.spent_hyper,
                    hyper_steps=self.hyper_steps, skipped=self.skipped,
                    spent_added=self.spent_added, spent_per_step=self.spent_per_step,
                    training_steps=self.training_steps,
                    first_hyper=self.first_hyper, last_hyper=self.last_hyper,
                    product_cost=self.product_cost, fixed_cost=self.fixed_cost)  # fmt: skip

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue the accounting of a checkpoint (a resumed fit keeps what it spent); an
        entry that is not a finite number ≥ 0 raises ConfigurationError, changing nothing."""
        check_budget_state(state)
        self.spent_training = float(state.get("spent_training", 0.0))
        self.spent_hyper = float(state.get("spent_hyper", 0.0))
        self.hyper_steps = int(state.get("hyper_steps", 0))
        self.skipped = int(state.get("skipped", 0))
        self.spent_added = float(state.get("spent_added", 0.0))
        self.spent_per_step = float(state.get("spent_per_step", 0.0))
        self.training_steps = int(state.get("training_steps", 0))
        self.first_hyper = float(state.get("first_hyper", 0.0))
        self.last_hyper = float(state.get("last_hyper", 0.0))
        self.product_cost = float(state.get("product_cost", 0.0))
        self.fixed_cost = float(state.get("fixed_cost", 0.0))
        self._mark = None


class _AddedWork:
    """:meth:`OverheadBudget.added_work`'s context (a class, not a generator: the hooks enter one
    at every training step, and what the bookkeeping costs outside its clock readings counts as
    training)."""

    __slots__ = ("budget", "every_step", "start")

    def __init__(self, budget: OverheadBudget, every_step: bool) -> None:
        self.budget, self.every_step, self.start = budget, every_step, 0.0

    def __enter__(self) -> None:
        self.budget._open.append(0.0)  # the time the work nested in this one takes
        self.start = self.budget.clock()
        self.budget.work.begin(self.start)

    def __exit__(self, *exc: object) -> None:
        now = self.budget.clock()
        self.budget.work.end(now)
        self.budget._charge(now - self.start, self.every_step)


class _SharedWork:
    """Added work of a callback without a budget, timed for the others' (:class:`HyperWork`)."""

    __slots__ = ("work",)

    def __init__(self, work: HyperWork) -> None:
        self.work = work

    def __enter__(self) -> None:
        self.work.begin(self.work.clock())

    def __exit__(self, *exc: object) -> None:
        self.work.end(self.work.clock())


_NOTHING: AbstractContextManager[None] = nullcontext()


@dataclass
class PlannedBudget(OverheadBudget):
    """The hyper steps of a fit of known length planned from its length: what the fit can still
    spend, shared evenly among the hyper steps still due (eq. budgetplan),

        share = (credit + remaining · payback) / due_left,    part = max(share, credit),
        a due hyper step runs when part (+ the first's curvature allowance) pays for its
        products at their measured cost (its predicted minimum, for the fit's last one),

    with :meth:`OverheadBudget.ceiling`'s ``credit + remaining · payback`` (what the steps so far
    left unspent plus what the remaining steps pay back) and ``due_left`` the hyper steps due
    from now to the end of the fit, this one included. A hyper step may spend its part; the
    first, whose curvature estimate sets the adjoint's step size, may spend on that estimate
    ``curvature_share`` of all the fit can still spend, as under :class:`OverheadBudget` (later
    estimates get that share of their part; a retry after a divergence, or a refresh, is
    afforded while it fits in ``curvature_share`` of all the fit can still spend on top of the
    part, :class:`PlannedDeadline` — without it the main job's due hyper steps were given up
    after diverged solves, "no room to retry", 6 of 20). What a hyper step spends
    beyond its share is taken from the shares of all the hyper steps still due, not paid back
    before the next one runs: :class:`OverheadBudget` ran 9–12 of the 19 due hyper steps of a
    384-step fit (an MLP on 20 Newsgroups), its first holding λ still from step 20 to 110. The
    fixed part of a hyper step (its validation gradient, outer step, checks) is counted once
    measured on two hyper steps (the first's holds one-off work). The fit's final share stays
    within ``max_overhead``, give or take what its last hyper step spends beyond its predicted
    minimum; before the end it may run above it, a debt the steps still to come pay back. Where
    the fit's length is unknown: :class:`OverheadBudget`'s rule.
    """

    def share(self, remaining_steps: int, products: int, due_left: int) -> float:
        """This hyper step's part of what the fit can still spend (eq. budgetplan)."""
        return self.ceiling(remaining_steps, products) / max(due_left, 1)

    def _plan(self, remaining_steps: int, products: int, due_left: int) -> tuple[float, float]:
        """(part, curvature allowance) of the next hyper step (eq. budgetplan)."""
        part = max(self.share(remaining_steps, products, due_left), self.credit, 0.0)
        if self.hyper_steps:
            return part, self.curvature_share * part
        return part, self.curvature_share * max(self.ceiling(remaining_steps, products), 0.0)

    def allows(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> bool:
        """Its part (eq. budgetplan) pays for the hyper step's ``products`` products at their
        measured cost and the fixed part measured so far (the fit's last: its predicted
        minimum); with one-off work announced before it (:attr:`one_off`), all the fit can still
        spend pays for that work and the hyper step's predicted minimum, and the part is planned
        from what is left after the work; without the fit's length,
        :meth:`OverheadBudget.allows`."""
        if remaining_steps is None or due_left is None or not self.training_steps:
            return super().allows(remaining_steps, products, due_left)
        part, curvature = self._plan(remaining_steps, products, due_left)
        if due_left <= 1:
            need = self.predicted(products)
        else:
            need = products * self.product_cost + self.fixed_cost * (self.hyper_steps >= 2)
        ok = part + curvature * (not self.hyper_steps) >= need
        if self.one_off > 0:
            ok = ok and self.ceiling(remaining_steps, products) >= self.predicted(products)
        self.skipped += not ok
        return ok

    def allowance(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> Allowance:
        """A :class:`Deadline` of its part from now, the first's curvature allowance on top
        (eq. budgetplan)."""
        if remaining_steps is None or due_left is None:
            return super().allowance(remaining_steps, products, due_left)
        part, curvature = self._plan(remaining_steps, products, due_left)
        now, extra = self.clock(), curvature * (not self.hyper_steps)
        spare = self.curvature_share * max(self.ceiling(remaining_steps, products), 0.0)
        return PlannedDeadline(
            self, now + part + extra, now + curvature, self.predicted(0), now + part + spare
        )


@dataclass
class PacedBudget(OverheadBudget):
    """:class:`OverheadBudget` with the first hyper step's one-off excess amortised over the fit
    (eq. budgetpace): where the fit's length is known, a due hyper step runs while

        credit ≥ −E · remaining / total,   E = max(first − typical, 0)           (eq. budgetpace)

    and ``ceiling ≥ predicted`` (:meth:`OverheadBudget.allows`'s end-of-fit rule, unchanged),
    with ``first`` the first hyper step's cost (its first curvature estimate), ``typical`` the
    mean of the hyper steps after it (before the second: the predicted minimum of the next),
    ``remaining`` the training steps left and ``total`` the fit's length (the steps counted so
    far + remaining). The first hyper step's excess E is a debt repaid at E / total per training
    step, evenly to the end, instead of before the next hyper step runs: under
    :class:`OverheadBudget` the first (its curvature estimate, step 20) held λ still until step
    102–110 of a 384-step fit (an MLP on 20 Newsgroups). Any other debt (a refresh, a retry) is
    paid back before the next hyper step, as under :class:`OverheadBudget`; the end-of-fit rule
    keeps the fit's final share within ``max_overhead``, give or take what its last hyper step
    spends beyond its predicted minimum. Where the fit's length is unknown:
    :class:`OverheadBudget`'s rule. Unlike :class:`PlannedBudget` (eq. budgetplan), nothing but
    the first hyper step's excess is shared out.
    """

    def first_excess(self, products: int = 0) -> float:
        """E of eq. budgetpace: what the first hyper step cost beyond a typical one (0 before
        it)."""
        if not self.hyper_steps:
            return 0.0
        if self.hyper_steps >= 2:
            own = self.spent_hyper - self.spent_added  # the hyper steps', the added work not
            typical = (own - self.first_hyper) / (self.hyper_steps - 1)
        else:
            typical = self.predicted(products)
        return max(self.first_hyper - typical, 0.0)

    def debt_allowed(self, remaining_steps: int, products: int = 0) -> float:
        """How far below 0 the credit may be for a due hyper step to run (eq. budgetpace)."""
        total = self.training_steps + remaining_steps
        return self.first_excess(products) * remaining_steps / total if total > 0 else 0.0

    def allows(
        self, remaining_steps: int | None = None, products: int = 0, due_left: int | None = None
    ) -> bool:
        """Eq. budgetpace where the fit's length is known (its first hyper step's excess
        amortised to the end, the end-of-fit rule kept), else :meth:`OverheadBudget.allows`."""
        if remaining_steps is None or not self.training_steps:
            return super().allows(remaining_steps, products, due_left)
        ok = self.credit >= -self.debt_allowed(remaining_steps, products)
        ok = ok and self.ceiling(remaining_steps, products) >= self.predicted(products)
        self.skipped += not ok
        return ok


def _synchronizer(kind: str) -> Callable[[], None] | None:
    """What waits for the queued work of a device of this kind (nothing on the CPU)."""
    if kind == "cpu":
        return None
    try:
        return torch.get_device_module(kind).synchronize
    except (RuntimeError, AttributeError):  # a device type without a torch module (meta)
        return None


_BUDGET_KEYS = (
    "spent_training", "spent_hyper", "hyper_steps", "skipped", "spent_added", "spent_per_step",
    "training_steps",
    "first_hyper", "last_hyper", "product_cost", "fixed_cost",
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


def make_budget(max_overhead: float | None | Budget, who: str = "") -> Budget:
    """``max_overhead`` as a :class:`Budget`: None → :class:`NoBudget`, a number →
    :class:`OverheadBudget` (a dear hyper step is paid back before the next one runs;
    ``PlannedBudget(0.5)``, eq. budgetplan, shares it among the hyper steps still due instead;
    ``PacedBudget(0.5)``, eq. budgetpace, repays only the first one's excess, to the end of the
    fit), a Budget as it is. A refused number is refused in the name of ``who`` (the object
    whose setting it is, e.g. ``"LearnedWeightDecay: "``; session 61 left it nameless), and so
    is a percent-like one's warning (session 62 said it as "hypertorch_sid:")."""
    if max_overhead is None:
        return NoBudget()
    if isinstance(max_overhead, Budget):
        return max_overhead
    return OverheadBudget(max_overhead, who=who)
