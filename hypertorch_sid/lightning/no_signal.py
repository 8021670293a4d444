"""What ``LearnedDataWeights`` does where its weights carry no signal (session 64).

Session 63 read, at the fit's end, whether the learned per-sample weights moved more than a
random walk of their own steps (eq. drift, :mod:`~.weight_signal`), and warned where they did
not: such weights only shrink the effective sample, and the deployed model was worse than
plain training's (a VAE's outlier images +0.88 / +1.18 nats, the generalized cross entropy
+0.21, a char-CNN up to +0.14). Said at the end, the warning comes after the damage. The
variations here are the callback's ``no_signal=`` objects:

* :class:`WarnAtEnd` — learn the weights to the fit's end and say it there (session 63);
* :class:`ShrinkWeights` ``(keep, after)`` — read eq. drift once, after a share ``after`` of
  the fit's planned hyper steps; where it reads no signal, move every logit back toward its
  start, x ← x₀ + keep·(x − x₀), and learn the weights no further in this fit (the hyper steps
  and the training batches' cross term stop: the rest of the fit trains under the weights as
  they were left); said once, with the numbers;
* :class:`ResetWeights` ``(after)`` — :class:`ShrinkWeights` with ``keep=0``: every weight back
  at its start, so the rest of the fit is plain training.

The decision is taken once, from the logits, which every DDP rank holds alike (every rank
applies every row's step), and rank 0's is broadcast, so every rank settles at the same hyper
step. Where eq. drift gives no reading then (hyper steps far apart, rows that stepped in too
few intervals: :meth:`~.weight_signal.WeightSignal.reading`) nothing is done, and the fit's end
reads it as :class:`WarnAtEnd` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import ConfigurationError
from ..core.sample_weights import SampleWeights
from .weight_signal import MIN_STEPS, NO_SIGNAL_DRIFT, NO_SIGNAL_MEDIAN, SignalReading


class NoSignalPolicy:
    """What ``LearnedDataWeights`` does where eq. drift reads no signal (see the module)."""

    def judged_at(self, planned: float) -> int | None:
        """The interval k between hyper steps (k = 1 after the second hyper step) after which
        eq. drift is read during the fit, for a fit of ``planned`` intervals (inf: unknown);
        None: not during the fit (only at its end)."""
        return None

    def settle(self, weights: SampleWeights) -> str:
        """Act on ``weights`` that read no signal; what was done, for the warning. The base
        policy (judged only at the fit's end) leaves them as they are."""
        return "the weights were left as they are"


class WarnAtEnd(NoSignalPolicy):
    """Learn the weights to the fit's end and warn there where they read no signal (session
    63's behaviour): nothing changes during the fit."""

    def __repr__(self) -> str:
        return "WarnAtEnd()"


@dataclass(frozen=True)
class ShrinkWeights(NoSignalPolicy):
    """After a share ``after`` of the fit's planned hyper-step intervals (at least
    :data:`~.weight_signal.MIN_STEPS`, the fewest eq. drift reads), where the weights read no
    signal: x ← x₀ + keep·(x − x₀) for every logit, and no further hyper step or cross term in
    this fit."""

    keep: float = 0.5
    after: float = 0.5

    def __post_init__(self) -> None:
        name = type(self).__name__
        keep, after = self.keep, self.after
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 <= keep < 1:
            raise ConfigurationError(
                f"{name}: keep must be a number in [0, 1) (the share of each logit's move from "
                f"its start kept; 0 resets the weights), got {keep!r}."
            )
        if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 < after < 1:
            raise ConfigurationError(
                f"{name}: after must be a number in (0, 1) (the share of the fit's planned "
                f"hyper steps after which the weights are judged), got {after!r}."
            )

    def judged_at(self, planned: float) -> int | None:
        if not math.isfinite(planned):
            return MIN_STEPS
        return max(MIN_STEPS, math.ceil(self.after * planned))

    def settle(self, weights: SampleWeights) -> str:
        weights.shrink(self.keep)
        return f"every logit was moved back {1 - self.keep:.0%} of the way to its start"


@dataclass(frozen=True)
class ResetWeights(ShrinkWeights):
    """:class:`ShrinkWeights` with ``keep=0``: every weight back at its start (uniform), the
    rest of the fit plain training."""

    keep: float = 0.0

    def settle(self, weights: SampleWeights) -> str:
        weights.shrink(0.0)
        return "every weight was reset to its start (all examples weighted alike)"


def as_no_signal(policy: NoSignalPolicy) -> NoSignalPolicy:
    """``policy``, or a clear error naming the choices."""
    if not isinstance(policy, NoSignalPolicy):
        raise ConfigurationError(
            "LearnedDataWeights: no_signal must be a NoSignalPolicy: WarnAtEnd() (learn the "
            "weights to the end, warn there), ResetWeights(after=0.5) or "
            f"ShrinkWeights(keep=0.5, after=0.5) (from hypertorch_sid.lightning.no_signal), got "
            f"{policy!r}."
        )
    return policy


def planned_intervals(total: float, start_step: int, every_n_steps: int) -> float:
    """The intervals between hyper steps in a fit of ``total`` optimizer steps: one per hyper
    step (the last one's runs to the fit's end); inf where the length is unknown."""
    if not math.isfinite(total):
        return math.inf
    first = -(-max(start_step, 1) // every_n_steps) * every_n_steps
    return max(0, int(total) // every_n_steps - first // every_n_steps + 1)


def settled_advice(reading: SignalReading, step: int, done: str) -> str:
    """The warning said once where a policy acted at optimizer step ``step``."""
    return (
        f"after {reading.steps} hyper steps (optimizer step {step}) the learned weights carry no "
        "more signal than a random walk: each row's logit moved back and forth as a random walk "
        f"of its own steps would (over {reading.rows} rows, net drift² / summed step² R = "
        f"{reading.drift:.2f}, each row's own ratio's median {reading.median:.2f}; weights that "
        f"tell rows apart read above {NO_SIGNAL_DRIFT:g} / {NO_SIGNAL_MEDIAN:g}). Such weights "
        "only shrink the effective sample (session 63: the test loss worse than plain "
        f"training's). So {done}, and the "
        "weights are learned no further in this fit. LearnedDataWeights(no_signal=WarnAtEnd()) "
        "keeps learning them (docs/data_weights.md, session 64)."
    )
