"""Saving and restoring a :class:`~hypertorch_sid.SIDHyperOptimizer` (to resume a run).

The state holds λ, the outer optimizer's state, the warm-start v, the step constants
(:class:`~hypertorch_sid.core.constants.StepConstants`), the map's preconditioner S, the
divergence guard, the cost, the position in the current pass of the ``train_batches`` the
optimizer iterates itself (a list or a ``DataLoader``: the resumed run skips the batches the
saved one had drawn), the config's settings (a load under other settings warns) and each λ's
name where it has one (held by ``module=``, given as ``(name, tensor)`` pairs, or named in the
outer optimizer: a load whose names differ, λ of equal shapes in another order, is refused).
Every entry is validated before anything changes: a truncated, corrupted or foreign state
raises :class:`ConfigurationError` and leaves the optimizer as it was.

It does not hold the inner weights w: they are the user's model's, saved with it
(``model.state_dict()``, or the tensors themselves). A resumed run continues the saved one
exactly when w, this state, and whatever random state the user's data and losses draw on (a
shuffling ``DataLoader``'s generator, dropout) are restored, and the optimizer is built with the
same config over the same losses (session 54: 3 + 3 hyper steps equal 6 to the last bit in
float64).
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .batches import BatchStream
from .constants import StepConstants
from .cost import Cost
from .divergence import DivergenceGuard
from .errors import ConfigurationError

if TYPE_CHECKING:
    from .config import SIDConfig
    from .optimizer import SIDHyperOptimizer

Tensors = list[Tensor]


def state_dict(opt: SIDHyperOptimizer) -> dict[str, Any]:
    """Everything needed to resume: λ, outer optimizer state, warm-start v, constants, cost."""
    return {
        "hyperparameters": [h.detach().clone() for h in opt.hyperparameters],
        "outer_optimizer": (
            copy.deepcopy(opt.outer_optimizer.state_dict())
            if opt.outer_optimizer is not None
            else None
        ),
        "v": [x.clone() for x in opt.v] if opt.v is not None else None,
        "hyper_step": opt.hyper_step,
        "constants": opt.constants.state_dict(),
        "scale": opt.phi.scale_state(),
        "guard": opt.guard.state_dict(),
        "cost": opt.cost.as_dict(),
        "train_batches_position": _position(opt),
        "config": settings(opt.config),
        "hyperparameter_names": hyperparameter_names(opt),
    }


def hyperparameter_names(opt: SIDHyperOptimizer) -> list[str | None]:
    """Each λ's name: in ``opt.module`` (a parameter or buffer there, e.g. a ``BilevelModule``'s
    registered hyperparameter), else the name it was given with (``(name, tensor)`` pairs), else
    its name in the outer optimizer (one built over named tensors: torch's ``param_names``);
    None where it has none. What a load compares, position by position, so that
    hyperparameters of equal shapes given in another order (a module whose
    ``register_hyperparameter`` calls were reordered, another problem) are not loaded into each
    other's places (session 57: they were, silently; session 58: also where λ live outside
    ``module``, named by the caller or the outer optimizer)."""
    named: dict[int, str] = {}
    outer = opt.outer_optimizer
    for group in outer.param_groups if outer is not None else ():
        named.update(zip(map(id, group["params"]), group.get("param_names", ())))
    given = getattr(opt, "given_names", ())
    named.update((id(h), n) for h, n in zip(opt.hyperparameters, given) if n)
    module = opt.module
    if module is not None:
        named.update((id(t), n) for n, t in (*module.named_parameters(), *module.named_buffers()))
    return [named.get(id(h)) for h in opt.hyperparameters]


def _check_same_names(saved: Any, opt: SIDHyperOptimizer) -> None:
    """Refuse a state whose hyperparameters, named where both runs name them, come in another
    order or are others (absent in states saved before session 57: not compared)."""
    if saved is None:
        return
    ours = hyperparameter_names(opt)
    if (
        not isinstance(saved, (list, tuple))
        or len(saved) != len(ours)
        or not all(n is None or isinstance(n, str) for n in saved)
    ):
        raise ConfigurationError(
            f"the saved hyperparameter_names must be a list of {len(ours)} names or None, got "
            f"{saved!r}: the checkpoint is corrupted or belongs to another problem."
        )
    differ = [i for i, (a, b) in enumerate(zip(saved, ours)) if a and b and a != b]
    if differ:
        in_saved = set(saved) >= {ours[i] for i in differ}
        raise ConfigurationError(
            f"the saved hyperparameters are {list(saved)}, this optimizer's {ours} (position "
            f"{differ[0]}: {saved[differ[0]]!r} saved, {ours[differ[0]]!r} here): "
            + (
                "the same hyperparameters in another order, so each would be loaded into "
                "another's place. Pass (or register) them in the saved run's order."
                if in_saved
                else "another problem's hyperparameters. Resume from a checkpoint of this model."
            )
        )


def _warn_unchecked_order(saved: Any, opt: SIDHyperOptimizer) -> None:
    """Say which λ a load could not check: two or more of one shape named on neither side are
    matched by position alone, so a run that gives them in another order than the saved one
    gets each other's values, and no test on the values can tell (a λ's stored value is as
    plausible in either place)."""
    ours = hyperparameter_names(opt)
    saved = list(saved) if saved is not None else [None] * len(ours)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, (h, a, b) in enumerate(zip(opt.hyperparameters, saved, ours)):
        if not a and not b:
            by_shape.setdefault(tuple(h.shape), []).append(i)
    alike = {shape: at for shape, at in by_shape.items() if len(at) > 1}
    if alike:
        said = "; ".join(f"positions {at} of shape {shape}" for shape, at in alike.items())
        warnings.warn(
            f"loaded hyperparameters named on neither side by position only ({said}): if "
            "this run gives them in another order than the saved one, each now holds "
            "another's value, and nothing in the checkpoint can tell. Name them ((name, "
            "tensor) pairs, module=, or an outer optimizer over named tensors) to have the "
            "order checked.",
            UserWarning,
            stacklevel=4,
        )


#: the settings a resumed run must share with the saved one to continue it exactly
_SETTINGS = (
    "inner_steps", "adjoint_steps", "step_size", "adjoint_step_size", "alpha", "eta", "beta",
    "gamma", "switch", "q", "sigma2", "warm_start_adjoint", "mode", "batches",
)  # fmt: skip
#: strategies compared by their kind (their fields may follow the training, e.g. a horizon)
_STRATEGIES = (
    "curvature", "inner_solver", "damping", "adjoint_solver", "look_ahead", "preconditioner",
    "on_divergence", "hvp",
)  # fmt: skip


def settings(config: SIDConfig) -> dict[str, str]:
    """What of ``config`` a resumed run is compared on: its plain settings and the kinds of its
    strategies, as text."""
    plain = {
        name: re.sub(r" at 0x[0-9a-f]+", "", repr(getattr(config, name))) for name in _SETTINGS
    }
    kinds = {name: type(getattr(config, name)).__name__ for name in _STRATEGIES}
    return plain | kinds


def _warn_other_config(saved: Any, config: SIDConfig) -> None:
    """Warn where the state was saved under other settings: the resumed run is not the
    continuation of the saved one (a deliberate change, e.g. more inner steps, is allowed)."""
    if not isinstance(saved, dict):
        return
    ours = settings(config)
    changed = [f"{k} {saved[k]} → {v}" for k, v in ours.items() if k in saved and saved[k] != v]
    if changed:
        warnings.warn(
            "hypertorch_sid: the loaded state was saved with other settings than this "
            f"optimizer's config ({'; '.join(changed)}): the resumed hyper steps run with this "
            "config, so they do not continue the saved run exactly. Build the optimizer with the "
            "saved run's SIDConfig to continue it as it was.",
            UserWarning,
            stacklevel=4,
        )


def _same_list(last: BatchStream | None, source: Any) -> bool:
    """Whether ``source`` is a list or tuple as long as the ``last`` stream's list or tuple."""
    return (
        last is not None
        and isinstance(last.source, (list, tuple))
        and isinstance(source, (list, tuple))
        and len(last.source) == len(source)
    )


