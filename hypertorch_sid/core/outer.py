"""The outer objective E(w, λ) and its partial gradients ∇₁E, ∇₂E (eq. gradfv2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from . import rows
from .errors import ConfigurationError, DivergenceError
from .solvers import norm
from .validation import check_scalar_loss

Tensors = list[Tensor]


class SeveralBatches(list):
    """A list of validation batches that is always read as several (E and ∇E averaged over
    them, one at a time), whatever their shapes: the parts of one sampled minibatch, each padded
    by the user's collate to its own length, would not pass :func:`_several_batches`' check."""


def _validation_batches(val_batch: Any) -> tuple[list[Any], bool]:
    """The validation batches E is averaged over, and whether there are several.

    - a ``DataLoader``: the whole validation set in pieces (every batch it yields);
    - a list or tuple of batches, e.g. ``[(X1, y1), (X2, y2)]`` or ``list(val_loader)``: several
      batches, averaged like a DataLoader. It is recognised when every item is itself a batch
      container (a tuple, list or dict holding tensors) and the items agree: same structure,
      and tensors in the same place have the same dtype and the same shape apart from the
      batch dimension;
    - anything else is one batch: a tensor, a dict, ``(X, y)``, ``[X, y]``, and also a nested
      batch such as ``((X_img, X_txt), (y1, y2))`` whose parts differ in shape.

    A *tuple* of two or more such items (``((X1, X2), (Y1, Y2))`` with every part shaped alike)
    is ambiguous — one nested batch or several batches — and raises :class:`ConfigurationError`
    asking for ``[batch]`` (one) or a list ``[b1, b2]`` (several); a list is never ambiguous.
    A one-shot iterator (a generator) raises too: it would be read once, then be empty.
    """
    if isinstance(val_batch, Iterator) and not isinstance(val_batch, Tensor):
        raise ConfigurationError(
            f"val_batch is a one-shot iterator ({type(val_batch).__name__}): it would be "
            "exhausted after the first hyper step. Pass a batch such as (X_val, y_val), a list "
            "of batches (list(generator)), or a DataLoader over the validation set."
        )
    if isinstance(val_batch, Dataset):  # its samples, not a batch (session 53)
        raise ConfigurationError(
            f"val_batch is a {type(val_batch).__name__} (a dataset, not a batch): outer_loss "
            "would be handed the dataset object itself. Pass a DataLoader over it "
            "(DataLoader(val_set, batch_size=...)), or one batch such as (X_val, y_val)."
        )
    if isinstance(val_batch, SeveralBatches):
        return list(val_batch), True
    if isinstance(val_batch, DataLoader):
        batches = list(val_batch)
        if not batches:
            raise ConfigurationError("the validation DataLoader is empty: it yielded no batch.")
        return batches, True
    if isinstance(val_batch, (list, tuple)) and not _is_namedtuple(val_batch):
        loaders = [type(b).__name__ for b in val_batch if isinstance(b, (DataLoader, Dataset))]
        if loaders:  # each was handed to outer_loss as a batch: a raw error in it (session 56)
            raise ConfigurationError(
                f"val_batch is a {type(val_batch).__name__} holding a {loaders[0]}: each item "
                "would be handed to outer_loss as one batch. Pass the DataLoader itself (for "
                "several validation sets, one DataLoader over a ConcatDataset of them)."
            )
        if not val_batch:
            raise ConfigurationError(
                "val_batch is an empty list: pass a batch such as (X_val, y_val), a list of "
                "batches, or a DataLoader over the validation set."
            )
        if _several_batches(val_batch):
            if isinstance(val_batch, tuple) and len(val_batch) > 1:
                raise ConfigurationError(
                    f"val_batch is a tuple of {len(val_batch)} parts with the same structure "
                    "and shapes: it could be one nested batch (e.g. ((X1, X2), (Y1, Y2))) or "
                    f"{len(val_batch)} batches. Pass [val_batch] for one batch, or a list "
                    "[batch1, batch2, ...] for several (averaged like a DataLoader)."
                )
            return list(val_batch), True
    return [val_batch], False


def check_one_full_batch(full_train_batch: Any) -> None:
    """``full_train_batch`` is one batch holding the whole training set: a DataLoader, a
    dataset, an iterator or a list of batches was handed to the losses whole, failing inside
    them ("too many values to unpack", session 56)."""
    given = None
    if isinstance(full_train_batch, (DataLoader, Dataset)) or (
        isinstance(full_train_batch, Iterator) and not isinstance(full_train_batch, Tensor)
    ):
        given = f"a {type(full_train_batch).__name__}"
    elif (
        isinstance(full_train_batch, list)
        and len(full_train_batch) > 1
        and _several_batches(full_train_batch)
    ):
        given = f"a list of {len(full_train_batch)} batches"
    if given is not None:
        raise ConfigurationError(
            f"full_train_batch must be one batch holding the whole training set, got {given}. "
            "Join it into one, e.g. next(iter(DataLoader(train_set, batch_size=len(train_set)))) "
            "or train_set.tensors for a TensorDataset."
        )


def check_validation_batch(outer_loss: Callable[[Any], Tensor], val_batch: Any) -> None:
    """Refuse a validation batch with no samples, and ``val_batch=None`` unless ``outer_loss``
    takes it (an E that reads no data), before the solves run (session 54). None reached the
    user's ``outer_loss`` after the inner solve, as its own ``TypeError`` ("cannot unpack
    non-iterable NoneType"); it is now tried once, at the call, without gradients."""
    tensors = [t for t in _tensors(val_batch) if t.dim() > 0]
    empty = [tuple(t.shape) for t in tensors if t.shape[0] == 0]
    if tensors and len(empty) == len(
        tensors
    ):  # E = mean over no samples = NaN: it was "∇E diverged (residual norm 0)"
        raise ConfigurationError(
            f"val_batch holds a tensor with no samples (shape {empty[0]}): E would be a mean "
            "over nothing (NaN). Check the validation split (e.g. X[n_train:] past the end of "
            "X) and pass at least one validation sample."
        )
    if val_batch is not None:
        return
    try:
        with torch.no_grad():
            outer_loss(None)
    except Exception as err:
        raise ConfigurationError(
            f"val_batch is None, and outer_loss(None) fails ({type(err).__name__}: {err}). "
            "Pass the validation data: one batch such as (X_val, y_val), a list of batches or a "
            "DataLoader over the validation set, e.g. hopt.step(train_loader, (X_val, y_val))."
        ) from err


