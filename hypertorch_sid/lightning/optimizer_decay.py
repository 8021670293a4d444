"""The training optimizers' own ``weight_decay``, modelled in the hyper steps' inner loss.

A :class:`~hypertorch_sid.BilevelModule` or :class:`~hypertorch_sid.LearnedDataWeights` fit may
keep its optimizer's own decay (``SGD(weight_decay=5e-4)``, ``AdamW``'s default 0.01). The
training then reaches the fixed point of ℓ̂ plus that decay, not of ℓ̂:

* coupled (SGD, Adam, ... ``weight_decay=``: ``grad += wd·w``): ∇ℓ̂ + wd·w = 0, the stationary
  points of ℓ̂ + ½ wd ‖w‖² whatever the optimizer;
* decoupled (AdamW; Adam / NAdam / RAdam with ``decoupled_weight_decay=True``:
  ``w ← w(1 − lr·wd)``): P⁻¹∇ℓ̂ + wd·w = 0 with P the optimizer's preconditioner, with P frozen
  the stationary points of ℓ̂ + ½ wd Σ P ⊙ w².

The hypergradient must differentiate that fixed point, so the callback adds the decay to ℓ̂
(:func:`with_optimizer_decay`), as :class:`~hypertorch_sid.LearnedWeightDecay` does for its own
λ (which therefore refuses an optimizer that keeps its own decay on the tensors it decays).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .problem import BilevelProblem

__all__ = [
    "PRECONDITIONED",
    "OptimizerDecay",
    "decouples",
    "preconditioner",
    "stepping",
    "with_optimizer_decay",
    "with_penalty",
]

#: optimizers whose ``weight_decay`` adds wd·w to the gradient (unless they decouple it)
COUPLED = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.RMSprop,
    torch.optim.ASGD,
)


#: optimizers whose preconditioner P :func:`preconditioner` reads (Adam's second moment, SGD's
#: momentum); for any other (Adafactor, RMSprop, Adagrad, Adamax, ...) it returns 1, which is
#: not the P of their fixed point
PRECONDITIONED = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.SGD,
)


#: where a wrapper optimizer keeps the one it wraps: SAM's ``base_optimizer``; Lookahead's
#: ``optimizer`` (the widely copied implementation, torch-optimizer's) or ``_base_optimizer``
#: (timm's)
WRAPPED = ("base_optimizer", "optimizer", "_base_optimizer", "_optimizer")


def stepping(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose update applies ``optimizer``'s ``weight_decay``: the one it wraps
    over the same parameter groups (:data:`WRAPPED`: SAM, Foret et al. 2021, as users write it:
    two gradient evaluations, then the base SGD or Adam steps, its ``weight_decay=`` included;
    Lookahead, Zhang et al. 2019: k steps of the wrapped optimizer, then the weights set on the
    slow ones), else ``optimizer`` itself. Session 63: SAM over SGD was said to keep a decay
    "whose fixed point this callback does not know"; session 64: Lookahead over AdamW was said
    to have a preconditioner this callback does not read."""
    for attr in WRAPPED:
        base = getattr(optimizer, attr, None)
        if base is not optimizer and isinstance(base, torch.optim.Optimizer):
            if _same_groups(base.param_groups, optimizer.param_groups):
                return stepping(base)
    return optimizer


def _same_groups(first: Sequence[Any], second: Sequence[Any]) -> bool:
    return first is second or (
        len(first) == len(second) and all(a is b for a, b in zip(first, second))
    )


def decouples(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> bool:
    """Whether the optimizer applies its ``weight_decay`` decoupled, as ``w ← w(1 − lr·λ)``:
    AdamW, and Adam / NAdam / RAdam with ``decoupled_weight_decay=True`` (a wrapper: its base,
    :func:`stepping`)."""
    base = stepping(optimizer)
    return isinstance(base, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))


def default_decay(optimizer: torch.optim.Optimizer) -> str:
    """The text " — its default is …" for an optimizer class whose ``weight_decay`` defaults
    to non-zero (AdamW 0.01, Muon 0.1: a user who never passed one meets the refusal), else
    ""; the refusal named AdamW's 0.01 whatever the class (session 63: Muon's is 0.1)."""
    import inspect

    try:
        default = inspect.signature(type(optimizer).__init__).parameters["weight_decay"].default
    except (KeyError, TypeError, ValueError):
        return ""
    if isinstance(default, (int, float)) and default != 0:
        return f" — {type(optimizer).__name__}'s default is {default:g}"
    return ""


def preconditioner(
    optimizer: torch.optim.Optimizer, group: Mapping[str, Any], param: Tensor
) -> Tensor | float:
    """P of the decoupled fixed point P⁻¹∇ℓ + λw = 0 for ``param``, from the optimizer's state:
    Adam's √v̂ + ε (v̂ the bias-corrected second moment, ``max_exp_avg_sq`` with amsgrad); SGD
    with momentum μ and dampening d, (1 − μ)/(1 − d); otherwise (and before a first step) 1."""
    state = stepping(optimizer).state.get(param, {})
    if "exp_avg_sq" in state:
        v = state["exp_avg_sq"]
        if group.get("amsgrad") and "max_exp_avg_sq" in state:
            v = state["max_exp_avg_sq"]
        step = float(state["step"])
        beta2 = float(group["betas"][1])
        return ((v / (1 - beta2**step)).sqrt() + group["eps"]).detach()
    momentum = float(group.get("momentum", 0.0) or 0.0)
    dampening = float(group.get("dampening", 0.0) or 0.0)
    if momentum > 0 and dampening < 1:
        return (1 - momentum) / (1 - dampening)
    return 1.0