def _position(opt: SIDHyperOptimizer) -> int | None:
    """The batches drawn from the current pass of the ``train_batches`` the optimizer iterates
    itself (a list, a DataLoader), or None (none yet, a one-shot iterator: its position is the
    caller's, or a :class:`BatchStream` given by the caller, e.g. the Lightning callback's)."""
    streams = list(opt._streams.values())
    if not streams or not streams[0]._reiterable:
        return opt._resume_position  # a loaded one not yet used, else None
    return streams[0].position


def resume_position(stream: BatchStream, position: int | None, last: BatchStream | None) -> None:
    """Go on where the batches left off: from a loaded state's ``position``, or from the ``last``
    stream's where the new source is a list (or tuple) as long as its list, the same batches
    built again (``hopt.step([b for b in batches], ...)`` in the loop: every hyper step restarted
    from the first batch, and the rest of the data were never drawn, session 54). A loaded
    position that cannot be skipped to warns."""
    if position is None:
        if _same_list(last, stream.source):
            stream.skip(last.position)  # type: ignore[union-attr]
        return
    if stream.skip(position):
        return
    warnings.warn(
        f"hypertorch_sid: the loaded state had drawn {position} batches of the current pass of "
        f"train_batches; this {stream.name} cannot go on from there ("
        + (
            "a one-shot iterator: resume it yourself"
            if not stream._reiterable
            else "its pass is shorter: another data source than the saved run's"
        )
        + "), so it starts from its first batch and the resumed run draws other batches than "
        "an uninterrupted one would.",
        UserWarning,
        stacklevel=4,
    )


