"""SID (Grazzi, Pontil, Salzo, AISTATS 2021) through ``hypertorch_sid``, as a benchopt solver of
``benchopt/benchmark_bilevel`` (data-cleaning problem).

Copied next to the peers' solvers by ``benchmarks/benchopt/get_benchmark.sh`` so that one
``benchopt run`` times every method the same way. The data are read from the closures of the
benchmark's own ``f_inner`` / ``f_outer`` (``datasets/mnist.py``), so the split, corruption,
scaling and regulariser are theirs; the model is the same multinomial logistic regression,

    g(z, x) = (1/|B|) Σ_{i∈B} σ(xᵢ) CE(Xᵢ z, yᵢ) + reg ‖z‖²,    f(z) = mean CE on validation,

in torch (float32, CPU), with z₀, x₀ the objective's initial point. Test/validation errors are
computed by the benchmark's own ``metrics`` on the returned (z, x).

The weights are the library's per-sample family: ``SampleWeights`` (sigmoid, x₀ = the objective's
start), minibatches carry their example ids (``Indexed``), the outer optimizer is ``LazyAdam``
(moves only the rows a hypergradient touched), as ``docs/data_weights.md`` recommends.

Parameters: ``d2`` — ``"minibatch"`` (library default, J = 1: the ∂₂Φ̂ term reads one fresh
minibatch, so a hyper step moves only that minibatch's weights) or ``"full"`` (the documented
option ``Batches(d2="full")`` with ``full_train_batch``: every weight each hyper step); ``lr`` —
LazyAdam's step on the logits (0.1 as in the library's docs); ``on_divergence`` — ``"raise"``
(the library default; a diverged hyper step leaves x untouched and the solver goes on) or
``"recover"`` (``Recover(2)``: re-estimate the curvature and retry). Everything else is
``SIDHyperOptimizer``'s default ``SIDConfig()``.

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

    from hypertorch_sid import Batches, FeasibleSet, SIDConfig, SIDHyperOptimizer
    from hypertorch_sid.core.divergence import Recover
    from hypertorch_sid.core.errors import DivergenceError
    from hypertorch_sid.core.sample_weights import Indexed, LazyAdam, SampleWeights


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


class _Rows:
    """A map-style dataset of in-memory tensors read a minibatch at a time: ``rows[ids]`` is one
    ``Indexed(ids, (X, y))`` (one gather per batch, as the peers slice their arrays in JAX)."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, ids):
        ids = torch.as_tensor(ids)
        return Indexed(ids, (self.X[ids], self.y[ids]))


class _Counter:
    """Counts the examples each loss evaluation reads (samples read)."""

    def __init__(self):
        self.samples = 0

    def __call__(self, n):
        self.samples += int(n)


class Solver(BaseSolver):
    """SID: stochastic implicit differentiation (hypertorch_sid, PyTorch)."""

    name = "SID"
    stopping_criterion = SufficientProgressCriterion(patience=100_000, strategy="callback")
    parameters = {
        "d2": ["minibatch"],
        "lr": [0.1],
        "on_divergence": ["raise"],
        "batch_size": [64],
        "random_state": [1],
    }
    requirements = []  # torch and hypertorch_sid come from the project's environment

    def set_objective(
        self, f_inner, f_outer, n_inner_samples, n_outer_samples, inner_var0, outer_var0
    ):
        X_train, y_train, dataset = _closure(f_inner, ["X_train", "y_train", "self"])
        X_val, y_val = _closure(f_outer, ["X_val", "y_val"])
        self.reg = float(dataset.reg)
        self.tag = (
            f"sid_{self.d2}_lr{self.lr}_{self.on_divergence}_p{dataset.ratio}"
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

    def _problem(self, counter):
        z = self.z0.clone().requires_grad_(True)
        weights = SampleWeights(len(self.y_train))
        with torch.no_grad():
            weights.logits.copy_(self.x0)  # the objective's start, x₀ = -2
        reg = self.reg

        def inner_loss(batch):  # g on a minibatch (datasets/mnist.py::f_inner)
            index, (X, y) = batch
            counter(len(index))
            losses = F.cross_entropy(X @ z, y, reduction="none")
            return weights.weighted_mean(losses, index) + reg * (z**2).sum()

        def outer_loss(batch):  # f: mean CE on validation (f_outer)
            X, y = batch
            counter(len(y))
            return F.cross_entropy(X @ z, y)

        return z, weights, inner_loss, outer_loss

    def run(self, callback):
        torch.manual_seed(self.random_state)
        counter = _Counter()
        z, weights, inner_loss, outer_loss = self._problem(counter)
        train = _Rows(self.X_train, self.y_train)
        sampler = torch.utils.data.BatchSampler(
            torch.utils.data.RandomSampler(
                train, generator=torch.Generator().manual_seed(self.random_state)
            ),
            self.batch_size,
            drop_last=False,
        )
        loader = torch.utils.data.DataLoader(train, sampler=sampler, batch_size=None)
        config = SIDConfig(feasible_set=FeasibleSet(project=weights.projection))
        full_train_batch = None
        if self.d2 == "full":
            full_train_batch = train[range(len(train))]
            config = config.replace(batches=Batches(d2="full"))
        if self.on_divergence == "recover":
            config = config.replace(on_divergence=Recover(2))
        hopt = SIDHyperOptimizer(
            weights.hyperparameters,
            [z],
            inner_loss,
            outer_loss,
            LazyAdam(weights.hyperparameters, lr=float(self.lr)),
            config=config,
            full_train_batch=full_train_batch,
        )
        val = (self.X_val, self.y_val)
        self._z, self._x = z, weights.logits
        samples, divergences = [0], 0
        while callback():
            try:
                hopt.step(loader, val)
            except DivergenceError:
                divergences += 1  # x untouched, v reset by the library: go on
            samples.append(counter.samples)
        self._save(samples, divergences)

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
        if hasattr(self, "_z"):
            self.inner_var = jnp.asarray(self._z.detach().numpy().reshape(-1))
            self.outer_var = jnp.asarray(self._x.detach().numpy())
        return dict(inner_var=self.inner_var, outer_var=self.outer_var)
