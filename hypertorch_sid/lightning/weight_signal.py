"""Whether the learned data weights carry more signal than a random walk (session 63).

Each visit moves a row's logit by about ``outer_lr`` whatever the size of its hypergradient
(``LazyAdam``, β₁ = 0, each row scaled by its own second moment). Where the validation data
tells rows apart, a row the data distrusts is pushed the same way visit after visit and its
logit drifts; where it does not (session 63: a VAE's outlier images, the generalized cross
entropy, a char-CNN on noisy labels), every row's steps change sign at random, the weights
random-walk, the effective sample shrinks and the test loss rises above plain training's.

:class:`WeightSignal` tells the two apart from the fit's own logits, without the truth. Before
each hyper step (a new adjoint v) it takes every row's step since the last one, dᵢₖ — all of
it taken under one v: the hyper step's own outer step and the training cross term's visits —
less the median step (a gauge or a common shift moves every row alike), and adds it to
Sᵢ = Σₖ dᵢₖ and Qᵢ = Σₖ dᵢₖ². For steps of random sign, independent from one v to the next,
E[Sᵢ²] = E[Qᵢ] whatever their sizes, so

    R = Σᵢ Sᵢ² / Σᵢ Qᵢ                                                      (eq. drift)

is about 1 for a random walk and grows with the number of hyper steps where rows drift: with a
share p of rows moved one way under each of K vs, R ≈ (1 − p) + p·K. R weighs each row by its
steps' size, so a few rows with large steps that walk can hide many that drift (stochastic
depth, seed 2: R 1.29 at AUC 0.88); the median of zᵢ² = Sᵢ²/Qᵢ, each row by its own steps,
reads those (1.55 there). Both are read over the first k hyper steps, k ≥ :data:`MIN_STEPS`,
and the largest kept (a long fit holds rows where they drifted to, and their later steps go
back and forth); the weights are said to carry no signal only where both are low. Epochs are
no unit here: under one v a row's hypergradient keeps its sign, so a v held for several epochs
reads as a drift counted per epoch, and per hyper step as overshoot (R below 1): hyper steps
more than :data:`MAX_EPOCHS_PER_STEP` epochs apart are not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: R (eq. drift) at or below this, with the median zᵢ² at or below :data:`NO_SIGNAL_MEDIAN`,
#: reads as "no more signal than a random walk". Measured (session 63, docs/data_weights.md):
#: the recipes whose weights did not separate (AUC 0.51–0.66: a VAE's outliers, GCE, a
#: char-CNN) R 0.86–1.15 and median 0.71–1.15; those that did (AUC 0.88–0.96: SAM, R-Drop,
#: stochastic depth, SupCon, the noisy-label CNN) R 1.41–2.01 and median 1.41–2.13 (the
#: largest over the first k ≥ 4 hyper steps; nosig63.txt in benchmarks/results/user_recipes/s63).
NO_SIGNAL_DRIFT = 1.25
#: the median zᵢ² at or below which (with R at or below :data:`NO_SIGNAL_DRIFT`) no signal is read
NO_SIGNAL_MEDIAN = 1.3
#: intervals between hyper steps with steps (after the weights first moved) needed to read R
MIN_STEPS = 4
#: the fewest effective steps nᵢ = Qᵢ² / Σₖ dᵢₖ⁴ the median row (of those that moved) needs for
#: a reading: a row moved in one interval only (nᵢ ≈ 1, whatever small shifts a gauge adds in
#: the others) has Sᵢ² ≈ Qᵢ whatever its drift, so where rows move in few of the intervals (only
#: in the hyper steps' own minibatches, ``cross_term="hyper_step"``; a fit of less than an epoch
#: with hyper steps every few steps) R reads about 1 whether or not the weights separate
#: (session 64: such fits of the tests read R 1.00–1.16, median 1.0, nᵢ 1.00–1.02, and were
#: reset; rows stepping in each of 4 intervals, by steps of varied size, read nᵢ about 2)
MIN_EFFECTIVE_STEPS = 1.5
#: the most epochs between hyper steps (median) at which R is read. With v held longer each row
#: takes several steps the same way under it, overshoots and comes back under the next v: the
#: rows of the networks test (a hyper step every 4 epochs, AUC 0.76–0.93) read R 0.65–0.91.
MAX_EPOCHS_PER_STEP = 2.0


@dataclass(frozen=True)
class SignalReading:
    """What :class:`WeightSignal` read at a fit's end (eq. drift).

    ``drift``: R, about 1 for weights that random-walk; ``median``: the median over rows of
    zᵢ² = Sᵢ²/Qᵢ; ``steps``: the intervals between hyper steps summed; ``rows``: the rows that
    moved; ``separates``: R above :data:`NO_SIGNAL_DRIFT` or the median above
    :data:`NO_SIGNAL_MEDIAN`."""

    drift: float
    median: float
    steps: int
    rows: int

    @property
    def separates(self) -> bool:
        """True where the weights drifted more than a random walk of the same steps would."""
        return self.drift > NO_SIGNAL_DRIFT or self.median > NO_SIGNAL_MEDIAN

    def advice(self) -> str | None:
        """The warning for weights that carry no more signal than noise; None where they do."""
        if self.separates:
            return None
        return (
            f"the learned weights carry no more signal than a random walk: over {self.steps} "
            "hyper steps each row's logit moved back and forth as a random walk of its own "
            f"steps would (over {self.rows} rows, net drift² / summed step² R = "
            f"{self.drift:.2f} and each row's own ratio's median {self.median:.2f}: about 1 for "
            f"a random walk; weights that tell rows apart read above {NO_SIGNAL_DRIFT:g} / "
            f"{NO_SIGNAL_MEDIAN:g}). Such weights only shrink the effective sample: on session "
            "63's recipes where this happened (a VAE's outlier images, the generalized cross "
            "entropy, a char-CNN on noisy labels) the test loss was worse than plain training's "
            "on 15 of the 17 fits it was said on (by up to 1.5), better on 2 char-CNN fits; "
            "on session 64's hinge-loss and trusted + untrusted recipes it was said on fits "
            "whose weights told rows apart weakly (AUC 0.7–0.8) and beat plain training. "
            "Compare with a fit without LearnedDataWeights on validation accuracy before "
            "deploying; LearnedDataWeights(no_signal=ResetWeights()) (hypertorch_sid.lightning."
            "no_signal) resets such weights half-way through the fit (docs/data_weights.md, "
            "session 64). "
            "flagged() is then no list of bad examples (docs/data_weights.md, session 63)."
        )


class WeightSignal:
    """Sᵢ and Qᵢ of eq. drift, kept on the logits' device, read at the fit's end."""

    def __init__(self) -> None:
        self._last: Tensor | None = None
        self._sum: Tensor | None = None
        self._squares: Tensor | None = None
        self._fourth: Tensor | None = None  # Σₖ dᵢₖ⁴ (each row's effective steps)
        self.steps = 0
        self._prefixes: list[tuple[float, float, int, float]] = []  # (R, median, rows, visits)
        self._spans: list[float] = []  # epochs between the hyper steps summed

    def observe(self, logits: Tensor, epochs: float = 1.0) -> None:
        """Add the steps since the last call, ``epochs`` of training ago (the first only
        records where the rows are; a call after no step adds nothing)."""
        x = logits.detach().double()
        last = self._last if self._last is None else self._last.to(x.device)
        if self._sum is not None and self._squares is not None:  # a checkpoint's: CPU
            self._sum, self._squares = self._sum.to(x.device), self._squares.to(x.device)
        if self._fourth is not None:
            self._fourth = self._fourth.to(x.device)
        self._last = x.clone()
        if last is None or last.shape != x.shape:
            self._sum, self._squares, self._fourth = None, None, None
            self.steps, self._prefixes, self._spans = 0, [], []
            return
        d = x - last
        d = d - d.median()
        if not bool((d != 0).any()):
            return
        if self._sum is None or self._squares is None or self._fourth is None:
            self._sum, self._squares = torch.zeros_like(x), torch.zeros_like(x)
            self._fourth = torch.zeros_like(x)
        self._sum += d
        self._squares += d * d
        self._fourth += (d * d).square()
        self.steps += 1
        self._spans.append(epochs)
        if self.steps >= MIN_STEPS:
            self._prefixes.append(self._read())

    def _read(self) -> tuple[float, float, int, float]:
        """R, the median zᵢ², the rows that moved and their median effective steps
        (:data:`MIN_EFFECTIVE_STEPS`), of the steps so far."""
        assert self._sum is not None and self._squares is not None and self._fourth is not None
        moved = self._squares > 0
        z2 = self._sum[moved].square() / self._squares[moved]
        q = float(self._squares.sum())
        drift = float(self._sum.square().sum()) / q if q > 0 else math.nan
        if not len(z2):
            return drift, math.nan, 0, 0.0
        steps = self._squares[moved].square() / self._fourth[moved]
        return drift, float(z2.median()), int(moved.sum()), float(steps.median())

    def reading(self) -> SignalReading | None:
        """The largest R and the largest median zᵢ² over the fit's first k hyper steps, for
        every k from :data:`MIN_STEPS` on at which the median row took at least
        :data:`MIN_EFFECTIVE_STEPS` effective steps; None before that many intervals with
        steps, where the hyper steps were more than :data:`MAX_EPOCHS_PER_STEP` epochs apart
        (median, or of unknown length), where rows stepped in too few intervals or a reading is
        not finite.

        The largest over the first k, not the fit's own: once the rows have drifted apart a long
        fit holds them there, each row's later steps go back and forth about its place (the
        validation data holding it) and Q grows while S does not, so R of the whole fit falls
        below 1 where the weights separate (the networks test's 60 epochs, 14 hyper steps:
        0.67–0.89 at AUC above 0.65)."""
        read = [
            r
            for r in self._prefixes
            if math.isfinite(r[0]) and math.isfinite(r[1]) and r[3] >= MIN_EFFECTIVE_STEPS
        ]
        span = sorted(self._spans)[len(self._spans) // 2] if self._spans else math.nan
        if not read or not span <= MAX_EPOCHS_PER_STEP:
            return None
        drift, median = max(r[0] for r in read), max(r[1] for r in read)
        return SignalReading(drift, median, self.steps, read[-1][2])

    def state_dict(self) -> dict[str, Any]:
        """Sᵢ, Qᵢ, Σₖ dᵢₖ⁴, the logits last seen and the readings so far (a resumed fit reads
        on)."""
        last, total, squares, fourth = (
            None if t is None else t.cpu().clone()
            for t in (self._last, self._sum, self._squares, self._fourth)
        )
        return {
            "last": last,
            "sum": total,
            "squares": squares,
            "fourth": fourth,
            "steps": self.steps,
            "prefixes": list(self._prefixes),
            "spans": list(self._spans),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint's, on the CPU: moved where ``observe``'s
        logits are at its next call)."""
        self._last, self._sum, self._squares = state["last"], state["sum"], state["squares"]
        self._fourth = state["fourth"]
        self.steps = int(state["steps"])
        self._prefixes = [tuple(r) for r in state["prefixes"]]  # type: ignore[misc]
        self._spans = [float(e) for e in state["spans"]]