def _tensors(x: Any) -> list[Tensor]:
    """The tensors of a batch or a list of batches (tuples, lists, dicts; nested)."""
    if isinstance(x, Tensor):
        return [x]
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    return [t for item in items for t in _tensors(item)]


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _signature(x: Any) -> Any:
    """The structure of a batch with its tensors' dtype and trailing shape; None if no tensor."""
    if isinstance(x, Tensor):
        return ("tensor", x.dtype, tuple(x.shape[1:]) if x.dim() > 0 else None)
    if isinstance(x, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__ if _is_namedtuple(x) else "seq", tuple(map(_signature, x)))
    return ("other", type(x).__name__)


def _holds_tensor(x: Any) -> bool:
    if isinstance(x, Tensor):
        return True
    if isinstance(x, dict):
        return any(_holds_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds_tensor(v) for v in x)
    return False


def _several_batches(items: list[Any] | tuple[Any, ...]) -> bool:
    """Every item is a batch container holding tensors, and all items share one signature."""
    if not all(isinstance(b, (list, tuple, dict)) and _holds_tensor(b) for b in items):
        return False
    first = _signature(items[0])
    return all(_signature(b) == first for b in items[1:])


#: (id of outer_loss, unused pattern) already probed: the probe reruns E once per pattern
_PROBED: set[tuple[int, tuple[bool, ...]]] = set()


class _GradientlessReads(torch.overrides.TorchFunctionMode):
    """Records which of ``watched`` an op reads without a gradient path: through ``.detach()``,
    ``.data`` or under ``torch.no_grad()``."""

    _DETACH = {Tensor.detach, Tensor.detach_, Tensor.data.__get__}  # type: ignore[attr-defined]

    def __init__(self, watched: Sequence[Tensor]) -> None:
        super().__init__()
        self.index = {id(w): i for i, w in enumerate(watched)}
        self.found: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        cut = func in self._DETACH or not torch.is_grad_enabled()
        if cut:
            for a in list(args) + list(kwargs.values()):
                i = self.index.get(id(a))
                if i is not None:
                    self.found.add(i)
        return func(*args, **kwargs)