def load_state_dict(opt: SIDHyperOptimizer, state: dict[str, Any]) -> None:
    """Restore what :func:`state_dict` saved (λ in place, on their current device)."""
    if not isinstance(state, dict):
        raise ConfigurationError(
            f"a SIDHyperOptimizer state is a dict, got {type(state).__name__}."
        )
    required = {"hyperparameters", "outer_optimizer", "v", "hyper_step", "constants", "cost"}
    missing = required - set(state)
    if missing:
        raise ConfigurationError(
            f"not a SIDHyperOptimizer state: keys {sorted(missing)} are missing (truncated or "
            "foreign checkpoint?)."
        )
    saved = _saved_tensors("hyperparameters", state["hyperparameters"], opt.hyperparameters)
    _check_same_names(state.get("hyperparameter_names"), opt)
    if not opt.is_feasible(saved):
        raise ConfigurationError(
            "the saved hyperparameters are outside the feasible set (feasible() returned "
            "False): the checkpoint does not belong to this problem."
        )
    v = _saved_tensors("v", state["v"], opt.inner_parameters) if state["v"] is not None else None
    scale = state.get("scale")
    if scale is not None:
        scale = _saved_tensors("scale", scale, opt.inner_parameters)
    opt.phi.check_scale_state(scale)
    hyper_step = state["hyper_step"]
    if isinstance(hyper_step, bool) or not isinstance(hyper_step, int) or hyper_step < 0:
        raise ConfigurationError(
            f"the saved hyper_step must be an integer ≥ 0, got {hyper_step!r}."
        )
    StepConstants.check_state(state["constants"])
    cost = state["cost"]
    fields = set(Cost().as_dict())
    if (
        not isinstance(cost, dict)
        or not set(cost) <= fields
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in cost.values())
    ):
        raise ConfigurationError(
            f"the saved cost must be a dict of integer counters among {sorted(fields)}, got "
            f"{cost!r}."
        )
    position = state.get("train_batches_position")
    if position is not None and (
        isinstance(position, bool) or not isinstance(position, int) or position < 0
    ):
        raise ConfigurationError(
            f"the saved train_batches_position must be an integer ≥ 0 or None, got {position!r}."
        )
    if "guard" in state:
        DivergenceGuard().load_state_dict(state["guard"])  # validates only
    if state["outer_optimizer"] is not None and opt.outer_optimizer is not None:
        _load_outer_optimizer(opt.outer_optimizer, state["outer_optimizer"])
    # ------------------------------------------------ all checked: change the optimizer
    with torch.no_grad():
        for h, x in zip(opt.hyperparameters, saved):
            h.copy_(x)
    like = opt.inner_parameters
    opt.v = (
        [x.to(device=w.device, dtype=w.dtype) for x, w in zip(v, like)] if v is not None else None
    )
    opt.hyper_step = hyper_step
    if "guard" in state:
        opt.guard.load_state_dict(state["guard"])
    opt.constants.load_state_dict(state["constants"])
    opt.phi.load_scale_state(scale)
    opt.cost.load(cost)
    opt._resume_position = position
    _warn_other_config(state.get("config"), opt.config)
    _warn_unchecked_order(state.get("hyperparameter_names"), opt)
    opt._streams = {}  # the next train_batches goes on from the saved position


