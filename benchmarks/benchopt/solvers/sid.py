"""SID (Grazzi, Pontil, Salzo, AISTATS 2021) through ``hypertorch_sid``, as a benchopt solver of
``benchopt/benchmark_bilevel`` (data-cleaning problem).

Copied next to the peers' solvers by ``benchmarks/benchopt/get_benchmark.sh`` so that one
``benchopt run`` times every method the same way. The data are read from the closures of the
benchmark's own ``f_inner`` / ``f_outer`` (``datasets/mnist.py``), so the split, corruption,
scaling and regulariser are theirs; the model is the same multinomial logistic regression,

    g(z, x) = (1/|B|) Σ_{i∈B} σ(xᵢ) CE(Xᵢ z, yᵢ) + reg ‖z‖²,    f(z) = mean CE on validation,

in torch (float32, CPU), with z₀, x₀ the objective's initial point. Test/validation errors are
computed by the benchmark's own ``metrics`` on the returned (z, x).

**The problem is the benchmark's; the solver settings are the drop-in's.** The outer objective
is part of the problem: the benchmark asks for min_x f(z*(x)) with f the mean validation
cross-entropy, which every peer (SOBA, SRBA, AmIGO, ...) minimises. So SID minimises that f too
(``outer_objective="f"``, the default since session 47: E = ``MeanLoss()`` of the validation
CE losses, i.e. ``LearnedDataWeights(objective="mean_loss")``). Everything else that the drop-in
chooses is a *solver* setting and is read from a ``LearnedDataWeights`` instance, unchanged:
the hyper step's schedule (``every_n_steps``, ``start_step``, ``adjoint_steps``), the outer
optimizer (``LazyAdam`` and its step sizes), the step sizes and damping of ``_sid_config()``,
the validation batch floor ``MIN_VAL_BATCH`` and the row-sparse gradients.
``outer_objective="drop_in"`` keeps the drop-in's own default objective instead
(``LearnedDataWeights().problem.objective``, ``ExpectedError(q=0.5)`` when this was written): a
*different* upper-level problem, which is what a user of the drop-in who changes nothing gets,
and what the row "SID (defaults)" of sessions 41–46 ran (then written
``outer_objective=default``, a value this solver now refuses as ambiguous). Any other name of
``as_validation_objective`` (``"expected_error"``, ...) is passed to the drop-in as its
``objective``. The ``SID_BENCH_OUT`` file tag always names E (``_Ef``, ``_Edrop_in``, ...), so no
run's files can be mistaken for, or overwrite, another objective's.

``regime="drop_in"`` (default) runs exactly what ``LearnedDataWeights`` (the Lightning drop-in)
does inside a fit, on tensors, with the drop-in's own solver defaults read from a
``LearnedDataWeights(normalize=False, objective=E)`` instance (``normalize=False``: the
benchmark's objective g above, not the self-normalised loss): the training's minibatch SGD
steps on z are the warm-started inner solve (t = 0); every ``every_n_steps`` steps a hyper
step of ``adjoint_steps`` warm-started adjoint steps refreshes v and moves the weights of its
∂₂Φ̂ minibatch (from step ``start_step`` on); and every training batch moves its own rows by eq.
gradestim's cross term from the last v (core ``TrainingCrossTerm``, u by one forward-mode
pass), all through the drop-in's outer optimizer (``LazyAdam``; ``outer_beta1``: its β₁, the
drop-in's 0 by default, ``outer_betas=(β₁, 0.999)``) on row-sparse gradients
(``SampleWeights(sparse_grad=...)`` as the drop-in chooses). The settings that are not the
library's are a user's, identical at every p: the training's own optimizer, SGD with a
decaying step η_t = inner_lr / (t + 1)^0.75, inner_lr = 1.0 (constant steps plateau: with the
*perfect* weights, SGD at a constant 0.1 stalls at test error 0.20 at p = 0.9, against 0.167 at
the objective's minimum; with SOBA's 1/√(t + 1) the test error still jumps by ±0.4 points
between evaluations at p = 0.9, with ^0.75 it is within 0.1 point of L-BFGS's at the same
weights after 25 s); the training's minibatch, ``batch_size = 256`` (the
peers use 64; at 64 the work of a step of this 784×10 model is mostly Python and dispatch: 4×
the batch read 1.8× the samples per second at p = 0.9, at about the same error per sample read;
512 added 10 %); and the model's
layout, ``nn.Linear``'s weight (classes × features), which torch's kernels serve best.

``regime="algorithm1"``: ``SIDHyperOptimizer.step`` with its default ``SIDConfig()`` (t = k = 100
minibatches per hyper step; the previous session's "SID defaults").

With ``SID_BENCH_OUT`` set, the final logits and the samples read after each hyper step are
saved there (``<tag>.npz``) for the precision/recall summary.
"""

