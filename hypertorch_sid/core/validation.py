"""Input checks with errors that say what is wrong and how to fix it.

Scalar and choice settings are checked here, by one rule everywhere (the config, the strategies,
the schedules, the callback): a **bool is not a number** (``True`` is refused where a count or a
step size is expected), and **NumPy scalars are numbers** (``np.int64(5)``, ``np.float32(0.1)``
are accepted and stored as Python ``int``/``float``). Each check names the setting and what it
must be: ``"{name} must be {requirement}, got {value!r}."``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigurationError


def as_tensor_list(xs: Iterable[Tensor] | Tensor, name: str) -> list[Tensor]:
    """A list of tensors from a tensor, a list, or ``module.parameters()``."""
    if isinstance(xs, Tensor):
        xs = [xs]
    one_shot = iter(xs) is xs  # a generator, e.g. model.parameters()
    xs = list(xs)
    if not xs and one_shot:  # was "is empty" alone (session 56)
        raise ConfigurationError(
            f"{name} is an empty iterator: a generator such as model.parameters() read once "
            "already (e.g. by an optimizer built from the same generator object) is empty the "
            "second time. Pass a list: params = list(model.parameters())."
        )
    if not xs:
        raise ConfigurationError(f"{name} is empty: pass at least one tensor.")
    for i, x in enumerate(xs):
        if not isinstance(x, Tensor):
            fix = (  # a number was refused without the fix (session 61)
                f": a number cannot be moved in place; make it a leaf tensor, "
                f"torch.tensor({float(x)!r}, requires_grad=True) (a float dtype, the model's), "
                "and read that tensor in the losses"
                if is_real(x)
                else ""
            )
            raise ConfigurationError(
                f"{name}[{i}] is a {type(x).__name__}, not a torch.Tensor{fix}."
            )
    return xs


def named_tensor_list(
    xs: Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Mapping[str, Tensor] | Tensor, name: str
) -> tuple[list[Tensor], list[str | None]]:
    """The tensors of what :func:`as_tensor_list` takes, or of ``(name, tensor)`` pairs (a
    dict, ``module.named_parameters()``), and their names (None where none was given)."""
    if isinstance(xs, Tensor):
        return [xs], [None]
    one_shot = not isinstance(xs, Mapping) and iter(xs) is xs  # type: ignore[arg-type]
    items = list(xs.items() if isinstance(xs, Mapping) else xs)  # type: ignore[arg-type]
    if not any(isinstance(x, tuple) for x in items):
        tensors = as_tensor_list(iter(items) if one_shot else items, name)
        return tensors, [None] * len(tensors)
    if not all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], Tensor)
        for x in items
    ):
        raise ConfigurationError(
            f"{name} mixes tensors and other items: pass tensors, or (name, tensor) pairs "
            "(a dict of tensors, module.named_parameters()), not both."
        )
    names = [n for n, _ in items]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(
            f"{name} names {twice} more than once: give each tensor its own name (a saved "
            "state's values are matched to the tensors by these names)."
        )
    return as_tensor_list([t for _, t in items], name), names


def check_parameters(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """w and λ: distinct leaf tensors that require grad, on one device, of one float dtype.

    Each tensor may appear once (in one of the two lists), and no two of them may share memory
    (see :func:`check_no_shared_memory`); the dtypes are checked by :func:`check_dtypes`.
    """
    for name, xs in (("hyperparameters", hyper), ("inner_parameters", inner)):
        for i, x in enumerate(xs):
            if not x.is_floating_point():
                raise ConfigurationError(f"{name}[{i}] has dtype {x.dtype}; use a float dtype.")
            if not x.requires_grad:
                raise ConfigurationError(
                    f"{name}[{i}] does not require grad: create it with requires_grad=True "
                    "(or call .requires_grad_())."
                )
            if not x.is_leaf:
                raise ConfigurationError(
                    f"{name}[{i}] is not a leaf tensor (it was computed from other tensors). Pass "
                    "the leaf you optimise, e.g. log_lam, and compute λ = log_lam.exp() inside "
                    "the losses."
                )
    for i, x in enumerate(hyper):  # was "read by neither inner_loss nor outer_loss" (s54)
        if x.numel() == 0:
            raise ConfigurationError(
                f"hyperparameters[{i}] has no entries (shape {tuple(x.shape)}): there is nothing "
                "to tune in it. Leave it out, or give it its size (e.g. torch.zeros(d))."
            )
    check_no_duplicates(inner, hyper)
    devices = {x.device for x in list(inner) + list(hyper)}
    if len(devices) > 1:
        raise ConfigurationError(
            "inner parameters and hyperparameters are on different devices "
            f"{sorted(map(str, devices))}; move them to one device."
        )
    check_dtypes(inner, hyper)
    check_no_shared_memory(inner, hyper)
    check_finite(hyper, "hyperparameters")
    check_finite(inner, "inner_parameters")


def check_module(module: Any, inner: Sequence[Tensor]) -> None:
    """``module=`` must be an ``nn.Module`` holding some of the inner parameters w.

    A module holding none of them (another model, a ``copy.deepcopy`` of the model, a model
    whose parameters are all frozen) was taken silently: its modes and buffers were switched
    while the solves trained other tensors, and ``hvp="forward"`` differentiated the wrong model
    (session 54)."""
    if not isinstance(module, torch.nn.Module):
        raise ConfigurationError(
            f"module= must be the torch.nn.Module that owns the inner parameters, got "
            f"{type(module).__name__}. Pass the model (module=model), or leave module= out."
        )
    params = list(module.parameters())
    ids = {id(w) for w in inner}
    if any(id(p) in ids for p in params):
        return
    if not params:
        why = "it has no parameters"
    elif not any(p.requires_grad for p in params):
        why = f"its {len(params)} parameters are all frozen (requires_grad=False)"
    else:
        why = (
            f"none of its {len(params)} parameters is among the inner parameters (another "
            "model, or a copy of the model: copy.deepcopy makes new tensors)"
        )
    raise ConfigurationError(
        f"module= ({type(module).__name__}) holds none of the inner parameters w: {why}. Pass "
        "the model whose parameters are trained, with inner_parameters=model.parameters() (or "
        "a list of them), or leave module= out where w is not a module's."
    )


def check_unchanged(
    hyper: Sequence[Tensor], before: Sequence[Tensor], where: str = "the hypergradient"
) -> None:
    """λ is as the hypergradient found it, else λ is put back and :class:`ConfigurationError`.

    A loss that writes λ (``log_lam.data.clamp_(min=0)``, ``lam.data.add_(...)``: a constraint
    or a schedule put inside ``inner_loss``/``outer_loss``) moved λ at every one of its calls
    with no word: the hypergradient was taken along a λ that changed under it, and λ drifted
    apart from the outer optimizer's steps (session 54)."""
    if not hyper:
        return
    differ = torch.stack([(h.detach() != b).any() for h, b in zip(hyper, before)]).tolist()
    moved = [i for i, d in enumerate(differ) if d]  # one read of the device
    if not moved:
        return
    with torch.no_grad():
        for h, b in zip(hyper, before):
            h.copy_(b)
    raise ConfigurationError(
        f"the hyperparameters at positions {moved} were changed during {where}: "
        "a loss writes λ in place (inner_loss, outer_loss or a training_step: e.g. "
        "log_lam.data.clamp_(...), "
        "lam.data.add_(...)); λ was put back. λ is changed only by the outer optimizer: put a "
        "constraint into SIDConfig(feasible_set=FeasibleSet(project=...)), and compute a "
        "transformed λ inside the loss without writing it (e.g. lam = log_lam.exp())."
    )


