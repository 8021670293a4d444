"""Module modes for the adjoint solve: one consistent mode, running statistics untouched.

Models with BatchNorm or dropout behave differently in ``train()`` and ``eval()`` mode, and
BatchNorm updates its running statistics on every training-mode forward pass. The Jacobian
products of the adjoint solve and of the ∂₂Φ̂ term run inside :func:`frozen_mode`:

* ``mode="train"`` (default): the same map the inner SGD steps iterate — BatchNorm normalises by
  batch statistics and dropout draws fresh masks (part of the randomness ζ̂). A module already in
  training mode keeps its submodules' flags: a part its training runs in eval mode (BatchNorm
  whose statistics the user froze with ``.eval()``) is run so here too (session 50: it was
  switched to batch statistics, so the map differed from the training's, and a Linear before
  such a BatchNorm was probed as scale-invariant and its decay held);
* ``mode="eval"``: a deterministic map — BatchNorm uses its running statistics, dropout is off.

In both, every buffer (running mean/var, ``num_batches_tracked``) is restored afterwards, so the
adjoint solve never changes the model's statistics, and the previous train/eval flags come back.

A module in eval mode at its root is switched to training mode by ``"train"`` (a core user may
call the hypergradient after an evaluation), except under :func:`as_trained`: a caller that runs
the solves inside its own training step (the Lightning drop-ins' hyper steps) says so, and the
module's flags, root included, are then the training's (session 52: a training run in eval mode,
``self.eval()`` in ``on_train_batch_start``, had its hyper steps run dropout and BatchNorm's
batch statistics, which its training never did).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .errors import ConfigurationError

#: whether the module's current flags are the training's (set by :func:`as_trained`)
_AS_TRAINED: ContextVar[bool] = ContextVar("hypertorch_sid_as_trained", default=False)


@contextmanager
def as_trained() -> Iterator[None]:
    """Within the body ``frozen_mode(module, "train")`` keeps every flag as it is, the root's
    too: the caller runs inside the training's own step, whose flags these are."""
    token = _AS_TRAINED.set(True)
    try:
        yield
    finally:
        _AS_TRAINED.reset(token)


@contextmanager
def frozen_mode(module: torch.nn.Module | None, mode: str) -> Iterator[None]:
    """Run the body with ``module`` in ``mode`` ('train' or 'eval'), buffers restored after."""
    if mode not in ("train", "eval"):
        raise ConfigurationError(f"mode must be 'train' or 'eval', got {mode!r}.")
    if module is None:
        yield
        return
    flags = {m: m.training for m in module.modules()}
    buffers = {name: (b, b.detach().clone()) for name, b in module.named_buffers()}
    # in training mode (or as trained): the training's own flags
    if mode == "eval" or not (module.training or _AS_TRAINED.get()):
        module.train(mode == "train")
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                if name in buffers and _written(b, *buffers[name]):
                    b.copy_(buffers[name][1])
        for m, flag in flags.items():
            m.training = flag


def _written(now: torch.Tensor, before: torch.Tensor, saved: torch.Tensor) -> bool:
    """Whether the body wrote a buffer (in place, or a new tensor in its place): only those
    are copied back. A copy into an unchanged one raised its version counter all the same, and
    a training step's backward that saved it failed (session 63: BatchNorm's running
    statistics, saved by its training-mode forward, after the masked-row check's eval-mode
    re-run inside the step: "modified by an inplace operation" at the first masked batch).
    Read by value, not by the version counter: BatchNorm's kernel updates its running
    statistics without raising it."""
    return now is not before or not torch.equal(now, saved)