from pathlib import Path

from benchopt import BaseSolver, safe_import_context
from benchopt.stopping_criterion import SufficientProgressCriterion

with safe_import_context() as import_ctx:
    import inspect
    import os

    import jax.numpy as jnp
    import numpy as np
    import torch
    import torch.nn.functional as F

    from hypertorch_sid import FeasibleSet, SIDConfig, SIDHyperOptimizer
    from hypertorch_sid.core.directional import TrainingCrossTerm, directional_losses
    from hypertorch_sid.core.errors import DivergenceError
    from hypertorch_sid.core.indexing import Indexed
    from hypertorch_sid.core.lazy_adam import LazyAdam
    from hypertorch_sid.core.objectives import MeanLoss
    from hypertorch_sid.core.sample_weights import SampleWeights
    from hypertorch_sid.core.weighted_loss import weighted_loss
    from hypertorch_sid.lightning.data_weights import MIN_VAL_BATCH, LearnedDataWeights


def _closure(f, names):
    """The arrays a jitted benchmark function closes over (its data)."""
    cells = inspect.getclosurevars(getattr(f, "__wrapped__", f)).nonlocals
    missing = [n for n in names if n not in cells]
    if missing:
        raise ValueError(
            f"the SID solver reads the data from the closure of datasets/mnist.py's f_inner/"
            f"f_outer; {missing} not found: only the data-cleaning dataset is supported."
        )
    return [cells[n] for n in names]


def _linear_weight(z0):
    """The benchmark's z (features × classes) as ``nn.Linear``'s weight (classes × features),
    the layout torch's kernels serve best: ∇ = gᵀX rather than Xᵀg (4× faster at b = 256)."""
    return z0.t().contiguous().requires_grad_(True)


def _rows(X, y, index):
    """A minibatch of rows (``index_select``: a third of advanced indexing's time)."""
    return X.index_select(0, index), y.index_select(0, index)


def _batches(n, batch_size, generator):
    """Endless shuffled epochs of index minibatches (a DataLoader's RandomSampler)."""
    while True:
        perm = torch.randperm(n, generator=generator)
        yield from perm.split(batch_size)


