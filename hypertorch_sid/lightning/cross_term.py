"""The training batches' cross term of the data weights (eq. gradestim's on the rows of each
training minibatch, ``cross_term="training"``): the pieces that read it.

:class:`RandomState` captures the RNG (and the buffers) at a training step's start, so that the
extra forward replays the step's dropout masks; :func:`directional_losses` gives every sample's
uᵢ = ⟨∇ℓᵢ(w), v⟩ by a directional derivative of the per-sample losses; :func:`_cross_term_for`
checks ``cross_term=`` (or chooses it: ``"hyper_step"`` under a compute budget).
:class:`~hypertorch_sid.lightning.data_weights.LearnedDataWeights` moves the rows' weights by it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.budget import Budget
from ..core.directional import DirectionalDerivative, ForwardMode
from ..core.errors import ConfigurationError
from .isolation import as_in_training, muted_logging


class RandomState(NamedTuple):
    """The RNG state at the start of a training step (CPU, and the module's accelerator through
    torch's device module: CUDA, XPU, MPS, ...), so that the cross term's extra forward draws the
    same dropout masks as the step itself. ``replayable`` is False on an accelerator whose RNG
    torch cannot read back: there a forward difference would difference two different dropout
    masks, and the drop-in uses dual numbers instead.

    ``buffers``: copies of the module's buffers at the start of the step (``capture`` with a
    module), from which every extra forward starts. A forward that changes a buffer it then
    reads — ``spectral_norm``'s power iteration updates its ``_u``, ``_v`` and normalises the
    weight by them — otherwise ran from the state the step left, one iteration further: its
    losses at w differed from the step's own (0.008 of their mean on a Fashion-MNIST MLP), the
    forward difference was dropped for dual numbers, and those failed inside the power
    iteration (torch has no forward AD for its ``out=`` division; session 49)."""

    cpu: Tensor
    device: torch.device
    accelerator: Tensor | None
    replayable: bool = True
    buffers: dict[str, Tensor] | None = None

    @classmethod
    def capture(cls, device: torch.device, module: torch.nn.Module | None = None) -> RandomState:
        buffers = (
            None if module is None else {n: b.detach().clone() for n, b in module.named_buffers()}
        )
        if device.type == "cpu":
            return cls(torch.get_rng_state(), device, None, buffers=buffers)
        try:
            device_module = torch.get_device_module(device.type)
        except RuntimeError:  # a device type with no torch.<type> module (e.g. "meta")
            device_module = None
        if device_module is None or not hasattr(device_module, "get_rng_state"):
            return cls(torch.get_rng_state(), device, None, replayable=False, buffers=buffers)
        return cls(
            torch.get_rng_state(), device, device_module.get_rng_state(device), buffers=buffers
        )

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Inside: the captured state, in a forked stream; after: the caller's stream exactly
        as it was (the training's own randomness is neither replayed nor advanced)."""
        if self.accelerator is None:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self.cpu)
                yield
            return
        module = torch.get_device_module(self.device.type)
        with torch.random.fork_rng(devices=[self.device], device_type=self.device.type):
            torch.set_rng_state(self.cpu)
            module.set_rng_state(self.accelerator, self.device)
            yield


def directional_losses(
    module: torch.nn.Module,
    step: Callable[..., Any],
    data: Any,
    params: list[Tensor],
    tangents: list[Tensor],
    directional: DirectionalDerivative | None = None,
    at: Tensor | None = None,
    rng: RandomState | None = None,
) -> Tensor:
    """uᵢ = ⟨∇ℓᵢ(w), v⟩ for every sample of ``data`` by ``directional`` (default
    :class:`~hypertorch_sid.core.directional.ForwardMode`: one dual-number pass;
    :class:`~hypertorch_sid.core.directional.ForwardDifference`: one forward at w + hv,
    against ``at`` = ℓ(w) from the training step) of the per-sample losses that
    ``step(data, 0)`` returns, with ``params`` (parameters of ``module``) swapped in for the
    pass. Buffers are swapped for clones, so BatchNorm's running statistics are not updated
    by it; with ``rng`` (the training step's :class:`RandomState`) every pass replays the
    step's randomness (its dropout masks) in a forked stream, leaving the training's own
    stream as it was, and starts from the buffers as they were when the step began (a
    ``spectral_norm``'s power-iteration vectors).
    """
    from torch.nn.utils.stateless import _reparametrize_module

    names = {id(p): n for n, p in module.named_parameters()}
    keys = [names[id(p)] for p in params]
    start = rng.buffers if rng is not None and rng.buffers is not None else None
    if start is None:
        start = {n: b.detach() for n, b in module.named_buffers()}

    def once(flat: tuple[Tensor, ...]) -> Any:
        buffers = {n: b.clone() for n, b in start.items()}  # each pass from the step's start
        swapped = {**buffers, **dict(zip(keys, flat))}
        with _reparametrize_module(module, swapped), muted_logging(module):  # type: ignore[arg-type]
            with rng.replayed() if rng is not None else contextlib.nullcontext():
                return step(data, 0)

    def losses(*flat: Tensor) -> Tensor:
        out = as_in_training(module, lambda: once(flat))
        out = out.get("loss") if isinstance(out, Mapping) else out
        return out.reshape(out.shape[0], -1).mean(1) if out.dim() > 1 else out

    return (directional or ForwardMode())(losses, params, tangents, at)


def _cross_term_for(cross_term: str | None, budget: Budget, max_overhead: Any) -> str:
    """``cross_term`` checked, or its default: ``"training"``, or ``"hyper_step"`` under a
    compute budget (one that plans from measured costs: ``budget``, made of the setting
    ``max_overhead``), which spaces hyper steps but cannot space a cross term run at every
    training step; that pair is refused."""
    budgeted = budget.plans_costs()
    if cross_term is None:
        return "hyper_step" if budgeted else "training"
    if cross_term not in ("training", "hyper_step"):
        raise ConfigurationError(
            f"LearnedDataWeights: cross_term must be 'training' or 'hyper_step', got "
            f"{cross_term!r}."
        )
    if cross_term == "training" and budgeted:
        raise ConfigurationError(
            f"LearnedDataWeights: cross_term='training' moves the rows of every training batch "
            f"(about one more forward per step, about half a training step), work a compute "
            f"budget (max_overhead={max_overhead!r}) cannot space: under one the hyper steps got "
            f"almost none of it. Leave cross_term out (with a budget it is 'hyper_step') or "
            f"pass max_overhead=None."
        )
    return cross_term
