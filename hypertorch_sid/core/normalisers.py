"""Statistics of all n rows kept from the rows that moved (eq. keptsum): the softmax's
normaliser and the gauges that fix the self-normalised loss's scale (mean logit, per class)."""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .sample_weights import SampleWeights

Tensors = list[Tensor]


# ---------------------------------------------------------------------- statistics of all n rows
class Normaliser(ABC):
    """A statistic of all n logits that the weights read, held within a hyper step and kept
    across outer steps: log Z of :class:`SoftmaxWeights` (:class:`SoftmaxNormaliser`), the mean
    logit x̄ of the mean-logit gauge (:class:`MeanLogitGauge`). The family owns one
    (:attr:`SampleWeights.normaliser`) and updates it after every outer step (its projection).

    With dense gradients (every row may move: ``torch.optim.Adam``) it is recomputed after
    every outer step, one pass over the n logits. With row-sparse ones (``sparse_grad=True``:
    the outer optimizer moves only the rows of its gradient, which a minibatch read) it is kept
    from a sum over the rows that moved,

        S = Σᵢ f(xᵢ − m),   S ← S + Σ_{i read} [f(xᵢ − m) − f(xᵢ° − m)],          (eq. keptsum)

    xᵢ° a row's logit when a minibatch read it (:meth:`read` keeps it until the outer step), m
    the statistic at the last full pass (f(z) = z for the mean logit, eᶻ for log Z), in
    float64: O(rows read) per outer step. Once the rows moved since the last full pass reach n
    (about n/b steps of b rows moved: every row read is kept, only those that changed count),
    S is recomputed in one pass, so the amortised cost stays O(rows) and the rounding drift is
    that of at most n/b updates of a float64 sum. So it is wherever the logits were written
    other than by an outer step on the rows read (a checkpoint restored, a ``copy_``: the
    tensor's version counter says so at the next read or step). A due full pass that finds
    the kept statistic off by more than rounding (an optimizer that moved rows it was not
    given, e.g. SGD with momentum on sparse gradients) says so once and recomputes after every
    step from then on. ``full_passes`` counts the passes over the n rows.
    """

    #: S right after a full pass, Σᵢ f(xᵢ − m): 0 for the mean, 1 for log Z
    START: float = 0.0
    #: |kept − recomputed| above DRIFT·(1 + |statistic|): rows moved that were not read
    DRIFT = 1e-9

    def __init__(self, family: SampleWeights) -> None:
        self.family = family
        self.full_passes = 0
        #: False once a full pass found rows moved that no minibatch had read
        self.trusted = True
        self._centre = torch.zeros((), dtype=torch.float64)  # m of eq. keptsum
        self._sum = torch.zeros((), dtype=torch.float64)  # S of eq. keptsum
        self._exact_for: tuple[Any, ...] | None = None  # the logits m and S are exact for
        self._reads: list[tuple[Tensor, Tensor]] = []
        self._read_rows = 0
        self._moved = 0  # rows moved since the last full pass

    # ------------------------------------------------------------------ what it is
    @staticmethod
    @abstractmethod
    def f(z: Tensor) -> Tensor:
        """f of eq. keptsum, elementwise."""

    @abstractmethod
    def statistic_of(self, x: Tensor) -> Tensor:
        """The statistic of all the logits ``x`` (float64), in one pass: m."""

    @abstractmethod
    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        """The statistic from m and S."""

    def in_range(self, total: Tensor) -> bool:
        """Whether S keeps its relative precision (else a full pass re-centres it)."""
        return True

    # ------------------------------------------------------------------ how it is kept
    @property
    def kept(self) -> bool:
        """Whether S is kept from the rows moved (eq. keptsum) rather than recomputed."""
        return self.family.sparse_grad and self.trusted

    def value(self) -> Tensor:
        """The statistic the weights read (float64, a 0-d tensor): that of the logits after the
        last outer step, recomputed where anything else wrote them since."""
        if self._exact_for != self._logits_now():
            self.full_pass()
        return self.value_of(self._centre, self._sum)

    def read(self, index: Tensor, rows: Tensor) -> None:
        """A minibatch reads the rows ``index`` (``rows``: their logits now), which the next
        outer step may move: their values are kept until then (at most n of them)."""
        if not self.kept:
            return
        if self._exact_for != self._logits_now():
            self.full_pass()
        if self._read_rows <= self.family.n:
            self._reads.append((index, rows.detach().clone()))
            self._read_rows += int(index.numel())

    @torch.no_grad()
    def full_pass(self) -> None:
        """m ← the statistic of the n logits, S ← its value at m (``START``): one pass."""
        self._centre = self.statistic_of(self.family.logits.detach().double())
        self._sum = torch.full_like(self._centre, self.START)
        self._settle(moved=0)
        self.full_passes += 1

    def _logits_now(self) -> tuple[Any, ...]:
        """What identifies the logits' values (an in-place write bumps the version)."""
        x = self.family.logits
        return (x._version, x.data_ptr(), x.dtype, x.device)

    def _settle(self, moved: int) -> None:
        self._exact_for = self._logits_now()
        self._reads, self._read_rows, self._moved = [], 0, moved

    @torch.no_grad()
    def update(self) -> None:
        """After an outer step: eq. keptsum over the rows it moved, or a full pass where due."""
        if not self.kept:
            self.step_full()
            return
        if self._exact_for == self._logits_now():
            return  # nothing moved
        if not self._reads or self._read_rows > self.family.n:
            self.step_full()  # written without a read to account for it, or too many reads
            return
        index = torch.cat([i for i, _ in self._reads])
        before = torch.cat([r for _, r in self._reads])
        rows, inverse = torch.unique(index, return_inverse=True)
        old = before.new_empty(rows.shape).scatter_(0, inverse, before).double()
        new = self.family.logits.detach().index_select(0, rows).double()
        total = self._sum + (self.f(new - self._centre) - self.f(old - self._centre)).sum()
        if not bool(torch.isfinite(total)):  # a non-finite step: λ is restored, then re-read
            self._exact_for, self._reads, self._read_rows = None, [], 0
            return
        moved = self._moved + int((new != old).sum())  # rows read that the step moved
        if moved < self.family.n and self.in_range(total):
            self._sum = total
            self._settle(moved)
            return
        kept = self.value_of(self._centre, total)
        exact = self.statistic_of(self.family.logits.detach().double())
        if float((kept - exact).abs()) > self.DRIFT * (1 + float(exact.abs())):
            self._untrusted(kept, exact)
        self.step_full()

    def step_full(self) -> None:
        """After an outer step, one pass over the n rows."""
        self.full_pass()

    def offset(self) -> Tensor | None:
        """A common shift the weights read the stored logits with (None: none)."""
        return None

    def check_held(self) -> None:
        """Before the weights are read: say where what this statistic holds in place was not
        held since the logits last moved (nothing here)."""
        return None

    def log_partition(self) -> Tensor | None:
        """log Z that softmax weights divide by (float64; None: this statistic is no log Z)."""
        return None

    def release(self) -> None:
        """Before the family stops keeping this statistic (another gauge or gradient)."""
        return None

    def _untrusted(self, kept: Tensor, exact: Tensor) -> None:
        self.trusted = False
        warnings.warn(
            f"{type(self).__name__}: the outer step moved rows of the {self.family.n} logits "
            f"that no minibatch had read (kept {float(kept):.10g}, recomputed "
            f"{float(exact):.10g}): with sparse_grad=True the outer optimizer must move only the "
            "rows of its gradient (LazyAdam, or SGD without momentum). It is recomputed over "
            "all n rows after every outer step from now on.",
            UserWarning,
            stacklevel=2,
        )