class DropIn:
    """``LearnedDataWeights``'s regime on in-memory tensors (see the module docstring).

    ``step()`` is one training step (cross term on its batch, SGD on z, a hyper step when due);
    ``samples`` counts the examples read (training batches, the hyper steps' reads, validation).
    """

    def __init__(
        self,
        X,
        y,
        Xv,
        yv,
        z0,
        x0,
        reg,
        batch_size,
        inner_lr,
        seed,
        inner_decay=0.75,
        normalize=False,
        **drop_in_kwargs,
    ):
        # what a user of the drop-in gets (``drop_in_kwargs``: what a user would change);
        # ``normalize=True`` (the drop-in's own default) trains on Σ ωᵢℓᵢ / Σ ωᵢ: not the
        # benchmark's g, whose (1/n) Σ ωᵢℓᵢ caps the data term's scale at ω = 1
        drop_in = LearnedDataWeights(normalize=normalize, **drop_in_kwargs)
        self.normalize = bool(normalize)
        self.X, self.y, self.Xv, self.yv, self.reg = X, y, Xv, yv, reg
        # E of the validation losses: the drop-in's ``objective`` (the solver passes the
        # benchmark's f, MeanLoss(), unless outer_objective=drop_in)
        self.objective = drop_in.problem.objective
        self.z = _linear_weight(z0)
        self.weights = SampleWeights(len(y), sparse_grad=drop_in.sparse_grad_for(world_size=1))
        with torch.no_grad():
            self.weights.logits.copy_(x0)
        outer = drop_in.outer_optimizer(self.weights.hyperparameters)
        config = drop_in._sid_config().replace(
            feasible_set=FeasibleSet(project=self.weights.projection)
        )
        self.sid = SIDHyperOptimizer(
            self.weights.hyperparameters, [self.z], self.inner_loss, self.outer_loss, outer,
            config=config,
        )  # fmt: skip
        self.cross = TrainingCrossTerm(self.weights, outer, normalize=self.normalize)
        self.every, self.batch_size = drop_in.every_n_steps, batch_size
        self.start = max(drop_in.start_step, 1)  # the callback's _due: plain steps before
        self.inner = torch.optim.SGD([self.z], lr=inner_lr)
        # the training's decaying step (SOBA's inner one is decay ½): η_t = inner_lr / (t + 1)^decay
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.inner, lambda t: (t + 1) ** -inner_decay
        )
        g = torch.Generator().manual_seed(seed)
        self.train = _batches(len(y), batch_size, g)
        self.hyper_train = (self.train_batch(i) for i in _batches(len(y), batch_size, g))
        # the drop-in's hyper steps read ≥ MIN_VAL_BATCH validation examples (256 = this
        # benchmark's batch_size: the same batches as before that default)
        self.val = _batches(len(yv), min(max(batch_size, MIN_VAL_BATCH), len(yv)), g)
        self.steps, self.reads, self.divergences = 0, 0, 0

    def train_batch(self, index):
        return Indexed(index, _rows(self.X, self.y, index))

    def losses(self, z, X, y):  # z: nn.Linear's (classes, features) weight, no bias
        return F.cross_entropy(F.linear(X, z), y, reduction="none")

    def inner_loss(self, batch):  # g on a minibatch (datasets/mnist.py::f_inner)
        index, (X, y) = batch
        return (
            self.weights.weighted_mean(self.losses(self.z, X, y), index, self.normalize)
            + self.reg * (self.z**2).sum()
        )

    def outer_loss(self, batch):  # E of the validation CE losses (f: their mean)
        X, y = batch
        return self.objective(self.losses(self.z, X, y))

    @property
    def samples(self):
        return self.reads + self.sid.cost.samples + self.sid.cost.validation_samples

    def step(self):
        index = next(self.train)
        X, y = _rows(self.X, self.y, index)
        self.reads += len(index)
        with torch.no_grad():
            omega = self.weights.weights(index)
        sid = self.sid
        if sid.v is not None and sid.alpha is not None:  # the drop-in's training cross term
            u = directional_losses(lambda z: self.losses(z, X, y), [self.z], sid.v)
            self.cross.step(index, u, float(sid.alpha))
        loss = weighted_loss(self.losses(self.z, X, y), omega, self.normalize)
        loss = loss + self.reg * (self.z**2).sum()
        self.inner.zero_grad(set_to_none=True)
        loss.backward()
        self.inner.step()
        self.schedule.step()
        self.steps += 1
        if self.steps % self.every == 0 and self.steps >= self.start:
            v_index = next(self.val)
            try:
                sid.step(self.hyper_train, _rows(self.Xv, self.yv, v_index))
            except DivergenceError:
                self.divergences += 1  # λ untouched, v reset by the library: go on


class Algorithm1:
    """``SIDHyperOptimizer.step`` with the default ``SIDConfig()`` (t = k = 100)."""

    def __init__(self, X, y, Xv, yv, z0, x0, reg, batch_size, inner_lr, seed):
        self.X, self.y, self.Xv, self.yv, self.reg = X, y, Xv, yv, reg
        self.objective = MeanLoss()  # f itself (the benchmark's f_outer)
        self.normalize = False  # g itself (the benchmark's f_inner)
        self.z = _linear_weight(z0)
        self.weights = SampleWeights(len(y), sparse_grad=True)
        with torch.no_grad():
            self.weights.logits.copy_(x0)
        self.sid = SIDHyperOptimizer(
            self.weights.hyperparameters, [self.z], DropIn.inner_loss.__get__(self),
            DropIn.outer_loss.__get__(self), LazyAdam(self.weights.hyperparameters, lr=0.1),
            config=SIDConfig(feasible_set=FeasibleSet(project=self.weights.projection)),
        )  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        self.train = (DropIn.train_batch(self, i) for i in _batches(len(y), batch_size, g))
        self.val = _batches(len(yv), batch_size, g)
        self.divergences = 0

    losses = DropIn.losses

    @property
    def samples(self):
        return self.sid.cost.samples + self.sid.cost.validation_samples

    def step(self):
        v_index = next(self.val)
        try:
            self.sid.step(self.train, _rows(self.Xv, self.yv, v_index))
        except DivergenceError:
            self.divergences += 1


