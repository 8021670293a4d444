"""The scale-invariance probe of :class:`~hypertorch_sid.lightning.weight_decay.LearnedWeightDecay`.

Which λ groups decay a layer whose training loss does not see its scale (a Linear before a
normalisation layer; :mod:`~hypertorch_sid.core.scale`, eq. invariant): on such a group the decay
acts through the effective learning rate only and the implicit hypergradient has no fixed point
to describe, so the drop-in holds its λ. The probe scales each group's layers by ½ and by 2 on a
few samples of a training batch and compares the losses (:func:`scale_invariant_slots`); a
budget plans it before running it (:func:`probe_cost`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from ..core.batches import head
from ..core.errors import ConfigurationError
from ..core.modes import frozen_mode
from ..core.scale import MAX_FORWARDS, scale_invariant
from .isolation import as_in_training, private_rng
from .problem import named_tensors

if TYPE_CHECKING:
    from .weight_decay_problem import WeightDecayProblem

__all__ = ["PROBE_SAMPLES", "probe_cost", "probe_forwards", "scale_invariant_slots"]

#: the samples of the training batch the invariance probe reads: invariance is a property of
#: the network, not of the batch, and the probe's 2–5 forwards per λ group were 11 s of a
#: ResNet-18's first hyper step on the CPU (41 groups, batch 64: 40 training steps' time). The
#: same groups are found as from 64 samples on the benchmark's CNN and MLP (3 seeds) and on
#: ResNet-18 but for its stem convolution, borderline through BatchNorm's ε (on 3 of 6 lightly
#: trained seeds one of 16 and 32 samples calls it not invariant where 64 call it invariant)
PROBE_SAMPLES = 16


def scale_invariant_slots(
    problem: WeightDecayProblem, module: pl.LightningModule, batch: Any, seed: int = 0
) -> dict[str, bool]:
    """Which λ slots decay a scale-invariant group (:mod:`~hypertorch_sid.core.scale`, eq.
    invariant): the training loss ℓ on ``batch``, in train mode, unchanged when every tensor of
    the slot is scaled by ½ and by 2. Per element, the probe is per layer. It reads the first
    :data:`PROBE_SAMPLES` samples of ``batch`` (all of it where those cannot be cut off) and one
    base loss for all slots. BatchNorm's running statistics, the train/eval flags and the
    training's random streams are left as they were.

    On such a slot the decay acts through the effective learning rate η/‖w‖² only, and the
    implicit hypergradient has no fixed point to describe (see :mod:`~hypertorch_sid.core.scale`).
    """
    decay = _probed_decay(problem, "scale_invariant_slots")
    found: dict[str, bool] = {}
    with _probing(problem, module, batch, seed) as (loss, base):
        for i, name in enumerate(decay.group_names()):
            tensors = [e.param for e in decay.entries if decay.group_of(e) == i]
            scaled = _with_their_layers(tensors, module, decay.layer_of)
            found[name] = scale_invariant(loss, scaled, base=base)
    return found


def probe_forwards(problem: WeightDecayProblem) -> int:
    """The most forward passes :func:`scale_invariant_slots` makes: one base loss, then at most
    :data:`~hypertorch_sid.core.scale.MAX_FORWARDS` per λ slot (2 scalings, 2 random moves)."""
    decay = _probed_decay(problem, "probe_forwards")
    return 1 + MAX_FORWARDS * len(decay.group_names())


def probe_cost(
    problem: WeightDecayProblem,
    module: pl.LightningModule,
    batch: Any,
    clock: Callable[[], float],
    seed: int = 0,
) -> float:
    """What :func:`scale_invariant_slots` on ``batch`` costs at most on ``clock``: its base
    forward, timed (with the mode switch around it), × :func:`probe_forwards` (a budget plans the
    probe before committing to it, :meth:`~hypertorch_sid.core.budget.Budget.expect_one_off`).
    Leaves the module as the probe does."""
    forwards = probe_forwards(problem)
    start = clock()
    with _probing(problem, module, batch, seed):
        one = clock() - start
    return max(one, 0.0) * forwards


def _probed_decay(problem: WeightDecayProblem, who: str) -> Any:
    if problem.decay is None:
        raise ConfigurationError(f"{who}: λ is created when a fit starts (problem.decay is None).")
    return problem.decay


@contextmanager
def _probing(
    problem: WeightDecayProblem, module: pl.LightningModule, batch: Any, seed: int
) -> Iterator[tuple[Callable[[], Tensor], float]]:
    """The probe's loss on the first :data:`PROBE_SAMPLES` samples of ``batch`` (all of it where
    those cannot be cut off) and its base value, in train mode (BatchNorm's running statistics,
    the train/eval flags and the training's random streams left as they were), no graph kept."""
    with frozen_mode(module, "train"), torch.no_grad():
        loss = _probe_loss(problem, module, head(batch, PROBE_SAMPLES), seed)
        try:
            base = float(loss())
        except Exception:  # a batch whose dim 0 is not its samples' (time-first sequences)
            loss = _probe_loss(problem, module, batch, seed)
            base = float(loss())
        yield loss, base


def _probe_loss(
    problem: WeightDecayProblem, module: pl.LightningModule, batch: Any, seed: int
) -> Callable[[], Tensor]:
    """ℓ on ``batch``, one forward pass, its randomness (dropout) seeded by ``seed``, each
    from the module's buffers as they were when it was made. A forward that updates a buffer
    it reads ran from the state the last one left: ``spectral_norm``'s power iteration moves
    its ``_u``, ``_v`` and so the σ it divides the weight by, and a layer whose loss does not
    see the scale of its weight (W / σ(W)) was called not invariant, its λ learned (session 56)."""
    start = {name: b.detach().clone() for name, b in module.named_buffers()}

    def once() -> Tensor:
        for name, b in module.named_buffers():
            if name in start:
                b.copy_(start[name])
        with private_rng(seed, module.device):
            return problem.data_loss(module, batch, "training")

    return lambda: as_in_training(module, once)


def _with_their_layers(
    tensors: list[Tensor], module: pl.LightningModule, layer_of: Callable[[str], str]
) -> list[Tensor]:
    """``tensors`` and the other trainable tensors of the layers (``layer_of``: the decay's) that
    own them.

    A layer's invariance is a property of all its tensors together: Linear → LayerNorm does not
    see the scale of (W, b), but of W alone it nearly does not either. Where a λ slot holds only
    part of a layer (``apply_to="weights"``: W without b; ``granularity="per_tensor"``), the
    probe scaled that part, found it not invariant, and the implicit hypergradient drove W's λ
    to 0.62 (validation loss 1.33 against 0.24 without decay): the slot's layers are scaled
    whole. A tensor no layer owns is its own layer: a cosine classifier's class vectors (their
    loss sees no scale) are scaled without the logit scale beside them on the module."""
    named = named_tensors(module)
    owners = {id(p): layer_of(name) for name, p in named}
    layers = {owners.get(id(t)) for t in tensors} - {None}
    chosen = {id(t) for t in tensors}
    extra = [p for name, p in named if p.requires_grad
             and layer_of(name) in layers and id(p) not in chosen]  # fmt: skip
    return [*tensors, *extra]
