"""``LearnedWeightDecay``: drop-in learned weight decay for any ``LightningModule``.

A module whose optimizer used ``weight_decay=1e-4`` switches to a weight decay learned from its
validation loss with three changed lines::

    +from hypertorch_sid import LearnedWeightDecay
     ...
    -        return torch.optim.SGD(self.parameters(), lr=0.1, weight_decay=1e-4)
    +        return torch.optim.SGD(self.parameters(), lr=0.1)
     ...
    -trainer = pl.Trainer(max_epochs=10)
    +trainer = pl.Trainer(max_epochs=10, callbacks=[LearnedWeightDecay(1e-4)])

(one λ per layer, the default; ``granularity="global"`` learns one value.) The module's
code (``training_step``, ``configure_optimizers``) stays as it is: the callback
applies the decay itself where the optimizer's own ``weight_decay=`` acts, inside every
optimizer step once the gradient is final (after the backward, Lightning's gradient clipping and
AMP unscaling: an optimizer step pre-hook), and tunes λ by SID (see
:class:`~hypertorch_sid.lightning.HyperOptimizationCallback`).

What is learned
---------------
Write ℓ(w; ζ) for the user's training loss (what ``training_step`` returns) and λ ≥ 0 for the
decay (one value, one per parameter group / layer / tensor, or one per element).

* **Coupled** (``decoupled=False``; what ``SGD``/``Adam``'s ``weight_decay=`` do): before each
  step ``w.grad += λ ⊙ w``, the gradient of ½ Σ λ ⊙ w². The training minimises

      ℓ̂(w, λ; ζ) = ℓ(w; ζ) + ½ Σ_p Σ_i λ_{p,i} w_{p,i}²,

  whatever the optimizer (its fixed points are the stationary points of ℓ̂), and this ℓ̂ is the
  inner loss of the hypergradient. With a fixed λ the training is exactly the optimizer's own
  ``weight_decay=λ`` (tested).
* **Decoupled** (``decoupled=True``; what ``AdamW`` does): before each step ``w ← w ⊙ (1 − lr·λ)``
  with the parameter group's current ``lr``; the optimizer then adds its own update, so with a
  fixed λ the training is exactly ``AdamW(weight_decay=λ)`` (tested). Its fixed points solve
  P⁻¹∇ℓ(w) + λ ⊙ w = 0 for the optimizer's preconditioner P: for Adam/AdamW P = diag(√v̂ + ε)
  (v̂ the bias-corrected second moment, ``max_exp_avg_sq`` with amsgrad); for SGD with momentum
  μ and dampening d, P = (1 − μ)/(1 − d); otherwise P = 1. With P frozen at its current value these
  are the minimisers of ℓ(w) + ½ Σ (P λ) ⊙ w², so the hypergradient is computed for the inner loss

      ℓ̂(w, λ; ζ) = ℓ(w; ζ) + ½ Σ_p Σ_i P_{p,i} λ_{p,i} w_{p,i}²   (P read at each hyper step),

  i.e. λ is learned as AdamW's decoupled coefficient through the effective L2 coefficient
  P ⊙ λ. This is exact for the fixed point with the current preconditioner; it ignores how P
  itself would change with λ.

The outer objective E is the same training loss ℓ evaluated on validation batches (without the
penalty), unless ``validation_loss`` is given.

Positivity: ``parameterization="log"`` learns ρ with λ = exp(ρ) (λ > 0 always);
``"projection"`` learns λ directly and projects onto λ ≥ 0 after each outer step.

Caveats: under float16 mixed precision a step the ``GradScaler`` skips (non-finite gradients)
skips the decay with it, as it does the optimizer's own; by default ℓ is obtained by calling
``training_step`` with ``self.log`` muted and the module's torchmetrics states restored after
each hyper step, so a ``training_step`` with other side effects (appending to lists, manual
optimisation) needs ``training_loss=``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from ..core.budget import Budget
from ..core.decay import ElementModel, as_element_model
from ..core.errors import ConfigurationError
from ..core.modes import as_trained
from ..core.outer_step import ReachRprop
from ..core.scale import InvariantRule, as_invariant_rule
from ..core.validation import check_positive, is_real
from .amp import loss_scale, scaler_skips
from .callback import HyperOptimizationCallback
from .callback_settings import (
    CALLBACK_CONFIG,
    config_given,
    default_unless_given,
    given,
    refuse_settings_given_positionally,
)
from .gradient_clip import BindingClip
from .invariance import probe_cost, probe_forwards, scale_invariant_slots
from .isolation import metric_states_kept
from .problem import MEANING_KEY, check_meaning
from .training_length import horizon
from .weight_decay_problem import (
    APPLIED_KEY,
    DECIDED_KEY,
    GROUPS_KEY,
    NORMS_KEY,
    SLOTS_KEY,
    WeightDecayProblem,
    shared_slots,
)

__all__ = [
    "LearnedWeightDecay",
    "WeightDecayProblem",
    "probe_cost",
    "probe_forwards",
    "scale_invariant_slots",
]


#: the drop-in's compute budget (``max_overhead="auto"``, not per element): see :func:`_defaults`
DEFAULT_MAX_OVERHEAD = 0.5


def _defaults(
    granularity: str, elements: ElementModel, kwargs: dict[str, Any], parameterization: str = "log"
) -> dict[str, Any]:
    """The drop-in's callback defaults, chosen by ``benchmarks/bench_weight_decay.py``.

    A hyper step every 20 training steps with k = 3 adjoint steps and, per layer/tensor/group or
    global with λ on the log scale, :class:`~hypertorch_sid.core.outer_step.TrustRprop` on log λ
    with its first step ``outer_lr`` = 0.3 (Rprop: no memory of old hypergradients, a flip of
    their sign stops λ at the next hyper step; rises of λ held to δ/(ηR), eq. decaytrust). It
    replaced Adam (lr 0.3), whose momentum carried the early "less decay" past the late flip:
    held-out test loss, 9 seeds × 7 settings, against Adam: the main job's recipe −0.0075 ±
    0.0072, 20 Newsgroups MLP −0.0067 ± 0.0005, MNIST MLP −0.0039 ± 0.0045, Fashion MLP
    +0.0068 ± 0.0083, CNNs and digits MLP within ±0.0003 (docs/weight_decay_budget.md, "The
    outer step without memory"); Adam stays the outer step per element and with projection,
    except an element model with its own step (``elements="layer_then_shrunk"``: TrustRprop on
    the layers' λ as here, shrunk deviations; ``"shrunk"``: Adam and shrinkage).
    Since session 60 the step is :class:`~hypertorch_sid.core.outer_step.ReachRprop`, a
    TrustRprop whose first fall is sized by the decay's own shrink (eq. shrinkfall) and whose
    step is held at or above what can still cross two decades of λ with the hyper steps left
    (eqs. reachpace, reachstep): on the main job's recipe, fresh seeds, −0.0100 ± 0.0040 held-out
    test loss at the deployed epoch; the CNNs within 0.0005; the main job's last weights +0.0083
    ± 0.0087 (docs/weight_decay_budget.md, "Session 60").
    All within a compute budget of half the training's (``max_overhead=0.5``: no worse on held-out
    test loss than no budget on five settings × nine seeds, ``docs/weight_decay_budget.md``;
    planned over the fit's known length, :class:`~hypertorch_sid.core.budget.PlannedBudget`, is
    an option: −0.0056 ± 0.0007 on an MLP on 20 Newsgroups with TrustRprop, but with it the MNIST
    MLP +0.0086 ± 0.0053 (7 of 9 seeds worse) and the Fashion MLP +0.0046 ± 0.0028 over 54
    seeds with Adam, where decay pays);
    per element the element model's own budget (none:
    :attr:`~hypertorch_sid.core.decay.ElementModel.max_overhead`) and outer lr
    (:class:`~hypertorch_sid.core.decay.TiedToLayer`: 0.3 with the curvature refreshed, as per
    layer; :class:`~hypertorch_sid.core.decay.Untied`: 1.0,
    whose many small hypergradients move λ too slowly at 0.3, and the curvature estimated once —
    the damping of a per-element λ does not need refreshing, and the estimate is a third of a
    hyper step's cost). The validation gradient is read at the current weights
    (:class:`~hypertorch_sid.core.horizon.CurrentWeights`); ``look_ahead=TrainedWeights()``
    (eq. trainedgrad, the weights the training will reach) is an option, not the default: on
    the benchmark's 6 settings × 9 seeds it was within noise (MNIST MLP −0.0087 ± 0.0058 held-out
    test loss), but on an MLP on 20 Newsgroups trained with Adam and dropout, where no decay is
    best, it drove λ from 1e-4 to 6–8e-4 and the test loss from 1.25 to 1.36–1.41 (no decay
    1.22; 3 seeds, ``benchmarks/check_20news_recipe.py``): its target ∇E − ∇ℓ̂ is the gradient
    of the generalisation gap, which decay always narrows
    (docs/weight_decay_budget.md). Measured against the old callback defaults
    (every 10, k = 10, lr 0.01) on MNIST MLP: val 0.1699 at 1.5× a plain training, was 0.2282 at
    3.9×. Explicit settings (or ``config=``/``curvature=``) win.
    """
    per_element = granularity == "per_element"
    defaults: dict[str, Any] = {"every_n_steps": 20}
    if kwargs.get("preset") is None:
        defaults["adjoint_steps"] = 3
    if kwargs.get("outer_optimizer") is None:
        defaults["outer_lr"] = elements.outer_lr if per_element else 0.3
        own = elements.outer_optimizer(given(kwargs.get("outer_lr"), defaults["outer_lr"]))
        if per_element and own is not None:  # e.g. ShrunkToLayer's step
            defaults["outer_optimizer"] = own
        elif not per_element and parameterization == "log":
            lr = given(kwargs.get("outer_lr"), defaults["outer_lr"])  # Δ₀; Δ_min, Δ_max widen
            sizes = (min(1e-2, lr), max(2.0, lr))
            # ReachRprop (session 57; the default by rules_s60/reach60-rule.txt): ShrinkFallRprop
            # (session 52: TrustRprop whose first fall goes where the decay's own shrink says)
            # whose step on log λ is held at or above what can still cross ln 100 with the
            # hyper steps left
            defaults["outer_optimizer"] = functools.partial(ReachRprop, lr=lr, step_sizes=sizes)
    chosen = config_given(kwargs) or kwargs.get("curvature") is not None
    fixed = elements.refresh_curvature or chosen
    if per_element and not fixed:
        defaults["curvature"] = dataclasses.replace(CALLBACK_CONFIG.curvature, every=None)
    return defaults


class LearnedWeightDecay(HyperOptimizationCallback):
    """Weight decay learned by SID for any ``LightningModule`` (see the module docstring).

    Parameters
    ----------
    weight_decay:
        The initial λ (the value the optimizer's ``weight_decay=`` had). Must be > 0 with the log
        parameterisation, ≥ 0 with projection.
    granularity:
        ``"global"`` (one λ), ``"per_group"`` (one per optimizer parameter group),
        ``"per_layer"`` (one per module owning parameters; a tensor no layer owns — on the
        LightningModule itself, in an ``nn.ParameterList`` / ``ParameterDict`` — one of its own,
        named by it), ``"per_tensor"`` (one per parameter tensor) or ``"per_element"`` (λ shaped
        like each parameter: one per weight, per feature).
        Default ``"per_layer"``: measured against ``"global"`` (``bench_weight_decay.py``, 5
        settings × 9 seeds), it was as good on the CNNs and digits and lower on both MLPs, where
        weight decay matters most (best validation loss, per layer minus global, paired by seed:
        MNIST MLP −0.0180 ± 0.0085; its test loss significantly better than the grid's pick on
        fresh batch orders).
    decoupled:
        False: coupled decay ``grad += λ w`` (SGD/Adam ``weight_decay``). True: decoupled decay
        ``w *= 1 − lr λ`` (AdamW); see "What is learned".
    parameterization:
        ``"log"`` (λ = exp(ρ), ρ learned) or ``"projection"`` (λ learned, clamped at 0).
    apply_to:
        ``"all"`` trainable parameters of the optimizers, only ``"weights"`` (tensors with
        ≥ 2 dimensions: no biases, no normalisation scales), or ``"decayed_groups"``: the
        tensors of the parameter groups whose ``weight_decay`` is non-zero in the optimizers
        ``configure_optimizers`` returns, your optimizer code unchanged (the usual Transformer
        recipe: a decay group of Linear weights, a no-decay group of biases, norms and
        embeddings, which ``"weights"`` would decay). The callback takes their decay over: it
        sets those groups' ``weight_decay`` to 0 before the first step (so nothing is decayed
        twice) and leaves the groups with ``weight_decay=0`` undecayed. λ starts at this
        callback's ``weight_decay`` (λ₀), not at the groups' values (a warning where one is more
        than 10× from λ₀); AdamW's decoupled decay still needs ``decoupled=True``. The decided
        tensors are kept in the checkpoint, so a resumed fit decays the same ones.
    training_loss:
        ``training_loss(module, batch) -> scalar``: ℓ. ``None``: ``module.training_step(batch, 0)``
        (its ``loss``), with logging muted.
    validation_loss:
        ``validation_loss(module, batch) -> scalar``: E. ``None``: ℓ on validation batches.
    proximal:
        Solve the adjoint system with the proximal gradient map Φ̂ = (w − α∇ĝ)/(1 + αPλ)
        (:class:`~hypertorch_sid.ProximalGradientMap`) instead of the GD map of ĝ + ½Σ Pλw²:
        the same hypergradient, with α limited by the data term's curvature only — for decays
        that grow large (per-element λ). Training itself is unchanged.
    invariant:
        What the λ of a *scale-invariant* group learns from (a convolution or linear layer
        followed by BatchNorm: the loss does not change when its weights are scaled, so decay
        acts only through the effective learning rate η/‖w‖², and the implicit hypergradient
        describes a fixed point that does not exist; :mod:`~hypertorch_sid.core.scale`):
        ``"held"`` (default, :class:`~hypertorch_sid.core.scale.HoldInvariant`: it keeps the
        user's value; the groups are found by a probe just before the first hyper step — the
        training loss of 16 samples with each slot scaled by ½ and 2 (and moved at random where
        both leave it unchanged), 1 to 4 forward passes per slot, once; under a budget its worst
        case is planned into the first hyper step's cost, so a fit that cannot pay for both runs
        neither — :attr:`invariant_groups`), ``"implicit"``
        (:class:`~hypertorch_sid.core.scale.LearnInvariant`: like every other λ, no probe; the
        default until this version), or an :class:`~hypertorch_sid.core.scale.InvariantRule`.
        Why held: a linear layer followed by LayerNorm or GroupNorm is scale-invariant too, and
        there the implicit hypergradient drove its λ up from 1e-3 to 0.24–0.73 in 20 hyper steps
        (digits MLP, SGD lr 0.1, 6 of 6 seeds), the validation loss 0.71–1.91 against 0.29–0.41
        without decay, with no warning; held ends within 0.015 of no decay on all six
        (``tests/test_user_recipes_sweep.py``). On the benchmark's BatchNorm CNNs, with this probe
        and the default budget, held − implicit in held-out test loss was −0.0006 ± 0.0004
        (Fashion) and −0.0002 ± 0.0003 (MNIST), 9 seeds back to back, the same wall time
        (``benchmarks/results/weight_decay/runs/held_default_s41``); on networks without an
        invariant group it changes nothing.
    min_weight_decay:
        The lowest λ learned (default 0: no floor); per element tied to its layer, the layer's
        λ. ``min_weight_decay=weight_decay`` lets λ rise from the initial value but not fall
        below it: on the benchmark's MLPs the hypergradient pushes λ down for the first
        30–50 % of the training (decay only slows fitting then) and up once the training
        overfits, so λ climbs late from 10⁻⁵ (docs/weight_decay_budget.md).
    elements:
        Per element only, how a layer's λ relate: ``"layer_then_shrunk"`` (default,
        :class:`~hypertorch_sid.LayerThenShrunk`: the layers' λ stepped exactly as per layer,
        TrustRprop; the per-element deviations moved by the James–Stein step of ``"shrunk"``;
        with every deviation 0 the fit is per layer's bit for bit; held-out test loss against
        per layer and ``"tied"``: docs/per_element_decay.md), ``"tied"`` (the default until
        this version, :class:`~hypertorch_sid.TiedToLayer`: λ_e = λ_layer · exp(s_e), each
        deviation s_e under a N(0, 1) prior added to the validation loss as the MAP term of the
        n validation samples, Σ s_e² / (2n); ``TiedToLayer(scale=σ)`` for another spread),
        ``"shrunk"`` (:class:`~hypertorch_sid.ShrunkToLayer`: the deviations move along their
        averaged hypergradient shrunk by a James–Stein factor toward the layer's λ, Adam on the
        layers'), ``"untied"``
        (:class:`~hypertorch_sid.Untied`: one free λ per element, as in 0.1 — it fitted
        the validation set), or an :class:`~hypertorch_sid.ElementModel`.
    max_overhead:
        The compute budget of the hyper steps, a share of the training's own compute.
        ``"auto"``: 0.5 (hyper steps within half of the training's compute, measured as it
        runs); per element ``None``, the element model's (a budget of 0.5 starved its hyper
        steps, see :class:`~hypertorch_sid.core.decay.ElementModel`). ``None`` runs every due
        hyper step and makes a seeded fit bit-for-bit repeatable. A
        :class:`~hypertorch_sid.core.budget.Budget` (e.g. ``PlannedBudget(0.5)``) for another.
    **kwargs:
        Settings of :class:`~hypertorch_sid.lightning.HyperOptimizationCallback`
        (``every_n_steps``, ``adjoint_steps``, ``outer_lr``, ``val``, ``config``, ...). The
        drop-in's own defaults differ from the callback's (measured on weight decay, see
        ``_defaults``): ``every_n_steps=20``, ``adjoint_steps=3``, ``outer_lr=0.3`` (the
        first step of :class:`~hypertorch_sid.core.outer_step.ReachRprop` on log λ, the outer
        step; per element Adam's lr, ``1.0`` untied, with one curvature estimate:
        ``EstimatedCurvature(every=None)``),
        the validation gradient at the
        current weights (``look_ahead=TrainedWeights()`` reads it at the weights the training
        will reach: an option, see ``_defaults``).

    Notes
    -----
    The weight-decay problem itself is :attr:`problem`, a :class:`WeightDecayProblem` (the
    callback is the Lightning scheduling around it); λ lives in ``problem.decay``, a core
    :class:`~hypertorch_sid.core.decay.WeightDecay`.
    """

    #: what happens to tensors the optimizers train that the fit did not start with
    _new_tensors_get = (
        "get no learned decay, only the weight_decay of the group holding them (a group added "
        "mid-fit takes the optimizer's default: 0 once the decay moved to this callback, i.e. "
        "no decay at all), and are left out of the hypergradient"
    )
    _thawed_mid_fit_advice = (
        " Where a callback thaws them mid-fit (BackboneFinetuning), give the group it adds a "
        "fixed decay, e.g. in its finetune_function after unfreeze_and_add_param_group: "
        'optimizer.param_groups[-1]["weight_decay"] = 1e-4.'
    )

    def __init__(
        self,
        weight_decay: float = 1e-4,
        granularity: Literal[
            "global", "per_group", "per_layer", "per_tensor", "per_element"
        ] = "per_layer",
        decoupled: bool = False,
        parameterization: Literal["log", "projection"] = "log",
        apply_to: Literal["all", "weights", "decayed_groups"] = "all",
        training_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        validation_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        proximal: bool = False,
        elements: str | ElementModel = "layer_then_shrunk",
        invariant: str | InvariantRule = "held",
        min_weight_decay: float = 0.0,
        max_overhead: float | Budget | Literal["auto"] | None = "auto",
        **kwargs: Any,
    ) -> None:
        refuse_settings_given_positionally(type(self), weight_decay)
        if kwargs.get("problem") is not None:
            raise ConfigurationError(
                "LearnedWeightDecay builds its own problem; use HyperOptimizationCallback("
                "problem=...) for another one."
            )
        kwargs.pop("problem", None)  # None: a LightningCLI passes every parameter it knows
        # refused now, not by the outer step (TrustRprop, a name the user never gave) at the fit
        check_positive("LearnedWeightDecay: outer_lr", kwargs.get("outer_lr"), allow_none=True)
        if kwargs.get("outer_optimizer") is not None and kwargs.get("outer_lr") is not None:
            raise ConfigurationError(
                f"LearnedWeightDecay: outer_lr={kwargs['outer_lr']!r} sets the drop-in's own "
                "outer step (its first step on log λ), but outer_optimizer= replaces it, so "
                "outer_lr would be ignored: give the learning rate to your optimizer (e.g. "
                "outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1)), or drop "
                "outer_optimizer=."
            )
        if granularity != "per_element" and not (
            isinstance(elements, str) and elements == "layer_then_shrunk"
        ):
            raise ConfigurationError(
                f"LearnedWeightDecay: elements={elements!r} says how the λ of one layer's "
                f"elements relate, which only granularity='per_element' learns; with "
                f"granularity={granularity!r} it would be ignored. Pass "
                "granularity='per_element', or drop elements=."
            )
        try:
            model = as_element_model(elements)
            rule = as_invariant_rule(invariant)
        except ConfigurationError as err:
            raise ConfigurationError(f"LearnedWeightDecay: {err}") from None
        for name, value in _defaults(granularity, model, kwargs, parameterization).items():
            default_unless_given(kwargs, name, value)
        auto = isinstance(max_overhead, str) and max_overhead == "auto"
        per_element = granularity == "per_element"
        if auto:  # per element the element model's own budget (none: a budget starved it)
            max_overhead = model.max_overhead if per_element else DEFAULT_MAX_OVERHEAD
        kwargs["max_overhead"] = max_overhead
        own_lr = None
        if kwargs.get("outer_optimizer") is not None:
            own_lr = kwargs.pop("outer_lr", None)  # read by the drop-in's own outer step
        problem = WeightDecayProblem(
            weight_decay,
            granularity,
            decoupled,
            parameterization,
            apply_to,
            training_loss,
            validation_loss,
            proximal,
            model,
            min_weight_decay,
        )
        super().__init__(problem=problem, **kwargs)
        if own_lr is not None:
            self.outer_lr = own_lr  # the drop-in's outer step's first step
        self.problem: WeightDecayProblem = problem
        problem.stability.data_curvature = self._data_curvature
        problem.validation_size = self._validation_size
        problem.validation_share = self._validation_share
        self._estimate_seen: tuple[float | None, float] = (None, 0.0)  # (L̂, min λ when made)
        #: λ₀, the constructor's ``weight_decay`` (also readable by that name, as LightningCLI
        #: and configs do); the learned λ: :attr:`learned_weight_decay`, :meth:`decay_values`
        self.initial_weight_decay = problem.weight_decay
        self._said_initial = False
        self.granularity = granularity
        self.decoupled = decoupled
        self.parameterization = parameterization
        self.apply_to = apply_to
        self.proximal = proximal
        self.elements = model
        self.invariant = rule
        #: which λ groups (slots; per element, layers) are scale-invariant, once probed
        self.invariant_groups: dict[str, bool] | None = None
        #: the decay (its tensors) they were probed on: a fit on other tensors (another module
        #: given to this callback, tensors unfrozen for a new fit) probes again
        self._probed_on: Any = None
        #: the groups a checkpoint held, taken over by the resumed fit instead of a new probe
        self._checkpointed_groups: dict[str, bool] | None = None
        #: the λ slots' names a checkpoint held, in its order (compared when it is applied)
        self._checkpointed_slots: list[str] | None = None
        self._probe_batch: Any = None
        self._probe_planned: Any = None  # the decay whose probe's cost the budget was told
        #: the fit's watch of a binding gradient clip (session 64), made anew at each fit's start
        self._clip_watch = BindingClip("LearnedWeightDecay", self.every_n_steps, self.decoupled)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Also: a new watch of a binding gradient clip (:class:`~.gradient_clip.BindingClip`)."""
        super().on_fit_start(trainer, pl_module)
        self._clip_watch = BindingClip(type(self).__name__, self.every_n_steps, self.decoupled)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Keep a training batch for the invariance probe (until it has run)."""
        if self._probe_pending():
            self._probe_batch = batch
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Also: a fit never ends silently with layers the decay wiped
        (:meth:`WeightDecayProblem.check_not_wiped`), and says where λ was driven so low that
        the decay is off in effect (:meth:`WeightDecayProblem.decay_off`) and where λ ended far
        above the decay the fit applied (:meth:`WeightDecayProblem.ended_above_applied`)."""
        super().on_train_end(trainer, pl_module)
        if self.sid is not None:
            self.problem.check_not_wiped()
            said = self.problem.decay_off(self._losses.last())
            if said is not None:
                rank_zero_info(f"LearnedWeightDecay: {said}")
            said = self.problem.ended_above_applied()
            if said is not None:
                rank_zero_info(f"LearnedWeightDecay: {said}")

    def training_penalty(self, pl_module: pl.LightningModule) -> Callable[[], Tensor]:
        """½ Σᵢ λᵢ‖wᵢ‖² at the current λ (eq. weighted decay; decoupled: with the optimizer's P),
        for :class:`~hypertorch_sid.LearnedDataWeights` in the same fit, whose training
        minimises the weighted loss plus this decay."""
        return functools.partial(self.problem.training_penalty, pl_module)

    def _outer_step_size(self, eta: float | None) -> float | None:
        return self.problem.shrink.step_size(eta, self.step_shares.share)

    def _observe_horizon(self, trainer: pl.Trainer) -> None:
        """Also: an outer step that reads the decay's shrink of the weights (``observe_shrink``,
        :class:`~hypertorch_sid.core.outer_step.ShrinkFallRprop`) gets it per λ slot."""
        super()._observe_horizon(trainer)
        outer = self.sid.outer_optimizer
        observe = getattr(outer, "observe_shrink", None)
        if callable(observe) and outer.wants_shrink():
            readings = self.problem.shrink.readings(self.step_shares.share)
            if readings is not None and len(readings):
                observe(horizon(trainer)[0], {0: readings})

    def _probe_pending(self) -> bool:
        """Whether the groups are still to be probed on this fit's decayed tensors: once per
        set of tensors. A callback given another module kept the first module's groups (a
        LayerNorm model after a plain MLP: its invariant layer's λ rose from 1e-3 to 0.91,
        not held), silently."""
        decay = self.problem.decay
        if not (self.invariant.probes and decay is not None and self._probed_on is not decay):
            return False
        saved, self._checkpointed_groups = self._checkpointed_groups, None
        if saved is not None and sorted(saved) == sorted(decay.group_names()):
            # a resumed fit keeps the groups its checkpoint was probed on: probed again later
            # in the fit a group near the threshold could change its answer, and a held λ move
            self.invariant_groups, self._probed_on = saved, decay
            return False
        return True

    def _probe(self, pl_module: pl.LightningModule) -> None:
        """Find the invariant groups (:func:`scale_invariant_slots`) on the latest training batch,
        once."""
        self.invariant_groups = scale_invariant_slots(
            self.problem, pl_module, self._probe_batch, seed=self.seed
        )
        self._probed_on, self._probe_batch = self.problem.decay, None

    def _budget_allows(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """The budget's decision, the invariance probe planned in: a rule that probes does it
        once, just before the first hyper step the budget allows, and the budget knows its cost
        before it commits — one forward pass timed (charged as one-off added work) ×
        :func:`probe_forwards`, announced
        (:meth:`~hypertorch_sid.core.budget.Budget.expect_one_off`) — so a fit that cannot pay
        for the probe and a hyper step after it runs neither, and says so. The probe runs as
        one-off added work, outside the hyper step (whose fixed part the budget measures for the
        next ones). Without a budget, nothing is timed."""
        probe = self._probe_pending()
        if probe and self._probe_planned is not self.problem.decay and self.budget.plans_costs():
            self._probe_planned = self.problem.decay
            with self.budget.added_work(), metric_states_kept(pl_module), as_trained():
                cost = probe_cost(
                    self.problem, pl_module, self._probe_batch,
                    self.budget.synchronized_clock, seed=self.seed,
                )  # fmt: skip
            self.budget.expect_one_off(cost)
        allowed = super()._budget_allows(trainer, pl_module)
        if allowed and probe:  # the user's metrics see no probe forward (as in a hyper step)
            with self.budget.added_work(), metric_states_kept(pl_module), as_trained():
                self._probe(pl_module)  # in a training step: the module's flags are its
            self.budget.expect_one_off(0.0)
        return allowed

    def _adjust_hypergradient(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, hypergrad: list[Tensor]
    ) -> list[Tensor]:
        """The invariant rule's hypergradient (``invariant=``); a rule that probes has had the
        groups probed once, before the first hyper step, on a training batch
        (:meth:`_budget_allows`); one that does not sees no group flagged."""
        decay = self.problem.decay
        if decay is None:
            return hypergrad
        if self._probe_pending():  # a hyper step the budget was not asked for
            self._probe(pl_module)
        found = self.invariant_groups or {}  # a rule that does not probe: no group flagged
        flags = [found.get(n, False) for n in decay.group_names()]
        return self.invariant.adjust(hypergrad, decay.mask(flags))

    def _change_gradient(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Apply the decay to the final gradient, inside the training optimizer's step where its
        own ``weight_decay=`` acts (the base callback's step hook, :meth:`_hook_steps`): after
        Lightning's gradient clipping, so the clip sees the data gradient alone, as under the
        optimizer's own decay (session 56: added in ``on_before_optimizer_step``, before the
        clip, the clipped gradient held ``λw``); ``grad += λ w`` (coupled) or ``w *= 1 − lr λ``
        (decoupled). The step-size probes read the gradient after it. Optimizers created anew
        during the fit (:meth:`WeightDecayProblem.follow_new_optimizers`) are decayed from their
        first step."""
        # the decay's own cost is the callback's, not training's; every step adds it
        with self.budget.added_work(every_step=True):
            self.problem.follow_new_optimizers(trainer, pl_module)
            self.problem.apply(
                optimizer, loss_scale(trainer, optimizer), scaler_skips(trainer, optimizer)
            )

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """At each optimizer's first steps: every tensor it trains got a gradient at one of
        them (a tensor without one waits for the next step, until the step of the first due
        hyper step). The decay itself is applied later, inside the optimizer's step
        (:meth:`_change_gradient`). Also: a ``gradient_clip_val`` that binds late in the fit
        is said (:class:`~.gradient_clip.BindingClip`, read here, before Lightning's clip)."""
        self._clip_watch.read(trainer, optimizer)
        if not self.problem._checked_gradients:
            n = self.every_n_steps
            first_due = -(-max(self.start_step, 1) // n) * n
            with self.budget.added_work():  # until every tensor had a gradient
                self.problem.check_gradients(
                    pl_module, optimizer, final=trainer.global_step + 1 >= first_due
                )

    def _validation_size(self) -> int:
        """n of the per-element prior: the validation set's size, or for a streamed one (no
        length) the validation samples the hyper steps have read so far (all processes)."""
        if self.data is None:
            return 0
        return self.data.n_val or self.data.val_samples

    def _validation_share(self) -> float:
        """b/n: one hyper step's validation batch over the validation set (1: the whole set
        is read at once; 0: a streamed set of unknown length)."""
        if self.data is None or not self.data.n_val:
            return 0.0
        if self.data.val is None:
            return 1.0
        return min(1.0, self.data.val.sampler.global_batch / self.data.n_val)

    def _data_curvature(self) -> float | None:
        """L̂ of the data term ℓ alone: the estimate of ℓ̂'s curvature less the smallest λ (ℓ̂ =
        ℓ + ½Σλw², so L(ℓ) ≥ L̂ − max λ and ≤ L̂ − min λ; the larger, safer value is taken).
        With ``proximal=True`` the estimate is of ℓ alone. None before the first estimate and
        where it found negative curvature (a network)."""
        sid = self.sid
        if sid is None or sid.L is None or self.problem.decay is None:
            return None
        if sid.lambda_min is None or sid.lambda_min <= 0:  # not convex: no stability theory
            return None
        if self.proximal:
            return float(sid.L)
        if sid.L != self._estimate_seen[0]:  # a new estimate, made at the λ of this hyper step
            self._estimate_seen = (sid.L, self.problem.lambda_min_at_step)
        return float(sid.L) - self._estimate_seen[1]

    @property
    def weight_decay(self) -> float:
        """The constructor's ``weight_decay``, the initial λ₀ (what LightningCLI and a config
        read back), **not** the learned λ: those are :attr:`learned_weight_decay` (by slot) and
        :meth:`decay_values` (by tensor). Read after a fit has learned λ it says so, once (users
        printed it as the learned decay and got λ₀, silently)."""
        if self.problem.decay is not None and not self._said_initial:
            self._said_initial = True
            rank_zero_warn(
                f"LearnedWeightDecay.weight_decay is the initial λ you passed "
                f"({self.initial_weight_decay:g}), not the learned one: read "
                "learned_weight_decay (λ by layer / group / tensor) or decay_values() (λ by "
                "parameter name); initial_weight_decay names λ₀ without this warning."
            )
        return self.initial_weight_decay

    @property
    def learned_weight_decay(self) -> dict[str, Tensor]:
        """The learned λ by slot name (one per layer, group or tensor as ``granularity`` says;
        ``granularity="global"``: one entry; ``"per_element"``: every value of each tensor,
        flattened), detached; empty before a fit has built λ in this process. Where no decay
        was best λ can end far below any effect (1e-30): the fit's end says so, naming the
        tensors (:meth:`WeightDecayProblem.decay_off`)."""
        self._refuse_unapplied_checkpoint("learned_weight_decay")
        decay = self.problem.decay
        if decay is None:
            self._say_unbuilt("learned_weight_decay", "{}")
            return {}
        return decay.by_group() or {name: decay.summary() for name in decay.slot_names}

    @property
    def effective_weight_decay(self) -> dict[str, float]:
        """The effective λ by group (the slots of :attr:`learned_weight_decay`; per element, the
        layers): the constant that, under your learning-rate schedule, shrinks each group's
        weights as much over the fit as the learned λ did, Σ_t lr_t λ_t / Σ_t lr_t over its
        optimizer steps (eq. effectivedecay, :class:`~.shrink.AppliedShrink`). The value to put
        in a plain training's ``weight_decay``: the last λ (:attr:`learned_weight_decay`) is the
        fit's last steps alone, and where the learning rate ends near 0 its last rises applied
        almost nothing. Summed over this fit (a resumed fit: since the fit it resumes began);
        empty before a fit has stepped."""
        self._refuse_unapplied_checkpoint("effective_weight_decay")
        if self.problem.decay is None:
            self._say_unbuilt("effective_weight_decay", "{}")
        return self.problem.applied.effective()

    @property
    def rho(self) -> list[Tensor]:
        """The learned tensors: ρ (log) or λ (projection); one slot vector, or one per tensor."""
        return self.problem.decay.hyperparameters if self.problem.decay is not None else []

    @property
    def slot_names(self) -> list[str]:
        """Names of the λ slots (all but per-element granularity)."""
        return self.problem.decay.slot_names if self.problem.decay is not None else []

    def state_dict(self) -> dict[str, Any]:
        """The callback's state and what its stored λ mean (which tensors share a slot, on which
        scale, coupled or decoupled): a resume under other such settings is refused, not read as
        other λ."""
        state = super().state_dict()
        if state:
            state[MEANING_KEY] = self._meaning()
            probed = self.invariant_groups is not None and self._probed_on is self.problem.decay
            groups = self.invariant_groups if probed else self._checkpointed_groups
            if groups is not None:  # a loaded state saved again before its fit keeps them
                state[GROUPS_KEY] = dict(groups)
            norms = self.problem.start_norms() or self.problem.checkpointed_start_norms
            if norms is not None:
                state[NORMS_KEY] = dict(norms)
            decay = self.problem.decay
            slots = decay.group_names() if self.sid is not None and decay else None
            slots = slots if slots is not None else self._checkpointed_slots
            if slots is not None:
                state[SLOTS_KEY] = list(slots)
            applied = self.problem.applied.state() or self.problem.applied.checkpointed
            if applied:
                state[APPLIED_KEY] = applied
            if self.problem.decided is not None:
                state[DECIDED_KEY] = list(self.problem.decided)
        return state

    def _meaning(self) -> dict[str, str]:
        meaning = {
            "parameterization": self.parameterization,  # ρ = log λ, or λ itself
            "granularity": self.granularity,  # which tensors share a slot
            "decoupled": str(self.decoupled),  # ½λ‖w‖² in the loss, or AdamW's coefficient
        }
        if self.granularity == "per_element":
            meaning["elements"] = type(self.elements).__name__
        if self.granularity in ("per_tensor", "per_element"):  # which tensors have a slot
            meaning["apply_to"] = self.apply_to  # (s53: "truncated or another model" before)
        return meaning

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and MEANING_KEY in state_dict:
            state_dict = dict(state_dict)
            check_meaning("LearnedWeightDecay", state_dict.pop(MEANING_KEY), self._meaning())
        if isinstance(state_dict, dict) and GROUPS_KEY in state_dict:
            state_dict = dict(state_dict)
            groups = state_dict.pop(GROUPS_KEY)
            if not isinstance(groups, dict) or not all(
                isinstance(k, str) and isinstance(v, bool) for k, v in groups.items()
            ):
                raise ConfigurationError(
                    f"LearnedWeightDecay: the checkpoint's {GROUPS_KEY} must map λ group names "
                    "to True / False (truncated or foreign checkpoint?)."
                )
            self._checkpointed_groups = dict(groups)
        if isinstance(state_dict, dict) and NORMS_KEY in state_dict:
            state_dict = dict(state_dict)
            norms = state_dict.pop(NORMS_KEY)
            if not isinstance(norms, dict) or not all(
                isinstance(k, str) and is_real(v) for k, v in norms.items()
            ):
                raise ConfigurationError(
                    f"LearnedWeightDecay: the checkpoint's {NORMS_KEY} must map decayed tensor "
                    "names to numbers (truncated or foreign checkpoint?)."
                )
            self.problem.checkpointed_start_norms = {k: float(v) for k, v in norms.items()}
        if isinstance(state_dict, dict) and APPLIED_KEY in state_dict:
            state_dict = dict(state_dict)
            self.problem.applied.load(state_dict.pop(APPLIED_KEY), APPLIED_KEY)
        if isinstance(state_dict, dict) and DECIDED_KEY in state_dict:
            state_dict = dict(state_dict)
            self.problem.decided = _names(state_dict.pop(DECIDED_KEY), DECIDED_KEY, "tensor")
        if isinstance(state_dict, dict) and SLOTS_KEY in state_dict:
            state_dict = dict(state_dict)
            self._checkpointed_slots = _names(state_dict.pop(SLOTS_KEY), SLOTS_KEY, "λ group")
        super().load_state_dict(state_dict)

    def _restore(self) -> None:
        """Refuse a checkpoint whose λ slots name other layers, or the same in another order,
        than this fit's, then load it (the stored λ are read slot by slot)."""
        decay, saved = self.problem.decay, self._checkpointed_slots
        ours = decay.group_names() if decay is not None else None
        if saved is not None and ours is not None and saved != list(ours):
            self._read_shared_slots(saved, list(ours))
            saved = self._checkpointed_slots
        if saved is not None and ours is not None and saved != list(ours):
            reordered = sorted(saved) == sorted(ours)
            self._pending = None  # nothing of it is applied
            raise ConfigurationError(
                f"LearnedWeightDecay: the checkpoint's λ belong to the groups {saved}, in that "
                f"order; this model's are {list(ours)}. "
                + (
                    "The same layers declared in another order: each would read another "
                    "layer's λ. Declare the layers in the checkpoint's order (the order of "
                    "named_parameters()), or start a new fit (no ckpt_path)."
                    if reordered
                    else "Another model's λ: resume from a checkpoint of this model, or start a "
                    "new fit (no ckpt_path)."
                )
            )
        super()._restore()

    def _read_shared_slots(self, saved: list[str], ours: list[str]) -> None:
        """A checkpoint written while the tensors no layer owns shared one λ (before session 63:
        ``"(root)"``, or a ParameterList's name; :func:`~.weight_decay_problem.shared_slots`):
        where each such slot held one tensor, the λ are this fit's slot by slot and only their
        names changed, so they are renamed and resumed; where one held several, refused, saying
        why and how to go on."""
        became = shared_slots(self.problem.decay)
        if list(became) != saved:
            return  # another model's, or another order: refused as such
        if len(saved) != len(ours):
            self._pending = None  # nothing of it is applied
            split = "; ".join(
                f"{old!r} → {', '.join(now)}" for old, now in became.items() if len(now) > 1
            )
            raise ConfigurationError(
                "LearnedWeightDecay: the checkpoint was written by an earlier version, which "
                "gave the tensors no layer owns (registered on the LightningModule itself, or in "
                "an nn.ParameterList / ParameterDict) one λ together; this version gives each "
                f"its own ({split}), so the checkpoint's {len(saved)} λ are not this fit's "
                f"{len(ours)} and cannot be resumed. Load the weights alone "
                "(model.load_state_dict(torch.load(path)['state_dict'])) and start a new fit "
                "without ckpt_path, or resume with the version that wrote it."
            )
        names = dict(zip(saved, ours))
        self._checkpointed_slots = list(ours)
        if self._checkpointed_groups is not None:
            self._checkpointed_groups = {
                names.get(k, k): v for k, v in self._checkpointed_groups.items()
            }
        self.problem.applied.rename(names)

    def decay_values(self) -> dict[str, Tensor]:
        """The current λ of every decayed parameter, by parameter name (detached); empty before
        a fit has built λ in this process (and after a ``ddp_spawn`` fit: see the warning)."""
        self._refuse_unapplied_checkpoint("decay_values")
        if self.problem.decay is None:
            self._say_unbuilt("decay_values", "{}")
        return self.problem.decay.values() if self.problem.decay is not None else {}


def _names(value: Any, key: str, what: str) -> list[str]:
    """A checkpoint's list of names under ``key``, or a clear error where it is none."""
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            f"LearnedWeightDecay: the checkpoint's {key} must be a list of {what} names "
            "(truncated or foreign checkpoint?)."
        )
    return list(value)
