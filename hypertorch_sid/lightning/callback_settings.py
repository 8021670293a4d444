"""The settings of :class:`~hypertorch_sid.lightning.HyperOptimizationCallback` and its drop-ins.

:data:`CALLBACK_CONFIG` is the callback's SID configuration; :func:`given`,
:func:`default_unless_given` and :func:`config_given` tell a setting the user chose from the
default a ``LightningCLI`` passes explicitly; :func:`check_setting_names` refuses a keyword that
is neither the callback's argument nor a :class:`~hypertorch_sid.core.config.SIDConfig` field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from ..core.config import REMOVED, SIDConfig
from ..core.divergence import Recover
from ..core.errors import ConfigurationError
from ..core.estimation import EstimatedCurvature
from ..core.preconditioning import NoPreconditioner

__all__ = [
    "CALLBACK_CONFIG",
    "check_setting_names",
    "config_given",
    "default_unless_given",
    "given",
    "unset_torch_lr",
]


#: the callback's SID settings: Lightning's training is the inner solver (t = 0), k = 10 adjoint
#: steps, a cheap curvature estimate refreshed every 10 hyper steps (a network's sharpness grows),
#: and Recover(2) on divergence (re-estimate; halve α or raise the damping; retry). The estimate
#: reads the mean of its minibatches' Hessians: ``minibatches="each"`` (the union of their spectra)
#: cut the main job's diverged refreshes (27 of 36 runs → 6) and its budgeted median test loss
#: (0.2524 → 0.2401, 24 runs), but with ``max_overhead=None`` it was worse on 11 of 12 seeds
#: (median 0.2383 against 0.2248: a larger L, a smaller α, less adjoint progress per hyper step),
#: and within noise on the benchmark's seven settings (session 44, docs/weight_decay_budget.md).
CALLBACK_CONFIG = SIDConfig(
    inner_steps=0,
    adjoint_steps=10,
    step_size="decreasing",  # a few warm-started adjoint steps per hyper step
    curvature=EstimatedCurvature(batches=2, iters=10, every=10),
    preconditioner=NoPreconditioner(),  # per-sample passes: not yet measured on networks
    on_divergence=Recover(retries=2),
)


def given(value: Any, default: Any) -> Any:
    """``value``, or ``default`` where it is None (not given: a ``LightningCLI`` passes every
    parameter's default explicitly, so "absent" cannot be told from "the default")."""
    return default if value is None else value


def default_unless_given(kwargs: dict[str, Any], name: str, default: Any) -> None:
    """``kwargs[name] = default`` unless a value other than None is there: a drop-in's own
    default for a parameter of :class:`HyperOptimizationCallback`, kept when a ``LightningCLI``
    passes the parent's default (None) for it."""
    if kwargs.get(name) is None:
        kwargs[name] = default


def config_given(kwargs: dict[str, Any]) -> bool:
    """Whether a drop-in's ``config=`` is a choice: one other than :data:`CALLBACK_CONFIG`, the
    default a ``LightningCLI`` passes explicitly."""
    return kwargs.get("config") not in (None, CALLBACK_CONFIG)


def warn_ignored_inner_steps(callback: type, config: Any) -> None:
    """Say that a ``config`` whose ``inner_steps`` was set (neither 0 nor :class:`SIDConfig`'s
    default) has it ignored: the keyword ``inner_steps=`` is refused (:func:`check_setting_names`),
    but the same setting inside a ``SIDConfig`` — one shared with a core experiment — was
    dropped without a word (session 61). A warning, not a refusal: sharing the config is fine."""
    steps = getattr(config, "inner_steps", 0)
    if isinstance(config, SIDConfig) and steps not in (0, SIDConfig.inner_steps):
        warnings.warn(
            f"{callback.__name__}: config.inner_steps={steps!r} is ignored: Lightning's own "
            "training steps are the inner solver (t = 0 extra steps in each hyper step). How "
            "often λ moves is every_n_steps=, how far the training runs is the Trainer's "
            "max_epochs / max_steps; the config's other settings apply.",
            UserWarning,
            stacklevel=4,
        )


def own_setting_names(callback: type) -> list[str]:
    """The arguments of the callback's constructors (its class and the classes it extends)."""
    return sorted(
        {
            name
            for cls in callback.__mro__
            if "__init__" in vars(cls)
            for name, p in inspect.signature(vars(cls)["__init__"]).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
    )


def refuse_settings_given_positionally(callback: type, first: Any) -> None:
    """A dict of the callback's settings given as its first argument (a config file's section:
    ``LearnedWeightDecay(config)``) was refused as a bad first setting ("weight_decay must be a
    finite number > 0 …, got {'every_n_steps': 4, …}"), not saying that it is unpacked with
    ``**`` (session 62)."""
    if not isinstance(first, Mapping) or not all(isinstance(k, str) for k in first):
        return
    names = set(own_setting_names(callback)) | {f.name for f in dataclasses.fields(SIDConfig)}
    known = [k for k in first if k in names]
    if known:
        raise ConfigurationError(
            f"{callback.__name__}: its first argument is a dict of its settings ({known}), "
            f"given as one value: unpack it into keywords, {callback.__name__}(**settings)."
        )


def check_setting_names(callback: type, settings: dict[str, Any]) -> None:
    """Refuse a keyword that is neither the callback's own argument nor a :class:`SIDConfig`
    field, naming the callback, the closest names and both lists (a typo such as
    ``num_class=`` for ``num_classes=`` otherwise read as an unknown SIDConfig setting)."""
    if "inner_steps" in settings:  # accepted and ignored (session 56)
        raise ConfigurationError(
            f"{callback.__name__}: inner_steps={settings['inner_steps']!r} would be ignored: "
            "Lightning's own training steps are the inner solver (t = 0 extra steps in each "
            "hyper step). Drop inner_steps=; how often λ moves is every_n_steps=, how far the "
            "training runs is the Trainer's max_epochs / max_steps."
        )
    fields = {f.name for f in dataclasses.fields(SIDConfig)} | set(REMOVED)
    unknown = sorted(set(settings) - fields)
    if not unknown:
        return
    own = own_setting_names(callback)
    close = {n: difflib.get_close_matches(n, own + sorted(fields), n=1) for n in unknown}
    hints = "; ".join(f"{n}= → did you mean {c[0]}=?" for n, c in close.items() if c)
    raise ConfigurationError(
        f"{callback.__name__}: unknown argument(s) {unknown}"
        + (f" ({hints})" if hints else "")
        + f". It takes its own arguments {own} and the SIDConfig settings "
        f"{sorted(f.name for f in dataclasses.fields(SIDConfig))}."
    )


def unset_torch_lr(factory: Any) -> float | None:
    """torch's default learning rate, where an ``outer_optimizer`` factory is a ``torch.optim``
    class given without one (``torch.optim.Adam``, or a ``functools.partial`` of it with no
    ``lr``); else None. Such a factory runs at torch's default (Adam, SGD: 0.001), not at the
    callback's own outer step (``outer_lr``, 0.3 on log λ for LearnedWeightDecay): λ then moves
    some 300× slower, with nothing said."""
    cls, given_lr = factory, False
    if isinstance(factory, functools.partial):
        cls, given_lr = factory.func, "lr" in factory.keywords or len(factory.args) > 0
    if given_lr or not isinstance(cls, type) or not cls.__module__.startswith("torch.optim"):
        return None
    lr = inspect.signature(cls).parameters.get("lr")
    if lr is None or not isinstance(lr.default, float):
        return None
    return float(lr.default)
