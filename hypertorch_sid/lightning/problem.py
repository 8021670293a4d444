"""The bilevel problem a :class:`HyperOptimizationCallback` solves, as a public protocol.

The callback knows *when* to step and *which data* to use; what it optimises — λ, w, ℓ̂, E — comes
from a :class:`ProblemSource`, an object with three methods that the callback calls at fixed
points of a fit:

* ``check(trainer, module)`` at ``on_fit_start``: refuse what cannot work (e.g. a training
  optimizer that holds λ);
* ``build(trainer, module) -> BilevelProblem`` at ``on_train_start``: the problem itself;
* ``before_hyper_step(trainer, module)`` before each hyper step: refresh what the problem reads
  from the training (e.g. an optimizer's preconditioner).

:class:`ModuleProblem` (the default) reads the problem from a :class:`BilevelModule`;
:class:`~hypertorch_sid.lightning.weight_decay_problem.WeightDecayProblem` builds it for
weight decay on any ``LightningModule`` (what :class:`~hypertorch_sid.LearnedWeightDecay` passes).

A source's ``inner_loss`` leaves out the training optimizers' own ``weight_decay``: the callback
adds it (:mod:`~hypertorch_sid.lightning.optimizer_decay`), since the training reaches the fixed
point of ℓ̂ plus that decay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from ..core.errors import ConfigurationError
from ..core.second_order import check_second_derivatives
from ..core.validation import check_inner_optimizers
from .module import Bilevel
from .namespaces import classes

Tensors = list[Tensor]


@dataclass
class BilevelProblem:
    """What the callback optimises: λ, w, ℓ̂, E and what to report about λ.

    Attributes
    ----------
    hyperparameters, inner_parameters: λ and w.
    inner_loss, outer_loss: ℓ̂(batch) and E(batch) as closures over w, λ.
    summary: ``summary() -> {name: tensor}``, the λ values to log.
    projection: P_Λ, called on λ after each outer step.
    penalty: coefficients c(λ) of a weighted L2 penalty left out of ``inner_loss`` (the
        proximal gradient map), or None.
    regularizer: the batch-independent part R(w, λ) of ``inner_loss`` (the weight decay inside
        it), or None: given to ``GaussNewton`` products that were configured without one.
    exact_cross_term: whether λ enters ``inner_loss`` only through ``regularizer`` (the rest of
        it does not read λ): eq. gradestim's cross term ∂₂Φ̂ᵀv is then computed from R alone
        (``SIDHyperOptimizer(regularizer=)``), exactly and without reading a minibatch.
    freeze: λ tensors living in the module (their ``requires_grad`` is toggled around hyper
        steps so the training never updates them).
    names: the names of λ that live outside the module (a checkpoint's values are matched to
        λ by them: session 58, same-shaped λ in another order loaded swapped), or None.
    """

    hyperparameters: Tensors
    inner_parameters: Tensors
    inner_loss: Callable[[Any], Tensor]
    outer_loss: Callable[[Any], Tensor]
    summary: Callable[[], dict[str, Tensor]]
    projection: Callable[[Tensors], None] | None = None
    penalty: Callable[[], Tensors] | None = None
    regularizer: Callable[[], Tensor] | None = None
    exact_cross_term: bool = False
    freeze: Tensors = field(default_factory=list)
    names: list[str] | None = None

    def named_hyperparameters(self) -> Tensors | list[tuple[str, Tensor]]:
        """λ as the core optimizer takes them: ``(name, tensor)`` pairs where named."""
        if self.names is None:
            return self.hyperparameters
        return list(zip(self.names, self.hyperparameters, strict=True))


@runtime_checkable
class ProblemSource(Protocol):
    """Where a :class:`HyperOptimizationCallback` gets its :class:`BilevelProblem`."""

    def check(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Refuse what cannot work, before training starts."""

    def build(self, trainer: pl.Trainer, module: pl.LightningModule) -> BilevelProblem:
        """The problem, at the start of training."""

    def before_hyper_step(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Refresh what the problem reads from the training, before each hyper step."""


#: the submodule ``torch.compile`` wraps a module in (``OptimizedModule._orig_mod``)
COMPILE_WRAPPER = "_orig_mod."


def with_batch_idx(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` (a module's ``training_step``) callable as ``step(batch, batch_idx, ...)``:
    Lightning lets a ``training_step(self, batch)`` leave ``batch_idx`` out and then passes the
    batch alone (its own test, ``is_param_in_hook_signature``); the drop-ins' calls passed
    ``batch_idx`` and failed inside the user's code ("takes 2 positional arguments but 3 were
    given")."""
    from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature

    if is_param_in_hook_signature(step, "batch_idx", min_args=2):
        return step

    @functools.wraps(step)
    def without_batch_idx(batch: Any, batch_idx: int = 0, *args: Any, **kwargs: Any) -> Any:
        return step(batch, *args, **kwargs)

    return without_batch_idx


def named_tensors(module: Any) -> list[tuple[str, Tensor]]:
    """``module.named_parameters()`` by the names the user's code writes: the ``_orig_mod.``
    that ``torch.compile`` inserts (``self.net = torch.compile(net)``) is left out, so decayed
    tensors, λ slots, logs and warnings say ``net.0.weight``, not ``net._orig_mod.0.weight``.
    Every name the drop-ins show or look up comes from here."""
    return [(n.replace(COMPILE_WRAPPER, ""), p) for n, p in module.named_parameters()]


def check_optimizers_output(module: pl.LightningModule, who: str) -> None:
    """For the rest of this fit, every call of the module's ``configure_optimizers`` is checked
    by :func:`refuse_malformed_optimizers` (a wrapper, removed at the fit's teardown or failure
    by :func:`release_optimizers_check`). Lightning calls it in the strategy's setup, after every
    callback's ``setup`` and before any hook that could see what it returned (session 61's
    leftover: calling it a second time to check it would build a second optimizer); optimizers
    re-created during the fit (``trainer.strategy.setup_optimizers(trainer)``, a warm restart)
    call it again, and were unchecked until session 63 (Lightning's bare ``KeyError``)."""
    own = module.__dict__.get("configure_optimizers")
    if hasattr(own, "_checks_for"):  # another hyper-optimization callback's, this fit
        return
    original = module.configure_optimizers

    def checked() -> Any:
        out = original()
        refuse_malformed_optimizers(out, who)
        return out

    checked._checks_for = own  # type: ignore[attr-defined]  # what to put back
    module.__dict__["configure_optimizers"] = checked


def release_optimizers_check(module: pl.LightningModule) -> None:
    """Remove :func:`check_optimizers_output`'s wrapper (a fit that failed before Lightning
    called it), putting back what the instance held before."""
    checked = module.__dict__.get("configure_optimizers")
    if not hasattr(checked, "_checks_for"):
        return
    own = checked._checks_for  # type: ignore[union-attr]
    if own is None or own is checked:
        del module.__dict__["configure_optimizers"]
    else:
        module.__dict__["configure_optimizers"] = own


def refuse_malformed_optimizers(out: Any, who: str) -> None:
    """What ``configure_optimizers`` returned, in the forms Lightning names badly: a dict (or a
    list of dicts) without the key ``"optimizer"`` failed with a bare ``KeyError: 'optimizer'``
    from inside the strategy's setup; a learning-rate scheduler alone with Lightning's list of
    forms, not saying that the optimizer was left out (session 62)."""
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    schedulers = (LRScheduler, ReduceLROnPlateau)
    dicts = [out] if isinstance(out, dict) else []
    if isinstance(out, (list, tuple)) and out and all(isinstance(d, dict) for d in out):
        dicts = list(out)
    for d in dicts:
        if "optimizer" not in d:
            sched = d.get("lr_scheduler")
            sched = sched.get("scheduler") if isinstance(sched, dict) else sched
            raise ConfigurationError(
                f"{who}: configure_optimizers returned a dict with the keys {sorted(d)}, "
                "without 'optimizer', which Lightning needs (it would fail with a bare "
                "KeyError: 'optimizer'). Return the optimizer under that key: {'optimizer': "
                "optimizer"
                + (", 'lr_scheduler': scheduler}" if sched is not None else "}")
                + (
                    f" (your {type(sched).__name__}'s optimizer is scheduler.optimizer)."
                    if isinstance(sched, schedulers)
                    else "."
                )
            )
    alone = out if isinstance(out, (list, tuple)) else [out]
    if alone and all(isinstance(x, schedulers) for x in alone):
        name = type(alone[0]).__name__
        raise ConfigurationError(
            f"{who}: configure_optimizers returned the learning-rate scheduler {name} "
            "without its optimizer: Lightning needs the optimizer, with the scheduler beside "
            "it. Return {'optimizer': optimizer, 'lr_scheduler': scheduler} (or "
            "([optimizer], [scheduler]))."
        )


def _refuse_tensors_listed_twice(optimizers: list[Any], names: dict[int, str], who: str) -> None:
    """A tensor listed twice in one optimizer group (tied weights: ``list(enc.parameters()) +
    list(dec.parameters())``) is stepped twice per step, at twice its learning rate (torch
    only warns, "duplicate parameters"), while the hyper steps model one step: λ was learned
    for another training, silently (session 62)."""
    for i, optimizer in enumerate(optimizers):
        for j, group in enumerate(getattr(optimizer, "param_groups", [])):
            seen: set[int] = set()
            for p in group["params"]:
                if id(p) in seen:
                    raise ConfigurationError(
                        f"{who}: the training optimizer {type(optimizer).__name__} (optimizer "
                        f"{i}, group {j}) lists {names.get(id(p), 'a tensor')} twice, so it "
                        "steps it twice per step (at twice its learning rate), but the hyper "
                        "steps model one step per tensor. List each tensor once: "
                        "self.parameters() gives a tied weight once (or "
                        "list(dict.fromkeys(params)) removes the repeats)."
                    )
                seen.add(id(p))


def refuse_untunable_training(trainer: pl.Trainer, module: pl.LightningModule, who: str) -> None:
    """Refuse, at fit start, a training the hyper steps cannot describe: an optimizer group with
    ``maximize=True`` (the hypergradient is that of a training that minimises its loss: the
    decay's λw, added to the gradient, grew the weights instead, λ rose from 1e-2 to 0.48 on
    the careless-user toy, silently), trained tensors of several dtypes (the core's refusal
    named them by position and asked to convert λ, the drop-in's own), and parameters not
    created yet (lazy modules: every tensor's shape is needed before the first training step,
    and torch's "Attempted to use an uninitialized parameter" came from inside the callback),
    and trained layers without second derivatives (:func:`check_second_derivatives`); a tensor
    listed twice in a group (:func:`_refuse_tensors_listed_twice`)."""
    from torch.nn.parameter import is_lazy

    accumulate = trainer.accumulate_grad_batches
    if isinstance(accumulate, dict):  # Lightning 1.x's schedule: a raw TypeError in 2.x (s62)
        raise ConfigurationError(
            f"{who}: Trainer(accumulate_grad_batches={accumulate!r}) is Lightning 1.x's "
            "schedule of accumulation by epoch; Lightning 2 takes one integer there (and failed "
            "with a bare TypeError \"unsupported operand type(s) … 'int' and 'dict'\"). Pass "
            "the schedule as a callback: callbacks=[GradientAccumulationScheduler("
            f"{accumulate!r}), ...] (Lightning's callbacks module), which the hyper steps "
            "follow."
        )
    mock = classes("core.optimizer._MockOptimizer")  # Lightning's stand-in for None
    if all(isinstance(optimizer, mock) for optimizer in trainer.optimizers):
        # Lightning runs such a fit (warned: "this fit will run with no optimizer"), and the
        # hyper steps then learned λ for a w nothing trained: a BilevelModule's λ moved over 6
        # hyper steps with w still at its start (session 52)
        raise ConfigurationError(
            f"{who}: the fit has no training optimizer (configure_optimizers returned None or "
            "an empty list), so nothing trains the parameters, and the hyper steps assume "
            "they follow the training as the hyperparameters change. Return the optimizer from "
            "configure_optimizers, e.g. torch.optim.SGD(self.parameters(), lr=0.1)."
        )
    for i, optimizer in enumerate(trainer.optimizers):
        for j, group in enumerate(optimizer.param_groups):
            if group.get("maximize", False):
                raise ConfigurationError(
                    f"{who}: the training optimizer {type(optimizer).__name__} (optimizer {i}, "
                    f"group {j}) has maximize=True, but the hyper steps assume the training "
                    "minimises the loss training_step returns (a decay added to a gradient "
                    "that is ascended grows the weights). Return the negated objective from "
                    "training_step and drop maximize=True."
                )
    names = {id(p): n for n, p in named_tensors(module)}
    _refuse_tensors_listed_twice(trainer.optimizers, names, who)
    trained = {
        id(p): p
        for optimizer in trainer.optimizers
        for group in optimizer.param_groups
        for p in group["params"]
        if p.requires_grad and p.is_floating_point() and not is_lazy(p)
    }
    dtypes: dict[torch.dtype, list[str]] = {}
    for key, p in trained.items():
        dtypes.setdefault(p.dtype, []).append(names.get(key, "an unnamed tensor"))
    if len(dtypes) > 1:
        listed = "; ".join(
            f"{dtype}: {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}"
            for dtype, held in dtypes.items()
        )
        raise ConfigurationError(
            f"{who}: the optimizers train tensors of {len(dtypes)} dtypes ({listed}), and the "
            "hyper steps differentiate them together with the hyperparameters in one dtype. "
            "Convert the whole module to one (model.float() or model.double(), the data with "
            "it) before fit."
        )
    # before the problems' own checks: a sparse embedding or an EmbeddingBag is refused
    # whatever else is changed, so it is said first (session 61: a manual fit of a sparse
    # embedding was told to pass training_loss=, then refused for the embedding)
    check_second_derivatives(module, list(trained.values()))
    lazy = [n for n, p in named_tensors(module) if is_lazy(p)]
    if lazy:
        raise ConfigurationError(
            f"{who}: {len(lazy)} parameters are not created yet ({', '.join(lazy[:4])}"
            f"{', ...' if len(lazy) > 4 else ''}: a LazyLinear / LazyConv layer, whose shape its "
            "first forward sets), and the hyper steps need every trained tensor from the fit's "
            "start. Create them before fit: run the model once on an example batch, e.g. "
            "model(torch.zeros(1, n_features)) after constructing it, or give the layers their "
            "input sizes (nn.Linear)."
        )


class UntrainedGroups:
    """Says when the training optimizers hold tensors they do not move: a parameter group at
    ``lr=0`` (a backbone "frozen" by its learning rate) at two hyper steps in a row. The hyper
    steps treat every tensor an optimizer holds as trained (w(λ) of the implicit function), so
    the λ of such tensors were learned for a training that leaves them where they are, and the
    others' through them: on an MLP whose first layer had ``lr=0`` its λ rose from 1e-3 to
    1.96 and the head's ended at 0.52, against 0.89 with the layer left out of the optimizer.
    Two in a row: a schedule that touches 0 at one step (cosine annealing at ``T_max``) is no
    frozen group. Once per fit (a new one is made at each ``build``)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.said = False
        self.before: set[tuple[int, int]] = set()

    def check(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.said:
            return
        names = {id(p): n for n, p in named_tensors(module)}
        now: dict[tuple[int, int], list[str]] = {}
        trained = 0
        for i, optimizer in enumerate(trainer.optimizers):
            for j, group in enumerate(optimizer.param_groups):
                held = [p for p in group["params"] if p.requires_grad]
                lr = group.get("lr")
                if not held or isinstance(lr, bool) or not isinstance(lr, (int, float, Tensor)):
                    continue
                if float(lr) == 0.0:
                    now[(i, j)] = [names.get(id(p), "an unnamed tensor") for p in held]
                else:
                    trained += 1
        still = [key for key in now if key in self.before]
        self.before = set(now)
        if not still:
            return
        self.said = True
        frozen = [n for key in still for n in now[key]]
        shown = ", ".join(frozen[:3]) + (", ..." if len(frozen) > 3 else "")
        where = (
            "every parameter group of the training optimizers has lr=0"
            if not trained
            else f"{len(still)} parameter group(s) of the training optimizers have lr=0"
        )
        rank_zero_warn(
            f"{self.who}: {where} at two hyper steps in a row ({len(frozen)} tensors: {shown}): "
            "the training does not move them, but the hyper steps treat every tensor an "
            "optimizer holds as trained, so the hyperparameters are learned for a training "
            "that does not happen (through these tensors also the others'). Freeze such tensors "
            "with requires_grad_(False) before the fit, or leave them out of the optimizer."
        )


class ModuleProblem:
    """The problem a :class:`BilevelModule` declares (its λ, w, ``inner_loss``, ``outer_loss``).

    At the first training batch the module checks that ``training_step`` reads λ (see
    :meth:`BilevelModule.on_train_batch_start`): a training that ignores λ while ``inner_loss``
    reads it would make λ move although the training it tunes does not depend on it.
    """

    def check(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if isinstance(module, Bilevel):
            named = list(module.named_hyperparameters())
            check_inner_optimizers(trainer.optimizers, [h for _, h in named], [n for n, _ in named])
            module._check_lambda_read = True

    def build(self, trainer: pl.Trainer, module: pl.LightningModule) -> BilevelProblem:
        self.untrained = UntrainedGroups("HyperOptimizationCallback")
        if not isinstance(module, Bilevel):
            raise ConfigurationError(
                "HyperOptimizationCallback needs a BilevelModule (declare λ with "
                "register_hyperparameter and write inner_loss/outer_loss); for weight decay on "
                f"any LightningModule use LearnedWeightDecay. Got {type(module).__name__}."
            )
        hyper = list(module.hyperparameters())
        if not hyper:
            raise ConfigurationError(
                f"{type(module).__name__} declares no hyperparameter: call "
                "self.register_hyperparameter(name, value) in __init__."
            )
        self.tuned = dict(module.named_hyperparameters())
        return BilevelProblem(
            hyperparameters=hyper,
            inner_parameters=list(module.inner_parameters()),
            inner_loss=module.inner_loss,
            outer_loss=module.outer_loss,
            summary=functools.partial(summarised, module),
            freeze=hyper,
        )

    def before_hyper_step(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        untrained = getattr(self, "untrained", None)
        if untrained is not None:
            untrained.check(trainer, module)
        tuned = getattr(self, "tuned", None)
        if tuned is not None and isinstance(module, Bilevel):
            check_same_hyperparameters(module, tuned)


def check_same_hyperparameters(module: Bilevel, tuned: dict[str, Tensor]) -> None:
    """The hyper steps tune the λ the fit started with (``tuned``, by name): one registered
    later (in ``on_train_start``, a hook) was never tuned, and one replaced by a new
    ``nn.Parameter`` was read by the training while the hyper steps moved the old tensor,
    both without a word (session 56)."""
    now = dict(module.named_hyperparameters())
    added = [n for n in now if n not in tuned]
    replaced = [n for n in now if n in tuned and now[n] is not tuned[n]]
    if added or replaced:
        what = "registered after the fit started" if added else "replaced by new tensors"
        raise ConfigurationError(
            f"{type(module).__name__}: hyperparameter(s) {added or replaced} were {what}, but "
            "the hyper steps tune the tensors the fit started with "
            f"({sorted(tuned)}): register every hyperparameter in __init__ (or setup / "
            "configure_model), and change a λ's value in place (with torch.no_grad(): "
            "self.log_lam.copy_(...)) rather than assigning a new nn.Parameter."
        )


def summarised(module: Bilevel) -> dict[str, Tensor]:
    """``module.hyperparameter_summary()`` as detached tensors: an override may return floats
    or tensors with a graph (e.g. ``{"lam": self.log_lam.exp()}``); anything else is refused,
    naming the key."""
    summary = module.hyperparameter_summary()
    if not isinstance(summary, dict):
        raise ConfigurationError(
            f"{type(module).__name__}.hyperparameter_summary() must return a dict "
            f"{{name: tensor or number}}, got {type(summary).__name__}."
        )
    out = {}
    for name, value in summary.items():
        try:
            out[str(name)] = (
                value.detach()
                if isinstance(value, Tensor)
                else torch.as_tensor(value, dtype=torch.get_default_dtype())
            )
        except (TypeError, ValueError, RuntimeError) as err:
            raise ConfigurationError(
                f"{type(module).__name__}.hyperparameter_summary()[{name!r}] is "
                f"{type(value).__name__}, not a tensor or a number: return e.g. "
                '{"lam": self.log_lam.exp()}.'
            ) from err
    return out


def toggled_off(module: torch.nn.Module) -> set[int]:
    """The ids of the tensors that Lightning's ``toggle_optimizer`` switched off for another
    optimizer's step (manual optimisation with several optimizers, the GAN pattern): they
    required gradients before the toggle and do again after ``untoggle_optimizer``, so they
    are still trained (session 59: such a fit was refused as "stopped requiring gradients" at
    the second optimizer's first step)."""
    state = getattr(module, "_param_requires_grad_state", None) or {}
    return {id(p) for p, before in state.items() if before}


def _refuse_replaced_tensors(
    who: str, inner: Tensors, module: torch.nn.Module, at_start: dict[int, str] | None = None
) -> None:
    """A layer replaced during the fit (``self.net[2] = nn.Linear(...)`` in a hook): the
    optimizers still hold the old tensors, which no longer get a gradient, and the new ones are
    trained by nothing; the hyper steps went on learning λ for the old ones, silently (session
    62). Said where tensors the fit started with have left the module while it holds trainable
    tensors nothing trains (a tensor of a custom problem outside the module alone is not), or,
    given ``at_start`` (the module's tensors by id when the fit started, names as values),
    where tensors that were the module's then are gone: a layer replaced by a frozen one
    (session 63: λ of the old layer was driven to 2e-8 and blamed on the validation loss)."""
    held = {id(p) for p in inner}
    named = named_tensors(module)
    ours = {id(p) for _, p in named}
    gone = [p for p in inner if id(p) not in ours]
    new = [n for n, p in named if p.requires_grad and id(p) not in held]
    if gone and new:
        raise ConfigurationError(
            f"{who}: {len(gone)} tensor(s) the optimizers trained when the fit started are no "
            f"longer the module's, and it holds trainable tensors no optimizer trains "
            f"({', '.join(new[:4])}{' ...' if len(new) > 4 else ''}): a layer replaced during "
            "the fit? The optimizers still step the old tensors (which get no gradient now), "
            "and nothing trains the new ones. Replace layers before trainer.fit (in __init__ or "
            "configure_model), or end this fit and start a new one, whose configure_optimizers "
            "holds the new layer."
        )
    left = [at_start[id(p)] for p in gone if at_start and id(p) in at_start]
    if left:
        raise ConfigurationError(
            f"{who}: {', '.join(left[:4])}{' ...' if len(left) > 4 else ''}, which the "
            "optimizers trained when the fit started, are no longer the module's: a layer "
            "replaced during the fit by one that requires no gradient (a frozen or pretrained "
            "layer)? The optimizers still step the old tensors, which get no gradient now, and "
            "the hyper steps would go on learning their hyperparameters for a layer the "
            "training no longer uses. Replace or freeze layers before trainer.fit (in __init__ "
            "or configure_model), or end this fit and start a new one with the new layer."
        )


def check_still_trained(
    who: str, inner: Tensors, module: torch.nn.Module, at_start: dict[int, str] | None = None
) -> None:
    """Every tensor the optimizers trained when the fit started (``inner``, the inner
    parameters collected at the fit's start) still requires gradients: the hypergradient
    differentiates the training's fixed point in all of them. One frozen during the fit
    (``requires_grad_(False)`` in a hook or callback) made autograd fail inside the hyper step
    ("One of the differentiated Tensors does not require grad"): said since session 49 for
    ``LearnedWeightDecay``, since session 53 for every callback. ``at_start``: the module's
    tensors by id when the fit started (:func:`_refuse_replaced_tensors`)."""
    _refuse_replaced_tensors(who, inner, module, at_start)
    toggled = toggled_off(module)
    frozen = [p for p in inner if not p.requires_grad and id(p) not in toggled]
    if not frozen:
        return
    names = {id(p): n for n, p in named_tensors(module)}
    said = [names.get(id(p), "an unnamed tensor") for p in frozen]
    raise ConfigurationError(
        f"{who}: {', '.join(said[:5])}{' ...' if len(said) > 5 else ''} "
        "stopped requiring gradients during the fit (requires_grad_(False) after it "
        "started), but the hypergradient differentiates the training's fixed point in every "
        "tensor the optimizers trained when the fit started. Freeze them before trainer.fit, "
        "or end this fit and continue in a new one (trainer.fit again with this callback: "
        "the hyperparameters carry over and the trained tensors are collected again)."
    )


#: the checkpoint key under which a drop-in saves what its stored hyperparameters mean
MEANING_KEY = "hyperparameter_meaning"


def check_meaning(who: str, saved: Any, ours: dict[str, str]) -> None:
    """Refuse a checkpoint whose hyperparameters were stored under other settings than this
    run's (``saved``: its :data:`MEANING_KEY` entry, ``ours``: this run's): the same tensors
    would be read as other values (a sigmoid's logits as a softmax's; log λ as λ), a resumed
    fit silently starting somewhere else. A checkpoint written before the key existed is
    taken as it is."""
    if saved is None:
        return
    if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
        raise ConfigurationError(
            f"{who}: the checkpoint's {MEANING_KEY} must be a dict of strings: it is corrupted."
        )
    refuse_another_callbacks_state(who, saved)
    differ = [
        f"{name}={saved[name]!r} (this run: {value!r})"
        for name, value in ours.items()
        if name in saved and saved[name] != value
    ]
    if differ:
        raise ConfigurationError(
            f"{who}: the checkpoint's hyperparameters were learned with {', '.join(differ)}; "
            "with this run's settings the same stored values would mean other ones, and the "
            "resumed fit would silently start somewhere else. Resume with the checkpoint's "
            "settings, or start a new fit (no ckpt_path) to learn under these."
        )


#: a key of each drop-in's :data:`MEANING_KEY` entry that only it writes, and what its
#: hyperparameters are
_MEANING_OWNERS = {
    "granularity": ("LearnedWeightDecay", "weight decays λ"),
    "per": ("LearnedDataWeights", "per-example (or per-class) data weights"),
}


def refuse_another_callbacks_state(who: str, saved: Any) -> None:
    """Refuse the state of another callback class, told from its :data:`MEANING_KEY` entry
    (``saved``; None: a state without one, taken). A ``LearnedWeightDecay`` state handed to
    ``LearnedDataWeights.load_state_dict`` (the wrong entry of a checkpoint's ``"callbacks"``
    picked by hand) was refused as "learned with parameterization='log' (this run:
    'SigmoidWeights')", a setting the user never gave, and either drop-in's state was taken
    by a ``HyperOptimizationCallback`` (session 61)."""
    owners = [_MEANING_OWNERS[k] for k in _MEANING_OWNERS if isinstance(saved, dict) and k in saved]
    if not owners or owners[0][0] == who:
        return
    owner, holds = owners[0]
    raise ConfigurationError(
        f"{who}: this is a {owner} state (its hyperparameters are {holds}), not a {who} "
        f"one. Load it into a {owner}, or take this callback's own entry of the checkpoint: "
        f"checkpoint['callbacks'] holds one per callback, under a key starting with its class "
        f"name ('{who}')."
    )
