"""What the data-weights drop-in reads of the user's data, and the checks it makes of it.

Where a batch's labels are (:func:`batch_labels`: ``batch[1]``, or a dict sample's one label
key) and which examples a training set's rows are (:func:`_examples_of`); and the refusals and
warnings, each naming the fix, that
:class:`~hypertorch_sid.lightning.data_weights.LearnedDataWeights` gives for data it cannot
weight: an ``IndexedDataset`` inside another dataset, a ``collate_fn`` that drops the indices,
an indexed validation set, per-sample losses with masked entries or masked examples (exactly 0),
a regression under the default objective E (eq. softerr), ``gauge="class"`` where it cannot be
held, a validation loss that is not a tensor.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler
from torch.utils.data.dataloader import default_collate

from ..core.errors import ConfigurationError
from ..core.indexing import LABEL_KEYS, Indexed, IndexedDataset, LabelledIndexed, indexed_collate
from ..core.normalisers import CLASS_GAUGES
from ..core.parameterizations import WeightParameterization
from ..core.sample_weights import SampleWeights
from ..core.validation import check_takes, is_integer, is_real, number_fix
from .sampling import _identity, _unwrapped


def _inner_indexed(dataset: Any, depth: int = 4) -> str | None:
    """Where an :class:`IndexedDataset` sits inside ``dataset`` (a ``Subset``'s ``.dataset``, a
    ``ConcatDataset``'s ``.datasets``, a few levels deep), for the refusal's advice; else None."""
    if depth == 0:
        return None
    children = [getattr(dataset, "dataset", None), *getattr(dataset, "datasets", ())]
    for child in children:
        if isinstance(child, IndexedDataset):
            return f"{type(dataset).__name__}(IndexedDataset(...))"
        found = _inner_indexed(child, depth - 1) if child is not None else None
        if found is not None:
            return f"{type(dataset).__name__}({found})"
    return None


def _carried_labels(batch: Any) -> Tensor | None:
    """The labels :class:`~hypertorch_sid.core.indexing.indexed_collate` read from the
    samples before the user's ``collate_fn`` (a :class:`LabelledIndexed` batch's), or None."""
    return batch.labels if isinstance(batch, LabelledIndexed) else None


def _integer_vector(labels: Any, b: int | None = None) -> bool:
    """Whether ``labels`` is an integer tensor of one class id per row (of ``b`` rows where
    given): 1-D, or a column ``(b, 1)`` (a data set returning ``torch.tensor([y])``, labels
    kept as ``y[:, None]``), read as :func:`class_ids`. A column was read as no labels before
    (session 52): the class gauge and every label check were silently off, and
    ``per="class"`` advised ``batch[1].argmax(1)``, which maps every row to class 0. Binary
    labels stored as bools (``y == k``) are read as the classes 0 / 1 (:func:`class_ids`): read
    as no labels before (session 53), the class gauge and the label checks were silently off
    (the weights up to 0.75 off the integer labels' fit)."""
    return (
        isinstance(labels, Tensor)
        and (labels.dim() == 1 or (labels.dim() == 2 and labels.shape[1] == 1))
        and not labels.is_floating_point()
        and not labels.is_complex()
        and (b is None or labels.shape[0] == b)
    )


def class_ids(labels: Tensor) -> Tensor:
    """An :func:`_integer_vector`'s class ids as a 1-D int64 tensor (a column flattened; bools
    as 0 / 1). Labels of another integer dtype (uint8 as MNIST's raw targets, int8, int16)
    crashed in torch's indexing before (session 58: "index_reduce_(): Expected dtype
    int32/int64 for index but got: Char")."""
    ids = labels if labels.dim() == 1 else labels.reshape(-1)
    return ids if ids.dtype == torch.long else ids.long()


def batch_labels(data: Any) -> Any:
    """A batch's label entry, the one place that says where it is: the one of
    :data:`LABEL_KEYS` a dict sample (a dataclass's or namedtuple's fields) holds, else
    ``batch[1]`` of a ``(x, y, ...)`` sample; None where there is none, or more than one key
    could be it. Dict samples gave no label to read before (session 50): their label-change
    check, ``flagged("split_misfit")``, the contrast warning and the masked-row warnings were
    silently off, and ``per="class"`` asked for ``target=``."""
    if isinstance(data, Mapping):
        found = [data[k] for k in LABEL_KEYS if k in data]
    elif dataclasses.is_dataclass(data) or hasattr(data, "_fields"):
        found = [getattr(data, k) for k in LABEL_KEYS if hasattr(data, k)]
        if not found and isinstance(data, tuple) and len(data) > 1:
            found = [data[1]]
    elif isinstance(data, (list, tuple)) and len(data) > 1:
        found = [data[1]]
    else:
        found = []
    return found[0] if len(found) == 1 else None


def _warn_unread_labels(data: Any, b: int) -> None:
    """Labels the drop-in cannot read, said once at the fit's first step, naming ``target=``:
    class names (strings) or one-hot rows where the labels are read, a dict sample
    (dataclass) holding no key of :data:`LABEL_KEYS` but an integer vector of one entry per
    row under another (``{"x": ..., "cls": ...}``), or a tuple batch's labels after ``batch[1]``
    (:func:`_labels_elsewhere`). No label was read from any, and the class gauge
    ``gauge="auto"`` chooses for labelled data and every label check were off without a word
    (the weights 0.73 off those of the same data under ``"y"``, session 53)."""
    found = (
        _names_read(data)
        or _one_hot_read(data, b)
        or _keys_elsewhere(data, b)
        or _labels_elsewhere(data, b)
    )
    if found is None:
        return
    where, fix = found
    rank_zero_warn(
        f"LearnedDataWeights: the training batches hold their labels {where}, so none were "
        "read (integer class ids are): the class gauge (what gauge='auto' chooses for labelled "
        "data) and the label checks (labels changing between epochs, -100 rows, classes "
        "missing from the validation data) are off. If those are the class labels, pass "
        f"target=lambda batch: {fix}; otherwise ignore this."
    )


def _one_hot_rows(labels: Any, b: int) -> bool:
    """Whether ``labels`` is a (b, C ≥ 2) tensor whose every row is one-hot (one entry 1, the
    others 0): class labels the drop-in does not read as such (session 64: the class gauge
    off, the weights correlated 0.75 with those of the same fit under integer labels, and
    ``flagged`` said "the examples carry no class labels (a regression?)")."""
    if not (isinstance(labels, Tensor) and labels.dim() == 2 and labels.shape[0] == b >= 1):
        return False
    if labels.shape[1] < 2 or labels.is_complex():
        return False
    rows = labels.detach()
    return bool(((rows == 0) | (rows == 1)).all()) and bool((rows.sum(1) == 1).all())


def _one_hot_read(data: Any, b: int) -> tuple[str, str] | None:
    """(where, the ``target=`` that reads them) where the labels read are one-hot rows."""
    labels = batch_labels(data)
    if not _one_hot_rows(labels, b):
        return None
    return f"as one-hot rows (shape {tuple(labels.shape)})", "batch[1].argmax(1)"


def _names_read(data: Any) -> tuple[str, str] | None:
    """(where, the ``target=`` that reads them) where the labels read are class names."""
    labels = batch_labels(data)
    if isinstance(labels, (list, tuple)) and labels and all(isinstance(c, str) for c in labels):
        return "as class names (strings)", "torch.tensor([CLASSES.index(c) for c in batch[1]])"
    return None


def _keys_elsewhere(data: Any, b: int) -> tuple[str, str] | None:
    """(where, the ``target=`` that reads them) where a dict (dataclass) batch holds no key of
    :data:`LABEL_KEYS` but an integer vector of one entry per row under another."""
    if isinstance(data, Mapping):
        items = list(data.items())
    elif dataclasses.is_dataclass(data) and not isinstance(data, type):
        items = [(f.name, getattr(data, f.name)) for f in dataclasses.fields(data)]
    else:
        return None
    keys = [k for k, v in items if _integer_vector(v, b)]
    if not keys or batch_labels(data) is not None:
        return None
    where = (
        f"under {', '.join(repr(k) for k in keys)}, but labels are read under the keys "
        f"{', '.join(LABEL_KEYS)} only"
    )
    return where, f"batch[{keys[0]!r}]"


def _labels_elsewhere(data: Any, b: int) -> tuple[str, str] | None:
    """Where a tuple batch's labels stand when ``batch[1]`` is none but a later entry is one
    integer class id per row (``(view1, view2, y)``: a dataset returning two augmented views),
    as (where, the ``target=`` that reads them); None otherwise. Such labels were unread
    without a word (session 64: the class gauge and the label checks off; ``flagged()`` then
    asked "a regression?")."""
    if not isinstance(data, (list, tuple)) or len(data) < 3 or _integer_vector(data[1], b):
        return None
    found = [k for k in range(2, len(data)) if _integer_vector(data[k], b)]
    if len(found) != 1:
        return None
    k = found[0]
    at = "batch[-1]" if k == len(data) - 1 else f"batch[{k}]"
    return (
        f"at {at} of a batch of {len(data)} entries, but labels are read at batch[1] only "
        f"(here {_label_fault(data[1])[0]})",
        at,
    )


def _default_target(data: Any) -> Tensor:
    labels = batch_labels(data)
    if labels is None:
        keys = f" (keys {sorted(data)})" if isinstance(data, Mapping) else ""
        raise ConfigurationError(
            "LearnedDataWeights(per='class') reads the labels as batch[1] of a (x, y) sample, "
            f"or the one of the keys / fields {LABEL_KEYS} of a dict or dataclass sample; this "
            f"{type(data).__name__} batch has none{keys}: pass target=lambda batch: <the label "
            "tensor>."
        )
    return labels


def _refuse_arguments(
    per: str,
    num_classes: Any,
    gauge: str,
    target: Any,
    validation_loss: Any,
    initial: Any,
) -> None:
    """The refusals of :class:`~.data_weights.LearnedDataWeights`' arguments that need no
    weights built: ``per``, ``num_classes`` (only and always with ``per="class"``), ``gauge``,
    ``target`` and ``validation_loss`` callables, one ``initial`` for every row."""
    if per not in ("sample", "class"):
        raise ConfigurationError(
            f"LearnedDataWeights: per must be 'sample' or 'class', got {per!r}."
        )
    if per == "class" and (not is_integer(num_classes) or num_classes < 2):
        fix = number_fix("num_classes", num_classes, int, lambda n: n >= 2)  # 3.0, '3'
        raise ConfigurationError(
            "LearnedDataWeights(per='class') needs num_classes, an integer ≥ 2 (the largest "
            f"label + 1), got {num_classes!r}{fix}."
        )
    if per == "sample" and num_classes is not None:
        raise ConfigurationError(
            f"LearnedDataWeights: num_classes={num_classes!r} is read only with per='class' "
            "(one weight per class); per='sample', the default, learns one weight per "
            "training example and needs no class count. Pass per='class' for class weights, "
            "or drop num_classes."
        )
    if gauge not in ("auto", "batch", "mean_logit", *CLASS_GAUGES):
        raise ConfigurationError(
            "LearnedDataWeights: gauge must be 'auto', 'batch' or 'mean_logit' (or 'class', "
            "each row's cross term centred on its class and each class's mean logit held, or "
            f"'class_centred', the centring alone), got {gauge!r}."
        )
    if target is not None:
        check_takes("LearnedDataWeights: target", target, ("batch",), "class ids")
    if validation_loss is not None:
        call = ("module", "batch")
        check_takes("LearnedDataWeights: validation_loss", validation_loss, call, "losses")
    _refuse_initial_of_many(initial, per)


def _refuse_initial_of_many(initial: Any, per: str) -> None:
    """``initial`` is one ω₀ for every row: a tensor or list of one per example (or class) was a
    raw "only one element tensors can be converted to Python scalars" / "float() argument must
    be ... not 'list'" from inside the weights (session 52)."""
    if (
        initial is None
        or is_real(initial)
        or (isinstance(initial, Tensor) and initial.numel() == 1)
    ):
        return
    many = len(initial) if isinstance(initial, (list, tuple, Tensor)) else None
    got = f"a {type(initial).__name__} of {many}" if many is not None else repr(initial)
    row = "example" if per == "sample" else "class"
    raise ConfigurationError(
        f"LearnedDataWeights: initial is one starting weight ω₀ for every {row} (a number, "
        f"e.g. initial=0.5 under the sigmoid), got {got}: the weight of each {row} is what the "
        "callback learns, all from that one start. Pass one number, or drop initial= (the "
        "parameterisation's default)."
    )


def _refuse_class_gauge(
    per: str, parameterization: WeightParameterization, initial: float | None, gauge: str = "class"
) -> None:
    """A class gauge (``"class"``, ``"class_centred"``) where it can be held: per sample, a
    sigmoid parameterisation."""
    if per != "sample":
        raise ConfigurationError(
            f"LearnedDataWeights(gauge={gauge!r}) works on each class's per-sample logits; "
            "per='class' learns one weight per class, which it would hold fixed: drop gauge= "
            "(or use per='sample')."
        )
    SampleWeights(1, parameterization, initial).use_class_gauge(lambda: None, gauge)  # type: ignore[arg-type]


def _refuse_masked_entries(losses: Any) -> None:
    """A clear error for a per-sample loss of more than one dimension with entries exactly 0
    at the fit's first step: a network (untrained, at a fresh fit's start) fits no entry
    exactly, so these are masked ones (padding dropped by ``ignore_index``, a loss multiplied
    by a mask), which averaging each row over all its entries would count as fitted."""
    if not isinstance(losses, Tensor) or losses.dim() < 2 or losses.numel() == 0:
        return
    zeros = int((losses.detach() == 0).sum())
    if zeros == 0:
        return
    raise ConfigurationError(
        f"LearnedDataWeights: training_step returned per-sample losses of shape "
        f"{tuple(losses.shape)} with {zeros} entries exactly 0 at the fit's first step: "
        "masked entries (padding dropped by ignore_index, or a mask)? Each row would be "
        "averaged over all its entries, padding included, so a padded sequence's loss would "
        "shrink with its padding, and its weight, the outer objective and flagged() would read "
        "it as better fitted. Reduce each row yourself to one loss per sample over its real "
        "entries: tok = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=pad, "
        "reduction='none'); return tok.sum(1) / (y != pad).sum(1).clamp_min(1). (A dense loss "
        "that can be exactly 0, e.g. a hinge: return loss.mean(1).)"
    )


def _warn_broadcast_losses(losses: Any, rows: int) -> None:
    """A warning where the fit's first step returns per-sample losses of shape (B, B) for a
    batch of B rows: a (B,) prediction broadcast against (B, 1) targets (or the other way
    round), ``(pred.squeeze(-1) - y) ** 2`` with y of shape (B, 1), gives every prediction's
    error against every row's target, which the drop-in read as B labels per row and averaged:
    each row's loss then mixed every target of its batch, silently (session 64: a regression
    with 40 outlying targets of 180 kept their weights at 0.34 against 0.59 for the clean rows,
    0.09 against 0.66 with the shapes matched; correlation 0.19). A multi-label loss with as
    many labels as the batch's rows is told apart by no shape: said, not refused."""
    if not (isinstance(losses, Tensor) and losses.dim() == 2 and rows >= 2):
        return
    if tuple(losses.shape) != (rows, rows):
        return
    rank_zero_warn(
        f"LearnedDataWeights: training_step returned per-sample losses of shape ({rows}, "
        f"{rows}) for a batch of {rows} rows: a prediction of shape ({rows},) broadcast "
        f"against targets of shape ({rows}, 1), or the other way round ((pred - y) ** 2, "
        "F.mse_loss(..., reduction='none') with one of them squeezed)? Each row's loss then "
        "mixes every target of the batch, and the weights read the mean of that row. Give "
        "the prediction and the target the same shape (pred.squeeze(-1) with y.squeeze(-1), "
        f"or both ({rows}, 1)). A multi-label loss with {rows} labels per example is read "
        "as it should be: then ignore this."
    )


def _examples_digest(examples: tuple[Any, tuple[int, ...] | None]) -> str | None:
    """:func:`_examples_of`'s answer as a short string a checkpoint keeps, where it names the
    content (a ``TensorDataset``'s fingerprint; an object's identity means nothing in another
    process): a fit resumed on another data set of the same size, where no label tells the
    rows apart (a regression), continued the old rows' weights without a word (session 51)."""
    if not isinstance(examples[0], tuple):
        return None
    return hashlib.sha256(repr(examples).encode()).hexdigest()


def _examples_of(dataset: Any) -> tuple[Any, tuple[int, ...] | None]:
    """(the data set under the ``IndexedDataset`` / ``Subset`` wraps, by identity; the
    positions in it that rows 0..n-1 read, in order, or None for all of it): two training sets
    with the same first part and other positions give row i to other examples."""
    base, subsets = _unwrapped(dataset)
    positions: list[int] | None = None
    for subset in subsets:  # outermost first
        idx = [int(i) for i in subset.indices]
        positions = idx if positions is None else [idx[i] for i in positions]
    return _identity(base), None if positions is None else tuple(positions)


def _check_collation(loader: DataLoader) -> None:
    """A ``collate_fn`` of the user's own on the training DataLoader gets the
    :class:`IndexedDataset`'s ``Indexed(index, sample)`` pairs, which one written for the bare
    samples cannot read: it failed inside the user's code at the first batch ("object of type
    'int' has no len()" from a padding collate), or collated the pairs into a batch without the
    indices. Tried at fit start on the first two samples (before Lightning reads a batch);
    ``indexed_collate(fn)`` is the fix. Torch's default collation keeps the pairs: not tried."""
    collate = loader.collate_fn
    dataset = loader.dataset
    if collate is default_collate or isinstance(collate, indexed_collate) or len(dataset) == 0:
        return
    name = getattr(collate, "__name__", type(collate).__name__)
    fix = (
        "The training set's samples are Indexed(index, sample) pairs; pass your function "
        f"wrapped, DataLoader(IndexedDataset(train_set), collate_fn=indexed_collate({name})): "
        "it collates the samples with yours and keeps their indices, and training_step gets "
        "your batch as before."
    )
    samples = [dataset[i] for i in range(min(2, len(dataset)))]
    try:
        batch = collate(samples)
    except Exception as error:
        raise ConfigurationError(
            f"LearnedDataWeights: the train DataLoader's collate_fn ({name}) fails on the "
            f"IndexedDataset's samples ({type(error).__name__}: {error}). {fix}"
        ) from error
    if not isinstance(batch, Indexed):
        raise ConfigurationError(
            f"LearnedDataWeights: the train DataLoader's collate_fn ({name}) returns a "
            f"{type(batch).__name__} from the IndexedDataset's samples, not an Indexed batch: "
            f"the example indices are lost, so no batch says which weights it reads. {fix}"
        )


def draws_weighted(loader: DataLoader) -> bool:
    """Whether the training DataLoader draws its rows with a torch ``WeightedRandomSampler``
    (a class-rebalancing sampler), also as Lightning wraps it under DDP
    (``DistributedSamplerWrapper`` over a data set of the sampler's draws)."""
    sampler: Any = getattr(loader, "sampler", None)
    for _ in range(4):
        if isinstance(sampler, WeightedRandomSampler):
            return True
        inner = getattr(getattr(sampler, "dataset", None), "_sampler", None)
        if inner is None:
            return False
        sampler = inner
    return False


def _check_training_loader(loader: DataLoader, per: str) -> None:
    """The training DataLoader's refusals at the build: a stream (no stable example index), a
    loader without automatic batching, and per sample a dataset that is not an
    :class:`IndexedDataset` (one inside another dataset: wrap the outermost) or a
    ``collate_fn`` that loses the indices (:func:`_check_collation`)."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise ConfigurationError(
            f"LearnedDataWeights needs a map-style training dataset, got "
            f"{type(dataset).__name__}: a stream (IterableDataset) has no stable example "
            "index to attach a weight to. Materialise it (a TensorDataset, a list) and wrap it "
            "in IndexedDataset."
        )
    if loader.batch_size is None and loader.batch_sampler is None:
        raise ConfigurationError(
            "LearnedDataWeights: the train DataLoader has batch_size=None (its dataset yields "
            "whole batches), so samples carry no index of their own: give it a batch_size."
        )
    if per == "sample" and not isinstance(dataset, IndexedDataset):
        inner = _inner_indexed(dataset)
        if inner is not None:
            raise ConfigurationError(
                f"LearnedDataWeights: the training dataset is a {type(dataset).__name__} "
                f"of an IndexedDataset ({inner}): its samples carry the indices of the set "
                "inside, which need not run from 0 to len - 1 nor be distinct (two "
                "IndexedDatasets in one ConcatDataset both start at 0). Wrap the outermost "
                "dataset instead: IndexedDataset(random_split(train_set, ...)[0]), "
                "IndexedDataset(ConcatDataset([a, b])). To train on another part of one data "
                "set each epoch (reload_dataloaders_every_n_epochs), keep one IndexedDataset "
                "over all of it and let a sampler pick the part, DataLoader(indexed_set, "
                "sampler=SubsetRandomSampler(part)): a weight per example of the whole set "
                "(an IndexedDataset of each part would give each epoch's examples the same "
                "indices)."
            )
        raise ConfigurationError(
            f"LearnedDataWeights: the training dataset ({type(dataset).__name__}) has no "
            "stable example indices: wrap it, DataLoader(IndexedDataset(train_set), ...), so "
            "that each batch says which examples (and so which weights) it holds."
        )
    if per == "sample":
        _check_collation(loader)


def _label_fault(labels: Any, b: int | None = None) -> tuple[str, str, str]:
    """(what ``labels`` is, its likely cause, a fix) where they are no :func:`_integer_vector`
    of ``b`` class ids."""
    what = (
        f"a {labels.dtype} tensor of shape {tuple(labels.shape)}"
        if isinstance(labels, Tensor)
        else "None"
        if labels is None
        else f"a {type(labels).__name__}"
    )
    vector = isinstance(labels, Tensor) and (  # a vector or a column
        labels.dim() == 1 or (labels.dim() == 2 and labels.shape[1] == 1)
    )
    names = isinstance(labels, (list, tuple)) and any(isinstance(c, str) for c in labels)
    if vector and not labels.is_floating_point() and b is not None:
        return what, f"{labels.shape[0]} labels, not one per row", "batch[1] (every row's label)"
    if vector:
        return what, "class ids stored as floats?", "batch[1].long()"
    if names:  # session 53: argmax(1) was the fix given for a tuple of strings
        return what, "class names?", "torch.tensor([CLASSES.index(c) for c in batch[1]])"
    if isinstance(labels, Tensor) and not _distributions(labels):  # features (s63)
        return what, "no labels: its rows are no one-hot or soft labels; the inputs?", "batch[1]"
    if isinstance(labels, Tensor):
        return what, "one-hot or soft labels?", "batch[1].argmax(1)"
    return what, "not a tensor", "torch.as_tensor(batch[1])"


def _distributions(labels: Tensor) -> bool:
    """Whether the rows of a 2-D tensor may be one-hot or soft labels (in [0, 1], summing to
    1): ``target=lambda batch: batch[0]`` (the inputs) was read as soft labels and the fix
    offered was ``batch[1].argmax(1)`` (session 63)."""
    if labels.dim() != 2 or labels.is_complex():
        return labels.dim() == 2
    x = labels.detach().double()
    return bool(((x >= 0) & (x <= 1)).all()) and bool(
        torch.allclose(x.sum(1), torch.ones(1, dtype=x.dtype), atol=1e-3)
    )


def _check_sample_target(target: Any, data: Any, b: int, binary_floats: bool) -> None:
    """``per="sample"``: a ``target=`` the user gave must give one integer class id per row of
    a training batch (binary targets stored as floats are read as 0 / 1). What it gave was
    read as no labels before, without a word (session 55): a list, a float or one-hot tensor,
    a NumPy array, labels of another length or a ``target`` that failed turned the class gauge
    (``gauge="auto"``'s choice for labelled data) and every label check off, and the weights
    were those of the unlabelled fit (0.14 / 0.84 where the labels' fit has 0.09 / 0.64)."""
    try:
        labels = target(data)
    except Exception as err:
        raise ConfigurationError(
            f"LearnedDataWeights: target= failed on a training batch ({type(err).__name__}: "
            f"{err}): it is called as target(batch) on the training batches (without the "
            "index) and must give one integer class id per row."
        ) from err
    if binary_floats or _integer_vector(labels, b):
        return
    what, cause, fix = _label_fault(labels, b)
    raise ConfigurationError(
        f"LearnedDataWeights: target= gave {what} for a training batch of {b} rows ({cause}); "
        f"it must give one integer class id per row, a 1-D integer tensor of {b} entries (or a "
        f"({b}, 1) column), e.g. target=lambda batch: {fix}: the class gauge and the label "
        "checks read them. Without class labels (a regression), leave target= out."
    )


def _check_class_labels(labels: Any, num_classes: int, rows: int | None = None) -> Tensor:
    """``per="class"``: a training batch's ``target(batch)`` must be a 1-D integer tensor (or
    a column, :func:`_integer_vector`) of class ids in 0..num_classes - 1, the rows of the
    class weights; returned 1-D. ``rows``: the batch's rows where known (an ``Indexed``
    batch); labels of another count were refused as the losses' fault, "16 per-sample losses
    for a batch of 4 indexed samples … 4 views of each sample concatenated?" (session 63)."""
    if _integer_vector(labels) and rows is not None and labels.shape[0] != rows:
        raise ConfigurationError(
            f"LearnedDataWeights(per='class'): the batch's target gave {labels.shape[0]} class "
            f"ids for a training batch of {rows} rows: it must give one per row, in the "
            "batch's order, e.g. target=lambda batch: batch[1] (a slice or a filter in "
            "target=?)."
        )
    if not _integer_vector(labels):
        what, cause, fix = _label_fault(labels)
        raise ConfigurationError(
            f"LearnedDataWeights(per='class') indexes its weights by integer class labels, "
            f"and the batch's target is {what} ({cause}): pass target=lambda batch: <a 1-D "
            f"integer tensor of class ids>, e.g. {fix}."
        )
    labels = class_ids(labels)
    low, high = torch.stack(torch.aminmax(labels)).tolist() if labels.numel() else (0, 0)
    if low < 0 or high >= num_classes:
        unlabelled = (
            f"a negative label ({low}: F.cross_entropy's ignore_index, unlabelled rows?) has "
            "no class and so no class weight: leave those examples out of the training set "
            "(a Subset of the labelled rows), or pass target= giving each a class"
            if low < 0
            else f"pass num_classes={high + 1} (the largest label + 1)"
        )
        raise ConfigurationError(
            f"LearnedDataWeights(per='class', num_classes={num_classes}): a training "
            f"batch holds labels from {low} to {high}, outside 0..{num_classes - 1}: "
            f"{unlabelled}."
        )
    return labels


def _warn_indexed_validation(loaders: Any, step: str = "validation") -> None:
    """A validation (test, predict) DataLoader over an :class:`IndexedDataset` hands its
    batches, indices and all, to the user's ``validation_step`` (``test_step``,
    ``predict_step``; only ``training_step`` is unwrapped), which then fails inside the user's
    code (e.g. "mat1 and mat2 must have the same dtype", "Dimension out of range": the index
    read as the input), not with our words: said before Lightning's loop runs (a warning: a
    step written for ``Indexed`` batches works). ``trainer.predict`` over the training loader
    (the network's own suspects beside ``flagged()``) met it in session 57."""
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        if isinstance(getattr(loader, "dataset", None), IndexedDataset):
            data = {"validation": "val_set"}.get(step, f"{step}_set")
            rank_zero_warn(
                f"LearnedDataWeights: the {step} DataLoader's dataset is an IndexedDataset, "
                f"so your {step}_step gets Indexed batches (index, then your batch; only "
                f"training_step is unwrapped). Only the training set needs example indices: "
                f"pass the {step} set unwrapped, DataLoader({data}) instead of "
                f"DataLoader(IndexedDataset({data})) (for the training set: "
                f"DataLoader(train_loader.dataset.dataset)), unless your {step}_step reads "
                "batch.data."
            )
            return


#: the fit's first training batches in which per-sample losses exactly 0 are warned as masked
#: examples (a young network fits no example exactly; a trained one may, in float32)
MASKED_CHECKS = 20

#: the rows of training loss exactly 0 re-read at an epoch's end to see whether that loss
#: depends on the weights (:meth:`DataWeightsProblem.masked_rows`): one forward of them, only
#: where such rows exist
MASKED_REREADS = 16


def _rows(data: Any) -> int:
    """The number of samples in a batch (the first dimension of its first tensor)."""
    first = next((t for t in _tensors_of(data) if t.dim() > 0), None)
    return 0 if first is None else int(first.shape[0])


def _tensors_of(data: Any) -> Iterator[Tensor]:
    if isinstance(data, Tensor):
        yield data
    elif isinstance(data, Mapping):
        for value in data.values():
            yield from _tensors_of(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from _tensors_of(value)
    elif dataclasses.is_dataclass(data):
        for f in dataclasses.fields(data):
            yield from _tensors_of(getattr(data, f.name))


def _warn_masked_samples(
    losses: Any, data: Any, zero_when_shrunk: Callable[[Any], Tensor] | None = None
) -> bool:
    """A warning (and True) for per-sample losses (one per example) exactly 0 in one of the
    fit's first :data:`MASKED_CHECKS` training batches: a network near its start fits no
    example exactly, so these are masked examples (labels ``-100``, F.cross_entropy's default
    ``ignore_index``; a loss times a mask). Such an example teaches the network nothing; its
    weight was pushed down like a misfit's (on a 3-class toy with 30 % noise the masked rows
    ended at 0.02, below the corrupted ones' 0.03, against 0.48 for the clean ones) and
    ``flagged()`` named it, until session 63: the fit's weights now read a loss exactly 0 as
    masked from the batch that shows it (:class:`~.batch_masks.MaskDetection`, which calls
    this).
    ``zero_when_shrunk`` (:meth:`DataWeightsProblem._zero_when_shrunk`) keeps the rows whose
    loss is still 0 with the weights shrunk: a loss exactly 0 by a large margin (sharp logits,
    LBFGS fitting a batch, a hinge or triplet loss past its margin) is not said (session 50:
    it was, with "ignore this" for a hinge)."""
    if not isinstance(losses, Tensor) or losses.dim() != 1 or losses.numel() == 0:
        return False
    zeros = losses.detach() == 0
    if not bool(zeros.any()):
        return False
    if zero_when_shrunk is not None:  # still 0 with the weights shrunk: masked, not fitted
        zeros &= zero_when_shrunk(data).to(zeros.device)
        if not bool(zeros.any()):
            return False
    labels = batch_labels(data)
    ignored = ""
    if isinstance(labels, Tensor) and labels.shape == losses.shape:
        negative = zeros & (labels < 0) if not labels.is_floating_point() else zeros & False
        if bool(negative.any()):
            ignored = (
                f" ({int(negative.sum())} of them labelled {int(labels[negative].min())}: "
                "ignore_index?)"
            )
    rank_zero_warn(
        f"LearnedDataWeights: {int(zeros.sum())} of the {losses.numel()} per-sample losses of "
        f"a training batch near the fit's start are exactly 0{ignored}: masked examples (an "
        f"ignore_index, a mask)? {_MASKED_WHY}"
    )
    return True


#: why masked examples are said where the fit's first batches show them (the loss then known to
#: mask rows: :class:`~.batch_masks.MaskDetection`, session 63)
_MASKED_WHY = (
    "The loss masks rows, so from this batch on a row whose loss is exactly 0 at a visit is "
    "not moved by that visit (its weight enters the normalised loss's sum of weights by value "
    "only): a mask chosen anew in each batch (the hardest k: online hard example mining, a "
    "curriculum, loss truncation) needs no change. An example masked at EVERY visit "
    "(unlabelled: ignore_index, a fixed mask) teaches the network nothing, yet it is read and "
    "weighted, its weight kept about where it started, which says nothing about its label: "
    "leave unlabelled examples out of the training set (e.g. "
    "IndexedDataset(Subset(train_set, labelled)))."
)

#: why masked examples are said where only an epoch's end shows them (the fit's first batches
#: showed no mask, so a loss exactly 0 was not read as one: it may be a row fitted with
#: certainty)
_MASKED_LATE_WHY = (
    "An example whose loss is masked teaches the network nothing, but its weight is learned "
    "all the same: the fit's first batches showed no mask, so a loss exactly 0 is not read as "
    "one, and the normalised loss pushes the example down like a misfit's, and flagged() "
    "names it as suspect. Leave unlabelled examples out of the training set (e.g. "
    "IndexedDataset(Subset(train_set, labelled)))."
)


def _float_targets(data: Any, losses: Any) -> Tensor | None:
    """The batch's targets (:func:`batch_labels`) where they are floats, one per loss, detached;
    None otherwise."""
    if not isinstance(losses, Tensor):
        return None
    y = batch_labels(data)
    if not (isinstance(y, Tensor) and y.is_floating_point() and y.numel() == losses.numel()):
        return None
    return y.detach()


def _real_targets(data: Any, losses: Any) -> Tensor | None:
    """The entries of the batch's targets (:func:`batch_labels`: ``batch[1]``, or a dict
    sample's ``"y"`` / ``"target"`` / ...) that say regression, or None: targets that are real
    numbers, one per loss (same number of entries), some fractional and outside [0, 1] (not
    class ids, not probabilities)."""
    y = _float_targets(data, losses)
    if y is None:
        return None
    real = ((y < 0) | (y > 1)) & (y != y.round())
    return y[real] if bool(real.any()) else None


def _whole_float_targets(data: Any, losses: Any) -> Tensor | None:
    """The batch's targets where they are floats, one per loss, all whole numbers and some
    outside {0, 1} (binary targets stored as floats are labels): a regression on whole
    numbers or class ids stored as floats, which nothing in the batch tells apart."""
    y = _float_targets(data, losses)
    if y is None:
        return None
    whole = bool((y == y.round()).all()) and bool(((y < 0) | (y > 1)).any())
    return y[(y < 0) | (y > 1)] if whole else None


def _refuse_real_targets(data: Any, losses: Any) -> None:
    """A clear error where the default objective (:class:`ExpectedError`, which reads a loss
    as −log p of the right answer) meets a regression: a validation batch whose targets
    ``batch[1]`` are real numbers, one per loss (same number of entries), some fractional and
    outside [0, 1] (not class ids, not probabilities). e^(−qℓ) of a squared error depends on the
    targets' units, and at large ones the few best-fit examples alone decide E."""
    real = _real_targets(data, losses)
    whole = _whole_float_targets(data, losses)
    if real is None and whole is not None:  # silent before (session 55): either reading is
        raise ConfigurationError(  # a user's, and each has its own fix
            f"LearnedDataWeights: the validation targets are whole numbers stored as floats, "
            f"one per loss (e.g. {float(whole[0]):g}): a regression on whole-number targets "
            "(counts, ratings), or class ids stored as floats? A regression: the default outer "
            "objective ExpectedError(q=0.5) reads each loss as −log p of the right answer, and "
            "e^(−ℓ/2) of a squared error depends on the targets' units: pass "
            "objective='mean_loss'. Class ids: store them as integers (torch.long): float "
            "ids are read as no labels, so the class gauge and the label checks are off."
        )
    if real is not None:
        raise ConfigurationError(
            f"LearnedDataWeights: the validation targets are real numbers, one per "
            f"loss (e.g. {float(real[0]):.3g}): a regression? The default outer objective "
            "ExpectedError(q=0.5) reads each loss as −log p of the right answer, and e^(−ℓ/2) "
            "of a squared or absolute error depends on the targets' units (at large ones a few "
            "best-fit validation examples decide it). Pass objective='mean_loss' (the mean "
            "validation loss), or objective=ExpectedError(q=...) to keep it knowingly."
        )


def _validation_tensor(out: Any) -> Tensor:
    """The validation losses from ``training_step``'s (or ``validation_loss``'s) output."""
    out = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(out, Tensor):
        raise ConfigurationError(
            f"LearnedDataWeights: the validation loss must be a tensor, got {type(out).__name__}."
        )
    return out


@dataclasses.dataclass
class OneClassBatches:
    """Counts the training batches of one class alone under per-class weights and the
    self-normalised loss, over the fit's first :attr:`BATCHES` batches of several rows, and
    warns once where more than half were (session 60: a class-sorted set, ImageFolder's order,
    under a DataLoader that does not shuffle: Σ ω_c ℓᵢ / Σ ω_c of a batch of one class is its
    plain mean whatever ω_c, so the class weights changed no step of those batches, without a
    word)."""

    BATCHES = 8
    seen: int = 0
    alone: int = 0

    def note(self, classes: Tensor) -> None:
        """One training batch's class ids (the rows' weight indices under ``per="class"``)."""
        if self.seen >= self.BATCHES or classes.numel() < 2:
            return
        self.seen += 1
        self.alone += bool((classes == classes[0]).all())  # one read, first batches only
        if self.seen == self.BATCHES and 2 * self.alone > self.BATCHES:
            rank_zero_warn(
                f"LearnedDataWeights(per='class'): {self.alone} of the fit's first "
                f"{self.BATCHES} training batches hold examples of one class only. Under the "
                "self-normalised loss Σ ω_c ℓᵢ / Σ ω_c such a batch's loss is its plain mean "
                "whatever the class weights, so they change none of its steps (and get no "
                "hypergradient from it). A DataLoader that does not shuffle a set sorted by "
                "class (ImageFolder's order) does this: pass shuffle=True to the training "
                "DataLoader; otherwise use larger batches or normalize=False."
            )