class RegularizationSelection:
    """The paper's own problem (``datasets/mnist_oddeven.py``): binary logistic regression w,
    one L2 coefficient per feature, λ = exp(x); ``SIDHyperOptimizer.step`` with the default
    ``SIDConfig()`` (t = k = 100 minibatches per hyper step), the L2 term given as the
    library's ``penalty`` (the proximal map: α from the data term's curvature alone; with the
    penalty inside ``inner_loss`` the adjoint solve diverged on 14 of 15 hyper steps once λ
    moved, and with it as ``penalty`` too while α was the estimated one), α = 0.05 given (the
    data term's L ≤ λ_max(XᵀX)/(4n) = 9.47 on this split: α < 2/L), Adam(lr=0.1) on x (the
    outer step of the ``algorithm1`` regime above). Every other setting is the library's
    default but the minibatch (``batch_size``).

        g(w, x) = mean_B ψ(y xᵀw) + ½ Σᵢ exp(xᵢ) wᵢ²,   f(w) = mean_V ψ(y xᵀw)
    """

    def __init__(self, X, y, Xv, yv, z0, x0, batch_size, seed, outer_lr=0.1, **config):
        self.X, self.y, self.Xv, self.yv = X, y, Xv, yv
        self.z = z0.clone().requires_grad_(True)
        self.x = x0.clone().requires_grad_(True)
        self.sid = SIDHyperOptimizer(
            [self.x], [self.z], self.inner_loss, self.outer_loss,
            torch.optim.Adam([self.x], lr=outer_lr), config=SIDConfig(**config),
            penalty=lambda: [self.x.exp()],
        )  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        self.train = (_rows(X, y, i) for i in _batches(len(y), batch_size, g))
        self.val = _batches(len(yv), batch_size, g)
        self.divergences = 0

    def inner_loss(self, batch):  # the data term; ½ Σ λᵢwᵢ² is the penalty (proximal map)
        X, y = batch
        return F.softplus(-y * (X @ self.z)).mean()

    def outer_loss(self, batch):
        X, y = batch
        return F.softplus(-y * (X @ self.z)).mean()

    @property
    def samples(self):
        return self.sid.cost.samples + self.sid.cost.validation_samples

    def step(self):
        try:
            self.sid.step(self.train, _rows(self.Xv, self.yv, next(self.val)))
        except DivergenceError:
            self.divergences += 1


REGIMES = {"drop_in": DropIn, "algorithm1": Algorithm1}


