"""``WeightDecayProblem``: the bilevel problem of :class:`~.weight_decay.LearnedWeightDecay`.

It finds the decayed tensors in the trainer's optimizers, creates λ (a core
:class:`~hypertorch_sid.core.decay.WeightDecay`), adds the decay to every training step (coupled
``w.grad += λ ⊙ w`` or decoupled ``w ← w ⊙ (1 − lr·λ)``) and builds the bilevel problem
ℓ̂ = ℓ + ½ Σ P λ w², E = ℓ on validation data (see :mod:`.weight_decay` for the maths), with
the checks that watch it during the fit (a λ that wipes a layer, a decay that is off in effect,
a tensor no optimizer trains any more).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor

from ..core.decay import (
    GRANULARITIES,
    ElementModel,
    WeightDecay,
    as_element_model,
    as_parameterization,
)
from ..core.errors import ConfigurationError
from ..core.validation import check_bool, check_takes, is_real, number_fix
from .data_loss import DataLoss
from .optimizer_decay import (
    PRECONDITIONED,
    decouples,
    default_decay,
    preconditioner,
    stepping,
)
from .problem import (
    COMPILE_WRAPPER,
    BilevelProblem,
    UntrainedGroups,
    check_still_trained,
    named_tensors,
)
from .shrink import AppliedShrink, ShrinkRates
from .stability import StableBounds

__all__ = ["WeightDecayProblem"]


def _initial_value_fix(value: Any, parameterization: str) -> str:
    """How to give the initial λ the user meant by ``value`` (refused)."""
    meant = number_fix("weight_decay", value, float, lambda x: x > 0)
    if isinstance(value, str) and meant:  # '1e-3' from a YAML file
        return meant[2:]
    if math.prod(getattr(value, "shape", (0,))) == 1:  # a tensor or a NumPy array of one
        return f"pass a Python float (weight_decay={float(value):.6g})"
    if isinstance(value, (Mapping, list, tuple, Tensor)):
        return (
            "it is one starting value for every λ (a Python float); the values per layer "
            "are what the callback learns (granularity='per_layer', the default)"
        )
    if is_real(value) and value == 0 and parameterization == "log":
        return (
            "on the log scale λ never reaches 0; start small (e.g. weight_decay=1e-6: it falls "
            "further if no decay is best), or pass parameterization='projection' to start at 0"
        )
    return "the initial λ, e.g. the optimizer's former weight_decay (1e-4)"


class WeightDecayProblem:
    """Weight decay on any ``LightningModule`` as a :class:`~.problem.ProblemSource`.

    At ``check`` it finds the decayed tensors in the trainer's optimizers and creates λ (a core
    :class:`~hypertorch_sid.core.decay.WeightDecay`, :attr:`decay`); :meth:`apply` adds the decay
    to the training's steps; :meth:`build` gives the bilevel problem (ℓ̂ = ℓ + ½ Σ P λ w², E = ℓ on
    validation data, λ projected onto [min_weight_decay, stable bound]). Its parts: ℓ and E,
    :attr:`data_loss` (:class:`~.data_loss.DataLoss`); λ's stability bounds, :attr:`stability`
    (:class:`~.stability.StableBounds`); the decay's shrink of the weights, :attr:`shrink`
    (:class:`~.shrink.ShrinkRates`). Parameters: see :class:`LearnedWeightDecay`.
    """

    def __init__(
        self,
        weight_decay: float = 1e-4,
        granularity: str = "per_layer",
        decoupled: bool = False,
        parameterization: str = "log",
        apply_to: Literal["all", "weights", "decayed_groups"] = "all",
        training_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        validation_loss: Callable[[pl.LightningModule, Any], Tensor] | None = None,
        proximal: bool = False,
        elements: str | ElementModel = "tied",
        min_weight_decay: float = 0.0,
    ) -> None:
        if granularity not in GRANULARITIES:
            raise ConfigurationError(
                f"LearnedWeightDecay: granularity must be one of {list(GRANULARITIES)}, got "
                f"{granularity!r}."
            )
        try:
            self.parameterization = as_parameterization(parameterization)
            self.elements = as_element_model(elements)
        except ConfigurationError as err:
            raise ConfigurationError(f"LearnedWeightDecay: {err}") from None
        if apply_to not in APPLY_TO:
            raise ConfigurationError(
                "LearnedWeightDecay: apply_to must be 'all', 'weights' or 'decayed_groups', got "
                f"{apply_to!r}."
            )
        if (
            not is_real(weight_decay)  # a Python or NumPy number (np.float32 from an array)
            or not math.isfinite(weight_decay)
            or weight_decay < 0
            or (parameterization == "log" and weight_decay == 0)
        ):
            need = "> 0 (λ = exp(ρ))" if parameterization == "log" else "≥ 0"
            raise ConfigurationError(
                f"LearnedWeightDecay: weight_decay must be a finite number {need}, got "
                f"{weight_decay!r}: {_initial_value_fix(weight_decay, parameterization)}."
            )
        for name, fn in (("training_loss", training_loss), ("validation_loss", validation_loss)):
            if fn is not None:
                check_takes(f"LearnedWeightDecay: {name}", fn, ("module", "batch"), "scalar")
        check_bool("LearnedWeightDecay: proximal", proximal)
        check_bool("LearnedWeightDecay: decoupled", decoupled)
        if (
            not is_real(min_weight_decay)
            or not math.isfinite(min_weight_decay)
            or min_weight_decay < 0
        ):
            raise ConfigurationError(
                "LearnedWeightDecay: min_weight_decay must be a finite number ≥ 0 (the lowest λ "
                f"learned; 0: no floor), got {min_weight_decay!r}"
                f"{number_fix('min_weight_decay', min_weight_decay, float, lambda x: x >= 0)}."
            )
        if min_weight_decay > weight_decay:
            raise ConfigurationError(
                f"LearnedWeightDecay: min_weight_decay={min_weight_decay!r} is above the initial "
                f"weight_decay={weight_decay!r}: λ must start inside [min_weight_decay, ...]. "
                "Start at the floor or lower it."
            )
        self.min_weight_decay = float(min_weight_decay)
        self.weight_decay = float(weight_decay)
        self.granularity = granularity
        self.decoupled = decoupled
        self.apply_to = apply_to
        self.training_loss = training_loss
        self.validation_loss = validation_loss
        #: says when optimizer groups at lr=0 hold trained tensors (a new one at each build)
        self.untrained = UntrainedGroups("LearnedWeightDecay")
        self.proximal = proximal
        #: λ: the core container (created at ``check``, i.e. ``on_fit_start``)
        self.decay: WeightDecay | None = None
        #: (optimizer, group index) of each decayed tensor, in ``decay.entries`` order
        self.placement: list[tuple[torch.optim.Optimizer, int]] = []
        self._inner: list[Tensor] = []
        self._scales: list[Tensor | float] | None = None
        self._checked_gradients = False
        self._checked_optimizers: set[int] = set()
        #: ids of the trained tensors that got a gradient at a step checked so far, and the
        #: optimizers stepped with a tensor still without one (checked at the first hyper step)
        self._graded: set[int] = set()
        self._pending: dict[int, torch.optim.Optimizer | None] = {}
        self._optimizer_ids: set[int] = set()
        #: id(optimizer) → the indices of its groups holding decayed tensors
        self._decayed_groups: dict[int, list[int]] = {}
        self._lambda_cache: tuple[tuple | None, list[float | Tensor]] = (None, [])
        #: the smallest λ when the current hyper step began (a curvature estimate of ℓ̂ made in
        #: it includes at least this much decay)
        self.lambda_min_at_step = 0.0
        #: the norm of each decayed weight matrix at the fit's start (``build``), which
        #: :meth:`check_not_wiped` compares with; None once a wipe was said in this fit
        self._start_norms: list[float] | None = None
        #: the start norms of the fit a checkpoint was written in, by decayed tensor name
        #: (:data:`NORMS_KEY`), which the resumed fit's ``build`` takes over
        self.checkpointed_start_norms: dict[str, float] | None = None
        #: ``() -> n``, the number of validation samples behind E (0: unknown), for the
        #: per-element prior (set by LearnedWeightDecay)
        self.validation_size: Callable[[], int] = lambda: 0
        #: ``() -> b/n``, the share of the validation set in one hyper step's batch (0:
        #: unknown), told to the per-element model (set by LearnedWeightDecay)
        self.validation_share: Callable[[], float] = lambda: 0.0
        #: ℓ and E on a batch
        self.data_loss = DataLoss(training_loss, validation_loss)
        #: λ's box [min_weight_decay, stable bound], read from the optimizers
        self.stability = StableBounds(self, decoupled, self.weight_decay, self.min_weight_decay)
        #: how fast a unit of λ shrinks the decayed tensors, read from the optimizers
        self.shrink = ShrinkRates(self, decoupled)
        #: the decay applied so far per λ group, for the effective λ (eq. effectivedecay)
        self.applied = AppliedShrink()
        #: ``apply_to="decayed_groups"``: the names of the tensors decided to be decayed (their
        #: groups had ``weight_decay`` ≠ 0 in the optimizers ``configure_optimizers`` returned);
        #: kept in the checkpoint (:data:`DECIDED_KEY`) and reused by a resumed fit, whose
        #: loaded optimizer state carries the ``weight_decay`` 0 this callback set
        self.decided: list[str] | None = None
        self._said_start = False

    # ------------------------------------------------------------------ ProblemSource
    def check(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Refuse manual optimisation without ``training_loss``; find the decayed tensors."""
        if not module.automatic_optimization and self.training_loss is None:
            raise ConfigurationError(
                "LearnedWeightDecay: with manual optimization, training_step cannot be called to "
                "evaluate the training loss: pass training_loss=lambda module, batch: ..."
            )
        if not module.automatic_optimization and len(trainer.optimizers) > 1:
            rank_zero_warn(
                f"LearnedWeightDecay: manual optimization with {len(trainer.optimizers)} "
                "optimizers: the hypergradient takes the training to minimise training_loss "
                "(plus the decay) over all their tensors together. Adversarial training (a GAN, "
                "each optimizer minimising its own loss) has no such fixed point, and λ learned "
                "for it means nothing: decay only what minimises training_loss (one optimizer's "
                "module), or fix its weight decay by hand."
            )
        decays = [
            type(cb).__name__
            for cb in trainer.callbacks
            if isinstance(getattr(cb, "problem", None), WeightDecayProblem)
        ]
        if len(decays) > 1:
            raise ConfigurationError(
                f"{len(decays)} LearnedWeightDecay callbacks on one Trainer ({', '.join(decays)}): "
                "each would add its decay before every optimizer step, so the training would be "
                "decayed twice while each tunes its λ as if alone. Keep one (choose its "
                "granularity: per_layer, per_tensor, per_element ...)."
            )
        self._collect(trainer, module)
        self.applied.start()
        self.stability.check_initial()
        self._checked_gradients = False
        self._checked_optimizers = set()
        self._graded, self._pending = set(), {}

    def build(self, trainer: pl.Trainer, module: pl.LightningModule) -> BilevelProblem:
        self.untrained = UntrainedGroups("LearnedWeightDecay")
        if self.decay is None:
            self._collect(trainer, module)
        decay = self.decay
        assert decay is not None
        self._start_norms = self._norms()
        saved, self.checkpointed_start_norms = self.checkpointed_start_norms, None
        names = [e.name for e in decay.entries]
        if saved is not None and sorted(saved) == sorted(names):  # a resumed fit: its start's
            self._start_norms = [saved[name] for name in names]

        def inner_loss(batch: Any) -> Tensor:
            data = self.data_loss(module, batch, "training")
            return data if self.proximal else data + decay.penalty(self._scales)

        def outer_loss(batch: Any) -> Tensor:
            data = self.data_loss(module, batch, "validation")
            prior = decay.prior(self.validation_size() or None)  # eq. prior, per element
            return data if prior is None else data + prior

        return BilevelProblem(
            hyperparameters=decay.hyperparameters,
            inner_parameters=list(self._inner),
            inner_loss=inner_loss,
            outer_loss=outer_loss,
            summary=lambda: {
                "weight_decay": decay.summary(),
                **{f"weight_decay/{k}": v for k, v in decay.by_group().items()},
            },
            projection=lambda hs: self.stability.project(),
            penalty=(lambda: decay.coefficients(self._inner, self._scales))
            if self.proximal
            else None,
            regularizer=None if self.proximal else lambda: decay.penalty(self._scales),
            exact_cross_term=not self.proximal,  # ℓ (training_step) does not read λ
            names=decay.hyperparameter_names(),
        )

    def before_hyper_step(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Read the preconditioners P of decoupled decay from the optimizers' state."""
        if self.decoupled and self.decay is not None:
            self._scales = [self._preconditioner(i) for i in range(len(self.decay.entries))]
        if self.decay is not None:
            self.lambda_min_at_step = float(self.decay.summary().min())
            self.decay.elements.observe(self.validation_share())
        self.check_still_trained(module)
        for optimizer in list(self._pending.values()):  # a tensor no step gave a gradient
            self.check_gradients(module, optimizer)
        self.untrained.check(trainer, module)

    def _norms(self) -> list[float]:
        """The norm of each decayed tensor (one read of the device), 0 for a vector (a bias or
        a norm layer's scale: 0 is a fitted value for it, no wiped layer)."""
        assert self.decay is not None
        norms = [
            e.param.detach().float().norm() if _weight_matrix(e.param) else e.param.new_zeros(())
            for e in self.decay.entries
        ]
        return [float(n) for n in torch.stack([n.float().cpu() for n in norms]).tolist()]

    def start_norms(self) -> dict[str, float] | None:
        """The norms :meth:`check_not_wiped` compares with, by decayed tensor name (None before
        a build, and once a wipe was said)."""
        if self._start_norms is None or self.decay is None:
            return None
        return {e.name: a for e, a in zip(self.decay.entries, self._start_norms)}

    def decay_off(self, loss: float | None) -> str | None:
        """Say, at the fit's end, where the hyper steps drove λ so low that its decay is off in
        effect: the decay term ½λ‖w‖² of every tensor one λ decays below :data:`DECAY_OFF` of
        the training ``loss`` (None: no loss read, or no such λ). Judged per λ, not per tensor
        (a bias's term is small at any λ). The maths is unchanged; the number λ reached is
        not (session 53: a multi-label fit's λ fell to 1e-30 where no decay was best, and a
        printed ``learned_weight_decay`` of 1e-30 read like a fault)."""
        decay = self.decay
        if decay is None or loss is None or not math.isfinite(loss) or loss == 0:
            return None
        terms: dict[str, float] = {}
        reached: dict[str, float] = {}
        with torch.no_grad():
            for e, lam in zip(decay.entries, self._entry_lambdas()):
                name = e.name if decay.per_element else decay.slot_names[e.slot]
                term = float(0.5 * (lam * e.param.detach().float().pow(2)).sum())
                terms[name] = terms.get(name, 0.0) + term
                value = float(lam) if not isinstance(lam, Tensor) else float(lam.max())
                reached[name] = max(reached.get(name, 0.0), value)
        # not a λ held at λ₀ (read back as float32 exp(ρ₀), a few ulps off λ₀)
        fell = {n for n, v in reached.items() if v < self.weight_decay * (1 - 1e-5)}
        off = [n for n, term in terms.items() if term <= DECAY_OFF * abs(loss) and n in fell]
        if not off:
            return None
        low, high = min(reached[n] for n in off), max(reached[n] for n in off)
        values = f"{high:.1g}" if f"{low:.1g}" == f"{high:.1g}" else f"{low:.1g} … {high:.1g}"
        names = ", ".join(off[:4]) + (" …" if len(off) > 4 else "")
        # a negative loss (learned uncertainty weighting): the term is compared with its size
        size = (
            f" ({loss:.3g})" if loss > 0 else f"'s size ({abs(loss):.3g}; the loss is {loss:.3g})"
        )
        return (
            f"the hyper steps drove {len(off)} of the {len(terms)} learned λ ({names}) down to "
            f"{values}, where the decay's term ½λ‖w‖² is below {DECAY_OFF:g} of the training "
            f"loss{size}: the decay is effectively off there, because the validation loss "
            "was lowest with less decay. Read these λ as 0, not as a fault (learned_weight_decay "
            "and the logs give the number λ reached); pass min_weight_decay=... to keep a floor "
            "under λ."
        )

    def ended_above_applied(self) -> str | None:
        """Say, at the fit's end, where λ ended :data:`ABOVE_APPLIED` times or more above the
        effective λ the fit applied (eq. effectivedecay; None: nowhere). λ's last rises, where
        the learning rate had fallen near 0, move the weights little and the hypergradient
        little, so they are not held back; the number read back then is not a decay the fit
        used (session 60: 54 on an AdamW fit with a cosine tail whose effective λ was 1e-2)."""
        decay, effective = self.decay, self.applied.effective()
        if decay is None or not effective:
            return None
        groups = decay.group_names()
        last: dict[str, float] = {}
        for e, lam in zip(decay.entries, self._entry_lambdas()):
            value = float(lam) if not isinstance(lam, Tensor) else float(lam.float().mean())
            name = groups[decay.group_of(e)]
            last[name] = max(last.get(name, 0.0), value)
        above = [n for n, v in effective.items() if v > 0 and last.get(n, 0.0) >= ABOVE_APPLIED * v]
        if not above:
            return None
        n = max(above, key=lambda k: last[k] / effective[k])
        fell = self.applied.lr_fell(n)
        # a constant learning rate was blamed too (session 62: a 12-step fit, λ still rising)
        why = {
            True: "its last rises came where the learning rate was near 0 and changed little",
            False: "it was still rising in the fit's last steps (the learning rate had not "
            "fallen), which the weights felt only briefly: a fit too short for λ to settle "
            "(train longer, or run more hyper steps)",
            None: "its last rises came late in the fit and changed little",
        }[fell]
        return (
            f"λ ended {last[n] / effective[n]:.0f}× above the decay the fit applied on "
            f"{len(above)} of {len(effective)} groups (e.g. {n}: λ = {last[n]:.3g} at the end, "
            f"effective λ = {effective[n]:.3g}): {why}. For a plain training's weight_decay "
            "read effective_weight_decay (the constant with the same shrink over the fit), not "
            "learned_weight_decay (the last steps' λ)."
        )

    def check_not_wiped(self) -> None:
        """Say, at the fit's end, where the decay has wiped weight matrices: their norm ended
        below :data:`WIPED` of its value at the fit's start. A λ₀ so large that the decay
        removes a good share of the weights at every step drives them to 0 before λ can come
        down; layers at 0 pass no gradient to the layers before them, λ's hypergradient
        vanishes with the weights, and the network predicts by its biases (session 51: on a
        4-layer ReLU MLP at SGD lr 0.05, momentum 0.5, λ₀ = 0.5 (1/60 of the stable bound 30),
        left its matrices at 6e-4 of their start's norm and the network at chance; a 2-layer
        tanh MLP at lr 0.2 took λ₀ = 1.5 without harm, so λ₀ alone does not tell these fits
        apart: the weights do). Checked at the end, not at the hyper steps: some fits dip
        below it and regrow (a 3-layer MLP at momentum 0.9, λ₀ = 1, ended at 1.07 of the
        start's norm)."""
        start = self._start_norms
        if start is None or self.decay is None:
            return
        now = self._norms()
        wiped = [
            (e, a, b) for e, a, b in zip(self.decay.entries, start, now) if a > 0 and b < WIPED * a
        ]
        if not wiped:
            return
        self._start_norms = None
        lams = self._entry_lambdas()
        e, a, b = wiped[0]
        lam = lams[self.decay.entries.index(e)]
        lam = float(lam) if isinstance(lam, float) else float(lam.max())
        names = ", ".join(e.name for e, _, _ in wiped[:4]) + (" …" if len(wiped) > 4 else "")
        rank_zero_warn(
            f"LearnedWeightDecay: the fit ends with the decay having wiped {names}: the norm "
            f"of {e.name} fell from {a:.3g} at the fit's start to {b:.2g} (λ = {lam:.3g} now, "
            f"weight_decay={self.weight_decay:g} at the start). Layers at 0 pass no gradient "
            "to the layers before them and λ's hypergradient vanishes with their weights: the "
            "network predicts by its biases alone (MLPs so wiped ended at chance). Start from "
            "a smaller weight_decay (1e-4 is the usual start), or lower the learning rate."
        )

    # ------------------------------------------------------------------ the decayed tensors
    def _group(self, i: int) -> dict[str, Any]:
        """The parameter group now (``load_state_dict`` and schedulers replace/alter groups)."""
        optimizer, index = self.placement[i]
        return optimizer.param_groups[index]

    def _collect(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        names = {id(p): n for n, p in named_tensors(module)}
        order = {id(p): i for i, (_, p) in enumerate(module.named_parameters())}
        found: list[tuple[str, Tensor, str]] = []
        placement: list[tuple[torch.optim.Optimizer, int]] = []
        inner: dict[int, Tensor] = {}
        coupled_in: set[str] = set()  # decoupling optimizers given coupled decay
        owner: dict[int, int] = {}  # the optimizer training each tensor
        for oi, opt in enumerate(trainer.optimizers):
            for gi, group in enumerate(opt.param_groups):
                for p in group["params"]:
                    if not p.requires_grad:
                        continue
                    if id(p) in owner and owner[id(p)] != oi:
                        raise ConfigurationError(
                            f"LearnedWeightDecay: {names.get(id(p), 'a tensor')} is trained by "
                            f"two optimizers (optimizer{owner[id(p)]} and optimizer{oi}): "
                            "each one's step would add the decay to the gradient they share, "
                            "so it would be decayed as neither optimizer's weight_decay=λ "
                            "would, and not as learned_weight_decay says. Give each tensor to "
                            "one optimizer."
                        )
                    owner[id(p)] = oi
                    inner[id(p)] = p
                    name = names.get(id(p), f"optimizer{oi}.param{len(found)}")
                    if self.apply_to == "weights" and p.dim() < 2:
                        continue
                    if self.apply_to == "decayed_groups":
                        if not self._group_decays(group, name):
                            continue
                    elif group.get("weight_decay", 0) != 0:
                        groups_hint = (
                            " To keep biases and normalisation weights undecayed, as groups with "
                            "weight_decay=0 do, pass LearnedWeightDecay(..., apply_to='weights')."
                            if len(opt.param_groups) > 1 and self.apply_to == "all"
                            else ""
                        ) + (
                            " To keep your optimizer as it is, pass LearnedWeightDecay(..., "
                            "apply_to='decayed_groups'): the callback then decays exactly the "
                            "groups with weight_decay ≠ 0 and takes their decay over."
                        )
                        adamw_hint = (
                            f" For {type(opt).__name__}'s decoupled decay pass "
                            "LearnedWeightDecay(..., decoupled=True) (the default adds λw to "
                            "the gradient, as Adam's weight_decay= does)."
                            if decouples(opt, group) and not self.decoupled
                            else ""
                        )
                        raise ConfigurationError(
                            f"LearnedWeightDecay: the optimizer {type(opt).__name__} (group {gi}) "
                            f"already applies weight_decay={group['weight_decay']}: remove it "
                            f"(pass weight_decay=0{default_decay(opt)}); the callback "
                            f"applies the learned decay itself.{groups_hint}{adamw_hint}"
                        )
                    if decouples(opt, group) and not self.decoupled:
                        coupled_in.add(type(opt).__name__)
                    found.append((name, p, f"optimizer{oi}/group{gi}"))
                    placement.append((opt, gi))
        if not found and self.apply_to == "decayed_groups" and inner:
            raise ConfigurationError(
                "LearnedWeightDecay(apply_to='decayed_groups'): no parameter group of the "
                "training optimizers has weight_decay ≠ 0, so there is no group to decay. Give "
                "the groups to decay their weight_decay (e.g. 1e-4) in configure_optimizers, or "
                "pass apply_to='all' to decay every trained tensor."
            )
        if not found:
            which = " with ≥ 2 dimensions" if self.apply_to == "weights" else ""
            raise ConfigurationError(
                "LearnedWeightDecay: no parameter to decay: the training optimizers hold no "
                f"trainable parameter{which}."
            )
        if coupled_in:
            rank_zero_warn(
                f"LearnedWeightDecay: {', '.join(sorted(coupled_in))} decouples its weight decay "
                "(w ← w(1 − lr·λ)), but this callback adds λw to the gradient (decoupled=False, "
                "the default: Adam's L2 through its preconditioner, a different regulariser at "
                "the same λ). For the decay your optimizer was set up for pass "
                "LearnedWeightDecay(..., decoupled=True)."
            )
        unread = sorted(
            {
                type(opt).__name__
                for opt, _ in placement
                if not isinstance(stepping(opt), PRECONDITIONED)
            }
        )
        if self.decoupled and unread:
            rank_zero_warn(
                f"LearnedWeightDecay(decoupled=True): the training's fixed point under "
                f"{', '.join(unread)}'s decoupled decay is P⁻¹∇ℓ + λw = 0 with the optimizer's "
                "preconditioner P, which this callback reads only for SGD and Adam / AdamW / "
                "NAdam / RAdam; here it takes P = 1, so λ's hypergradient is that of another "
                "problem than the one trained (the shrink w ← w(1 − lr·λ) itself is applied as "
                "the optimizer would). Pass decoupled=False (λw added to the gradient: the "
                "hypergradient is exact whatever the optimizer), or train with AdamW."
            )
        if self.apply_to == "decayed_groups":
            self._take_decay_over(found, placement)
        self.placement = placement
        self._optimizer_ids = {id(opt) for opt in trainer.optimizers}
        self._decayed_groups = {}
        for opt, gi in placement:
            groups = self._decayed_groups.setdefault(id(opt), [])
            if gi not in groups:
                groups.append(gi)
        self._inner = sorted(inner.values(), key=lambda p: order.get(id(p), len(order)))
        old = self.decay
        same = old is not None and [(id(e.param), e.group) for e in old.entries] == [
            (id(p), g) for _, p, g in found
        ]
        if not same:  # a new fit keeps the learned λ of the tensors it still decays
            self.decay = WeightDecay(
                found,
                self.weight_decay,
                self.granularity,
                self.parameterization,
                self.elements,
                layer_of(module),
            )
            if old is not None:
                self.decay.carry_from(old)

    def _group_decays(self, group: Mapping[str, Any], name: str) -> bool:
        """``apply_to="decayed_groups"``: whether the tensor ``name`` of ``group`` is decayed:
        its group has ``weight_decay`` ≠ 0 (as ``configure_optimizers`` built it), or it was
        decided so before (:attr:`decided`: this fit's start, or the checkpoint resumed from,
        whose optimizer state holds the 0 this callback set)."""
        return group.get("weight_decay", 0) != 0 or name in (self.decided or ())

    def _take_decay_over(
        self,
        found: list[tuple[str, Tensor, str]],
        placement: list[tuple[torch.optim.Optimizer, int]],
    ) -> None:
        """``apply_to="decayed_groups"``: record the decided tensors (:attr:`decided`) and set
        their groups' ``weight_decay`` to 0 before the first step, so the optimizer does not
        decay them on top of λ; λ starts at the callback's λ₀, not at the groups' values (said
        once where one differs from λ₀ by more than 10×)."""
        self.decided = list(dict.fromkeys([*(self.decided or ()), *(n for n, _, _ in found)]))
        far: list[str] = []
        for opt, gi in dict.fromkeys(placement):  # each group once, in order
            group = opt.param_groups[gi]
            wd = float(group.get("weight_decay", 0) or 0)
            if wd and not 0.1 <= wd / self.weight_decay <= 10:
                far.append(f"{type(opt).__name__} group {gi}: weight_decay={wd:g}")
            group["weight_decay"] = 0.0
        if far and not self._said_start:
            self._said_start = True
            rank_zero_warn(
                f"LearnedWeightDecay(apply_to='decayed_groups'): λ starts at the callback's "
                f"weight_decay={self.weight_decay:g}, not at your optimizer's "
                f"({'; '.join(far)}), more than 10× apart. To start from your value pass "
                "LearnedWeightDecay(weight_decay=<it>, ...)."
            )

    # ------------------------------------------------------------------ decay in training
    def check_gradients(
        self,
        module: pl.LightningModule,
        optimizer: torch.optim.Optimizer | None = None,
        final: bool = True,
    ) -> None:
        """At an optimizer's first steps: every tensor it trains got a gradient at one of them.
        ``final=False`` (a step before the first hyper step) waits for the next step where a
        tensor got none: a block a random draw skipped (stochastic depth, LayerDrop) gets no
        gradient at some steps, not at all (session 63: refused at its first step on 59 % of
        the draws); the first hyper step checks with ``final=True``.

        A layer the training never uses (built but not called in ``forward``) has no fixed point
        for the hypergradient to differentiate: name it, and say how to leave it out. A tensor
        frozen after the fit started is named as such (:meth:`check_still_trained`). With
        several optimizers (manual optimisation) each is checked at its own first step, on
        the tensors it trains (the others' gradients may not be computed yet).
        """
        self.check_still_trained(module)
        held = None
        if optimizer is not None:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self._graded |= {id(p) for p in self._inner if p.grad is not None}
        names = {id(p): n for n, p in named_tensors(module)}
        unused = [
            names.get(id(p), f"tensor {i}")
            for i, p in enumerate(self._inner)
            if id(p) not in self._graded and (held is None or id(p) in held)
        ]
        if unused and not final:
            self._pending[id(optimizer)] = optimizer
            return
        self._pending.pop(id(optimizer), None)
        if optimizer is not None:
            self._checked_optimizers.add(id(optimizer))
        self._checked_gradients = held is None or self._checked_optimizers >= self._optimizer_ids
        if unused:
            raise ConfigurationError(
                f"LearnedWeightDecay: {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} "
                "got no gradient from the training loss, so it has no trained value for the "
                "hypergradient to differentiate: a layer the training never uses (freeze it "
                "with requires_grad_(False), leave it out of the optimizer, or remove it), or "
                "one whose gradient the forward cuts, which leaves it untrained without this "
                "callback too: a .detach() or torch.no_grad() before it, or a block run under "
                "torch.utils.checkpoint(..., use_reentrant=True) on inputs that do not require "
                "grad (torch warned 'None of the inputs have requires_grad=True'; pass "
                "use_reentrant=False)."
            )

    def check_still_trained(self, module: pl.LightningModule) -> None:
        """Every tensor the optimizers trained when the fit started still requires gradients
        (:func:`~hypertorch_sid.lightning.problem.check_still_trained`); one frozen before the
        first step was blamed as a layer the training never uses."""
        check_still_trained("LearnedWeightDecay", self._inner, module)

    @torch.no_grad()
    def apply(
        self,
        optimizer: torch.optim.Optimizer,
        scale: Tensor | None = None,
        skips: Tensor | None = None,
    ) -> None:
        """Add the decay to a step of ``optimizer``, once its gradients are final (after the
        clipping: :meth:`LearnedWeightDecay._change_gradient`): ``grad += λ w`` or
        ``w *= 1 − lr λ``. ``scale``: the loss scale the gradients still carry
        (:func:`loss_scale`: an optimizer that unscales in its own step), by which the added
        ``λ w`` is multiplied too; ``skips``: 1 where the step will be skipped
        (:func:`scaler_skips`: such an optimizer skips inside its step), and with it the
        decoupled shrink."""
        if self.decay is None:
            return
        self._refuse_optimizer_decay(optimizer)
        lams = self._entry_lambdas()
        if not self.decoupled:  # one fused add per layer/slot of constant λ: runs every step
            self._add_per_slot(optimizer, lams, scale)
        for i, e in enumerate(self.decay.entries):
            if self.placement[i][0] is not optimizer or e.param.grad is None:
                continue
            lam = lams[i]
            if self.decoupled:
                shrink = self._group(i)["lr"] * lam
                e.param.mul_(1 - (shrink if skips is None else shrink * (1 - skips)))
            elif isinstance(lam, Tensor):  # per element, λ_e varying over the tensor
                e.param.grad.addcmul_(lam if scale is None else lam * scale, e.param)
        self._record(optimizer, lams)

    def _record(self, optimizer: torch.optim.Optimizer, lams: list[float | Tensor]) -> None:
        """Add this step of ``optimizer`` to :attr:`applied` (eq. effectivedecay)."""
        decay = self.decay
        assert decay is not None
        groups = decay.group_names()
        for i, (e, lam) in enumerate(zip(decay.entries, lams)):
            if self.placement[i][0] is optimizer and e.param.grad is not None:
                lr = self._group(i).get("lr", 0.0) or 0.0
                lr = float(lr)
                if lr > 0:
                    self.applied.add(groups[decay.group_of(e)], lr, lam, e.param.numel())

    def _refuse_optimizer_decay(self, optimizer: torch.optim.Optimizer) -> None:
        """A group holding decayed tensors whose ``weight_decay`` became non-zero during the fit
        (a weight-decay schedule of the user's, a callback setting it) decays them twice: the
        optimizer's on top of λ, without a word (session 51: weights 0.03 off the fit at the
        learned λ alone). Refused where it happens; checked at :meth:`_collect` at fit start."""
        for gi in self._decayed_groups.get(id(optimizer), ()):
            wd = optimizer.param_groups[gi].get("weight_decay", 0)
            if wd:
                raise ConfigurationError(
                    f"LearnedWeightDecay: the optimizer {type(optimizer).__name__} (group {gi}) "
                    f"applies weight_decay={wd} since this fit started (set during the fit: a "
                    "weight-decay schedule, a callback?), on top of the decay this callback "
                    "learns and applies to the same tensors: they would be decayed twice. Leave "
                    "the optimizer's weight_decay at 0 (the learned λ replaces it)."
                )

    def follow_new_optimizers(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Optimizers created anew during the fit (``trainer.strategy.setup_optimizers(trainer)``
        in a callback: a warm restart, a switch of optimizer) hold the decayed tensors in new
        objects, and the decay was added only before the old ones' steps: the training went on
        undecayed without a word (session 51: weights 0.032 off ``SGD(weight_decay=λ)``'s).
        The decay follows them where they train the same tensors (checked again as at fit
        start); other tensors are refused (λ and the hyper steps were built for these)."""
        if {id(opt) for opt in trainer.optimizers} == self._optimizer_ids:
            return
        old = self.decay
        self._collect(trainer, module)
        if self.decay is not old:
            raise ConfigurationError(
                "LearnedWeightDecay: the training optimizers were created anew during the fit "
                "(trainer.strategy.setup_optimizers?) over other tensors or groups than the fit "
                "started with; λ and its hyper steps were built for those. Change optimizers "
                "between fits (a new trainer.fit continues from the learned λ)."
            )

    def _entry_lambdas(self) -> list[float | Tensor]:
        """λ of each decayed tensor, a number where it is one value over the tensor (every slot
        of per layer/tensor/group/global; per element where the model says so, e.g. a layer's
        tensor with every deviation 0), else a detached tensor; read again only after the
        hyperparameters changed (a hyper step, a load: every in-place change bumps a tensor's
        version). Per element this keeps the every-step cost of a λ the validation data did not
        tell apart from its layer's at per layer's (one fused add per layer)."""
        assert self.decay is not None
        key = tuple((id(h), h._version) for h in self.decay.hyperparameters)
        if self._lambda_cache[0] != key:
            self._lambda_cache = (key, self.decay.applied_lambdas())
        return self._lambda_cache[1]

    def _add_per_slot(
        self, optimizer: torch.optim.Optimizer, lams: list[float | Tensor], scale: Tensor | None
    ) -> None:
        """``grad += λ w`` (times the gradients' loss ``scale``, if any) for the tensors
        ``optimizer`` trains whose λ is a number, one foreach add per value."""
        assert self.decay is not None
        grads: dict[float, tuple[list[Tensor], list[Tensor]]] = {}
        for (opt, _), e, lam in zip(self.placement, self.decay.entries, lams):
            if opt is optimizer and e.param.grad is not None and not isinstance(lam, Tensor):
                g, w = grads.setdefault(lam, ([], []))
                g.append(e.param.grad)
                w.append(e.param)
        for lam, (g, w) in grads.items():
            torch._foreach_add_(g, w if scale is None else torch._foreach_mul(w, scale), alpha=lam)

    def training_penalty(self, module: pl.LightningModule) -> Tensor:
        """D(w) = ½ Σᵢ λᵢ Pᵢ ⊙ ‖wᵢ‖², the decay :meth:`apply` adds to the training, with λ (and
        a decoupled decay's preconditioner P, else 1) held constant: differentiable in w only,
        the tensors read through ``module`` now (``hvp="forward"`` swaps them in). Zero, still
        on w's graph, before the first build."""
        current = dict(named_tensors(module))  # the names the decay's entries carry
        if self.decay is None:
            return sum((0.0 * p.sum() for p in current.values() if p.requires_grad),
                       torch.zeros(()))  # fmt: skip
        terms = []
        for i, (e, lam) in enumerate(zip(self.decay.entries, self._entry_lambdas())):
            w = current.get(e.name, e.param)  # by name: a swap replaces the module's tensors
            coefficient = lam * self._preconditioner(i) if self.decoupled else lam
            terms.append(0.5 * (coefficient * w.pow(2)).sum())
        return sum(terms[1:], terms[0]) if terms else torch.zeros(())

    def _preconditioner(self, i: int) -> Tensor | float:
        """P of the decoupled fixed point P⁻¹∇ℓ + λw = 0 for decayed tensor ``i``
        (:func:`~hypertorch_sid.lightning.optimizer_decay.preconditioner`)."""
        assert self.decay is not None
        return preconditioner(self.placement[i][0], self._group(i), self.decay.entries[i].param)


#: a decayed weight matrix whose norm falls below this share of its norm at the fit's start is
#: wiped (:meth:`WeightDecayProblem.check_not_wiped`): on the session-51 toys (6 MLPs, 17 fits)
#: the fits a large λ₀ left at chance ended with a matrix at 2e-9–6e-3 of it, the others at
#: ≥ 0.68
WIPED = 0.05

#: λ whose decay term ½λ‖w‖² ends the fit below this share of the training loss is reported as
#: off in effect (:meth:`WeightDecayProblem.decay_off`): a term 1e-6 of the loss moves neither
#: the loss nor its minimiser by more than float32 reads (session 54)
DECAY_OFF = 1e-6

#: how far above the effective λ (eq. effectivedecay) a λ must end for the fit's end to say so
ABOVE_APPLIED = 10.0

#: the checkpoint entry holding the probe's answer (λ group → scale-invariant), which a resumed
#: fit takes over rather than probing again on a network trained further
GROUPS_KEY = "invariant_groups"

#: the checkpoint entry naming the λ slots (per element: the layers) in the order the stored
#: λ holds them: a resumed fit whose model declares its layers in another order (the same
#: names, so its weights load) would read each layer's λ from another's slot (session 57)
SLOTS_KEY = "hyperparameter_slots"


def shared_slots(decay: WeightDecay) -> dict[str, list[str]]:
    """``decay``'s λ groups as versions before session 63 named them, each with the groups
    (:meth:`~hypertorch_sid.core.decay.WeightDecay.group_names`) it is now, in order: per layer
    and per element the tensors no layer owns shared one group, their owner's name (``"(root)"``
    for the LightningModule itself); other granularities named them as now. Its keys are what a
    checkpoint of those versions holds under :data:`SLOTS_KEY`."""
    names = decay.group_names()
    now: dict[str, list[str]] = {}
    for e in decay.entries:
        group = names[decay.group_of(e)]
        shared = e.name.rpartition(".")[0] or "(root)"
        before = shared if decay.granularity in ("per_layer", "per_element") else group
        if group not in now.setdefault(before, []):
            now[before].append(group)
    return now


#: the checkpoint entry holding the decayed tensors' norms at the fit's start
#: (:meth:`WeightDecayProblem.check_not_wiped`): a resumed fit compares with them, not with its
#: own start's, which a wipe before the checkpoint had already brought down (session 53)
NORMS_KEY = "decay_start_norms"

#: the values ``apply_to`` takes (:class:`~.weight_decay.LearnedWeightDecay`)
APPLY_TO = ("all", "weights", "decayed_groups")

#: the checkpoint entry naming the tensors ``apply_to="decayed_groups"`` decided to decay
#: (:attr:`WeightDecayProblem.decided`): the resumed fit's optimizers carry weight_decay 0 once
#: their state is loaded, and no longer say which groups decayed
DECIDED_KEY = "decayed_tensors"

#: the checkpoint entry holding the decay applied so far per λ group (Σ lr·λ, Σ lr), from which
#: a resumed fit's effective λ sums on (:class:`~.shrink.AppliedShrink`)
APPLIED_KEY = "decay_applied"


def _weight_matrix(p: Tensor) -> bool:
    """Whether ``p`` looks like a layer's weight (a matrix or a kernel), not a tensor added to the
    activations: a ViT's class token (1, 1, d) and position embedding (1, N, d) are broadcast
    over the batch by their leading 1 (session 48). A raw (1, d) output layer stays a matrix."""
    return p.dim() == 2 or (p.dim() > 2 and p.shape[0] != 1)


def layer_of(module: torch.nn.Module) -> Callable[[str], str]:
    """The layer of each tensor of ``module`` by its name (:func:`named_tensors`'), as per-layer
    decay shares λ: the module that owns it, or the tensor itself where its owner is no layer
    but a container — the LightningModule itself (``self.w1 = nn.Parameter(...)``), an
    ``nn.ParameterList`` or ``nn.ParameterDict``. Such tensors shared one λ, ``"(root)"`` (or the
    container's name), as ``granularity="global"`` would: a cosine classifier's class vectors
    and its learned logit scale exp(log_s), whose shared λ rose to 0.011–0.022 on 4 of 6 seeds and
    pulled the scale to 8.9–10.8 against the own recipe's 11.4–13.9 (session 62); a two-layer MLP
    of raw parameters got one λ for all (session 48: a warning then; session 63: a λ each)."""
    containers = {""} | {
        name.replace(COMPILE_WRAPPER, "")
        for name, m in module.named_modules()
        if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict))
    }

    def layer(name: str) -> str:
        owner = name.rpartition(".")[0]
        return name if owner in containers else owner

    return layer