def _warn_if_read_without_gradient(
    outer_loss: Callable[[Any], Tensor],
    batch: Any,
    inner_parameters: Sequence[Tensor],
    used: list[bool],
) -> None:
    """E reads some w tensors but gives them no gradient: say which when it reads them detached.

    A tensor E never reads (a head used only in training) legitimately has ∇₁E = 0; one that E
    reads through ``.detach()``, ``.data`` or ``no_grad`` loses its part of the hypergradient
    silently. E is run once more on one batch, under a mode that watches those reads, once per
    ``outer_loss`` and pattern of unused tensors.
    """
    key = (id(outer_loss), tuple(used))
    if key in _PROBED:
        return
    _PROBED.add(key)
    mode = _GradientlessReads(inner_parameters)
    with torch.enable_grad(), mode:
        outer_loss(batch)
    cut = sorted(i for i in mode.found if not used[i])
    if cut:
        which = ", ".join(f"{i} (shape {tuple(inner_parameters[i].shape)})" for i in cut)
        warnings.warn(
            f"outer_loss reads inner parameter{'s' if len(cut) > 1 else ''} {which} without a "
            "gradient (through .detach(), .data or torch.no_grad()): ∇₁E of "
            f"{'them' if len(cut) > 1 else 'it'} is taken as 0, so the hypergradient misses "
            "their part. Compute E from w without .detach().",
            UserWarning,
            stacklevel=3,
        )


def _other_tensors_read(
    outer_loss: Callable[[Any], Tensor],
    batch: Any,
    module: torch.nn.Module | None,
    params: list[Tensor],
) -> str:
    """What E read instead of w and λ, for the error that says it read neither: the module's
    other tensors in E's graph on ``batch`` (E computed again: the first graph is spent), and
    the likely cause ("" where it read none of them either). E runs with the module in eval
    mode (as validation does), so a ``forward`` that switches to an averaged copy of the
    network outside training (``self.ema(x) if not self.training``) computes E from that copy,
    which no optimizer trains and λ moves only through the averaging."""
    if module is None:
        return ""
    own = {id(p) for p in params}
    others = [(n, p) for n, p in module.named_parameters() if id(p) not in own and p.requires_grad]
    read: list[str] = []
    if others:
        with torch.enable_grad():
            loss = outer_loss(batch)
        if isinstance(loss, Tensor) and loss.requires_grad:
            grads = torch.autograd.grad(loss.reshape(()), [p for _, p in others], allow_unused=True)
            read = [n for (n, _), g in zip(others, grads) if g is not None]
    if not read:  # nothing else in E's graph: no copy to name (e.g. w read detached)
        return ""
    return (
        f" It reads {', '.join(read[:4])}{' …' if len(read) > 4 else ''} instead (tensors "
        "that no optimizer trains). E runs with the module in eval mode, as validation does: a "
        "forward that switches to another copy of the network outside training (an EMA or SWA "
        "average, self.ema(x) when not self.training) computes E from that copy. Compute E "
        "from the network the optimizer trains: the drop-ins take validation_loss=lambda "
        "module, batch: <its loss on batch> (LearnedDataWeights: one loss per sample); or "
        "average with "
        "Lightning's EMAWeightAveraging / StochasticWeightAveraging callbacks, which work with "
        "the drop-ins."
    )


#: the other cause of an E that reads none of the tensors given (session 60: ``problem.w =
#: torch.zeros(...)`` between two hyper steps was told only "E must be computed from w and/or
#: λ", which the user's E is)
_REPLACED = (
    " If it read them at an earlier hyper step, the tensors given were replaced since (e.g. "
    "problem.w = torch.zeros(...), or a model built again): change them in place instead "
    "(with torch.no_grad(): w.zero_() or w.copy_(new)), or build the optimizer over the new "
    "tensors."
)


