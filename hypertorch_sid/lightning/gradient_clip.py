"""Whether ``Trainer(gradient_clip_val=...)`` binds late in a learned decay's fit (session 64).

Lightning clips the data gradient before the optimizer's step, and the decay is added after the
clip (as torch's own ``weight_decay=`` is, inside the step). Where the clip binds, scaling the
gradient by c = gradient_clip_val / ‖∇ℓ‖ < 1, the training settles where c·∇ℓ + λw = 0: the
decay λ/c, not the λ applied; the hyper steps model ∇ℓ + λw = 0, so λ is tuned for another
training (session 64: a clip of 0.1 against gradients of norm 0.7 late in a 1,600-step ridge
fit drove λ to its floor, and the validation loss ended 13 % above the best fixed decay under
the same clip). A clip that binds only early (large first gradients) leaves the fixed point
alone and is not said; nor is a clip under a decoupled decay with an optimizer that divides by
its gradients' second moment (AdamW): its fixed point P⁻¹∇ℓ + λw = 0 has P = √v̂ + ε, which
scales with c, so c cancels.

Read every ``every_n_steps`` optimizer steps, before the clip (Lightning's
``on_before_optimizer_step``): one fused norm of the optimizer's gradients and one read of the
device. Said once, where the clip scaled the gradient by less than :data:`BINDING` at each of
the last :data:`READINGS` readings, all in the fit's second half. ``gradient_clip_algorithm=
"value"`` (an element-wise clamp) is not read.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn

from .optimizer_decay import stepping
from .training_length import planned_steps

#: a clip factor c below this is a clip that binds (the gradient at most halved)
BINDING = 0.5
#: how many readings in a row, in the fit's second half, must each see the clip bind
READINGS = 6


class BindingClip:
    """The watch (module docstring) of one fit; ``who`` names the callback in its warning."""

    def __init__(self, who: str, every_n_steps: int, decoupled: bool = False) -> None:
        self.who, self.every = who, max(1, int(every_n_steps))
        self.decoupled = decoupled
        self._norms: deque[float] = deque(maxlen=READINGS)
        self.said = False

    def read(self, trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> None:
        """Before Lightning clips ``optimizer``'s gradients: their norm, every ``every`` steps
        of the fit's second half, and the warning once the clip bound at each of the last
        :data:`READINGS`."""
        clip = trainer.gradient_clip_val
        if self.said or not clip or (trainer.gradient_clip_algorithm or "norm") != "norm":
            return
        step, planned = trainer.global_step, planned_steps(trainer)
        if step % self.every or not math.isfinite(planned) or step < planned / 2:
            return
        if self.decoupled and _divides_by_second_moment(optimizer):
            return
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        with torch.no_grad():
            norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        if not math.isfinite(norm):
            return  # a step the GradScaler skips (or a diverged one): no clip factor to read
        self._norms.append(norm)
        factors = [min(1.0, float(clip) / n) if n > 0 else 1.0 for n in self._norms]
        if len(factors) == READINGS and max(factors) < BINDING:
            self.said = True
            self._say(float(clip), statistics.median(self._norms))

    def _say(self, clip: float, norm: float) -> None:
        c = clip / norm
        rank_zero_warn(
            f"{self.who}: Trainer(gradient_clip_val={clip:g}) clipped the gradient at each of "
            f"the last {READINGS} steps read, in the fit's second half: its norm was {norm:.3g} "
            f"(median), scaled by c ≈ {c:.2g}. The decay is added after the clip, so the "
            f"training settles where c·∇ℓ + λw = 0, a decay λ/c ≈ {1 / c:.2g}× the λ applied, "
            "while the hyper steps model ∇ℓ + λw = 0: λ is tuned for another training (a "
            "clip that binds only early in the fit does not matter). Raise gradient_clip_val "
            f"above the gradient's norm late in the fit (above {norm:.2g} here), or drop it."
        )


def _divides_by_second_moment(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (or the base it wraps) keeps a second moment of its gradients
    (Adam's ``exp_avg_sq``): a clip's factor c then cancels in a decoupled decay's fixed point."""
    return any("exp_avg_sq" in state for state in stepping(optimizer).state.values())
