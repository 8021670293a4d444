"""Whether the trained weights change between two optimizer steps, outside the optimizer
(session 63).

The hyper steps model the training as the optimizers' steps on ℓ̂: w ← w − (the update). A
hook or another callback that edits the weights between steps — a ``clamp_`` (WGAN's weight
clipping), a max-norm ``renorm_``, a re-initialisation of dead units — makes the training a
projected (or reset) one, whose fixed point the hypergradient does not differentiate: the
hyperparameters were tuned for another training, without a word.

Watched every ``every_n_steps`` optimizer steps: right after an update, the norm of every
tensor the optimizer trains (one fused ``_foreach_norm``, no read of the device), then at the
next step's start, before any change of the gradient, the same norms again (one read). Weights
swapped out and put back in between (an EMA's validation) have their norms back bit for bit
and are not said. Automatic optimisation with one optimizer only (the steps' order is then
Lightning's).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from .problem import named_tensors


class MovedWeights:
    """The watch (module docstring) of one fit; ``who`` names the callback in its warning."""

    def __init__(self, who: str, every_n_steps: int) -> None:
        self.who, self.every = who, max(1, int(every_n_steps))
        self._held: tuple[int, Any, list[Tensor], Tensor] | None = None
        self.said = False

    def note(self, trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> None:
        """After ``optimizer``'s update: hold its tensors' norms, every ``every`` steps."""
        if self.said or not _watched(trainer) or trainer.global_step % self.every:
            return
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if params:
            with torch.no_grad():
                norms = torch.stack(torch._foreach_norm(params))
            self._held = (trainer.global_step, optimizer, params, norms)

    def check(
        self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """At the next step of ``optimizer``, before any change: the norms must be those held."""
        held, self._held = self._held, None
        if held is None or self.said:
            return
        step, holder, params, before = held
        if holder is not optimizer or trainer.global_step != step + 1:
            return  # another step between (a tuner's restore, a resumed fit)
        with torch.no_grad():
            now = torch.stack(torch._foreach_norm(params))
        moved = ~((now == before) | (now.isnan() & before.isnan()))
        if not bool(moved.any()):
            return
        self.said = True
        names = {id(p): n for n, p in named_tensors(module)}
        said = [names.get(id(p), "an unnamed tensor") for p, m in zip(params, moved) if m]
        rank_zero_warn(
            f"{self.who}: {', '.join(said[:4])}{' ...' if len(said) > 4 else ''} changed "
            f"between optimizer steps {step} and {step + 1}, outside the optimizer (a clamp_, "
            "a renorm_ or a re-initialisation in a hook or another callback?): the hyper steps "
            "model the training as the optimizer's steps alone, so the hyperparameters are "
            "tuned for a training without that change. Put a constraint inside the model "
            "(torch.nn.utils.parametrize, e.g. w = c·tanh(v)) or the loss, where the "
            "hypergradient sees it; weights swapped out and put back (an EMA's validation) "
            "are not concerned."
        )


def _watched(trainer: pl.Trainer) -> bool:
    module = trainer.lightning_module
    return module is not None and module.automatic_optimization and len(trainer.optimizers) == 1
