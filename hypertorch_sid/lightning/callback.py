"""``HyperOptimizationCallback``: SID (Algorithm 1) on λ while Lightning trains w.

Lightning's training steps with the module's own optimizer are the warm-started inner solver
(step 1 of Algorithm 1, eq. inneralg). Every ``every_n_steps`` optimizer steps the callback runs,
through a core :class:`~hypertorch_sid.core.SIDHyperOptimizer` built with ``inner_steps=0``:

2. the adjoint solve (eq. backalg) v ← v + η_k (∂₁Φ̂(w, λ, ζ̂_k)ᵀ v + ∇₁E(w, λ) − v), on fresh
   training minibatches ζ̂ drawn by the callback's **own** seeded sampler (independent of the
   training batches), warm-started from the previous v, with Φ̂ = w − α∇₁ℓ̂ (eq. mainprobopt);
3. the assembly (eq. gradestim) ∇̂f(λ) = ∇₂E(w, λ) + mean_j ∂₂Φ̂(w, λ, ζ_j)ᵀ v, with ∇E on a
   validation minibatch (``val="batch"``) or the whole validation set (``val="full"``);
4. the outer step: ``λ.grad ← ∇̂f(λ)``, the outer torch optimizer steps, λ is projected.

Under DDP every Φ̂, Jacobian product and ∇E is averaged across processes with Lightning's
``trainer.strategy.reduce``; each rank's minibatch is its shard of one *global* minibatch drawn
with the same seed on every rank, so the hypergradient equals the single-process one on the same
global batches and λ stays identical on all ranks.

The callback never redoes math: it finds data, builds the core object, logs and checkpoints.
This module holds its hooks and the hyper step; the jobs they call are mixins, a module each:
building the fit's problem, data and core object (:mod:`.callback_build`), the budget's
decisions (:mod:`.callback_budget`), λ living in the module (:mod:`.callback_module_hyper`), the
metrics and the warnings about the fit (:mod:`.callback_logging`) and the checkpoint state
(:mod:`.callback_state`); its settings are :mod:`.callback_settings`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.cli import OptimizerCallable
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from ..checkpoint_file import checkpoint_problem
from ..core.budget import Budget, make_budget
from ..core.config import SIDConfig
from ..core.errors import ConfigurationError, DivergenceError
from ..core.horizon import PooledStepSizeProbe, effective_step_size
from ..core.modes import as_trained
from ..core.optimizer import SIDHyperOptimizer
from ..core.presets import PRESETS
from ..core.validation import (
    check_bool,
    check_choice,
    check_integer,
    check_positive,
    check_takes,
    check_training_loss_has_gradient,
    check_training_loss_is_scalar,
)
from .callback_budget import BudgetedHyperSteps
from .callback_build import CoreBuild
from .callback_logging import HyperLogging
from .callback_module_hyper import ModuleHyperparameters
from .callback_settings import (
    CALLBACK_CONFIG,
    check_setting_names,
    given,
    refuse_settings_given_positionally,
    unset_torch_lr,
    warn_ignored_inner_steps,
)
from .callback_state import _STATE_KEYS, CheckpointState  # noqa: F401  (_STATE_KEYS: re-exported)
from .in_step import StepHooks, hook_steps
from .isolation import (
    LossWatch,
    check_weights,
    hyperparameters_require_grad,
    metric_states_kept,
    private_rng,
)
from .metrics import FEW_HYPER_STEPS, readable_progress_bar
from .moved_weights import MovedWeights
from .namespaces import classes
from .optimizer_decay import OptimizerDecay
from .problem import (
    BilevelProblem,
    ModuleProblem,
    ProblemSource,
    check_optimizers_output,
    check_still_trained,
    named_tensors,
    refuse_untunable_training,
    release_optimizers_check,
)
from .sources import HyperData
from .training_length import StepShares, horizon, runs_in_new_processes

__all__ = ["CALLBACK_CONFIG", "FEW_HYPER_STEPS", "HyperOptimizationCallback"]

Tensors = list[Tensor]


#: Lightning's ``Callback`` from every installed namespace: the callbacks derive from each, so a
#: ``lightning.pytorch`` ``LightningCLI`` (which accepts subclasses of its own ``Callback`` only)
#: configures them as a ``pytorch_lightning`` one does
CALLBACK_BASES: tuple[type, ...] = classes("callbacks.Callback")


def refuse_a_class(hooked: Any) -> None:
    """The class of a callback given where an instance belongs (``callbacks=[LearnedWeightDecay]``):
    Lightning accepts it and calls its hooks on the class, unbound, so the Trainer lands in
    ``self`` and the fit failed with "on_exception() missing 1 required positional argument:
    'exception'" (session 50). Refused at the first hook, :meth:`HyperOptimizationCallback.setup`,
    naming the class and the fix."""
    if isinstance(hooked, HyperOptimizationCallback):
        return
    given = [
        c.__name__
        for c in getattr(hooked, "callbacks", None) or []
        if isinstance(c, type) and issubclass(c, HyperOptimizationCallback)
    ] or ["LearnedWeightDecay"]
    raise ConfigurationError(
        f"callbacks=[{given[0]}] holds the class, not a callback: Lightning calls a class's "
        f"hooks without an instance. Pass an instance: callbacks=[{given[0]}()] (with its "
        "settings in the parentheses)."
    )


def stepped(optimizer: torch.optim.Optimizer, sid: SIDHyperOptimizer) -> list[Tensor]:
    """The inner parameters ``optimizer`` updates: those a step-size probe of its step reads."""
    mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [p for p in sid.inner_parameters if id(p) in mine]


class HyperOptimizationCallback(  # type: ignore[misc]
    CheckpointState,
    HyperLogging,
    CoreBuild,
    BudgetedHyperSteps,
    ModuleHyperparameters,
    *CALLBACK_BASES,
):
    """Tune the hyperparameters of a :class:`BilevelModule` by SID while Lightning trains it.

    Every default that a drop-in replaces by its own is ``None`` here ("not given"), so that a
    ``LightningCLI``, which passes each parameter's default explicitly, keeps the drop-in's.

    Parameters
    ----------
    every_n_steps:
        Run one hyper step (adjoint solve + outer step) after every ``every_n_steps`` optimizer
        steps of the training (the warm-started inner solver of Algorithm 1). ``None``: 10 (the
        drop-ins: their own).
    adjoint_steps:
        k, the steps of the adjoint solve (eq. backalg). ``None``: 10, or with ``preset`` the
        paper's rule k = round(%LS × ``preset_epochs`` × n_tr / batch size).
    outer_optimizer:
        A factory ``params -> torch.optim.Optimizer`` for λ (e.g.
        ``functools.partial(torch.optim.SGD, lr=0.1)``; in a LightningCLI config a
        ``class_path``/``init_args`` pair). ``None``: ``Adam(lr=outer_lr)``.
    outer_lr:
        Learning rate of the default Adam outer optimizer (``None``: 1e-2). Beside
        ``outer_optimizer`` it is refused: that optimizer's own learning rate is the one used.
    val:
        ``"batch"``: ∇E on one validation minibatch per hyper step (its own seeded sampler);
        ``"full"``: on the whole validation set.
    batch_size, val_batch_size:
        Minibatch sizes of the callback's samplers (per process). ``None``: the train / val
        DataLoader's batch size; for ``val="full"`` ``None`` means one batch holding the set.
    preset:
        One of the paper's variants (``"batch"``, ``"stoch_const"``, ``"stoch_dec"``, ...): sets
        the adjoint's schedule and full-batch/minibatch choice (and k, see ``adjoint_steps``).
        The preset's inner solver is Lightning's training here.
    preset_epochs:
        The hypergradient budget (in epochs) of the preset's step rule.
    on_divergence:
        ``"raise"`` stops training on a :class:`~hypertorch_sid.DivergenceError`; ``"skip"``
        warns and leaves λ unchanged for that hyper step (after ``config.on_divergence``'s
        retries; v is reset, so the next hyper step starts clean).
    start_step:
        No hyper step before this many optimizer steps (let w approach w(λ) first). ``None``: 0
        (:class:`~hypertorch_sid.LearnedDataWeights`: 50).
    seed:
        Seed of the callback's training sampler (the validation sampler uses ``seed + 1``) and of
        the randomness (dropout) inside hyper steps; the training's own RNG streams are left
        untouched. The same on every process: under DDP each rank keeps its shard of one global
        minibatch.
    max_overhead:
        A compute budget: the hyper steps cost at most this fraction of the training's own
        compute (0.5: ≤ 1.5× a plain training), measured on this model and device as the fit
        runs (CPU time where it trains on the CPU, wall time on an accelerator); a due hyper step
        waits until the budget covers its fewest products, and each piece of it (Lanczos
        iterations, adjoint steps, a curvature refresh, a retry) is cut to what the fit can
        still pay back (:class:`~hypertorch_sid.core.budget.OverheadBudget`; logged as
        ``hyper/overhead``). ``max_overhead=PlannedBudget(0.5)`` (an option) shares what a fit of
        known length can still spend evenly among the hyper steps still due, a dear one (the
        first, with its curvature estimate) taken from all their shares instead of paid back
        before the next one runs (:class:`~hypertorch_sid.core.budget.PlannedBudget`).
        Counted as overhead: the hyper steps (their batches, curvature estimates, retries) and
        the callback's work around them; the accounting is kept in checkpoints.
        ``None`` (default; :class:`~hypertorch_sid.LearnedWeightDecay`'s is 0.5): every due
        hyper step runs, and a seeded fit is bit-for-bit repeatable (a budget reads the clock). A
        fit whose budget allowed none of its due hyper steps warns at its end.
    log_to_loggers:
        Send every hyper step's ``hyper/*`` metrics to ``trainer.loggers`` (bypassing
        ``log_every_n_steps``, so no hyper step is dropped).
    config:
        How SID runs (:class:`~hypertorch_sid.core.config.SIDConfig`, shared with the core and
        validated there): schedules, constants, curvature, damping, adjoint solver, divergence
        policy, batch sources. Default: :data:`CALLBACK_CONFIG` (a drop-in given a ``config``
        equal to it applies its own defaults, as when given none). Its ``inner_steps`` is ignored
        (Lightning's training is the inner solver).
    problem:
        A :class:`~hypertorch_sid.lightning.problem.ProblemSource`: where λ, w, ℓ̂ and E come
        from. ``None``: :class:`~hypertorch_sid.lightning.problem.ModuleProblem`, the
        :class:`BilevelModule` being trained.
    **settings:
        :class:`SIDConfig` fields changed from ``config`` (``step_size=``, ``alpha=``,
        ``damping=``, ``curvature=``, ``batches=``, ``hvp=``, ``mode=`` ...; the divergence
        policy: ``config=CALLBACK_CONFIG.replace(on_divergence=...)``). Validated here, at
        construction.

    Notes
    -----
    Logged: the ``hyper/*`` metrics of :func:`~hypertorch_sid.lightning.metrics.hyper_metrics`,
    also kept in :attr:`history`; the progress bar shows ``lam`` (the mean of the λ summary) and
    ``hg``; ``trainer.callback_metrics`` holds ``hyper/outer_loss`` (for ``ModelCheckpoint``).

    Checkpoints: :meth:`state_dict` holds λ, the outer optimizer, v, the counters, the constants
    and both samplers (plain tensors and numbers: ``torch.load(weights_only=True)`` reads it).
    On resume the checkpoint file's CRC-32s are verified (``torch.load`` does not; this reads the
    file once more) and the whole state is validated before any of it is loaded, so a truncated,
    corrupted or foreign checkpoint raises :class:`~hypertorch_sid.core.errors.ConfigurationError`
    instead of resuming from a partial state. Resuming from a mid-epoch checkpoint is exact only
    if the training DataLoader resumes mid-epoch too (Lightning restarts an ordinary one from the
    start of the epoch); the callback's own samplers always continue where they stopped.
    """

    #: what the hyperparameters are called in the callback's messages (λ, the paper's name)
    hyperparameters_named = "λ"

    #: what happens to tensors the optimizers train that the fit did not start with
    _new_tensors_get = "are left out of the hypergradient"
    #: what a callback that thaws tensors mid-fit (BackboneFinetuning) can do instead
    _thawed_mid_fit_advice = ""

    def __init__(
        self,
        every_n_steps: int | None = None,
        adjoint_steps: int | None = None,
        outer_optimizer: OptimizerCallable | None = None,
        outer_lr: float | None = None,
        val: Literal["batch", "full"] = "batch",
        batch_size: int | None = None,
        val_batch_size: int | None = None,
        preset: str | None = None,
        preset_epochs: float = 1.0,
        start_step: int | None = None,
        on_divergence: Literal["raise", "skip"] = "skip",
        seed: int = 0,
        log_to_loggers: bool = True,
        max_overhead: float | Budget | None = None,
        config: SIDConfig = CALLBACK_CONFIG,
        problem: ProblemSource | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        # the class the user built: a drop-in's settings were refused as those of
        # HyperOptimizationCallback, a class its user never named (session 61)
        who = f"{type(self).__name__}: "
        refuse_settings_given_positionally(type(self), every_n_steps)
        every_n_steps = check_integer(who + "every_n_steps", given(every_n_steps, 10), 1)
        adjoint_steps = check_integer(who + "adjoint_steps", adjoint_steps, 1, allow_none=True)
        if outer_optimizer is not None and not callable(outer_optimizer):
            raise ConfigurationError(
                f"{who}outer_optimizer must be a callable params -> "
                f"torch.optim.Optimizer (e.g. functools.partial(torch.optim.Adam, lr=0.01)), got "
                f"{type(outer_optimizer).__name__}."
            )
        if outer_optimizer is not None:
            call = ("params",)
            check_takes(who + "outer_optimizer", outer_optimizer, call, "torch.optim.Optimizer")
            torch_lr = unset_torch_lr(outer_optimizer)
            if torch_lr is not None:
                name = getattr(outer_optimizer, "func", outer_optimizer).__name__
                rank_zero_warn(
                    f"{type(self).__name__}: outer_optimizer=torch.optim.{name} is given without "
                    f"a learning rate, so it steps λ at torch's default lr={torch_lr:g}, not at "
                    "the callback's own outer step (outer_lr; 0.3 on log λ for "
                    "LearnedWeightDecay): λ would barely move. Give it one, e.g. "
                    f"outer_optimizer=functools.partial(torch.optim.{name}, lr=0.1), or drop "
                    "outer_optimizer= to keep the callback's own."
                )
        if outer_optimizer is not None and outer_lr is not None:
            raise ConfigurationError(
                f"{who}outer_lr={outer_lr!r} is the learning rate of the "
                "default Adam outer optimizer, but outer_optimizer= replaces it, so outer_lr "
                "would be ignored: give the learning rate to your optimizer (e.g. "
                "outer_optimizer=functools.partial(torch.optim.Adam, lr=0.1)), or drop "
                "outer_optimizer=."
            )
        outer_lr = check_positive(who + "outer_lr", 1e-2 if outer_lr is None else outer_lr)
        check_choice(who + "val", val, ("batch", "full"))
        batch_size = check_integer(who + "batch_size", batch_size, 1, allow_none=True)
        val_batch_size = check_integer(who + "val_batch_size", val_batch_size, 1, allow_none=True)
        if preset is not None:
            check_choice(who + "preset", preset, list(PRESETS))
        preset_epochs = check_positive(who + "preset_epochs", preset_epochs)
        start_step = check_integer(who + "start_step", given(start_step, 0), 0)
        check_choice(who + "on_divergence", on_divergence, ("raise", "skip"))
        check_bool(who + "log_to_loggers", log_to_loggers)
        seed = check_integer(who + "seed", seed, 0)
        if problem is not None and not isinstance(problem, ProblemSource):
            raise ConfigurationError(
                f"{who}problem must be a ProblemSource (an object with "
                f"check, build and before_hyper_step), got {type(problem).__name__}."
            )
        #: where λ, w, ℓ̂, E come from (default: the BilevelModule being trained)
        self.problem: ProblemSource = problem if problem is not None else ModuleProblem()
        check_setting_names(type(self), settings)
        warn_ignored_inner_steps(type(self), config)
        #: how SID runs, validated once (shared with the core object built at train start)
        self.config = SIDConfig.from_settings(config, **settings)
        self._schedule_given = config.step_size != CALLBACK_CONFIG.step_size or (
            "step_size" in settings
        )
        self.every_n_steps = every_n_steps
        self._step_probe: PooledStepSizeProbe | None = None
        self._step_size: float | None = None
        #: (the training batch, whether its updates are probed): :meth:`_probes_batch`
        self._probed_batch: tuple[int, bool] = (-1, False)
        #: the most optimizer steps one training batch has made in this fit (None: no batch
        #: ended yet), and the step the current batch started after
        self._steps_per_batch: int | None = None
        self._batch_start_step = 0
        #: the optimizer step hooks of the fit (:meth:`_hook_steps`), held by the first
        #: hyper-optimization callback of the Trainer
        self._step_hook: StepHooks | None = None
        self.budget: Budget = make_budget(max_overhead, who)
        self._waiting = False  # a due hyper step the budget has not yet allowed
        self._due_in_fit = 0  # hyper steps due in this fit (whether the budget allowed them)
        self._ran_in_fit = 0  # hyper steps the budget allowed in this fit
        self._planned_short = False  # the fit's start warned that it plans too few hyper steps
        self._fit_start = 0  # the optimizer step this fit started from (a resume: later)
        self._said_horizon = False  # the estimated horizon of a fit of unknown length, said
        self._said_new_tensors = False  # tensors trained that the fit did not start with, said
        self._losses = LossWatch()  # the training losses, read when the weights go non-finite
        #: each training optimizer's share of the fit's optimizer steps (eq. stepshare)
        self.step_shares = StepShares()
        self.adjoint_steps = adjoint_steps
        self.outer_optimizer = outer_optimizer
        self.outer_lr = outer_lr
        self.val = val
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.preset = preset
        self.preset_epochs = preset_epochs
        self.start_step = start_step
        self.on_divergence = on_divergence
        self.seed = seed
        self.log_to_loggers = log_to_loggers

        #: the core object doing Algorithm 1 (built at ``on_train_start``)
        self.sid: SIDHyperOptimizer | None = None
        #: ∇̂f(λ) of the latest hyper step
        self.last_hypergradient: Tensors | None = None
        #: the ``hyper/*`` metrics of every hyper step (also in checkpoints)
        self.history: list[dict[str, float]] = []
        self._active: BilevelProblem | None = None
        #: the training optimizers' own weight decay, inside the hyper steps' ℓ̂ (built at
        #: train start; see :mod:`~hypertorch_sid.lightning.optimizer_decay`)
        self._optimizer_decay: OptimizerDecay | None = None
        #: the optimizers' decay as read at the build, modelled or not (None: said switched on)
        self._decay_at_build: OptimizerDecay | None = None
        #: the training stream and validation source of the hyper steps (built at train start)
        self.data: HyperData | None = None
        self._world_size = 1
        self._rank = 0
        self._last_step = -1
        self._pending: dict[str, Any] | None = None
        self._frozen: list[tuple[Tensor, bool]] = []
        self._learned: list[Tensor] = []  # λ living in the module, as the hyper steps left it
        self._names: list[str] = []  # their names in the module
        self._fitting = False  # between setup("fit") and teardown / on_exception
        #: how the last fit ended where an exception ended it (a Ctrl-C included), said once by
        #: the read-outs (:meth:`_refuse_unapplied_checkpoint`); None after a finished fit
        self._unfinished: str | None = None
        self._before_build = False  # in a fit, before on_train_start built the core object
        #: the Trainer function ("fit", "test", ...) that last loaded a checkpoint into it
        self._loaded_by: str | None = None
        #: the module's tensors by name when this fit started (a layer replaced later is named)
        self._named_at_start: dict[int, str] = {}

    # ================================================================== hooks (one per job)
    def setup(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule | None = None, stage: str = ""
    ) -> None:
        """Freeze λ living in the module before the strategy wraps it (DDP skips it); a
        progress bar that shows λ (:func:`~.metrics.readable_progress_bar`).

        ``pl_module`` and ``stage`` have defaults only so that the class given for a callback
        (``callbacks=[LearnedWeightDecay]``: Lightning calls its hooks unbound, the Trainer in
        ``self``) reaches :func:`refuse_a_class` rather than failing in the binding of the
        arguments (session 51)."""
        refuse_a_class(self)
        assert pl_module is not None
        if stage == "fit":
            check_optimizers_output(pl_module, type(self).__name__)
            readable_progress_bar(trainer)
            self._fitting = self._before_build = True
            self._unfinished = None
            self._freeze_module_hyperparameters(pl_module)
            self.budget.share_work(None)  # a previous fit's (on_train_start shares this fit's)
            self._losses = LossWatch()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The training optimizers must not hold λ, nor ascend their loss; the module's
        parameters must exist (no lazy layer left uninitialised)."""
        refuse_untunable_training(trainer, pl_module, type(self).__name__)
        self._named_at_start = {id(p): n for n, p in named_tensors(pl_module)}
        self.problem.check(trainer, pl_module)
        if runs_in_new_processes(trainer):
            rank_zero_warn(
                f"{type(self).__name__}: this strategy runs the fit in new processes and "
                "Lightning hands only the module's weights back to the process that called "
                "fit: this callback's state (its history, the outer optimizer; "
                "LearnedWeightDecay's λ and decay_values()) stays in them. Keep it with a "
                "checkpoint (ModelCheckpoint saves the callback's state) or use "
                "strategy='ddp', whose rank 0 is the calling process."
            )
        self._hook_steps(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fit whose training loader gave no batch ran no training step and no hyper step;
        Lightning only logs "No training batches", and the read-outs gave λ₀ (or an empty
        tensor of data weights) without a word (session 57); so did a Trainer given
        ``max_epochs=0`` or ``max_steps=0`` (session 62: λ₀ read back as learned)."""
        zero = [f"{k}=0" for k in ("max_epochs", "max_steps") if getattr(trainer, k) == 0]
        if zero:
            rank_zero_warn(
                f"{type(self).__name__}: this fit ran no training step, so no hyper step: the "
                f"Trainer was given {zero[0]}, and {self.hyperparameters_named} were not "
                "learned (they are where they started). Give the Trainer the fit's length, "
                "e.g. max_epochs=10 (max_epochs=-1 with max_steps=... for a length in steps)."
            )
        elif trainer.num_training_batches == 0 or trainer.limit_train_batches == 0:
            rank_zero_warn(
                f"{type(self).__name__}: this fit ran no training step, so no hyper step: its "
                "training loader gave no batch (drop_last=True over fewer examples than "
                "batch_size, limit_train_batches=0, or an empty data set), and "
                f"{self.hyperparameters_named} were not learned. Give the training loader at "
                "least one batch (drop_last=False, or a batch_size ≤ the data set's size)."
            )

    def _hyper_callbacks(self, trainer: pl.Trainer) -> list[HyperOptimizationCallback]:
        """The fit's hyper-optimization callbacks, in the Trainer's order (this one among them
        where the Trainer holds it)."""
        return [c for c in trainer.callbacks if isinstance(c, HyperOptimizationCallback)]  # type: ignore[attr-defined]

    def _hook_steps(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """From now until the fit ends (:meth:`teardown`, :meth:`on_exception`), the training
        optimizers' steps run, once the gradient is final (after Lightning's clipping), every
        hyper-optimization callback's :meth:`_change_gradient` and then every one's
        :meth:`_read_gradient` (:func:`~.in_step.hook_steps`): one hook for the Trainer, held by
        the first of them, so that a reading sees the other callbacks' changes too."""
        self._release_step_hook()
        ours = self._hyper_callbacks(trainer)
        ours = ours if any(c is self for c in ours) else [self]
        if ours[0] is self:
            moved = MovedWeights(type(self).__name__, self.every_n_steps)  # edited outside (s63)
            self._step_hook = hook_steps(
                lambda: trainer.optimizers,
                [functools.partial(moved.check, trainer, pl_module)]
                + [functools.partial(c._change_gradient, trainer, pl_module) for c in ours],
                [functools.partial(c._read_gradient, trainer, pl_module) for c in ours],
                [c._close_reading for c in ours]
                + [c._count_step for c in ours]
                + [functools.partial(moved.note, trainer)],
            )

    def _release_step_hook(self) -> None:
        hook, self._step_hook = self._step_hook, None
        if hook is not None:
            hook.remove()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the samplers and the core SIDHyperOptimizer; restore checkpointed state."""
        self.budget.use_device(pl_module.device.type)  # CPU time on the CPU, else wall time
        self.step_shares.reset()  # each optimizer's share of this fit's steps (eq. stepshare)
        self._share_hyper_work(trainer)
        with self.budget.added_work():
            self._build(trainer, pl_module)
        # the batches' probes start afresh (a resumed fit: from the checkpoint's step)
        self._probed_batch, self._steps_per_batch = (-1, False), None
        self._batch_start_step, self._step_probe = trainer.global_step, None
        self.budget.training_step_done()  # the training's time is counted from here

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        """A training loss without a gradient (``@torch.no_grad()`` on ``training_step``, a
        count of errors) is named here, before torch's bare "element 0 of tensors does not
        require grad" from inside Lightning's backward (session 61); per-sample losses, before
        its "grad can be implicitly created only for scalar outputs" (session 62; automatic
        optimisation only: ``manual_backward(losses, gradient=...)`` may take a vector)."""
        if pl_module.automatic_optimization:
            check_training_loss_is_scalar(type(self).__name__, loss)
        check_training_loss_has_gradient(type(self).__name__, loss)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Every ``every_n_steps`` optimizer steps: one hyper step on λ (when the budget allows
        it: else at the first step after that it does)."""
        self._losses.observe(outputs, trainer.global_step)
        made = trainer.global_step - self._batch_start_step
        self._steps_per_batch = max(self._steps_per_batch or 0, made)
        self._batch_start_step = trainer.global_step
        if self._step_probe is not None:
            with self.budget.added_work():
                probe, self._step_probe = self._step_probe, None
                self._step_size = probe.step_size(self.step_shares.share)  # per step of R
        self.budget.training_step_done()
        with self.budget.added_work(every_step=True):  # deciding is the callback's work too
            due = self._due(trainer)
            self._due_in_fit += due
            self._waiting = due or self._waiting
            run = self._waiting and self._budget_allows(trainer, pl_module)
        if run:
            self._waiting = False
            self._budgeted_hyper_step(trainer, pl_module)

    def _change_gradient(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """What this callback does to the final gradient inside ``optimizer``'s step, before
        any callback reads it (:meth:`_hook_steps`); nothing here."""

    def _read_gradient(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """In a batch whose updates a hyper step follows: start measuring the update
        ``optimizer`` is about to make, where the optimizers give no reading of the training's
        step size (:func:`effective_step_size`), on the gradient the update uses — inside the
        step, after the clip and every callback's change (session 56: taken in
        ``on_before_optimizer_step``, the probe held the gradient the clip then rescaled in
        place, and measured a wrong η). The probe holds the tensors ``optimizer`` steps and is
        closed right after its update (:meth:`_close_reading`); every optimizer that steps in
        the batch adds its part, read by the batch's end (:class:`PooledStepSizeProbe`: session
        57 measured the update of one of them, the batch's last, under manual optimisation with
        one optimizer per layer; session 58 pools them all)."""
        with self.budget.added_work(every_step=True):
            if self.sid is None or not self._probes_batch(trainer, pl_module):
                return
            # once per probed update, not at every step (reading Adam's v̂ costs ms on a big
            # layer: charged as every step's, it was reserved from all remaining steps)
            with self.budget.added_work():
                if effective_step_size(trainer.optimizers) is None:
                    self._step_probe = self._step_probe or PooledStepSizeProbe()
                    self._step_probe.open(stepped(optimizer, self.sid), optimizer)

    def _count_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer`` has made its update: count it in its share of the fit's steps
        (:class:`~.training_length.StepShares`, eq. stepshare)."""
        self.step_shares.count(optimizer)

    def _close_reading(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer`` has made its update: close the probe of it (:meth:`_read_gradient`)."""
        if self._step_probe is not None:
            with self.budget.added_work():
                self._step_probe.close()

    def _probes_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Whether the training batch now stepping may end in a due hyper step, so that each of
        its optimizer updates is probed: decided at its first optimizer step, from the most
        steps a batch has made (one under automatic optimisation; under manual optimisation
        every batch until one has ended), and opened at any due step beyond that."""
        batch = trainer.fit_loop.epoch_loop.total_batch_idx
        if batch != self._probed_batch[0]:
            first = trainer.global_step  # no update of this batch has been made yet
            most = 1 if pl_module.automatic_optimization else self._steps_per_batch
            due = most is None or self._next_due(first) <= first + most
            self._probed_batch = (batch, due)
        if not self._probed_batch[1] and self._next_due(trainer.global_step) == (
            trainer.global_step + 1
        ):
            self._probed_batch = (batch, True)
        return self._probed_batch[1]

    def _next_due(self, step: int) -> int:
        """The first optimizer step after ``step`` at which a hyper step is due (:meth:`_due`)."""
        n = self.every_n_steps
        first = max(self.start_step, 1, step + 1)
        return -(-first // n) * n

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give λ its learned values (:meth:`_keep_learned`) and its ``requires_grad`` back."""
        if stage == "fit":
            release_optimizers_check(pl_module)
            self._release_step_hook()
            self._fitting = self._before_build = False
            self._keep_learned(trainer)
            self._unfreeze()

    def on_exception(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        exception: BaseException | None = None,
    ) -> None:
        """A failed fit also gives λ its ``requires_grad`` back.

        If the fit failed before this callback was built while a checkpoint was being loaded
        (``torch.load`` reports a truncated file as a bare ``EOFError``/``OSError``), a note
        saying what is wrong with the file is added to the exception. The class given for a
        callback (:func:`refuse_a_class`'s error) does nothing here: that error stays the one
        raised (``exception`` has a default for that call only).
        """
        if not isinstance(self, HyperOptimizationCallback):
            return
        self._release_step_hook()  # the optimizers' steps no longer run this fit's work
        release_optimizers_check(pl_module)
        if self._fitting:  # the read-outs say they are an unfinished fit's (session 55)
            name = type(exception).__name__ if exception is not None else "an exception"
            self._unfinished = f"by {name} at optimizer step {trainer.global_step}"
        before_build, self._fitting, self._before_build = self._before_build, False, False
        self._unfreeze()
        if before_build and not isinstance(exception, ConfigurationError):
            problem = checkpoint_problem(trainer.ckpt_path)
            if problem is not None and hasattr(exception, "add_note"):
                exception.add_note(f"{type(self).__name__}: {problem}")

    def _train_dataset(self) -> Any:
        """The training dataset where the callback samples it by index (else None)."""
        parts = self.data.train_parts if self.data is not None else None
        return parts[0] if parts is not None else None

    # ================================================================== reloads; other callbacks
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Where Lightning has reloaded the dataloaders over other data sets
        (``reload_dataloaders_every_n_epochs``), the hyper steps draw from those from now on
        (:meth:`HyperData.continue_from`): ℓ̂ is the loss the training now minimises, E on the
        validation data it now reads."""
        if self.data is None or not self.data.reloaded():
            return
        assert self.sid is not None
        if self.sid.full_train_batch is not None:
            raise ConfigurationError(
                f"{type(self).__name__}: the train dataloader was reloaded over another data set "
                "(reload_dataloaders_every_n_epochs), but these settings read the whole training "
                "set once, when the fit started (batches='full', or a full-batch preset): use "
                "minibatch settings, or keep one data set for the fit."
            )
        with self.budget.added_work():
            old, self.data = self.data, self._hyper_data(trainer)
            self.data.continue_from(old)
        rank_zero_info(
            f"{type(self).__name__}: the dataloaders were reloaded over other data sets (or "
            f"other rows of one, or a data set changed its length in place); the hyper steps "
            f"now draw from them "
            f"({self.data.n_train} training samples)."
        )

    def training_penalty(self, pl_module: pl.LightningModule) -> Callable[[], Tensor] | None:
        """D(w), the penalty whose gradient this callback adds to the training's, its
        hyperparameters held constant: another hyperparameter callback in the same fit adds it
        to its hyper steps' ℓ̂ (:func:`~hypertorch_sid.lightning.optimizer_decay.with_penalty`),
        as it adds the optimizers' own decay. None (here): the training's loss is all."""
        return None

    def hyper_steps_needed(self) -> int:
        """Fewer hyper steps than this in a fit get a warning: λ moves only in hyper steps, a
        bounded amount each (:data:`FEW_HYPER_STEPS`)."""
        return FEW_HYPER_STEPS

    # ================================================================== the hyper step
    def _due(self, trainer: pl.Trainer) -> bool:
        step = trainer.global_step
        if step == self._last_step or self.sid is None:
            return False
        self._last_step = step
        return step >= max(self.start_step, 1) and step % self.every_n_steps == 0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fit never ends silently with NaN weights, nor with λ unlearned because the budget
        allowed none of its hyper steps."""
        if self.sid is not None:
            with self.budget.added_work():
                self._check_weights(trainer, pl_module)
            self._warn_if_budget_cut()
            self._warn_if_ended_before_learning(trainer)

    def _check_weights(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Never go on with non-finite weights; the error names the cause
        (:func:`~hypertorch_sid.lightning.isolation.check_weights`)."""
        data = self._train_dataset()
        check_weights(pl_module, self._active, trainer.global_step, data, self._losses)

    def _hyper_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.sid is not None and self.data is not None and self._active is not None
        self._check_weights(trainer, pl_module)
        check_still_trained(
            type(self).__name__, self._active.inner_parameters, pl_module, self._named_at_start
        )
        self.problem.before_hyper_step(trainer, pl_module)
        if self._optimizer_decay is not None:
            self._optimizer_decay.refresh()  # P of decoupled decay, frozen for this hyper step
        self._warn_if_decay_switched_on(trainer)
        self._warn_if_new_tensors(trainer, pl_module)
        self._observe_horizon(trainer)
        seed = (self.seed * 1_000_003 + self.sid.hyper_step * 7919 + self._rank) % (2**63)
        with (
            hyperparameters_require_grad([h for h, _ in self._frozen]),
            private_rng(seed, pl_module.device),
            metric_states_kept(pl_module),
            as_trained(),  # inside a training step: the module's flags are the training's
        ):
            try:
                data = self.data
                hypergrad = self.sid.hypergradient(data.train_stream, data.validation_batch())
            except DivergenceError as err:
                if self.on_divergence == "raise":
                    raise
                rank_zero_warn(
                    f"{type(self).__name__}: hyper step skipped, {self.hyperparameters_named} "
                    f"unchanged: {err}"
                )
                return
            hypergrad = self._adjust_hypergradient(trainer, pl_module, hypergrad)
            self.sid.apply(hypergrad)
            self._remember_learned(trainer)
        self.last_hypergradient = [g.detach().clone() for g in hypergrad]
        self._log(trainer, pl_module)

    def _adjust_hypergradient(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, hypergrad: Tensors
    ) -> Tensors:
        """The hypergradient the outer step uses (a subclass may replace parts of it; here as
        computed)."""
        return hypergrad

    def _observe_horizon(self, trainer: pl.Trainer) -> None:
        """Tell the damping strategy, the adjoint solver, the look-ahead and an outer optimizer
        that has ``observe(remaining_steps, eta)`` the steps that remain and the
        training's step size: read from its optimizers (momentum's and Adam's gain included:
        :func:`effective_step_size`), else the one-step response measured on the last update."""
        assert self.sid is not None
        eta = effective_step_size(trainer.optimizers, self.step_shares.share)  # per step of R
        eta = self._step_size if eta is None else eta
        left, how = horizon(trainer)
        if how is not None and not self._said_horizon:
            self._said_horizon = True
            rank_zero_warn(f"{type(self).__name__}: {how}")
        self.sid.config.damping.observe(left, eta)
        self.sid.config.adjoint_solver.observe(left, eta)
        self.sid.config.look_ahead.observe(left, eta)
        observe = getattr(self.sid.outer_optimizer, "observe", None)  # e.g. TrustRprop's
        if callable(observe):
            observe(left, self._outer_step_size(eta))
        self._step_size = None
        self.sid.refresh_damping()

    def _outer_step_size(self, eta: float | None) -> float | None:
        """The step size an outer optimizer with ``observe`` is told: how far one training step
        moves the weights per unit of the force the hyperparameters exert (here the training's
        η; :class:`LearnedWeightDecay` with ``decoupled=True``: the optimizers' lr, since
        ``w ← w(1 − lr·λ)`` bypasses the optimizer's gain)."""
        return eta