def check_still_require_grad(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """At each hypergradient: w and λ still require grad. Switched off after the optimizer was
    built (``requires_grad_(False)``, e.g. ``model.requires_grad_(False)`` over a module that
    holds λ too) it was a raw autograd "One of the differentiated Tensors does not require
    grad" from inside the solve (session 53)."""
    for name, xs in (("hyperparameters", hyper), ("inner_parameters", inner)):
        off = [i for i, x in enumerate(xs) if not x.requires_grad]
        if off:
            raise ConfigurationError(
                f"{name} at positions {off[:5]}{' ...' if len(off) > 5 else ''} no longer "
                "require grad (requires_grad_(False) after the SIDHyperOptimizer was built): "
                "the hypergradient differentiates in every w and λ it was built with. Switch "
                "them back on (requires_grad_(True)), or build a new SIDHyperOptimizer over the "
                "tensors that are still trained and tuned."
            )


def check_finite(xs: Sequence[Tensor], name: str) -> None:
    """No NaN/Inf in w or λ. A λ₀ = log(0) = −inf (a decay of 0 learned as log λ) or a NaN
    was reported as "the inner solve diverged at step 0 … not a contraction: lower the inner
    step size", blaming the step size (session 53)."""
    flags = [torch.isfinite(x.detach()).all() for x in xs]
    if len({f.device for f in flags}) == 1 and bool(torch.stack(flags).all()):
        return
    bad = [i for i, f in enumerate(flags) if not bool(f)]
    if not bad:
        return
    x = xs[bad[0]].detach()
    raise ConfigurationError(
        f"{name} at positions {bad[:5]}{' ...' if len(bad) > 5 else ''} hold NaN or Inf "
        f"({name}[{bad[0]}]: {int((~torch.isfinite(x)).sum())} of {x.numel()} entries, e.g. "
        f"{float(x[~torch.isfinite(x)].flatten()[0])}). " + _FINITE_FIX[name]
    )


_FINITE_FIX = {
    "hyperparameters": "Start λ finite: a hyperparameter learned as log λ cannot start at "
    "λ = 0 (log 0 = −inf); start it at a small positive λ (e.g. log_lam = torch.full(shape, "
    "math.log(1e-4))), or learn λ itself with a projection onto λ ≥ 0.",
    "inner_parameters": "Start w finite: re-initialise the model (a previous fit that "
    "diverged leaves NaN weights; load a checkpoint from before it).",
}


def check_like_hyperparameters(hypergrad: Any, hyper: Sequence[Tensor]) -> None:
    """``apply(hypergrad)``: one tensor per hyperparameter, shaped like it. A shorter list was
    zipped away (the λ left out silently not stepped; an empty list stepped nothing and counted
    a hyper step), a bare tensor iterated over its rows: torch's "attempting to assign a
    gradient of size" (session 53)."""
    if isinstance(hypergrad, Tensor) or not isinstance(hypergrad, Sequence):
        raise ConfigurationError(
            f"apply() takes a list of tensors, one per hyperparameter (what hypergradient() "
            f"returns), got a {type(hypergrad).__name__}: pass [g] for one hyperparameter."
        )
    shapes = [tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__ for g in hypergrad]
    expected = [tuple(h.shape) for h in hyper]
    if shapes != expected:
        raise ConfigurationError(
            f"apply() got hypergradients shaped {shapes}, but the hyperparameters are shaped "
            f"{expected}: pass the whole list hypergradient() returned, in its order."
        )
    dtypes = [(i, g.dtype, h.dtype) for i, (g, h) in enumerate(zip(hypergrad, hyper))]
    other = [(i, g, h) for i, g, h in dtypes if g != h]
    if other:  # was torch's "attempting to assign a gradient with dtype" (session 56)
        i, g, h = other[0]
        raise ConfigurationError(
            f"apply() got hypergradient {i} of dtype {g}, but hyperparameter {i} is {h}: pass "
            f"it in λ's dtype (g.to({h}))."
        )


def check_no_duplicates(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """No tensor twice in ``inner`` or in ``hyper``, and none in both.

    A repeated w would get two updates per step (and ∇₁E counted twice), which silently gives a
    wrong hypergradient; a tensor that is both w and λ is refused too.
    """
    for name, xs in (("inner_parameters", inner), ("hyperparameters", hyper)):
        first: dict[int, int] = {}
        for i, x in enumerate(xs):
            if id(x) in first:
                raise ConfigurationError(
                    f"{name}[{first[id(x)]}] and {name}[{i}] are the same tensor: pass each "
                    "tensor once (e.g. list(model.parameters()), which yields every parameter "
                    "once, instead of concatenating lists that overlap)."
                )
            first[id(x)] = i
    inner_ids = {id(x) for x in inner}
    shared = [i for i, x in enumerate(hyper) if id(x) in inner_ids]
    if shared:
        raise ConfigurationError(
            f"hyperparameters at positions {shared} are also inner parameters: λ and w must be "
            "different tensors."
        )


def check_dtypes(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """All of w and λ share one dtype (mixing float32 and float64 silently loses precision)."""
    dtypes = {x.dtype for x in list(inner) + list(hyper)}
    if len(dtypes) > 1:
        where = ", ".join(
            f"{name}[{i}]: {x.dtype}"
            for name, xs in (("inner_parameters", inner), ("hyperparameters", hyper))
            for i, x in enumerate(xs)
        )
        raise ConfigurationError(
            "inner parameters and hyperparameters have different dtypes "
            f"{sorted(map(str, dtypes))} ({_shorten(where)}); use one dtype: convert the model "
            "and λ with .double() (float64) or .float() (float32), e.g. model.double() and "
            "torch.zeros(n, dtype=torch.float64, requires_grad=True)."
        )


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _byte_span(x: Tensor) -> tuple[int, int]:
    """[start, end) of the bytes of ``x`` relative to its storage (strides are non-negative)."""
    size = x.element_size()
    start = x.storage_offset() * size
    extent = sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    return start, start + (extent + 1) * size


def _element_bytes(x: Tensor) -> Tensor:
    """Every byte offset (relative to the storage) that ``x`` covers, as a 1-D int64 tensor."""
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(x.shape, x.stride()):
        offsets = (offsets.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s).flatten()
    size = x.element_size()
    starts = (offsets + x.storage_offset()) * size
    return (starts.unsqueeze(-1) + torch.arange(size, dtype=torch.int64)).flatten()


_EXACT_OVERLAP_LIMIT = 1 << 22  # bytes: above it, overlapping byte spans count as shared memory


def _overlap(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` (views of one storage) have a byte in common."""
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if a.is_contiguous() and b.is_contiguous():
        return True
    if a1 - a0 > _EXACT_OVERLAP_LIMIT or b1 - b0 > _EXACT_OVERLAP_LIMIT:
        return True
    return bool(torch.isin(_element_bytes(a), _element_bytes(b)).any())


def check_no_shared_memory(inner: Sequence[Tensor], hyper: Sequence[Tensor]) -> None:
    """No two of w and λ overlap in memory (views of one storage, e.g. ``p.data[:6]``).

    Tensors of one storage are compared by their byte ranges (``untyped_storage().data_ptr()``
    plus offsets and strides); disjoint views of one buffer (``buf[:5]``, ``buf[5:]``) are fine.
    Overlapping ones are refused: the inner solve writes w in place and would move λ with it,
    which shows up later as a "divergence".
    """
    named = [
        (f"{name}[{i}]", x)
        for name, xs in (("inner_parameters", inner), ("hyperparameters", hyper))
        for i, x in enumerate(xs)
    ]
    by_storage: dict[tuple[str, int], list[tuple[str, Tensor]]] = {}
    for label, x in named:
        if x.numel() == 0 or x.layout != torch.strided or x.device.type == "meta":
            continue
        try:
            ptr = x.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # tensors without a plain storage
            continue
        if ptr == 0:
            continue
        by_storage.setdefault((str(x.device), ptr), []).append((label, x))
    for group in by_storage.values():
        for j, (label_a, a) in enumerate(group):
            for label_b, b in group[j + 1 :]:
                if _overlap(a, b):
                    raise ConfigurationError(
                        f"{label_a} and {label_b} share memory (they are views of one storage, "
                        "e.g. slices of one parameter's .data): updating one would change the "
                        "other. Make them separate tensors, e.g. w = p.data[:6].clone()"
                        ".requires_grad_(), or split the buffer into disjoint pieces."
                    )


def warn_validation_in_training(train_batches: Any, val_batch: Any) -> None:
    """Warn where the validation data are training data: a floating-point tensor of
    ``val_batch`` (a batch, or a DataLoader over a ``TensorDataset``) overlapping in memory with
    one of ``train_batches`` (a list or tuple of batches, or such a DataLoader): the same
    tensors, or overlapping slices of one (``val_batch = batches[0]``, ``X[:100]`` against
    ``X[80:]``). E then measures the fit to data the inner steps minimise over, and λ is tuned
    for that (a learned weight decay falls towards 0), without a word (session 57). Other
    iterables are not read (a generator would be consumed); disjoint slices say nothing."""
    val = [x for _, x in _floating_tensors(_data_of(val_batch), "val_batch")]
    if not val or not isinstance(train_batches, (list, tuple, torch.utils.data.DataLoader)):
        return
    train = [x for _, x in _floating_tensors(_data_of(train_batches), "train_batches")]
    shared = [
        (i, j)
        for i, v in enumerate(val)
        for j, t in enumerate(train)
        if _same_storage(v, t) and _overlap(v, t)
    ]
    if shared:
        warnings.warn(
            "hypertorch_sid: the validation batch shares memory with the training batches (the "
            "same tensors, or overlapping slices of one): E then measures the fit to data the "
            "inner steps minimise over, and λ is tuned for that (a learned weight decay falls "
            "towards 0) instead of for held-out data. Hold out validation rows the training "
            "batches never hold, e.g. X[:n_train] for training and X[n_train:] for validation.",
            UserWarning,
            stacklevel=3,
        )


def _data_of(source: Any) -> Any:
    """The tensors of a DataLoader over a ``TensorDataset``; anything else as it is."""
    if isinstance(source, torch.utils.data.DataLoader):
        dataset = source.dataset
        return list(dataset.tensors) if isinstance(dataset, torch.utils.data.TensorDataset) else []
    return source


def _same_storage(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are views of one (plain, non-empty) storage."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.layout != torch.strided or b.layout != torch.strided or a.device.type == "meta":
        return False
    try:
        ptr = a.untyped_storage().data_ptr()
        return ptr != 0 and ptr == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return False


def check_batch_dtype(batch: Any, inner_parameters: Sequence[Tensor], name: str = "batch") -> None:
    """Floating tensors in ``batch`` have the parameters' dtype.

    Walks tensors, tuples, lists and dicts; integer and bool tensors (labels, indices) are
    ignored. float32 data with float64 parameters (or the reverse) either crashes deep inside a
    matmul or silently mixes precisions.
    """
    dtypes = {p.dtype for p in inner_parameters}
    if len(dtypes) != 1:
        return  # mixed parameters: check_dtypes reports that
    (dtype,) = dtypes
    for where, x in _floating_tensors(batch, name):
        if x.dtype != dtype:
            target = {torch.float64: ".double()", torch.float32: ".float()"}.get(
                dtype, f".to({dtype})"
            )
            other = {torch.float64: ".double()", torch.float32: ".float()"}.get(
                x.dtype, f".to({x.dtype})"
            )
            raise ConfigurationError(
                f"{where} has dtype {x.dtype} but the parameters are {dtype}: convert the data "
                f"with {target} (e.g. in the Dataset or with X{target}), or the model and "
                f"hyperparameters with {other}, so that both use one dtype."
            )


def _floating_tensors(batch: Any, where: str) -> Iterable[tuple[str, Tensor]]:
    if isinstance(batch, Tensor):
        if batch.is_floating_point():
            yield where, batch
    elif isinstance(batch, dict):
        for key, value in batch.items():
            yield from _floating_tensors(value, f"{where}[{key!r}]")
    elif isinstance(batch, (tuple, list)):
        for i, value in enumerate(batch):
            yield from _floating_tensors(value, f"{where}[{i}]")


def check_outer_optimizer(
    optimizer: torch.optim.Optimizer, inner: Sequence[Tensor], hyper: Sequence[Tensor]
) -> None:
    """The outer optimizer must hold every λ and no w, must not need a closure (LBFGS), must
    descend (no ``maximize=True``) and must not decay λ itself (no ``weight_decay``)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        cls = optimizer if isinstance(optimizer, type) else None
        raise ConfigurationError(
            f"outer_optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}."
            + (
                f" That is the class {cls.__name__} itself: build it over the hyperparameters, "
                f"e.g. {cls.__name__}(hyperparameters, lr=0.1)."
                if cls is not None and issubclass(cls, torch.optim.Optimizer)
                else ""
            )
        )
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ConfigurationError(
            "outer_optimizer is torch.optim.LBFGS, whose step(closure) re-evaluates the "
            "objective several times per step; SID gives one stochastic hypergradient per step "
            "and no closure. Use a first-order optimizer on λ, e.g. "
            "torch.optim.Adam(hyperparameters, lr=...) or torch.optim.SGD(hyperparameters, lr=...)."
        )
    ascending = [i for i, g in enumerate(optimizer.param_groups) if g.get("maximize")]
    if ascending:  # session 51: λ climbed E without a word (ridge log λ −3.5 → −0.85)
        raise ConfigurationError(
            f"outer_optimizer {type(optimizer).__name__} has maximize=True (group "
            f"{ascending[0]}): it would move λ up the hypergradient, increasing the validation "
            "objective E it is meant to lower. Drop maximize=True."
        )
    decaying = [
        (i, g["weight_decay"])
        for i, g in enumerate(optimizer.param_groups)
        if g.get("weight_decay")
    ]
    if decaying:  # session 53: partial(AdamW, lr=…) pulled log λ toward 0 (λ toward 1) unseen
        group, rate = decaying[0]
        raise ConfigurationError(
            f"outer_optimizer {type(optimizer).__name__} has weight_decay={rate} (group {group}): "
            "it would decay the hyperparameters themselves at every outer step (log λ toward 0, "
            "i.e. λ toward 1; a data weight's logit toward its midpoint), a pull the "
            "hypergradient does not see. Pass weight_decay=0 (AdamW's default is 0.01) or use "
            "torch.optim.Adam."
        )
    _check_group_learning_rates(optimizer)
    _check_eps_representable(optimizer)
    _warn_if_steps_below_resolution(optimizer)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    inner_ids = {id(x) for x in inner}
    if held & inner_ids:
        swapped = inner_ids <= held and not held & {id(x) for x in hyper}
        raise ConfigurationError(
            "outer_optimizer holds inner parameters: it must optimise only the hyperparameters "
            "(the inner parameters are updated by the inner solve)."
            + (  # session 56: the two lists given the other way round
                " It holds every inner parameter and no hyperparameter: were the two lists "
                "swapped? The first argument is λ: SIDHyperOptimizer(hyperparameters, "
                "inner_parameters, inner_loss, outer_loss, outer_optimizer)."
                if swapped
                else ""
            )
        )
    missing = [i for i, x in enumerate(hyper) if id(x) not in held]
    if missing:
        raise ConfigurationError(
            f"hyperparameters at positions {missing} are not in outer_optimizer: build it as "
            "torch.optim.Adam(hyperparameters, ...)."
        )
    hyper_ids = {id(x) for x in hyper}
    held_tensors = [p for g in optimizer.param_groups for p in g["params"]]
    others = [tuple(p.shape) for p in held_tensors if id(p) not in hyper_ids]
    if others:  # session 56: stepped with whatever .grad they held, which step() then cleared
        raise ConfigurationError(
            f"outer_optimizer also holds {len(others)} tensor(s) that are not hyperparameters "
            f"(shapes {others[:4]}): each outer step would move them by whatever .grad they "
            "hold and then clear it. Build it over the hyperparameters alone, "
            "torch.optim.Adam(hyperparameters, ...), or list those tensors as hyperparameters."
        )


def _check_eps_representable(optimizer: torch.optim.Optimizer) -> None:
    """An optimizer that keeps squared gradients (a group with ``eps``: Adam, AdamW, RMSprop,
    Adagrad …) over float16 λ computes them in float16, where the square of a hypergradient
    below 2.4e-4 is 0: its step divides by eps alone. With eps = 1e-8 (0 there) λ came out
    non-finite and the error blamed the learning rate (session 62); with an eps float16 holds
    (1e-4) the step is lr·g/eps, up to 2.4× lr where Adam's is at most lr, and float16 data
    weights came out 0.44 off float32's, silently (session 63). An optimizer that steps in
    float32 whatever λ's dtype (``steps_in_float32``: :class:`LazyAdam`) is not concerned;
    bfloat16 has float32's range and is not either."""
    if getattr(optimizer, "steps_in_float32", False):
        return
    for i, group in enumerate(optimizer.param_groups):
        eps = group.get("eps")
        if not is_real(eps):
            continue
        for p in group["params"]:
            if p.dtype != torch.float16:
                continue
            zero = float(torch.tensor(eps, dtype=p.dtype)) == 0.0
            raise ConfigurationError(
                f"outer_optimizer {type(optimizer).__name__} (eps={eps:g}, group {i}) keeps its "
                f"squared hypergradients in the hyperparameters' dtype {p.dtype}, where the "
                "square of a hypergradient below 2.4e-4 is 0"
                + (f" and eps={eps:g} is 0 too: its step divides by 0" if zero else "")
                + ": its steps are not Adam's (float16 data weights came out 0.44 off float32's; "
                "with eps=1e-8, non-finite). Use hypertorch_sid.core.LazyAdam (it computes its "
                "moments and steps in float32; the drop-ins' default), or keep λ in float32 "
                "(precision='16-mixed' keeps the weights in float32)."
            )


def _warn_if_steps_below_resolution(optimizer: torch.optim.Optimizer) -> None:
    """Say where λ's dtype holds it more coarsely than the outer learning rate: a bfloat16 λ
    (``precision="bf16-true"`` casts a ``BilevelModule``'s) holds log λ = −2.3 to a spacing
    of 0.016, so every outer step of lr = 0.01 was rounded to 0 or one spacing and the ridge
    learned λ ≈ 0.08 where float32 learns 0.06, silently (session 63)."""
    for i, group in enumerate(optimizer.param_groups):
        lr = group.get("lr")
        if not is_real(lr) or lr <= 0:
            continue
        for p in group["params"]:
            if not p.is_floating_point() or p.element_size() >= 4 or p.numel() == 0:
                continue
            top = float(p.detach().abs().max())
            if not 0 < top < math.inf:
                continue
            spacing = torch.finfo(p.dtype).eps * 2.0 ** math.floor(math.log2(top))
            if lr < spacing:
                warnings.warn(
                    f"hypertorch_sid: a hyperparameter tensor is {p.dtype}, which holds its "
                    f"values near {top:.3g} to a spacing of {spacing:.3g}, above the outer "
                    f"learning rate lr={lr:g} (group {i}): each outer step is rounded to 0 or "
                    "a whole spacing, and λ learns something else than in float32. Keep λ in "
                    "float32 (precision='bf16-mixed' or '16-mixed' keep the weights in "
                    "float32; a Trainer's '-true' precision casts them), or raise the outer "
                    "learning rate above the spacing.",
                    stacklevel=4,
                )
                return


def _check_group_learning_rates(optimizer: torch.optim.Optimizer) -> None:
    """No parameter group of the outer optimizer may hold λ at a negative learning rate, and
    one at 0 is said (session 60: torch checks only the optimizer's default ``lr``, not a
    group's own, so ``SGD([{"params": [log_lam], "lr": -0.5}], lr=0.1)`` climbed E without a
    word, and a group at ``lr=0`` was said to take steps "below the floating-point resolution
    of λ")."""
    for i, group in enumerate(optimizer.param_groups):
        lr = group.get("lr")
        if lr is None or not group["params"]:
            continue
        try:
            value = float(lr)
        except (TypeError, ValueError):
            continue  # an optimizer of its own kind: its lr is its business
        name = type(optimizer).__name__
        if value < 0:
            raise ConfigurationError(
                f"outer_optimizer {name} has lr={value:g} in parameter group {i}: a negative "
                "learning rate moves λ up the hypergradient, increasing the validation objective "
                "E it is meant to lower (torch checks only the optimizer's default lr, not a "
                "group's own). Give that group a positive lr."
            )
        if value == 0:  # a warning: lr=0 holds λ for a diagnostic run of the solves
            warnings.warn(
                f"outer_optimizer {name} has lr=0 in parameter group {i}, so the "
                f"{len(group['params'])} hyperparameter tensor(s) in it never move: give it a "
                "positive lr (e.g. functools.partial(torch.optim.Adam, lr=0.1)); to hold a "
                "hyperparameter fixed, leave it out of the hyperparameters.",
                UserWarning,
                stacklevel=4,
            )


def add_checked_group(
    optimizer: torch.optim.Optimizer, param_group: dict[str, Any], names: Sequence[str]
) -> None:
    """``torch.optim.Optimizer.add_param_group``, then the group's settings checked by the
    optimizer's ``_check_settings`` as its defaults were (session 60: torch checks only the
    defaults, so a group's own ``lr=-1`` moved λ up the hypergradient and ``betas=(1.0, 0.999)``
    divided by zero at the first step). A refused group is not kept."""
    torch.optim.Optimizer.add_param_group(optimizer, param_group)
    group = optimizer.param_groups[-1]
    try:
        optimizer._check_settings(*(group[n] for n in names))  # type: ignore[attr-defined]
    except ConfigurationError as err:
        optimizer.param_groups.pop()
        index = len(optimizer.param_groups)
        said = str(err).rstrip(".")
        raise ConfigurationError(f"{said} (the setting of parameter group {index}).") from None


def check_inner_optimizers(
    optimizers: Iterable[torch.optim.Optimizer],
    hyper: Sequence[Tensor],
    names: Sequence[str] | None = None,
) -> None:
    """No inner (training) optimizer may hold a hyperparameter (named by ``names`` where
    given, else by position)."""
    hyper_ids = {id(x): i for i, x in enumerate(hyper)}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) in hyper_ids:
                    i = hyper_ids[id(p)]
                    which = f"{names[i]!r}" if names is not None else str(i)
                    raise ConfigurationError(
                        f"hyperparameter {which} is also in the training optimizer "
                        f"{type(opt).__name__}: the training optimizer must see only the inner "
                        "parameters (use BilevelModule.inner_parameters(), not "
                        "self.parameters(), in configure_optimizers)."
                    )


def is_integer(value: Any) -> bool:
    """An integer: a Python or NumPy int, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number: a Python or NumPy int or float, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number_fix(
    name: str, value: Any, kind: type, holds: Callable[[float], bool] = lambda x: True
) -> str:
    """How to pass the number ``value`` meant, where it came as text or (an integer) as a
    whole float and that number ``holds``; "" otherwise. A YAML file reads ``1e-3`` as the
    string '1e-3' (PyYAML takes a float only with a dot: 1.0e-3), and so does a command line
    without ``type=``; ``every_n_steps=4.0`` comes from arithmetic or a config's float. A
    tensor is named as one, with its shape where it holds more than one number (session 61:
    ``GradientDescentMap(alpha=torch.tensor([0.1, 0.2]))`` raised torch's "only one element
    tensors can be converted to Python scalars")."""
    if isinstance(value, Tensor):
        return _tensor_fix(name, value, kind, holds)
    if _numpy_array(value):  # a 0-d array from np.load, an .npz, np.asarray (session 64)
        return _tensor_fix(name, value, kind, holds, "a NumPy array", "a")
    try:
        number = float(value) if isinstance(value, str) or is_real(value) else math.nan
    except ValueError:
        return ""
    if not math.isfinite(number) or not holds(number):
        return ""
    if kind is int and not number.is_integer():
        return ""
    meant = int(number) if kind is int else number
    if isinstance(value, str):
        return (
            f": it is the text {value!r} (a YAML file reads a number like 1e-3 as text, and so "
            f"does a command-line argument without type=), pass the number: "
            f"{name}={kind.__name__}({value!r}) = {meant!r}"
        )
    return f": pass {name}={meant}" if kind is int else ""


def _numpy_array(value: Any) -> bool:
    """A NumPy array (not a NumPy scalar, which is a number), told without importing NumPy."""
    return type(value).__module__ == "numpy" and hasattr(value, "ndim") and not is_real(value)


def _tensor_fix(
    name: str,
    value: Any,
    kind: type,
    holds: Callable[[float], bool],
    what: str = "a tensor",
    var: str = "t",
) -> str:
    """:func:`number_fix` for a tensor (or a NumPy array): one number is meant, given as a
    Python number."""
    size = value.numel() if isinstance(value, Tensor) else int(value.size)
    if size != 1:
        return f": {what} of shape {tuple(value.shape)}, where one number is meant"
    try:
        number = float(
            value.detach().reshape(()).cpu() if isinstance(value, Tensor) else value.item()
        )
    except (TypeError, ValueError):
        return f": {what}, where a number is meant"
    if math.isfinite(number) and holds(number) and (kind is float or number.is_integer()):
        meant = int(number) if kind is int else number
        return f": {what}, where a number is meant: pass {name}={var}.item() = {meant!r}"
    return f": {what}, where a number is meant"


def check_integer(name: str, value: Any, minimum: int, allow_none: bool = False) -> Any:
    """``value`` as an ``int`` ≥ ``minimum`` (None passes where ``allow_none``)."""
    if value is None and allow_none:
        return None
    if is_integer(value) and value >= minimum:
        return int(value)
    none = " or None" if allow_none else ""
    fix = number_fix(name.split(": ")[-1].split(" (")[0], value, int, lambda n: n >= minimum)
    raise ConfigurationError(f"{name} must be an integer ≥ {minimum}{none}, got {value!r}{fix}.")


def check_steps(name: str, value: int, minimum: int) -> int:
    """A step count that is an integer ≥ ``minimum`` (a Python or NumPy int, not a bool)."""
    return int(check_integer(name, value, minimum))


def check_real(
    name: str,
    value: Any,
    holds: Callable[[float], bool],
    requirement: str,
    allow_none: bool = False,
) -> Any:
    """``value`` as a ``float`` where ``holds(value)`` (None passes where ``allow_none``);
    ``requirement`` completes "must be ..." in the error."""
    if value is None and allow_none:
        return None
    if is_real(value) and not math.isnan(value) and holds(float(value)):
        return float(value)
    fix = number_fix(name.split(": ")[-1].split(" (")[0], value, float, holds)
    raise ConfigurationError(f"{name} must be {requirement}, got {value!r}{fix}.")


def check_positive(name: str, value: Any, allow_none: bool = False) -> Any:
    """A finite number > 0."""
    return check_real(
        name, value, lambda x: math.isfinite(x) and x > 0, "a finite positive number", allow_none
    )


def check_nonnegative(name: str, value: Any) -> float:
    """A finite number ≥ 0."""
    return float(
        check_real(name, value, lambda x: math.isfinite(x) and x >= 0, "a finite number ≥ 0")
    )


def check_fraction(name: str, value: Any) -> float:
    """A number in [0, 1) (a momentum, a contraction constant)."""
    return float(check_real(name, value, lambda x: 0 <= x < 1, "a number in [0, 1)"))


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """One of the strings ``choices``."""
    if isinstance(value, str) and value in choices:
        return value
    options = " or ".join(repr(c) for c in choices)
    raise ConfigurationError(f"{name} must be {options}, got {value!r}.")


def as_strategy(
    name: str, value: Any, kind: type, by_name: dict[str, Callable[[], Any]], example: str = ""
) -> Any:
    """A strategy object of ``kind``: ``value`` itself, or the default one of its name in
    ``by_name`` (``"log"`` → ``LogDecay()``); anything else is refused naming the choices."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str) and value in by_name:
        return by_name[value]()
    names = ", ".join(repr(n) for n in by_name)
    article = "an" if kind.__name__[0] in "AEIOU" else "a"
    hint = f" (e.g. {example})" if example else ""
    raise ConfigurationError(
        f"{name} must be {names} or {article} {kind.__name__}{hint}, got {value!r}."
        + class_given(value, kind)
    )


def class_given(value: Any, kind: type) -> str:
    """The fix where ``value`` is a class of ``kind`` given where an object of it belongs
    (session 60: ``SIDConfig(damping=CurvatureDamping)`` was refused as "must be a Damping
    object ..., got type", ``invariant=HoldInvariant`` as "got <class '...HoldInvariant'>"),
    else ``""``."""
    if not (isinstance(value, type) and issubclass(value, kind)):
        return ""
    return (
        f" That is the class {value.__name__} itself, not an object of it: call it, "
        f"{value.__name__}() (with its settings in the parentheses)."
    )


def check_takes(name: str, fn: Any, arguments: Sequence[str], returns: str) -> None:
    """``fn`` is a callable that can be called as ``fn(*arguments)`` (positionally): one of
    the user's callables that the drop-ins call only mid-fit (``validation_loss(module,
    batch)``, ``target(batch)``, ``outer_optimizer(params)``). Written for another call
    (``validation_loss=lambda batch: ...``), it failed at the first hyper step, after the
    training steps before it, with Python's "takes 1 positional argument but 2 were given"
    naming a lambda (session 53). A callable whose signature cannot be read is taken."""
    call = f"{name.split(': ')[-1]}({', '.join(arguments)}) -> {returns}"
    if not callable(fn):
        raise ConfigurationError(f"{name} must be a callable {call}, got {type(fn).__name__}.")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an extension type
        return
    try:
        signature.bind(*arguments)
    except TypeError as err:
        raise ConfigurationError(
            f"{name} is called as {call}, and the callable given cannot be called so ({err}): "
            "write it with those arguments."
        ) from None


def check_bool(name: str, value: Any) -> bool:
    """True or False (not 0/1, not a NumPy bool)."""
    if isinstance(value, bool):
        return value
    raise ConfigurationError(f"{name} must be True or False, got {value!r}.")


#: torch samplers whose result autograd treats as constant in their tensor arguments (their
#: derivative formulas are zeros): a draw from a λ- or w-dependent distribution made with them
#: silently loses that dependence
_NON_DIFFERENTIABLE_SAMPLERS = {
    torch.normal: "torch.normal",
    torch.bernoulli: "torch.bernoulli",
    torch.poisson: "torch.poisson",
    torch.binomial: "torch.binomial",
    torch.multinomial: "torch.multinomial",
    Tensor.bernoulli: "Tensor.bernoulli",
    Tensor.bernoulli_: "Tensor.bernoulli_",
    Tensor.multinomial: "Tensor.multinomial",
}


class _SamplerWatch(torch.overrides.TorchFunctionMode):
    """Records the samplers of :data:`_NON_DIFFERENTIABLE_SAMPLERS` called on a tensor that
    requires grad (one that depends on w or λ)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = _NON_DIFFERENTIABLE_SAMPLERS.get(func)
        if name is not None and any(
            isinstance(a, Tensor) and a.requires_grad for a in (*args, *kwargs.values())
        ):
            self.found.append(name)
        return func(*args, **kwargs)


def check_dependencies(
    inner_loss: Callable[[Any], Tensor],
    batch: Any,
    inner: Sequence[Tensor],
    hyper: Sequence[Tensor],
    names: Sequence[str] | None = None,
) -> list[int]:
    """ℓ̂ must depend on every inner parameter and on at least one hyperparameter, and draw no
    random numbers through a sampler autograd cannot differentiate (``torch.normal(0, σ)``).
    ``names``: the inner parameters' names in the model, for the error (else their positions:
    a drop-in user, whose inner parameters are the optimizer's, never listed them).

    Returns the positions of the hyperparameters ℓ̂ does not read (the outer loss must read
    them: :func:`~hypertorch_sid.core.outer.check_read_by_outer_loss`).
    """
    watch = _SamplerWatch()
    try:
        with watch:
            loss = inner_loss(batch)
    except RuntimeError as err:  # e.g. F.cross_entropy(weight=λ-dependent class weights)
        if "is not differentiable with respect to argument" not in str(err):
            raise
        raise ConfigurationError(
            f"inner_loss passes λ to a torch argument autograd cannot differentiate ({err}). "
            "Write that part with tensor operations, e.g. class weights c = K * "
            "class_logits.softmax(0) as (c[y] * F.cross_entropy(logits, y, reduction='none'))"
            ".sum() / c[y].sum() instead of F.cross_entropy(logits, y, weight=c)."
        ) from err
    if watch.found:
        raise ConfigurationError(
            f"inner_loss draws random numbers with {watch.found[0]} from a tensor that requires "
            "grad (it depends on w or λ): autograd gives such a draw a zero derivative in its "
            "parameters, so the hypergradient would silently leave that dependence out. "
            "Reparameterise the noise: mean + std * torch.randn_like(mean) for a Gaussian "
            "(and replay the same draw for a batch, e.g. noise stored with each sample); "
            "Bernoulli, Poisson and multinomial draws have no such form: keep λ out of them, "
            "and where the draw is meant to be a constant (a score-function estimator) pass "
            "its parameters .detach()ed."
        )
    check_scalar_loss("inner_loss", loss, "the minibatch training objective")
    if not loss.requires_grad:
        raise ConfigurationError(
            "inner_loss does not depend on the inner parameters (its result does not require "
            "grad): was it computed under torch.no_grad() or from detached weights?"
        )
    grads_w = torch.autograd.grad(
        loss.reshape(()), list(inner), allow_unused=True, retain_graph=True
    )
    grads_h, cut = _hyper_grads_and_cut(loss.reshape(()), inner, hyper)
    grads = grads_w + grads_h
    unused_w = [i for i, g in enumerate(grads[: len(inner)]) if g is None]
    if unused_w:  # a block a random draw skipped (stochastic depth) is read in other draws
        unused_w = _unused_in_every_draw(inner_loss, batch, inner, unused_w)
    if unused_w and names is not None:
        said = ", ".join(names[i] for i in unused_w[:5]) + (" …" if len(unused_w) > 5 else "")
        raise ConfigurationError(
            f"the training loss does not depend on {said}: either a layer the training never "
            "uses (e.g. an EMA copy of the network among the optimizer's parameters: leave them "
            "out of the optimizer or of inner_parameters, or freeze them with "
            "requires_grad_(False) before the fit), or a gradient cut on the way to them "
            "(.detach(), torch.no_grad(), or torch.utils.checkpoint(..., use_reentrant=True) on "
            "inputs that do not require grad: pass use_reentrant=False). They have no fixed "
            "point to solve for."
        )
    if unused_w and len(unused_w) == len(inner):  # "leave them out" left nothing (s56)
        raise ConfigurationError(
            "inner_loss depends on none of the inner parameters: it reads other tensors than "
            "the ones given, e.g. a copy of the model (copy.deepcopy(model) or a model built "
            "twice) or weights detached from them (.detach(), .data, torch.no_grad()). Pass "
            "the parameters of the model inner_loss calls: inner_parameters=model.parameters()."
        )
    if unused_w:
        raise ConfigurationError(
            f"inner_loss does not depend on inner parameters at positions {unused_w}: leave them "
            "out of inner_parameters (they have no fixed point to solve for)."
        )
    unread = [i for i, g in enumerate(grads[len(inner) :]) if g is None]
    if len(unread) == len(hyper):
        raise ConfigurationError(
            "inner_loss depends on none of the hyperparameters: the implicit part of the "
            "hypergradient would be zero. Use λ inside the training objective (e.g. a penalty "
            "0.5 * (log_lam.exp() * w**2).sum()) as a tensor: a λ turned into a Python number "
            "(float(lam), lam.item(), or passed to an argument that takes a float, such as "
            "F.cross_entropy's label_smoothing or F.huber_loss's delta) is cut from autograd; "
            "write that loss with tensor operations instead."
        )
    return sorted(set(unread) | set(cut))


#: the further evaluations of ℓ̂ on the first batch that must all leave an inner parameter
#: unread before :func:`check_dependencies` refuses it: a block skipped at random in training
#: (stochastic depth or LayerDrop written as a Python branch on torch.rand) is unread in one
#: draw, not in all (session 63: a residual MLP skipping each of its 4 blocks with probability
#: 0.2 was refused as "a layer the training never uses" in 59 % of the draws)
UNUSED_DRAWS = 8


def _unused_in_every_draw(
    inner_loss: Callable[[Any], Tensor], batch: Any, inner: Sequence[Tensor], unused: list[int]
) -> list[int]:
    """The positions of ``unused`` that :data:`UNUSED_DRAWS` more evaluations of ℓ̂ on ``batch``
    (fresh random draws) all leave unread; at most that many forwards, once per fit."""
    for _ in range(UNUSED_DRAWS):
        if not unused:
            break
        loss = inner_loss(batch).reshape(())
        grads = torch.autograd.grad(loss, [inner[i] for i in unused], allow_unused=True)
        unused = [i for i, g in zip(unused, grads) if g is None]
    return unused


def _hyper_grads_and_cut(
    loss: Tensor, inner: Sequence[Tensor], hyper: Sequence[Tensor]
) -> tuple[tuple[Tensor | None, ...], list[int]]:
    """∂ℓ̂/∂λ with its graph (only λ's path is differentiated twice) and the positions whose
    ∂ℓ̂/∂λ does not reach w (:func:`_not_moving_w`). Where the graph holds an op without a double
    backward, no verdict: the plain ∂ℓ̂/∂λ and nothing cut (such models run with
    ``directional="forward_difference"``)."""
    try:
        grads = torch.autograd.grad(loss, list(hyper), allow_unused=True, create_graph=True)
        return grads, _not_moving_w(grads, inner)
    except RuntimeError:
        return torch.autograd.grad(loss, list(hyper), allow_unused=True, retain_graph=True), []


def _not_moving_w(hyper_grads: Sequence[Tensor | None], inner: Sequence[Tensor]) -> list[int]:
    """Positions of the hyperparameters ℓ̂ reads whose ∂ℓ̂/∂λ does not depend on w: the cross
    derivative ∂²ℓ̂/∂w∂λ is then exactly zero, λ does not move w(λ) and the implicit part of its
    hypergradient is zero at every step (λ added to ℓ̂ in a term without w, or a penalty
    computed from ``w.detach()`` / ``w.data``). Found on autograd's graph: no path from
    ∂ℓ̂/∂λ back to any w (session 53)."""
    cut = []
    for j, g in enumerate(hyper_grads):
        if g is None or g.layout != torch.strided:  # a sparse ∂ℓ̂/∂λ: not read here
            continue
        if g.requires_grad:
            back = torch.autograd.grad(
                g, list(inner), grad_outputs=torch.ones_like(g), allow_unused=True,
                retain_graph=True,
            )  # fmt: skip
            if any(b is not None for b in back):
                continue
        cut.append(j)
    return cut


def estimate_contraction(
    phi_vjp: Callable[[Any, Sequence[Tensor]], Sequence[Tensor]],
    like: Sequence[Tensor],
    batches: Sequence[Any],
    iters: int = 20,
    seed: int = 0,
) -> float:
    """Estimate q = ‖∂₁Φ‖ of a fixed-point map by power iteration with VJPs only.

    Parameters
    ----------
    phi_vjp:
        ``phi_vjp(batch, v) -> list of tensors``: ∂₁Φ̂(w, λ; batch)ᵀ v at the current w.
    like:
        Tensors shaped like w (the inner parameters); the start vector is random, shaped alike.
    batches:
        The minibatches whose mean map ∂₁Φ = mean_j ∂₁Φ̂_j is measured (the same every iteration,
        so that the operator is fixed).
    iters:
        Power iterations v ← ∂₁Φᵀ v / ‖∂₁Φᵀ v‖.

    Returns
    -------
    The growth ‖∂₁Φᵀ v‖ / ‖v‖ as a geometric mean over the second half of the iterations: the
    spectral radius of ∂₁Φ (its norm when the Jacobian is symmetric, as for gradient-descent
    maps; for a non-symmetric Jacobian a lower bound on ‖∂₁Φ‖). A value ≥ 1 means the map is not
    a contraction (see :func:`check_contraction`).
    """
    iters = check_steps("iters", iters, 1)
    batches = list(batches)
    if not batches:
        raise ConfigurationError("estimate_contraction needs at least one batch.")
    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x) for x in like]
    v = _normalised(v)
    logs: list[float] = []
    for _ in range(iters):
        total = [torch.zeros_like(x) for x in v]
        for batch in batches:
            for t, g in zip(total, phi_vjp(batch, v)):
                t.add_(g.detach(), alpha=1.0 / len(batches))
        growth = float(torch.sqrt(sum((t.double() ** 2).sum() for t in total)))
        if not math.isfinite(growth):
            return math.inf
        if growth == 0.0:
            return 0.0
        logs.append(math.log(growth))
        v = [t / growth for t in total]
    tail = logs[len(logs) // 2 :]
    return math.exp(sum(tail) / len(tail))


def _normalised(v: Sequence[Tensor]) -> list[Tensor]:
    n = float(torch.sqrt(sum((x.double() ** 2).sum() for x in v)))
    return [x / n for x in v] if n > 0 else list(v)


def check_contraction(q: float, where: str) -> float:
    """Raise :class:`ConfigurationError` unless the measured contraction constant q < 1.

    ``where`` names the map in the message (e.g. ``"fixed_point_map"``). Returns ``q``.
    """
    if isinstance(q, numbers.Real) and math.isfinite(q) and q < 1:
        return float(q)
    raise ConfigurationError(
        f"{where} is not a contraction: the measured q ≈ {float(q):.4g} (‖∂₁Φ‖ estimated by "
        "power iteration) is not < 1, so the inner and adjoint fixed-point iterations diverge or "
        "give a wrong hypergradient (the theory assumes ‖∂₁Φ‖ ≤ q < 1). Make it a contraction: "
        "take a smaller step size inside the map, add damping (damping=FixedDamping(δ) with "
        f"δ > q − 1 ≈ {float(q) - 1:.3g}: the damped map has ‖∂₁Φ‖/(1 + δ)), or use a map that "
        "satisfies the paper's contraction "
        "assumption (e.g. gradient descent with α < 2/L on a strongly convex inner loss)."
    )


#: why an integer loss cannot be trained on, and what to return instead
_INTEGER_LOSS = (
    "an integer (a count of errors, argmax, .long(), .round().int()) has no gradient, so "
    "nothing could be differentiated through it. Return a floating-point loss computed from "
    "the model's outputs, e.g. F.cross_entropy(logits, y) (and count the errors apart, as a "
    "metric)."
)


def check_training_loss_has_gradient(who: str, loss: Any) -> None:
    """The loss a training step hands to backward carries a gradient: a ``training_step``
    under ``@torch.no_grad()`` (copied from a ``predict_step``), ``.detach()``ed, or a count of
    errors failed inside Lightning's backward with torch's "element 0 of tensors does not
    require grad and does not have a grad_fn", naming no step and no cause (session 61)."""
    if not isinstance(loss, Tensor) or loss.requires_grad:
        return
    if not (loss.is_floating_point() or loss.is_complex()):
        raise ConfigurationError(
            f"{who}: training_step returned a loss of dtype {loss.dtype}: " + _INTEGER_LOSS
        )
    raise ConfigurationError(
        f"{who}: training_step returned a loss that does not require grad (no grad_fn), so "
        "backward has nothing to differentiate: was it computed under torch.no_grad() or "
        "torch.inference_mode() (a decorator on training_step, or a block around the forward "
        "pass), detached (.detach(), .item(), .data, a Python number turned back into a "
        "tensor), or is it a count (of errors: argmax, .long(), .round(); Lightning turns an "
        "integer loss into a float, which has no gradient either)? Compute the training loss "
        "from the model's outputs with gradients on, e.g. F.cross_entropy(logits, y); wrap "
        "only what needs none (a metric) in torch.no_grad()."
    )


def check_training_loss_is_scalar(who: str, loss: Any) -> None:
    """The loss a training step hands to backward is one number: per-sample losses
    (``reduction="none"``, kept from a ``LearnedDataWeights`` fit, which reads them) failed
    inside Lightning's backward with torch's "grad can be implicitly created only for scalar
    outputs", naming neither the step nor the fix (session 62)."""
    if not isinstance(loss, Tensor) or loss.numel() == 1:
        return
    raise ConfigurationError(
        f"{who}: training_step returned a loss of shape {tuple(loss.shape)}, not one number, "
        "and backward needs a scalar. Per-sample losses (reduction='none')? Only "
        "LearnedDataWeights reads those (it weights and reduces them itself); here reduce them "
        "in training_step: return losses.mean(), or F.cross_entropy(logits, y) without "
        "reduction='none'."
    )


def check_scalar_loss(name: str, loss: Any, meaning: str) -> None:
    """Refuse a ``name(batch)`` result that is no real scalar tensor, naming what it was and
    how to reduce it (a vector of per-sample losses was refused as "must return a scalar
    tensor" without its shape or the fix, or failed in Lightning's ``self.log``: session 58)."""
    if isinstance(loss, Tensor) and loss.numel() == 1 and not loss.is_complex():  # complex: s56
        if not loss.is_floating_point():  # was "does not depend on the inner parameters" (s61)
            raise ConfigurationError(
                f"{name}(batch) returned a tensor of dtype {loss.dtype} ({meaning}): "
                + _INTEGER_LOSS
            )
        return
    if isinstance(loss, Tensor):
        got = f"a {'complex ' if loss.is_complex() else ''}tensor of shape {tuple(loss.shape)}"
    else:
        got = f"a {type(loss).__name__}"
    fix = (
        ": reduce it to one number, e.g. return losses.mean() (per-sample losses)"
        if isinstance(loss, Tensor) and loss.numel() > 1 and not loss.is_complex()
        else ""
    )
    raise ConfigurationError(
        f"{name}(batch) must return a scalar tensor ({meaning}, of real numbers), got {got}{fix}."
    )
