"""What a hyper step must leave as it found it: λ's ``requires_grad``, the training's random
streams, the module's torchmetrics states and its logs (BatchNorm statistics are the core's
``frozen_mode``); and what it must not start from: non-finite weights."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils._pytree import tree_map
from torch.utils.data import Subset
from torchmetrics import Metric

from ..core.errors import DivergenceError
from ..core.indexing import IndexedDataset


@contextmanager
def hyperparameters_require_grad(frozen: Sequence[Tensor]) -> Iterator[None]:
    """λ living in the module needs ``requires_grad`` inside the hyper step only."""
    for h in frozen:
        h.requires_grad_(True)
        h.grad = None  # never reuse a gradient from the training backward
    try:
        yield
    finally:
        for h in frozen:
            h.grad = None
            h.requires_grad_(False)


@contextmanager
def private_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seeded randomness (dropout) inside hyper steps; the training's RNG is untouched."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        yield


@contextmanager
def metric_states_kept(module: pl.LightningModule) -> Iterator[None]:
    """The module's torchmetrics states are what the training made them, after a hyper step.

    A hyper step evaluates ℓ on its own minibatches, by calling ``training_step`` in the
    drop-in: a ``Metric`` updated there (``self.train_acc(logits, y)``) would otherwise count
    those batches too (measured: 58 updates in an epoch of 32 training batches). Restored:
    every registered state, the update count and the cached values. (Running statistics of
    BatchNorm are kept by the core's ``frozen_mode``; logging is muted by the drop-in.)
    """
    saved = []
    for m in module.modules():
        if isinstance(m, Metric):
            try:
                saved.append(
                    (m, m._copy_state_dict(), m._update_count, m._computed, m._forward_cache)
                )
            except AttributeError:  # a torchmetrics without these internals: not restored
                continue
    try:
        yield
    finally:
        for m, states, count, computed, cache in saved:
            for name, value in states.items():
                setattr(m, name, value)
            m._update_count, m._computed, m._forward_cache = count, computed, cache


@contextmanager
def muted_logging(module: pl.LightningModule) -> Iterator[None]:
    """``self.log``/``self.log_dict`` do nothing inside (the hyper step must not overwrite logs).

    Lightning has no public switch for this: ``training_step`` called from a hyper step would
    otherwise log the hyper step's losses as training metrics. Pass ``training_loss=`` to avoid
    calling ``training_step`` at all.
    """

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    module.__dict__["log"] = noop
    module.__dict__["log_dict"] = noop
    try:
        yield
    finally:
        del module.__dict__["log"]
        del module.__dict__["log_dict"]


T = TypeVar("T")

#: what torch says where a step differentiates (``autograd.grad``, ``backward``) under no_grad
NO_GRAPH = "does not require grad"
#: modules whose training step differentiates inside itself, found by :func:`as_in_training`
_DIFFERENTIATING: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def as_in_training(module: torch.nn.Module, call: Callable[[], T]) -> T:
    """``call()``, a call of the user's training step (or loss), with autograd on where it fails
    without, as Lightning always runs a training step.

    Where the drop-ins need no graph they call the step under ``torch.no_grad`` (the
    scale-invariance probe; the data weights' difference of losses). A step that differentiates
    inside itself (a gradient penalty: ``torch.autograd.grad(loss, x, create_graph=True)``,
    double back-propagation) fails there with "element 0 of tensors does not require grad"
    (session 60). Such a call is made again with autograd on, its tensors detached (no graph
    kept), and the module's later calls go there at once. ``call`` must enter its own random
    stream (the retry replays the failed call's dropout). Any other error (torch's message
    without :data:`NO_GRAPH`) is raised as it is, the call not repeated."""
    if torch.is_grad_enabled():
        return call()
    if module not in _DIFFERENTIATING:
        try:
            return call()
        except RuntimeError as err:
            if NO_GRAPH not in str(err):
                raise
    with torch.enable_grad():
        out = call()
    _DIFFERENTIATING.add(module)
    return tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, out)


def non_finite_data(dataset: Any) -> str | None:
    """Where a dataset of tensors (``TensorDataset``) holds NaN/Inf, or None; read through
    :class:`~hypertorch_sid.IndexedDataset` and ``Subset`` wraps (a ``random_split`` part),
    the samples named by their training positions. Only a bare ``TensorDataset`` was read: a
    NaN feature under ``LearnedDataWeights`` (always an ``IndexedDataset``) or in a
    ``random_split`` part was blamed on the loss, "the loss itself produced the NaN/Inf"
    (session 61)."""
    positions: Tensor | None = None  # the base row of each training position (None: itself)
    while isinstance(dataset, (IndexedDataset, Subset)):
        if isinstance(dataset, Subset):
            rows = torch.as_tensor(list(dataset.indices), dtype=torch.long)
            positions = rows if positions is None else rows[positions]
        dataset = dataset.dataset
    tensors = getattr(dataset, "tensors", None)
    if not isinstance(tensors, (list, tuple)):
        return None
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            continue
        if not bool(torch.isfinite(t).all()):
            bad = (~torch.isfinite(t.reshape(len(t), -1))).any(1)
            rows = (bad if positions is None else bad[positions]).nonzero().flatten()
            if len(rows) == 0:  # in base rows outside the training positions
                continue
            return (
                f"tensor {i} of the training dataset has NaN/Inf in {len(rows)} sample(s) "
                f"(index {', '.join(str(int(r)) for r in rows[:5])})"
            )
    return None


class LossWatch:
    """The training losses Lightning reports after each step, watched on their device (no
    synchronisation per step): the first step whose loss was not finite, the first finite loss
    and the last one before it. Read only when the weights turn out non-finite, to tell a loss
    that produced NaN from finite weights (log of 0, 0/0: the learning rate is not the cause)
    from a training that grew until it overflowed.

    A step costs one operation (the loss detached and held); every :attr:`CHUNK` steps, and when
    read, the held losses are folded into three numbers on their device. A launch-bound step
    (a small network on a GPU) pays for each operation: the summary updated at every step cost
    13 (session 49, ``benchmarks/bench_step_ops.py``)."""

    #: a last finite loss above this multiple of the first says the training grew first
    GREW = 10.0
    #: losses held before they are folded into the summary
    CHUNK = 256

    def __init__(self) -> None:
        self._first: Tensor | None = None  # [first finite loss, last finite loss, first bad step]
        self._held: list[Tensor] = []
        self._steps: list[int] = []

    def observe(self, outputs: Any, step: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, Tensor) or loss.numel() == 0:
            return
        self._held.append(loss.detach())
        self._steps.append(int(step))
        if len(self._held) >= self.CHUNK:
            self._fold()

    def _fold(self) -> None:
        """The held losses into [first finite, last finite before the first bad, first bad step]
        (−1: none bad yet), on their device, without reading them."""
        if not self._held:
            return
        held, steps = self._held, self._steps
        self._held, self._steps = [], []
        with torch.no_grad():
            values = torch.stack([v.float().mean() for v in held])
            at = torch.tensor(steps, dtype=values.dtype, device=values.device)
            ok = torch.isfinite(values)
            position = torch.arange(len(held), device=values.device)
            first_bad = torch.where(ok, len(held), position).min()  # len: none in the chunk
            bad = torch.where(first_bad < len(held), at[first_bad.clamp(max=len(held) - 1)], -1.0)
            last_ok = torch.where(ok & (position < first_bad), position, -1).max()
            last = torch.where(last_ok >= 0, values[last_ok.clamp(min=0)], values[0])
            first_ok = torch.where(ok, position, len(held)).min().clamp(max=len(held) - 1)
            if self._first is None:
                self._first = torch.stack([values[first_ok], last, bad])
                return
            first, last_before, bad_before = self._first.unbind()
            clean = bad_before < 0  # no bad step before this chunk
            first = torch.where(torch.isfinite(first), first, values[first_ok])
            last = torch.where(clean & (last_ok >= 0), last, last_before)
            bad = torch.where(clean, bad, bad_before)
            self._first = torch.stack([first, last, bad])

    def last(self) -> float | None:
        """The last finite training loss watched (None: none yet)."""
        self._fold()
        if self._first is None:
            return None
        last = float(self._first[1])
        return last if math.isfinite(last) else None

    def cause(self) -> str | None:
        """Why the weights went non-finite, where the losses tell (None: they do not)."""
        self._fold()
        if self._first is None:
            return None
        first, last, bad = (float(x) for x in self._first.cpu())
        if bad < 0 or not math.isfinite(first) or not math.isfinite(last):
            return None
        if abs(last) > self.GREW * max(abs(first), 1e-12):
            return (
                f"the training loss grew from {first:.3g} to {last:.3g} before it turned "
                f"non-finite at step {int(bad)}: the training optimizer diverged"
            )
        return (
            f"the training_step returned a non-finite loss at step {int(bad)} while the last "
            f"loss before it was {last:.3g} (the first {first:.3g}): the loss itself produced "
            "the NaN/Inf from finite weights (log of 0, 0/0, a NaN in the batch or a target), "
            "and lowering the learning rate will not help; find the step's batch and the "
            "operation in the loss"
        )


def check_weights(
    module: pl.LightningModule,
    problem: Any,
    step: int,
    train_dataset: Any = None,
    losses: LossWatch | None = None,
) -> None:
    """Never go on (or end a fit) with non-finite weights: the training itself diverged
    (``problem``: the active bilevel problem, whose λ summary the error reports, or None), or
    the training data holds NaN/Inf (``train_dataset``, read only then, names it), or the loss
    produced it from finite weights (``losses``, read only then)."""
    named = list(module.named_parameters())
    with torch.no_grad():
        finite = [torch.isfinite(p).all() for _, p in named]
    if len({f.device for f in finite}) == 1:  # one wait for the device, not one per tensor
        finite = torch.stack(finite).tolist()
    bad = [n for (n, _), ok in zip(named, finite) if not bool(ok)]
    if not bad:
        return
    data = non_finite_data(train_dataset)
    if data is not None:
        raise DivergenceError(
            "training (weights w)",
            step,
            math.nan,
            f"{len(bad)} parameter tensors hold NaN/Inf ({', '.join(bad[:3])}...) because the "
            f"training data does: {data}. Clean or drop those samples (the learning rate and "
            "the hyperparameters are not the cause).",
            data=True,
        )
    lam = ""
    if problem is not None:
        lam = ", ".join(
            f"{k} in [{float(v.min()):.3g}, {float(v.max()):.3g}]"
            for k, v in problem.summary().items()
        )
    said = losses.cause() if losses is not None else None
    if said is not None and "diverged" not in said:
        raise DivergenceError(
            "training (weights w)",
            step,
            math.nan,
            f"{len(bad)} parameter tensors hold NaN/Inf ({', '.join(bad[:3])}...) because {said}.",
            data=True,
        )
    raise DivergenceError(
        "training (weights w)",
        step,
        math.nan,
        f"{len(bad)} parameter tensors hold NaN/Inf ({', '.join(bad[:3])}...). "
        + (f"{said[0].upper()}{said[1:]} " if said else "The training optimizer diverged ")
        + f"with the current hyperparameters ({lam or 'n/a'}): lower its learning rate or "
        "bound the hyperparameters.",
    )