class Solver(BaseSolver):
    """SID: stochastic implicit differentiation (hypertorch_sid, PyTorch)."""

    name = "SID"
    stopping_criterion = SufficientProgressCriterion(patience=100_000, strategy="callback")
    parameters = {
        "regime": ["drop_in"],
        "inner_lr": [1.0],
        "batch_size": [256],
        "outer_beta1": ["default"],
        "outer_objective": ["f"],
        "normalize": ["false"],
        "random_state": [1],
    }
    requirements = []  # torch and hypertorch_sid come from the project's environment

    def set_objective(
        self, f_inner, f_outer, n_inner_samples, n_outer_samples, inner_var0, outer_var0
    ):
        X_val, y_val = _closure(f_outer, ["X_val", "y_val"])
        if "self" not in inspect.getclosurevars(getattr(f_inner, "__wrapped__", f_inner)).nonlocals:
            return self._set_regularization_selection(f_inner, X_val, y_val, inner_var0, outer_var0)
        self.problem = "data_cleaning"
        X_train, y_train, dataset = _closure(f_inner, ["X_train", "y_train", "self"])
        self.reg = float(dataset.reg)
        b1 = "" if str(self.outer_beta1) == "default" else f"_b1{self.outer_beta1}"
        obj = f"_E{self._outer_objective_name}"  # always written: E is part of the problem
        norm = "_norm" if self._normalize else ""
        self.tag = (
            f"sid_{self.regime}_lr{self.inner_lr}{b1}{obj}{norm}_p{dataset.ratio}"
            f"_seed{self.random_state}"
        )
        self.n_features, self.n_classes = dataset.n_features, dataset.n_classes
        t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        self.X_train, self.X_val = t(X_train), t(X_val)
        self.y_train = torch.as_tensor(np.asarray(y_train).argmax(1))
        self.y_val = torch.as_tensor(np.asarray(y_val).argmax(1))
        self.z0 = t(inner_var0).reshape(self.n_features, self.n_classes)
        self.x0 = t(outer_var0)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        self.inner_var, self.outer_var = inner_var0, outer_var0

    def _set_regularization_selection(self, f_inner, X_val, y_val, inner_var0, outer_var0):
        """datasets/mnist_oddeven.py (labels ±1, one λ per feature): the paper's problem."""
        X_train, y_train = _closure(f_inner, ["X_train", "y_train"])
        self.problem = "regularization_selection"
        self.tag = f"sid_regsel_b{self.batch_size}_seed{self.random_state}"
        t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
        self.X_train, self.y_train = t(X_train), t(y_train)
        self.X_val, self.y_val = t(X_val), t(y_val)
        self.z0, self.x0 = t(inner_var0), t(outer_var0)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        self.inner_var, self.outer_var = inner_var0, outer_var0

    @property
    def _normalize(self) -> bool:
        return str(self.normalize).lower() in ("true", "1")

    @property
    def _outer_objective_name(self) -> str:
        """``outer_objective`` checked: 'f' (the benchmark's f), 'drop_in' (the drop-in's own
        default E) or a name ``LearnedDataWeights(objective=...)`` accepts."""
        name = str(self.outer_objective)
        if name == "default":
            raise ValueError(
                "SID: outer_objective='default' is ambiguous (before session 47 it meant the "
                "drop-in's default objective, now the default is the benchmark's f): write "
                "outer_objective=f (the mean validation cross-entropy, every peer's f) or "
                "outer_objective=drop_in (LearnedDataWeights()'s default objective)."
            )
        return name

    def _outer_objective_kwargs(self) -> dict:
        """The drop-in's ``objective`` argument for E (empty: the drop-in's own default)."""
        name = self._outer_objective_name
        if name == "f":  # the benchmark's f_outer: the mean CE over the validation batch
            return {"objective": MeanLoss()}
        return {} if name == "drop_in" else {"objective": name}

    def run(self, callback):
        torch.manual_seed(self.random_state)
        user = {}  # what a user changes from the drop-in's defaults
        if str(self.outer_beta1) != "default":
            user["outer_betas"] = (float(self.outer_beta1), 0.999)
        if self._normalize:  # Σ ωᵢℓᵢ / Σ ωᵢ: the drop-in's default, NOT the benchmark's g
            user["normalize"] = True
        if self.problem == "regularization_selection":
            method = RegularizationSelection(
                self.X_train, self.y_train, self.X_val, self.y_val, self.z0, self.x0,
                self.batch_size, self.random_state, alpha=0.05,
            )  # fmt: skip
            self._z, self._x = method.z, method.x
            return self._loop(method, callback)
        if self.regime == "drop_in":  # E: part of the problem (the benchmark's f by default)
            user.update(self._outer_objective_kwargs())
        elif self._outer_objective_name != "f" or user:
            raise ValueError(
                f"SID: regime={self.regime!r} minimises the benchmark's f with SIDConfig(); "
                "outer_objective, outer_beta1 and normalize are the drop_in regime's."
            )
        method = REGIMES[self.regime](
            self.X_train, self.y_train, self.X_val, self.y_val, self.z0, self.x0, self.reg,
            self.batch_size, float(self.inner_lr), self.random_state, **user,
        )  # fmt: skip
        self._z, self._x = method.z, method.weights.logits
        self._loop(method, callback)

    def _loop(self, method, callback):
        samples = [0]
        while callback():
            for _ in range(getattr(method, "every", 1)):  # one evaluation per hyper step
                method.step()
            samples.append(method.samples)
        self._save(samples, method.divergences)

    def _save(self, samples, divergences):
        out = os.environ.get("SID_BENCH_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            np.savez(
                Path(out) / f"{self.tag}.npz",
                logits=self._x.detach().numpy(),
                samples=np.array(samples),
                divergences=divergences,
            )

    def get_result(self):
        if hasattr(self, "_z") and self.problem == "regularization_selection":
            self.inner_var = jnp.asarray(self._z.detach().numpy())
            self.outer_var = jnp.asarray(self._x.detach().numpy())
        elif hasattr(self, "_z"):
            self.inner_var = jnp.asarray(self._z.detach().t().numpy().reshape(-1))
            self.outer_var = jnp.asarray(self._x.detach().numpy())
        return dict(inner_var=self.inner_var, outer_var=self.outer_var)