class OptimizerDecay:
    """D(w) = ½ Σ_g wd_g Σ_{p ∈ g} Σ_i P_{p,i} w_{p,i}², the decay the optimizers add to ℓ̂.

    P = 1 for coupled decay; for decoupled decay the optimizer's preconditioner
    (:func:`preconditioner`), frozen at its value at the latest :meth:`refresh` (each hyper step),
    as :class:`~hypertorch_sid.LearnedWeightDecay` freezes it: exact for the fixed point with the
    current P, ignoring how P itself would change with λ. Only inner parameters of groups with
    ``weight_decay > 0`` enter. The tensors are read through ``module`` at call time (so
    ``hvp="forward"``, which swaps them inside the module, sees them).
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        inner_parameters: Sequence[Tensor],
        module: torch.nn.Module,
    ) -> None:
        inner = {id(p) for p in inner_parameters}
        names = {id(p): n for n, p in module.named_parameters()}
        self.module = module
        self._inner = inner
        #: (optimizer index, group index) of every group with decay at the start, modelled or
        #: not (by position: optimizers created anew during the fit keep theirs)
        self.groups_at_start: set[tuple[int, int]] = set()
        #: (optimizer, group index, parameter, its name in the module or None)
        self.entries: list[tuple[torch.optim.Optimizer, int, Tensor, str | None]] = []
        #: "Type (group i): weight_decay=…, coupled/decoupled" for each modelled group
        self.modelled: list[str] = []
        #: the same for groups whose decay is not modelled (an optimizer of unknown semantics)
        self.unknown: list[str] = []
        for oi, opt in enumerate(optimizers):
            for gi, group in enumerate(opt.param_groups):
                wd = float(group.get("weight_decay", 0) or 0)
                params = [p for p in group["params"] if p.requires_grad and id(p) in inner]
                if wd <= 0 or not params:
                    continue
                self.groups_at_start.add((oi, gi))
                decoupled = decouples(opt, group)
                what = f"{type(opt).__name__} (group {gi}): weight_decay={wd:g}"
                if not decoupled and not isinstance(stepping(opt), COUPLED):
                    self.unknown.append(what)
                    continue
                self.modelled.append(f"{what}, {'decoupled' if decoupled else 'coupled'}")
                self.entries += [(opt, gi, p, names.get(id(p))) for p in params]
        self._coefficients: list[Tensor | float] = []
        self.refresh()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def refresh(self) -> None:
        """Read wd_g and, for decoupled decay, P from the optimizers (their current values)."""
        coefficients: list[Tensor | float] = []
        for opt, gi, p, _ in self.entries:
            group = opt.param_groups[gi]
            wd = float(group.get("weight_decay", 0) or 0)
            coefficients.append(wd * preconditioner(opt, group, p) if decouples(opt, group) else wd)
        self._coefficients = coefficients

    def switched_on(self, optimizers: Sequence[torch.optim.Optimizer]) -> list[str]:
        """Groups over inner parameters whose ``weight_decay`` was 0 when the decay was read and
        is not now (a weight-decay schedule, a callback switching it on): not modelled, so the
        hyper steps' ℓ̂ lacks it from then on (session 51). :meth:`refresh` follows a decay
        that changes from a non-zero value."""
        return [
            f"{type(opt).__name__} (group {gi}): weight_decay={group['weight_decay']:g}"
            for oi, opt in enumerate(optimizers)
            for gi, group in enumerate(opt.param_groups)
            if float(group.get("weight_decay", 0) or 0) > 0
            and (oi, gi) not in self.groups_at_start
            and any(p.requires_grad and id(p) in self._inner for p in group["params"])
        ]

    def penalty(self) -> Tensor:
        """D(w): differentiable in w, not in λ (constant coefficients)."""
        current = dict(self.module.named_parameters())
        terms = [
            0.5 * (c * current.get(name, p).pow(2)).sum() if name else 0.5 * (c * p.pow(2)).sum()
            for (_, _, p, name), c in zip(self.entries, self._coefficients)
        ]
        return sum(terms[1:], terms[0])  # tensors of several dtypes may be decayed


def _plus(first: Any, second: Any) -> Any:
    return lambda *args: first(*args) + second()


def with_optimizer_decay(problem: BilevelProblem, decay: OptimizerDecay) -> BilevelProblem:
    """``problem`` with the optimizers' own decay D(w) in its inner loss:

        ℓ̂_hyper(w, λ; ζ) = ℓ̂(w, λ; ζ) + D(w),   D(w) = ½ Σ_g wd_g Σ_{p ∈ g} P_p ⊙ w_p²

    (P = 1 coupled, the frozen preconditioner decoupled), so the hypergradient is that of the
    fixed point the training reaches. D is batch-independent and does not read λ: it joins the
    ``regularizer`` (Gauss–Newton keeps its Hessian exact; eq. gradestim's cross term from R + D
    is that from R). Without such decay ``problem`` is returned as it is."""
    return with_penalty(problem, decay.penalty) if decay else problem


def with_penalty(problem: BilevelProblem, penalty: Callable[[], Tensor]) -> BilevelProblem:
    """``problem`` with a batch-independent penalty D(w) that the training adds, constant in
    λ, in its inner loss and its ``regularizer``: the optimizers' own decay
    (:func:`with_optimizer_decay`) or another hyperparameter callback's
    (:meth:`~hypertorch_sid.lightning.callback.HyperOptimizationCallback.training_penalty`,
    e.g. :class:`~hypertorch_sid.LearnedWeightDecay`'s ½ Σ λᵢ‖wᵢ‖² in
    :class:`~hypertorch_sid.LearnedDataWeights`' hyper steps)."""
    reg = problem.regularizer
    return dataclasses.replace(
        problem,
        inner_loss=_plus(problem.inner_loss, penalty),
        regularizer=penalty if reg is None else _plus(reg, penalty),
    )