class LogitMean(Normaliser):
    """The mean logit x̄ (eq. keptsum with f(z) = z) and x₀, the logit of the starting weight:
    what the mean-logit gauges hold (:class:`MeanLogitGauge` over all rows,
    :class:`ClassMeanLogitGauge` per class)."""

    START = 0.0

    @staticmethod
    def f(z: Tensor) -> Tensor:
        return z

    def statistic_of(self, x: Tensor) -> Tensor:
        return x.mean()

    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        return centre + total / self.family.n

    @property
    def x0(self) -> float:
        family = self.family
        return family.parameterization.logit(family.initial_weight, family.n)


class MeanLogitGauge(LogitMean):
    """The mean logit x̄ that ``SampleWeights(gauge="mean_logit")`` holds at x₀.

    With dense gradients each outer step is followed by the shift x ← x − (x̄ − x₀) of every
    row. With row-sparse ones the shift is held, not applied: the weights read
    ωᵢ = T(xᵢ − c), c = x̄ − x₀ (:meth:`SampleWeights.logits_of`; x̄ kept by eq. keptsum with
    f(z) = z), the same numbers to rounding at O(rows) per step, and c is folded into the
    logits (the shift applied) at each full pass after a step. The stored logits then differ
    from the dense path's by c, one common shift that the self-normalised loss does not see;
    :meth:`SampleWeights.logits_of` and :meth:`SampleWeights.state_dict` give them shifted.
    """

    #: |x̄ − x₀| above HELD·(1 + |x₀|) after the logits moved: the dense shift was not applied
    HELD = 1e-5

    def offset(self) -> Tensor | None:
        """c = x̄ − x₀, the common shift the weights read the logits with (None: none held,
        the logits are shifted in place)."""
        return self.value() - self.x0 if self.kept else None

    @torch.no_grad()
    def step_full(self) -> None:
        """x ← x − (x̄ − x₀) in place, then x̄ in one pass."""
        x = self.family.logits
        x.sub_(x.mean() - self.x0)
        if self.kept:
            self.full_pass()
        else:  # x̄ = x₀ now; nothing else reads it
            self.full_passes += 1
            self._held_for = self._logits_now()

    @torch.no_grad()
    def check_held(self) -> None:
        """With dense gradients the shift is applied by the family's projection after each
        outer step: one left out (``SIDHyperOptimizer`` without ``FeasibleSet(project=
        weights.projection)``) left x̄ to drift, the gauge asked for silently not held (session
        56: x̄ 0.09 after 8 steps). Read once per change of the logits (one pass); said once."""
        if self.kept or getattr(self, "_said_unheld", False):
            return
        now = self._logits_now()
        if getattr(self, "_held_for", None) == now:
            return
        self._held_for = now
        drift = float(self.family.logits.detach().double().mean()) - self.x0
        if abs(drift) > self.HELD * (1 + abs(self.x0)):
            self._said_unheld = True
            warnings.warn(
                f"SampleWeights(gauge='mean_logit'): the mean logit is {drift:+.3g} off x₀ "
                "since the logits last moved: the gauge is held by weights.projection after "
                "each outer step, which did not run. Pass "
                "config=SIDConfig(feasible_set=FeasibleSet(project=weights.projection)) to "
                "SIDHyperOptimizer (HyperOptimizationCallback(feasible_set=...) under "
                "Lightning), or call weights.projection() after each outer step.",
                UserWarning,
                stacklevel=4,
            )

    @torch.no_grad()
    def release(self) -> None:
        c = self.offset()
        if c is not None and float(c) != 0.0:
            self.family.logits.sub_(c.to(self.family.logits.dtype))


