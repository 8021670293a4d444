"""Work done inside the training optimizers' steps, once their gradient is final (session 56).

Lightning's ``on_before_optimizer_step`` runs *before* its gradient clipping
(``Precision._after_closure``), which then rescales the gradients in place; torch's own
``weight_decay=`` and the update act inside ``optimizer.step()``, after it. What a
hyper-optimization callback must do to the gradient the update uses (``LearnedWeightDecay``'s
decay) or read from it (the step-size probe, :class:`~hypertorch_sid.core.horizon.StepSizeProbe`)
is therefore done here: one global optimizer step pre-hook for the fit, which runs after the
closure Lightning passes the step (the backward, ``on_before_optimizer_step``, the clip) —
first every callback's change of the gradient, then every callback's reading of it, so that a
reading sees every change (two drop-ins in one Trainer) — and one global step post hook, which
closes the readings right after the update (session 58: a probe of each optimizer's update,
under manual optimisation with one optimizer per layer).

torch runs those hooks from the ``step`` it wraps when an optimizer's ``__init__`` calls
``torch.optim.Optimizer.__init__``; a user's wrapper that skips it (Lookahead as it is widely
copied: ``self.optimizer = base; self.param_groups = base.param_groups``) steps without them, so
nothing a callback does in the step happened (session 64: λ learned up to 25 while the weights
came out as without decay, bit for bit). :func:`runs_step_hooks` gives such an optimizer torch's
wrap.
"""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

#: what a callback does to or with one optimizer's final gradient
InStepWork = Callable[[torch.optim.Optimizer], None]


class StepHooks:
    """The handles of :func:`hook_steps`' global hooks, removed together."""

    def __init__(self, *handles: RemovableHandle) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def hook_steps(
    optimizers: Callable[[], Sequence[torch.optim.Optimizer]],
    changes: Sequence[InStepWork],
    readings: Sequence[InStepWork],
    after: Sequence[InStepWork] = (),
) -> StepHooks:
    """Run ``changes`` then ``readings`` inside every step of the ``optimizers()`` (read at
    each step: an optimizer created during the fit is hooked from its first step), after the
    step's closure; a step without a closure (AMP's ``GradScaler.step``, after its unscaling; a
    step it skips never runs) gets them right away. LBFGS evaluates its closure several times:
    each evaluation is followed by them. ``after`` runs once the step has updated the weights.
    Other optimizers' steps (an outer optimizer, another fit's) are left alone. Registered
    globally, not per optimizer; remove the returned hooks when the fit ends. The optimizers of
    the fit's start whose ``step`` runs no hooks get torch's wrap (:func:`runs_step_hooks`)."""
    for optimizer in optimizers():
        runs_step_hooks(optimizer)
    handles = [
        register_optimizer_step_pre_hook(
            functools.partial(_in_step, optimizers, tuple(changes) + tuple(readings))
        )
    ]
    if after:
        handles.append(
            register_optimizer_step_post_hook(functools.partial(_after_step, optimizers, after))
        )
    return StepHooks(*handles)


def runs_step_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Make ``optimizer``'s ``step`` run torch's optimizer step hooks, as every optimizer whose
    ``__init__`` calls ``torch.optim.Optimizer.__init__`` does: this object's ``step`` wrapped
    by torch's own ``Optimizer.profile_hook_step`` (what that ``__init__`` does to the class),
    the hook tables it reads added to the object where missing. Only this object changes: its
    class, and other objects of it (without the tables), step as they did. An object of a
    class that skipped ``Optimizer.__init__`` (a Lookahead wrapper) otherwise steps past every
    hook: the decay was never applied. An optimizer whose step runs them already is left as
    it is."""
    if getattr(type(optimizer).step, "hooked", False) or getattr(optimizer.step, "hooked", False):
        return
    for table in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        if not isinstance(getattr(optimizer, table, None), dict):
            setattr(optimizer, table, OrderedDict())
    hooked = torch.optim.Optimizer.profile_hook_step(type(optimizer).step)
    hooked.hooked = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(hooked, optimizer)  # type: ignore[method-assign]


def _after_step(
    optimizers: Callable[[], Sequence[torch.optim.Optimizer]],
    work: Sequence[InStepWork],
    optimizer: torch.optim.Optimizer,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    if any(optimizer is opt for opt in optimizers()):
        for do in work:
            do(optimizer)


def _in_step(
    optimizers: Callable[[], Sequence[torch.optim.Optimizer]],
    work: tuple[InStepWork, ...],
    optimizer: torch.optim.Optimizer,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    if not any(optimizer is opt for opt in optimizers()):
        return None
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)

    def final() -> None:
        for do in work:
            do(optimizer)

    if closure is None:
        final()
        return None

    def then_final() -> Any:
        loss = closure()
        final()
        return loss

    if "closure" in kwargs:
        return args, {**kwargs, "closure": then_final}
    return (args[0], then_final, *args[2:]), kwargs
