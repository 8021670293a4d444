"""What float16 mixed precision leaves in the gradients a callback's ``on_before_optimizer_step``
sees: the loss scale still on them and whether the ``GradScaler`` will skip the step. Read by
:class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`, which adds its decay there."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import Tensor

__all__ = ["loss_scale", "scaler_skips"]


def loss_scale(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> Tensor | None:
    """The loss scale that the gradients ``on_before_optimizer_step`` sees still carry, or None.

    Under float16 mixed precision (``precision="16-mixed"`` on a GPU) Lightning scales the loss
    by a ``GradScaler`` and unscales the gradients before that hook, except for an optimizer
    that unscales inside its own step (``fused=True``: ``_step_supports_amp_scaling``): there
    the hook sees S·∇ℓ, so ``λ w`` is added as S·λ w (measured without: the decay was divided
    by S = 65536, the weights ended as without decay). The scale stays a tensor: no device
    synchronisation per step."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return None
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return None  # Lightning has unscaled the gradients
    return scaler._get_scale_async()  # get_scale() would synchronise the device every step


def scaler_skips(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> Tensor | None:
    """1.0 where float16 mixed precision's ``GradScaler`` found inf/NaN in this step's gradients
    (``scaler.step`` will skip ``optimizer.step``), else 0.0, as a tensor (no synchronisation);
    None without a scaler or before it unscaled (a fused optimizer unscales in its own step).
    Decoupled decay shrinks w itself, so it must skip with the step: it did not (a few steps
    while the scale settles, each a factor 1 − lr·λ)."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return None
    found = scaler._per_optimizer_states.get(id(optimizer), {}).get("found_inf_per_device")
    if not found:
        return None
    return torch.stack([v.float().reshape(()) for v in found.values()]).amax()