class ClassMeanLogitGauge(LogitMean):
    """Each class's mean logit held at x₀ (:meth:`SampleWeights.use_class_gauge`, the drop-in's
    ``gauge="class"``): after every outer step the rows labelled c are shifted by one common
    amount,

        xᵢ ← xᵢ − (x̄_c − x₀)  for every row i of class c, x̄_c their mean logit,  (eq. classgauge)

    so the weights can still order the examples within a class (a wrong label below a right
    one) but cannot push a whole class down: the weighted class shares stay near the unweighted
    ones, not the prior that the validation objective rewards on a short fit (session 50: 20
    Newsgroups, whole classes at mean ω 0.32–0.35, accuracy 0.64 against plain 0.79). Rows with
    no label yet (not visited) or a negative one are not shifted. ``labels()`` gives each row's
    integer label (a long tensor of shape (n,), negative where none), or None (nothing held).

    The shift is applied in place on both paths (dense and ``sparse_grad``), one pass over the n
    rows per outer step (an ``index_add`` and a subtraction), like the dense mean-logit gauge:
    no shift is held, so the stored logits are the weights' own and every reader (checkpoints
    included) sees them as they are. Sigmoid parameterisations only.
    """

    def __init__(self, family: SampleWeights, labels: Callable[[], Tensor | None]) -> None:
        super().__init__(family)
        self.labels = labels

    def read(self, index: Tensor, rows: Tensor) -> None:
        return None  # nothing kept between steps: every step recomputes the class means

    def _classes(self) -> tuple[Tensor, Tensor] | None:
        """(the labelled rows' mask, their labels), or None where no row has a label."""
        labels = self.labels()
        if labels is None or labels.shape != (self.family.n,):
            return None
        labels = labels.to(self.family.logits.device)
        known = labels >= 0
        return (known, labels[known]) if bool(known.any()) else None

    @torch.no_grad()
    def class_means(self) -> Tensor | None:
        """x̄_c of every class 0..max label (float64; NaN for a class without rows), or None."""
        classes = self._classes()
        if classes is None:
            return None
        known, y = classes
        k = int(y.max()) + 1
        x = self.family.logits.detach()[known].double()
        sums = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, y, x)
        counts = torch.bincount(y, minlength=k).double()
        return sums / counts  # 0/0: NaN for a class with no row

    @torch.no_grad()
    def update(self) -> None:
        """After an outer step: eq. classgauge, in place (one pass over the n rows)."""
        means = self.class_means()
        if means is None:
            return
        known, y = self._classes()  # type: ignore[misc]
        shift = torch.nan_to_num(means - self.x0, nan=0.0)
        x = self.family.logits
        delta = torch.zeros_like(x)
        delta[known] = shift[y].to(x.dtype)
        x.sub_(delta)
        self.full_passes += 1
        self._held_for = self._logits_now()

    def step_full(self) -> None:
        self.update()

    @torch.no_grad()
    def check_held(self) -> None:
        """The class means are held by the family's projection after each outer step: one left
        out (``SIDHyperOptimizer`` without ``FeasibleSet(project=weights.projection)``) let whole
        classes sink or rise, the gauge asked for silently not held (session 57: as the mean-logit
        gauge's, session 56). Read once per change of the logits the projection did not make
        (one pass); said once."""
        if getattr(self, "_said_unheld", False):
            return
        now = self._logits_now()
        if getattr(self, "_held_for", None) == now:
            return
        self._held_for = now
        means = self.class_means()
        if means is None:
            return
        drift = torch.nan_to_num(means - self.x0, nan=0.0)
        worst = int(drift.abs().argmax())
        if float(drift[worst].abs()) > MeanLogitGauge.HELD * (1 + abs(self.x0)):
            self._said_unheld = True
            warnings.warn(
                f"SampleWeights class gauge: class {worst}'s mean logit is "
                f"{float(drift[worst]):+.3g} off x₀ since the logits last moved: the gauge is "
                "held by weights.projection after each outer step, which did not run. Pass "
                "config=SIDConfig(feasible_set=FeasibleSet(project=weights.projection)) to "
                "SIDHyperOptimizer (HyperOptimizationCallback(feasible_set=...) under "
                "Lightning), or call weights.projection() after each outer step.",
                UserWarning,
                stacklevel=4,
            )