def _load_outer_optimizer(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """Load the outer optimizer's state, or raise with the optimizer as it was."""
    tensors = [
        x
        for per_param in (saved.get("state", {}) if isinstance(saved, dict) else {}).values()
        if isinstance(per_param, dict)
        for x in per_param.values()
        if isinstance(x, Tensor)
    ]
    if not all(torch.isfinite(x).all() for x in tensors):
        raise ConfigurationError(
            "the saved outer_optimizer state holds non-finite values (NaN/Inf); refusing to "
            "load it."
        )
    _check_outer_state_shapes(optimizer, saved)
    backup = copy.deepcopy(optimizer.state_dict())
    try:
        optimizer.load_state_dict(saved)
    except Exception as err:
        optimizer.load_state_dict(backup)
        raise ConfigurationError(
            f"the saved outer_optimizer state does not fit outer_optimizer "
            f"({type(optimizer).__name__} over these hyperparameters): {err}"
        ) from err
    _keep_this_runs_settings(optimizer, backup["param_groups"])


def _keep_this_runs_settings(optimizer: torch.optim.Optimizer, ours: list[dict[str, Any]]) -> None:
    """Put back the settings (lr, betas, ...) this run's outer optimizer was built with where the
    loaded state's differ, and say so. ``Optimizer.load_state_dict`` takes the saved run's
    settings with its moments, so a fit resumed with another ``outer_lr`` (or outer optimizer
    settings) silently went on at the saved one. The moments are the saved run's either way;
    unchanged settings load bit for bit as before."""
    changed = []
    for i, (group, mine) in enumerate(zip(optimizer.param_groups, ours)):
        for key, value in mine.items():
            if key == "params" or key not in group or _same(group[key], value):
                continue
            changed.append(f"{key} {group[key]!r} → {value!r}" + (f" (group {i})" if i else ""))
            group[key] = value
    if changed:
        warnings.warn(
            f"hypertorch_sid: resuming with other outer optimizer settings than the checkpoint's "
            f"({type(optimizer).__name__}: {'; '.join(dict.fromkeys(changed))}): the resumed "
            "hyper steps use this run's settings, with the checkpoint's moments. Pass the "
            "checkpoint's settings (e.g. the same outer_lr) to continue the saved run as it was.",
            UserWarning,
            stacklevel=2,
        )


def _same(a: Any, b: Any) -> bool:
    """Whether two optimizer settings are equal (numbers, tuples, tensors)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _check_outer_state_shapes(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """torch's own optimizers keep scalars or tensors shaped like the parameter per parameter.

    ``Optimizer.load_state_dict`` does not check these shapes: a moment of another shape loads and
    fails (or broadcasts) only at the next outer step. Optimizers from elsewhere, and torch's
    ``LBFGS``/``Adafactor`` (other per-parameter shapes), are not checked here.
    """
    kind = type(optimizer)
    if not kind.__module__.startswith("torch.optim.") or kind.__name__ in ("LBFGS", "Adafactor"):
        return
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return  # load_state_dict reports it
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return
    ids = [i for g in groups for i in g.get("params", [])]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(ids) != len(params):
        return  # load_state_dict reports it
    shapes = dict(zip(ids, (p.shape for p in params)))
    for i, per_param in saved["state"].items():
        if i not in shapes or not isinstance(per_param, dict):
            continue
        for name, x in per_param.items():
            if isinstance(x, Tensor) and x.dim() > 0 and x.shape != shapes[i]:
                raise ConfigurationError(
                    f"the saved outer_optimizer state {name!r} of hyperparameter {i} has shape "
                    f"{tuple(x.shape)}, the hyperparameter {tuple(shapes[i])}: the checkpoint is "
                    "corrupted or belongs to another model."
                )


def _saved_tensors(name: str, saved: Any, like: Sequence[Tensor]) -> Tensors:
    """``saved`` as a list of finite tensors shaped like ``like``, or ConfigurationError."""
    if not isinstance(saved, (list, tuple)) or not all(isinstance(x, Tensor) for x in saved):
        raise ConfigurationError(
            f"the saved {name} must be a list of tensors, got {type(saved).__name__}."
        )
    shapes, expected = [tuple(x.shape) for x in saved], [tuple(x.shape) for x in like]
    if shapes != expected:
        raise ConfigurationError(
            f"the saved {name} have shapes {shapes}, these have {expected}: the checkpoint is "
            "truncated or belongs to another model."
        )
    if not all(torch.isfinite(x).all() for x in saved):
        raise ConfigurationError(f"the saved {name} hold non-finite values (NaN/Inf).")
    return list(saved)
