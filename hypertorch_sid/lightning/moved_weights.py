"""Whether the trained weights change between two optimizer steps, outside the optimizer
(session 63).

The hyper steps model the training as the optimizers' steps on ℓ̂: w ← w − (the update). A
hook or another callback that edits the weights between steps — a ``clamp_`` (WGAN's weight
clipping), a max-norm ``renorm_``, a re-initialisation of dead units — or a layer that edits
its own weight in forward (``nn.Embedding(max_norm=...)``, named) makes the training a
projected (or reset) one, whose fixed point the hypergradient does not differentiate: the
hyperparameters were tuned for another training, without a word.

Watched every ``every_n_steps`` steps of each optimizer: right after its update, the norm of
every tensor it trains (one fused ``_foreach_norm``, no read of the device), then at its next
step's start, before any change of the gradient, the same norms again (one read). Weights
swapped out and put back in between (an EMA's validation) have their norms back bit for bit
and are not said. Automatic or manual optimisation, one optimizer or several (session 64: the
watch covered automatic optimisation with one optimizer, so a WGAN's ``clamp_`` after its
critic's manual step was not seen); a tensor two optimizers train is not compared (the other's
step moves it).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from .problem import named_tensors


class MovedWeights:
    """The watch (module docstring) of one fit; ``who`` names the callback in its warning."""

    def __init__(self, who: str, every_n_steps: int) -> None:
        self.who, self.every = who, max(1, int(every_n_steps))
        #: per optimizer (by id): its steps so far, and the norms held after its latest update
        self._steps: dict[int, int] = {}
        self._held: dict[int, tuple[int, list[Tensor], Tensor]] = {}
        self.said = False

    def note(self, trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> None:
        """After ``optimizer``'s update: hold its tensors' norms, every ``every`` of its steps."""
        key = id(optimizer)
        count = self._steps[key] = self._steps.get(key, -1) + 1
        if self.said or trainer.lightning_module is None or count % self.every:
            return
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if params:
            with torch.no_grad():
                norms = torch.stack(torch._foreach_norm(params))
            self._held[key] = (trainer.global_step, params, norms)

    def check(
        self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """At the next step of ``optimizer``, before any change: the norms must be those held."""
        held = self._held.pop(id(optimizer), None)
        if held is None or self.said:
            return
        step, params, before = held
        if trainer.global_step <= step:
            return  # the steps went back (a tuner's restore)
        with torch.no_grad():
            now = torch.stack(torch._foreach_norm(params))
        moved = ~((now == before) | (now.isnan() & before.isnan()))
        others = {
            id(p)
            for opt in trainer.optimizers
            if opt is not optimizer
            for g in opt.param_groups
            for p in g["params"]
        }
        moved &= torch.tensor([id(p) not in others for p in params], device=moved.device)
        if not bool(moved.any()):
            return
        self.said = True
        names = {id(p): n for n, p in named_tensors(module)}
        said = [names.get(id(p), "an unnamed tensor") for p, m in zip(params, moved) if m]
        capped = _max_norm_embeddings(module, [p for p, m in zip(params, moved) if m])
        cause = (
            f"{', '.join(capped)} renorms in place, in every forward, the rows it looks up "
            "(torch's max_norm=)"
            if capped
            else "a clamp_, a renorm_ or a re-initialisation in a hook, another callback or a "
            "manual training_step?"
        )
        fix = (
            "Cap the looked-up rows in forward instead, without editing the weight: "
            "e = F.embedding(ids, emb.weight, padding_idx=...); e = e * (max_norm / "
            "e.norm(dim=-1, keepdim=True).clamp(min=max_norm)) (each vector capped as "
            "max_norm= caps it, and the hypergradient sees the cap)"
            if capped
            else "Put a constraint inside the model "
            "(torch.nn.utils.parametrize, e.g. w = c·tanh(v)) or the loss, where the "
            "hypergradient sees it"
        )
        rank_zero_warn(
            f"{self.who}: {', '.join(said[:4])}{' ...' if len(said) > 4 else ''} changed "
            f"between optimizer steps {step} and {trainer.global_step}, outside the "
            f"optimizer ({cause}): the hyper steps model the training as the optimizers' "
            "steps alone, so the hyperparameters are tuned for a training without that "
            f"change. {fix}; weights swapped out and put back (an EMA's validation) are not "
            "concerned."
        )


def _max_norm_embeddings(module: torch.nn.Module, moved: list[Tensor]) -> list[str]:
    """The ``nn.Embedding(max_norm=...)`` layers of ``module`` whose weight is among ``moved``,
    as ``name (nn.Embedding(max_norm=1.0))`` (session 64: said as "a clamp_ … in a hook or
    another callback?" though the user had none)."""
    ids = {id(p) for p in moved}
    return [
        f"{name} (nn.Embedding(max_norm={m.max_norm:g}))"
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Embedding) and m.max_norm is not None and id(m.weight) in ids
    ]