#: The class gauges by name (:meth:`SampleWeights.use_class_gauge`): each centres the training
#: rows' cross term on its class (:func:`~hypertorch_sid.core.weighted_loss.class_centred`, eq.
#: classcentre) and holds after every outer step what its entry names: ``"class"`` each class's
#: mean logit (:class:`ClassMeanLogitGauge`, session 50), ``"class_centred"`` nothing, as
#: ``"batch"`` (session 52: the centred gradient has no part common to a class or to the batch
#: left to hold, and the per-class hold cost the imbalanced recipe under a
#: ``WeightedRandomSampler`` 1.3–1.6 points, docs/data_weights.md).
CLASS_GAUGES: dict[str, type[ClassMeanLogitGauge] | None] = {
    "class": ClassMeanLogitGauge,
    "class_centred": None,
}


class SoftmaxNormaliser(Normaliser):
    """log Z = logsumexp(x) of :class:`SoftmaxWeights`, kept by eq. keptsum with f(z) = eᶻ
    around the last full pass's log Z (S starts at 1; once it leaves [½, 2] a full pass
    re-centres it, so a row's term cannot overflow and the sum keeps its relative precision)."""

    START = 1.0

    @staticmethod
    def f(z: Tensor) -> Tensor:
        return torch.exp(z)

    def statistic_of(self, x: Tensor) -> Tensor:
        return torch.logsumexp(x, 0)

    def value_of(self, centre: Tensor, total: Tensor) -> Tensor:
        return centre + torch.log(total)

    def in_range(self, total: Tensor) -> bool:
        return 0.5 <= float(total) <= 2.0

    def log_partition(self) -> Tensor:
        return self.value()