def outer_gradients(
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    inner_parameters: Sequence[Tensor],
    hyperparameters: Sequence[Tensor],
    module: torch.nn.Module | None = None,
) -> tuple[Tensors, Tensors, float]:
    """(∇₁E(w, λ), ∇₂E(w, λ), E(w, λ)) on ``val_batch``.

    ``module`` (the model, in the mode E runs in): where E reads none of w and λ, the error
    names the module's tensors it reads instead (an EMA copy of the network that ``forward``
    uses outside training, session 49).

    ``val_batch`` is one batch, a list of batches or a DataLoader; E and its gradients are
    averaged over several batches (see :func:`_validation_batches` for how a list is read).

    Raises :class:`ConfigurationError` when E depends on neither w nor λ, and
    :class:`DivergenceError` when E or its gradients are not finite. When E depends on λ but not
    on w (e.g. it reads w only through ``w.detach()``), ∇₁E = 0 makes the implicit part of the
    hypergradient zero: a ``UserWarning`` says so (once per call site, by Python's default
    warning filter).
    """
    batches, _ = _validation_batches(val_batch)
    params = list(inner_parameters) + list(hyperparameters)
    total: list[Tensor | None] = [None] * len(params)
    value = 0.0
    used = [False] * len(params)
    values: Tensors = []  # E of each batch, read at once after the loop
    for batch in batches:
        loss = outer_loss(batch)
        check_scalar_loss("outer_loss", loss, "the validation objective E")
        if not loss.requires_grad:
            raise ConfigurationError(
                "outer_loss depends on neither the inner parameters nor the hyperparameters (its "
                "result does not require grad): E must be computed from w and/or λ."
                + _other_tensors_read(outer_loss, batch, module, params)
            )
        grads = torch.autograd.grad(loss.reshape(()), params, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                used[i] = True
                acc = total[i]
                scale = 1.0 / len(batches)
                total[i] = g * scale if acc is None else rows.add(acc, g, scale)
        values.append(loss.detach().reshape(()))
    if len({(v.device, v.dtype) for v in values}) == 1:  # one wait for the device, not one each
        read = torch.stack(values).tolist()
    else:
        read = [float(v) for v in values]
    for v in read:
        value += v / len(batches)
    if not any(used):
        raise ConfigurationError(
            "outer_loss depends on neither the inner parameters nor the hyperparameters: E must "
            "be computed from w and/or λ."
            + _other_tensors_read(outer_loss, batch, module, params)
            + _REPLACED
        )
    n = len(inner_parameters)
    if any(used[:n]) and not all(used[:n]):
        _warn_if_read_without_gradient(outer_loss, batches[0], inner_parameters, used[:n])
    if not any(used[:n]):
        warnings.warn(
            "outer_loss does not depend on the inner parameters w (every ∇₁E is unused, e.g. E "
            "reads w only through w.detach() or under torch.no_grad()), only on the "
            "hyperparameters: the implicit part of the hypergradient is zero and only ∇₂E is "
            "used. If E should measure the trained model, compute it from w without .detach().",
            UserWarning,
            stacklevel=2,
        )
    total = [rows.zero_gradient(p) if g is None else g for p, g in zip(params, total)]
    g1, g2 = total[:n], total[n:]
    if not torch.isfinite(torch.tensor(value)) or not rows.all_finite(total):
        raise DivergenceError(
            "outer gradient ∇E",
            None,
            norm(total),
            "The validation loss or its gradient is not finite: "
            + (
                _non_finite_batch(batches)
                or "check the validation data for NaN/Inf and that w has not diverged."
            ),
            data=bool(all(torch.isfinite(w).all() for w in inner_parameters)),
        )
    return g1, g2, value


def _non_finite_batch(batches: Sequence[Any]) -> str | None:
    """Where a validation batch itself holds NaN/Inf, which of its tensors and rows, or None
    (the error said "check the validation data for NaN/Inf and that w has not diverged"
    where the batch read held the NaN; session 63)."""
    for batch in batches:
        tensors = [batch] if isinstance(batch, Tensor) else []
        if isinstance(batch, dict):
            tensors = list(batch.values())
        elif isinstance(batch, (list, tuple)):
            tensors = list(batch)
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() == 0:
                continue
            bad = ~torch.isfinite(t.detach().reshape(len(t), -1)).all(1)
            if bool(bad.any()):
                return (
                    f"a validation batch it read holds NaN/Inf (its tensor {i}, in "
                    f"{int(bad.sum())} of its {len(t)} rows), so the validation data do: remove "
                    "or repair those examples (w is finite)."
                )
    return None


def warn_if_outer_is_inner(
    inner_loss: Callable[[Any], Tensor] | None,
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    g_lam: Sequence[Tensor],
) -> None:
    """Say where E is ℓ̂ itself on the validation data (``outer_loss`` returning
    ``inner_loss(batch)``, a copy-paste): E then holds the training's penalty, whose direct
    gradient ∇₂E pulls λ towards no regularisation whatever the validation data say (the ridge
    ``BilevelModule`` over 30 epochs: λ ≈ 0.044 where the validation loss alone gives 0.061),
    silently (session 62). Read only where E reads λ directly (∇₂E ≠ 0), on the first
    validation batch: two more forwards, once."""
    read = [g.coalesce().values() if g.is_sparse else g for g in g_lam if isinstance(g, Tensor)]
    if inner_loss is None or not any(bool(g.ne(0).any()) for g in read):
        return
    batch = _validation_batches(val_batch)[0][0]
    try:
        with torch.no_grad():
            e, ell = outer_loss(batch), inner_loss(batch)
    except Exception:  # an inner loss made for training batches only: nothing to compare
        return
    if not all(isinstance(x, Tensor) and x.numel() == 1 for x in (e, ell)):
        return
    e_value, ell_value = float(e), float(ell)
    if abs(e_value - ell_value) <= 1e-9 * max(abs(e_value), abs(ell_value), 1e-30):
        warnings.warn(
            f"hypertorch_sid: outer_loss equals inner_loss on the validation batch ({e_value:.6g}) "
            "and reads the hyperparameters directly: E holds the training's penalty, so its "
            "own gradient in λ (∇₂E) pulls λ towards no regularisation whatever the validation "
            "data say. E is usually the validation loss alone, without the penalty (e.g. "
            "outer_loss returns the data term, not inner_loss(batch)); if E should hold the "
            "penalty, ignore this warning.",
            UserWarning,
            stacklevel=3,
        )


def check_read_by_outer_loss(
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    hyperparameters: Sequence[Tensor],
    unread: Sequence[int],
) -> None:
    """The hyperparameters at positions ``unread`` (which ℓ̂ does not read, or reads only in
    terms without w, so that they do not move w(λ)) must be read by E: else their hypergradient
    is zero at every step and they never move, silently."""
    loss = outer_loss(_validation_batches(val_batch)[0][0])
    grads = torch.autograd.grad(
        loss.reshape(()), [hyperparameters[i] for i in unread], allow_unused=True
    )
    never = [i for i, g in zip(unread, grads) if g is None]
    if never:
        raise ConfigurationError(
            f"the hyperparameters at positions {never} (in the order given; a BilevelModule's "
            "order of register_hyperparameter) are read by neither inner_loss nor outer_loss, "
            "or by inner_loss only in terms without w (∂ℓ̂/∂λ does not depend on w: λ added to "
            "the loss on its own, or a penalty computed from w.detach() or w.data): they "
            "change neither the trained w nor E, so their hypergradient is zero and they never "
            "move. Use them in inner_loss as tensors, together with w (e.g. "
            "0.5 * (log_lam.exp() * w**2).sum(); float(lam), lam.item(), .detach() or an "
            "argument that takes a float, such as F.cross_entropy's label_smoothing, cut them "
            "from autograd), or do not register them."
        )


def outer_hessian_vector_product(
    outer_loss: Callable[[Any], Tensor],
    val_batch: Any,
    inner_parameters: Sequence[Tensor],
    vector: Sequence[Tensor],
) -> Tensors:
    """∇²₁₁E(w, λ)·u on ``val_batch`` (the validation curvature along u; batches read as in
    :func:`outer_gradients` and averaged): double backward, one product per batch."""
    batches, _ = _validation_batches(val_batch)
    params = list(inner_parameters)
    total = [torch.zeros_like(p) for p in params]
    for batch in batches:
        loss = outer_loss(batch).reshape(())
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        pairs = [(g, u) for g, u in zip(grads, vector) if g is not None and g.requires_grad]
        if not pairs:
            continue  # E is linear in w on this batch: no curvature
        dot = sum((g * u.detach()).sum() for g, u in pairs)
        hu = torch.autograd.grad(dot, params, allow_unused=True)
        for t, h in zip(total, hu):
            if h is not None:
                t.add_(h.detach(), alpha=1.0 / len(batches))
    return total
