"""Hypergradient accuracy per unit of compute: hypertorch_sid vs torchopt, betty and higher.

Problem (MNIST odd vs even, the paper's section 5 with per-pixel weight decay): binary logistic
regression without bias, pixels in [0, 1], labels ±1 (odd = +1), float64,

    f(λ) = mean_val ψ(y xᵀw(λ)),   w(λ) = argmin_w mean_train ψ(y xᵀw) + ½ Σ_j λ_j w_j²,

ψ(u) = log(1 + e^{−u}), 784 hyperparameters λ_j log-uniform in [1e-3, 1e-1] (seed 0). The truth
∇f(λ) comes from Newton's method on the inner problem (‖∇ℓ‖ ≤ 1e-11, dense Hessian) and a direct
solve of ∇²₁₁ℓ u = ∇₁E. Metric: relative squared error ‖ĝ − ∇f‖² / ‖∇f‖² of ONE cold-started
hypergradient (w₀ = 0, v₀ = 0) against

* **epochs**: training samples read by every gradient, Hessian–vector product and mixed product
  (inner solve, adjoint/linear solve, curvature estimation, the ∂²ℓ/∂λ∂w term), divided by n_tr.
  The library's and the peers' loss evaluations are counted by a wrapper around the inner loss;
  products that re-use a retained graph (torchopt's and betty's matvecs, higher's reverse sweep)
  are counted explicitly (one batch each). Validation passes are not counted (the same for all).
* **seconds**: wall time of the whole hypergradient (1 thread).

Methods, each one (name, factory) entry in ``library_methods()`` / ``peer_methods()``:

* the library: ``SIDHyperOptimizer`` with its defaults (``step_size="two_phase"`` since 0.2; L and
  λ_min estimated by Lanczos on 4 minibatches, J = 1), ``"decreasing"`` (0.1's default), the
  paper's *Batch*
  preset (GD, L and μ given), and every adjoint solver of ``hypertorch_sid.core`` that the
  optimizer accepts as ``adjoint_solver=`` (found at run time);
* torchopt 0.7.3: ``torchopt.diff.implicit.custom_root`` with ``solve_cg``, ``solve_normal_cg``
  and ``solve_inv(ns=True)`` (Neumann series, α = 1/L);
* betty-ml 0.1.1: its hypergradient functions ``betty.hypergradient.cg`` / ``neumann`` called
  directly with a minimal stand-in for its ``Problem`` objects (``_BettyProblem``): betty's
  ``Engine`` owns the training loop and offers no way to time one cold-started hypergradient
  against a fixed budget. **Bug found in betty-ml 0.1.1's CG** (``betty/hypergradient/cg.py``): the
  search direction is updated with the *old* residual, ``p_new = r + β p`` instead of
  ``r_new + β p`` (and ``r`` is updated with the unscaled HVP while the step uses the
  ``cg_alpha``-scaled one). It is benchmarked as shipped (not fixed): it stalls far from the
  solution, which the correct CG of torchopt and the library shows;
* higher 0.2.1: reverse-mode differentiation through the unrolled inner GD/SGD steps.

The peers' inner problem is solved by our own loop, identical for all of them: full-batch GD with
α = 2/(L+μ), or minibatch SGD with step α·η_t (η_t the library's two-phase schedule); then the
peer's linear solve uses full-batch Hessian–vector products. L = λ_max(XᵀX)/(4n) + max λ and
μ = min λ are given to the peers (and to the library's *Batch* entry) for free.

A second part (``scaling``) times one ``SIDHyperOptimizer.step`` and its peak memory (process
peak resident set size sampled every millisecond by a thread, minus the resident size before the
steps; falls back to ``ru_maxrss`` growth) as the number of
hyperparameters grows on a synthetic least-squares model with d = 10⁶ weights (per-element weight
decay grouped into h groups) and as n_tr grows on the logistic problem.

Run from the repository root::

    python benchmarks/bench_peers.py                 # n_tr = 5000, budgets 10, 20, 50, 200 epochs
    python benchmarks/bench_peers.py --n 30000       # the second size
    python benchmarks/bench_peers.py --quick         # seconds; writes to a temporary directory

It prints Markdown tables and writes ``benchmarks/results/peers/peers_n<n>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import importlib
import inspect
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hypertorch_sid import Batches, EstimatedCurvature, FeasibleSet, KnownCurvature, SIDConfig

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data" / "mnist"
RESULTS = REPO / "benchmarks" / "results" / "peers"  # n = 5000 is the summary; others in runs/

FULL = dict(
    n=5000,
    budgets=[10, 20, 50, 200],
    batch_size=50,
    hyper_counts=[1, 10, 784, 10_000, 100_000, 1_000_000],
    scaling_d=1_000_000,
    scaling_n=[1000, 5000, 30000, 60000],
    scaling_steps=20,
    scaling_n_steps=(100, 10),
    scaling_repeats=3,
)
QUICK = dict(
    n=300,
    budgets=[2, 6, 20],
    batch_size=20,
    hyper_counts=[1, 10, 1000],
    scaling_d=1000,
    scaling_n=[200, 800],
    scaling_steps=5,
    scaling_n_steps=(10, 2),
    scaling_repeats=2,
)
SYNTH_FEATURES = 784
PEER_PACKAGES = ("torchopt", "betty", "higher")


# ------------------------------------------------------------------------------------------ data
def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist_odd_even(data: Path, n_tr: int, n_val: int, seed: int) -> tuple[Any, Any]:
    """(X, y) train and validation splits drawn without overlap from MNIST's 60 000 training
    images; x/255 in float64, y = +1 for odd digits, −1 for even."""
    images = data / "train-images-idx3-ubyte.gz"
    labels = data / "train-labels-idx1-ubyte.gz"
    if not (images.exists() and labels.exists()):
        raise SystemExit(
            f"MNIST not found in {data.resolve()} (train-images-idx3-ubyte.gz, "
            "train-labels-idx1-ubyte.gz): pass --data DIR, or --synthetic."
        )
    X = _read_idx(images).reshape(-1, 784)
    y = _read_idx(labels)
    if n_tr + n_val > len(y):
        raise SystemExit(f"n_tr + n_val = {n_tr + n_val} > {len(y)} MNIST training images")
    perm = np.random.default_rng(seed).permutation(len(y))
    tr, va = perm[:n_tr], perm[n_tr : n_tr + n_val]

    def split(ix: np.ndarray) -> tuple[Tensor, Tensor]:
        x = torch.from_numpy(X[ix].astype(np.float64) / 255.0)
        return x, torch.from_numpy(np.where(y[ix] % 2 == 1, 1.0, -1.0))

    return split(tr), split(va)


def synthetic_odd_even(n_tr: int, n_val: int, seed: int, d: int = SYNTH_FEATURES) -> Any:
    """MNIST-shaped stand-in: sparse non-negative features in [0, 1], labels of a noisy linear
    rule (used by the tests and by ``--synthetic``)."""
    gen = torch.Generator().manual_seed(seed)
    n = n_tr + n_val
    X = torch.rand(n, d, generator=gen, dtype=torch.float64)
    X.mul_(torch.rand(n, d, generator=gen, dtype=torch.float32) < 0.2)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    y = torch.sign(X @ w - (X @ w).median() + 0.5 * torch.randn(n, generator=gen).double())
    y[y == 0] = 1.0
    return (X[:n_tr], y[:n_tr]), (X[n_tr:], y[n_tr:])


# --------------------------------------------------------------------------------------- problem
def inner_loss(w: Tensor, lam: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch
    return F.softplus(-y * (x @ w)).mean() + 0.5 * (lam * w * w).sum()


def outer_loss(w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch
    return F.softplus(-y * (x @ w)).mean()


def hessian(w: Tensor, lam: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, _ = batch
    p = torch.sigmoid(x @ w)
    return (x.T * (p * (1 - p) / x.shape[0])) @ x + torch.diag(lam.expand_as(w))


def exact_hypergradient(lam: Tensor, train: Any, val: Any, gtol: float = 1e-11) -> dict:
    """Newton (dense Hessian, backtracking) to ‖∇₁ℓ‖ ≤ gtol, then ∇f = −∇²₂₁ℓ H⁻¹ ∇₁E, where
    ∇²₂₁ℓ u = w ⊙ u for the weight decay ½ Σ λ_j w_j² (as in examples/_paper_common.py, written
    out for this problem so that it depends on nothing else)."""
    start = time.perf_counter()
    w = torch.zeros(train[0].shape[1], dtype=torch.float64)

    def grad(w: Tensor, lam: Tensor, batch: Any) -> Tensor:  # closed form of ∇₁ℓ
        x, y = batch
        return -(x.T @ (y * torch.sigmoid(-y * (x @ w)))) / x.shape[0] + lam * w

    steps = 0
    for steps in range(1, 101):  # noqa: B007
        g = grad(w, lam, train)
        if float(g.norm()) <= gtol:
            break
        step = torch.linalg.solve(hessian(w, lam, train), g)
        t, value = 1.0, float(inner_loss(w, lam, train))
        while t > 1e-10 and float(inner_loss(w - t * step, lam, train)) > value - 1e-4 * t * float(
            g @ step
        ):
            t /= 2
        w = w - t * step
    gnorm = float(grad(w, lam, train).norm())
    w_ = w.clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(outer_loss(w_, val), w_)
    u = torch.linalg.solve(hessian(w, lam, train), g1)
    return {
        "hypergradient": -(w * u),
        "w": w,
        "newton_steps": steps,
        "inner_grad_norm": gnorm,
        "seconds": time.perf_counter() - start,
    }


@dataclass
class Counter:
    """Training samples read by gradient-type evaluations."""

    samples: int = 0

    def add(self, batch: Any) -> None:
        self.samples += int(batch[0].shape[0])


class Minibatches:
    """Re-iterable minibatches: each pass is a fresh permutation (one epoch)."""

    def __init__(self, X: Tensor, y: Tensor, batch_size: int, seed: int) -> None:
        self.X, self.y, self.batch_size = X, y, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:  # minibatches per epoch, as a DataLoader with drop_last has
        return len(self.y) // self.batch_size

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        perm = torch.randperm(len(self.y), generator=self.gen)
        for i in range(0, len(perm) - self.batch_size + 1, self.batch_size):
            ix = perm[i : i + self.batch_size]
            yield self.X[ix], self.y[ix]


def endless(batches: Minibatches) -> Iterator[tuple[Tensor, Tensor]]:
    while True:
        yield from batches


@dataclass
class Context:
    """One benchmark problem: data, λ, constants, truth."""

    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    lam: Tensor
    batch_size: int
    seed: int
    L: float = 0.0
    mu: float = 0.0
    truth: Tensor = field(default_factory=lambda: torch.zeros(0))

    @property
    def n(self) -> int:
        return int(self.train[1].shape[0])

    @property
    def d(self) -> int:
        return int(self.train[0].shape[1])

    def loader(self) -> Minibatches:
        return Minibatches(*self.train, self.batch_size, self.seed)

    def steps(self, epochs: float, batch: int | None = None) -> int:
        """Steps on batches of ``batch`` samples (default: the minibatch size) in ``epochs``."""
        return max(1, round(epochs * self.n / (batch or self.batch_size)))


def make_context(train: Any, val: Any, batch_size: int, seed: int) -> Context:
    d = train[0].shape[1]
    gen = torch.Generator().manual_seed(seed)
    lam = 10.0 ** (torch.rand(d, generator=gen, dtype=torch.float64) * 2 - 3)  # [1e-3, 1e-1]
    ctx = Context(train, val, lam, batch_size, seed)
    X = train[0]
    ctx.L = float(torch.linalg.eigvalsh(X.T @ X)[-1]) / (4 * ctx.n) + float(lam.max())
    ctx.mu = float(lam.min())
    ctx.truth = exact_hypergradient(lam, train, val)["hypergradient"]
    return ctx


# --------------------------------------------------------------------------------------- library
Result = dict[str, Any]
Factory = Callable[[Context, float], Result]


def _sid(
    ctx: Context,
    epochs: float,
    adjoint_epochs: float | None = None,
    one_shot: bool = False,
    **kw: Any,
) -> Result:
    """One cold-started hypergradient of ``SIDHyperOptimizer``: t = k = the minibatch steps in
    epochs/2 each (full-batch solves: one step per epoch), unless ``kw`` says otherwise. The
    minibatches come from a re-iterable source with a length, like a ``DataLoader``, or with
    ``one_shot`` from an endless generator over it (no epoch the library could read)."""
    from hypertorch_sid import SIDHyperOptimizer

    counter = Counter()
    w = torch.zeros(ctx.d, dtype=torch.float64, requires_grad=True)
    lam = ctx.lam.clone().requires_grad_(True)

    def loss(batch: Any) -> Tensor:
        counter.add(batch)
        return inner_loss(w, lam, batch)

    full_batch = kw.pop("full_train_batch", None)
    batches = kw.get("batches", Batches())
    full = batches.inner == "full"
    kw.setdefault("inner_steps", ctx.steps(epochs / 2, ctx.n if full else None))
    adj_full = batches.adjoint == "full"
    kw.setdefault(
        "adjoint_steps", ctx.steps(adjoint_epochs or epochs / 2, ctx.n if adj_full else None)
    )
    opt = SIDHyperOptimizer(
        [lam], [w], inner_loss=loss, outer_loss=lambda b: outer_loss(w, b),
        full_train_batch=full_batch, config=SIDConfig(**kw),
    )  # fmt: skip
    (g,) = opt.hypergradient(endless(ctx.loader()) if one_shot else ctx.loader(), ctx.val)
    return {"g": g.detach(), "samples": counter.samples, "library_cost_samples": opt.cost.samples}


def _samples_per_step(solver: Any, ctx: Context) -> int:
    """Samples one adjoint step of ``solver`` reads: a minibatch per ``batches``, the full batch,
    or (variance-reduced) a minibatch plus its share of the anchor's epoch."""
    if type(solver).__name__ == "VarianceReduced":
        return 2 * ctx.batch_size
    batches = getattr(solver, "batches", 1)
    return ctx.n if batches == "full" else int(batches) * ctx.batch_size


def _sid_with_solver(solver: Any) -> Factory:
    """The two-phase SID inner solve with ``solver`` for the adjoint system; k is chosen so the
    adjoint solve reads about epochs/2 of data (a full-batch operator: one epoch per step). A
    full-batch CG gets the true L, μ (its α needs no estimate); the others estimate them."""

    def run(ctx: Context, epochs: float) -> Result:
        k = max(1, round(epochs / 2 * ctx.n / _samples_per_step(solver, ctx)))
        full = getattr(solver, "batches", None) == "full"
        given = full and type(solver).__name__ == "ConjugateGradient"
        return _sid(
            ctx,
            epochs,
            step_size="two_phase",
            adjoint_solver=solver,
            adjoint_steps=k,
            full_train_batch=ctx.train if full else None,
            curvature=KnownCurvature(ctx.L, ctx.mu) if given else EstimatedCurvature(),
        )

    return run


def adjoint_solvers() -> list[tuple[str, Any]]:
    """Every adjoint solver in ``hypertorch_sid.core`` that ``SIDHyperOptimizer`` accepts as
    ``adjoint_solver=`` (none while that argument does not exist), besides the paper's iteration
    and the default ``Automatic`` (rows of their own):
    each one's default instance and, where it takes ``batches``, the full-batch one."""
    core = importlib.import_module("hypertorch_sid.core")
    solvers_mod = importlib.import_module("hypertorch_sid.core.solvers")
    config = getattr(core, "SIDConfig", None)  # since 0.2 the strategies are SIDConfig fields
    fields = {f.name for f in dataclasses.fields(config)} if config is not None else set()
    accepted = fields | set(inspect.signature(core.SIDHyperOptimizer).parameters)
    if "adjoint_solver" not in accepted:
        return []
    base = getattr(solvers_mod, "AdjointSolver", None)
    if base is None:
        return []
    found = []
    for name in sorted(set(dir(core)) | set(dir(solvers_mod))):
        cls = getattr(core, name, None) or getattr(solvers_mod, name, None)
        if not (isinstance(cls, type) and issubclass(cls, base)) or cls is base:
            continue
        if inspect.isabstract(cls) or name in ("FixedPointIteration", "Automatic"):
            continue
        try:
            found.append((name, cls()))
            if "batches" in inspect.signature(cls).parameters:
                found.append((f"{name}(batches='full')", cls(batches="full")))
        except TypeError:  # needs arguments we do not know
            continue
    return found


def _fixed_point_iteration() -> Any:
    """The paper's adjoint iteration, pinned where a full batch is given only for d2 and for the
    old defaults (since 0.3 the default ``Automatic`` may run CG there, also on an epoch of the
    loader); None before solvers existed."""
    cls = getattr(importlib.import_module("hypertorch_sid.core"), "FixedPointIteration", None)
    return cls() if cls is not None else None


def _no_preconditioner() -> Any:
    return importlib.import_module("hypertorch_sid.core").NoPreconditioner()


#: the defaults on minibatches from a DataLoader-like source (Automatic may read an epoch for CG)
DEFAULTS = "SID defaults, minibatches from a loader (Automatic: PCG on an epoch or KM)"
#: the defaults on an endless generator of minibatches (no epoch to read: the KM iteration)
DEFAULTS_ONE_SHOT = "SID defaults, one-shot minibatch stream (two_phase + FisherDiagonal, KM)"


def library_methods() -> list[tuple[str, Factory]]:
    """The library's configurations; a new one is one more line."""
    methods: list[tuple[str, Factory]] = [
        (DEFAULTS, lambda ctx, E: _sid(ctx, E)),
        (DEFAULTS_ONE_SHOT, lambda ctx, E: _sid(ctx, E, one_shot=True)),
        (
            "SID defaults, full_train_batch given (Automatic: PCG or KM)",
            lambda ctx, E: _sid(ctx, E, full_train_batch=ctx.train),
        ),
        (
            "SID two_phase, unpreconditioned (0.2.0 default)",
            lambda ctx, E: _sid(
                ctx, E, preconditioner=_no_preconditioner(), adjoint_solver=_fixed_point_iteration()
            ),
        ),
        (
            "SID decreasing (0.1 default)",
            lambda ctx, E: _sid(
                ctx,
                E,
                step_size="decreasing",
                preconditioner=_no_preconditioner(),
                adjoint_solver=_fixed_point_iteration(),
            ),  # fmt: skip
        ),
        (
            "SID two_phase, d2 full (L, μ given)",
            lambda ctx, E: _sid(
                ctx,
                E - 1,
                step_size="two_phase",
                curvature=KnownCurvature(ctx.L, ctx.mu),
                batches=Batches(d2="full"),
                full_train_batch=ctx.train,
                adjoint_solver=_fixed_point_iteration(),
            ),
        ),
        (
            "SID Batch (GD, L, μ given)",
            lambda ctx, E: _sid(
                ctx,
                E,
                step_size="constant",
                eta=1.0,
                curvature=KnownCurvature(ctx.L, ctx.mu),
                batches=Batches(inner="full", adjoint="full", d2="full"),
                full_train_batch=ctx.train,
                adjoint_epochs=E / 2 - 1,
            ),
        ),
    ]
    for name, solver in adjoint_solvers():
        methods.append((f"SID two_phase + {name}", _sid_with_solver(solver)))
    return methods


# ----------------------------------------------------------------------------------------- peers
def _alpha(ctx: Context) -> float:
    return 2.0 / (ctx.L + ctx.mu)


def _lr_schedule(ctx: Context, steps: int, full: bool) -> Callable[[int], float]:
    """GD: η = 1. SGD: the library's two-phase η_t (constant, then β/(γ + t − t₀))."""
    if full:
        return lambda t: 1.0
    from hypertorch_sid import make_schedule, theory_constants

    return make_schedule("two_phase", q=theory_constants(ctx.L, ctx.mu).q, steps=steps)


def peer_inner_solve(ctx: Context, epochs: float, full: bool, counter: Counter) -> Tensor:
    """The peers' inner solve (our loop): GD (full) or SGD (minibatch) with step α·η_t."""
    steps = max(1, round(epochs)) if full else ctx.steps(epochs)
    batches = endless(ctx.loader())
    eta = _lr_schedule(ctx, steps, full)
    alpha = _alpha(ctx)
    w = torch.zeros(ctx.d, dtype=torch.float64)
    for t in range(steps):
        batch = ctx.train if full else next(batches)
        w_ = w.requires_grad_(True)
        counter.add(batch)
        (g,) = torch.autograd.grad(inner_loss(w_, ctx.lam, batch), w_)
        w = (w_ - alpha * eta(t) * g).detach()
    return w


def torchopt_method(kind: str, full: bool) -> Factory:
    """torchopt's implicit differentiation (``custom_root``) of the optimality condition
    ∇₁ℓ(w, λ) = 0 with the linear solver ``kind`` on full-batch products."""

    def run(ctx: Context, epochs: float) -> Result:
        import torchopt
        from torchopt.diff.implicit import custom_root

        counter = Counter()
        w_t = peer_inner_solve(ctx, epochs / 2, full, counter)
        # full-batch passes outside the solver: 2 evaluations of the optimality function
        # (torchopt builds two vjps) and the mixed product
        linear = max(1.0, epochs / 2 - 3)
        if kind == "cg":
            solver = torchopt.linear_solve.solve_cg(maxiter=max(1, round(linear) - 1), rtol=0.0)
        elif kind == "normal_cg":
            iters = max(1, round((linear - 1) / 2))
            solver = torchopt.linear_solve.solve_normal_cg(maxiter=iters, rtol=0.0)
        else:
            solver = torchopt.linear_solve.solve_inv(
                ns=True, maxiter=max(1, round(linear)), alpha=1.0 / ctx.L
            )
        matvecs = [0]

        def counting_solve(matvec: Callable, b: Any) -> Any:
            def counted(u: Any) -> Any:
                matvecs[0] += 1
                return matvec(u)

            return solver(counted, b)

        grad_w = torch.func.grad(lambda w, lam, X, y: _counted_inner(counter, w, lam, (X, y)))

        def optimality(w: Tensor, lam: Tensor, X: Tensor, y: Tensor) -> Tensor:
            return grad_w(w, lam, X, y)

        @custom_root(optimality, argnums=1, solve=counting_solve)
        def solve(w0: Tensor, lam: Tensor, X: Tensor, y: Tensor) -> Tensor:
            return w_t.clone()

        lam = ctx.lam.clone().requires_grad_(True)
        w = solve(torch.zeros_like(w_t), lam, *ctx.train)
        (g,) = torch.autograd.grad(outer_loss(w, ctx.val), lam)
        counter.samples += (matvecs[0] + 1) * ctx.n  # the matvecs and the mixed product
        return {"g": g.detach(), "samples": counter.samples, "matvecs": matvecs[0]}

    return run


def _counted_inner(counter: Counter, w: Tensor, lam: Tensor, batch: Any) -> Tensor:
    counter.add(batch)
    return inner_loss(w, lam, batch)


class _BettyProblem:
    """The attributes of betty's ``Problem`` that ``betty.hypergradient.cg``/``neumann`` read."""

    def __init__(self, params: list[Tensor], config: Any = None, loss: Any = None, batch=None):
        self._params, self.config, self._loss, self.cur_batch = params, config, loss, batch
        self.paths: list = []

    def training_step_exec(self, batch: Any) -> Tensor:
        return self._loss(batch)

    def trainable_parameters(self) -> list[Tensor]:
        return self._params

    def parameters(self) -> list[Tensor]:
        return self._params


def betty_method(kind: str, full: bool) -> Factory:
    """betty's ``cg`` (as shipped, with its bug) or ``neumann`` on full-batch products."""

    def run(ctx: Context, epochs: float) -> Result:
        from betty.configs import Config
        from betty.hypergradient import cg, neumann

        counter = Counter()
        w_t = peer_inner_solve(ctx, epochs / 2, full, counter)
        iters = max(1, round(epochs / 2 - 2))  # 2 passes: the gradient graph, the mixed product
        if kind == "cg":
            config = Config(type="cg", cg_iterations=iters, cg_alpha=1.0)
        else:
            config = Config(type="neumann", neumann_iterations=iters, neumann_alpha=1.0 / ctx.L)
        w = w_t.clone().requires_grad_(True)
        lam = ctx.lam.clone().requires_grad_(True)
        lower = _BettyProblem(
            [w], config, lambda b: _counted_inner(counter, w, lam, b), batch=ctx.train
        )
        upper = _BettyProblem([lam])
        (dE_dw,) = torch.autograd.grad(outer_loss(w, ctx.val), w)
        (g,) = (cg if kind == "cg" else neumann)([dE_dw], lower, upper)
        counter.samples += (iters + 1) * ctx.n  # the HVPs on the retained graph, mixed product
        return {"g": g.detach(), "samples": counter.samples, "iterations": iters}

    return run


def higher_method(full: bool) -> Factory:
    """higher: reverse mode through the unrolled inner GD/SGD steps (epochs/2 forward, the
    reverse sweep counted as one HVP-sized pass per step)."""

    def run(ctx: Context, epochs: float) -> Result:
        import higher

        counter = Counter()
        steps = max(1, round(epochs / 2)) if full else ctx.steps(epochs / 2)
        model = torch.nn.Linear(ctx.d, 1, bias=False).double()
        with torch.no_grad():
            model.weight.zero_()
        lam = ctx.lam.clone().requires_grad_(True)
        alpha = _alpha(ctx)
        eta = _lr_schedule(ctx, steps, full)
        opt = torch.optim.SGD(model.parameters(), lr=alpha)
        batches = endless(ctx.loader())
        with higher.innerloop_ctx(model, opt, copy_initial_weights=True) as (fmodel, diffopt):
            for t in range(steps):
                x, y = ctx.train if full else next(batches)
                counter.add((x,))
                (w,) = fmodel.parameters()
                loss = F.softplus(-y * fmodel(x).squeeze(1)).mean() + 0.5 * (lam * w[0] ** 2).sum()
                diffopt.step(loss, override={"lr": [alpha * eta(t)]})
            (w,) = fmodel.parameters()
            (g,) = torch.autograd.grad(outer_loss(w[0], ctx.val), lam)
        counter.samples *= 2  # the reverse sweep through every step
        return {"g": g.detach(), "samples": counter.samples, "steps": steps}

    return run


def peer_methods() -> list[tuple[str, str, Factory]]:
    """(package, name, factory); the package is checked for before running."""
    out: list[tuple[str, str, Factory]] = []
    for full, tag in ((True, "GD"), (False, "SGD")):
        out += [
            ("torchopt", f"torchopt CG ({tag} inner)", torchopt_method("cg", full)),
            ("torchopt", f"torchopt normal-CG ({tag} inner)", torchopt_method("normal_cg", full)),
            ("torchopt", f"torchopt Neumann ({tag} inner)", torchopt_method("neumann", full)),
            ("betty", f"betty CG, as shipped ({tag} inner)", betty_method("cg", full)),
            ("betty", f"betty Neumann ({tag} inner)", betty_method("neumann", full)),
            ("higher", f"higher unrolled ({tag})", higher_method(full)),
        ]
    return out


def installed(package: str) -> str | None:
    """The package's version if importable, else None."""
    try:
        mod = importlib.import_module(package)
    except Exception:  # noqa: BLE001 - a broken optional install counts as absent
        return None
    version = getattr(mod, "__version__", None)
    if version is None:
        with contextlib.suppress(Exception):
            from importlib.metadata import version as dist_version

            version = dist_version({"betty": "betty-ml"}.get(package, package))
    return str(version or "unknown")


# ------------------------------------------------------------------------------------ accuracy
def rel_error(g: Tensor, truth: Tensor) -> float:
    return float(((g.double() - truth) ** 2).sum() / (truth**2).sum())


def run_accuracy(
    ctx: Context, budgets: list[float], peers: bool, only: list[str] | None = None
) -> dict[str, Any]:
    """Every method (``only``: those whose name contains one of these strings) at every budget."""
    methods: list[tuple[str, str, Factory]] = [
        ("hypertorch_sid", n, f) for n, f in library_methods()
    ]
    versions = {p: installed(p) for p in PEER_PACKAGES}
    if peers:
        methods += peer_methods()
    if only:
        methods = [m for m in methods if any(part in m[1] for part in only)]
    out: dict[str, Any] = {}
    for package, name, factory in methods:
        if package != "hypertorch_sid" and versions[package] is None:
            out[name] = {"package": package, "skipped": f"{package} is not installed"}
            print(f"{name}: skipped ({package} not installed)", flush=True)
            continue
        rows = []
        for E in budgets:
            torch.manual_seed(ctx.seed)
            start = time.perf_counter()
            try:
                res = factory(ctx, E)
            except Exception as err:  # noqa: BLE001 - a peer failing is a result, reported
                rows.append({"budget": E, "error": f"{type(err).__name__}: {err}"})
                print(f"{name} @ {E} epochs: FAILED {type(err).__name__}: {err}", flush=True)
                continue
            seconds = time.perf_counter() - start
            row = {
                "budget": E,
                "epochs": res["samples"] / ctx.n,
                "seconds": seconds,
                "rel_error": rel_error(res["g"], ctx.truth),
            }
            row.update({k: v for k, v in res.items() if k not in ("g", "samples")})
            rows.append(row)
            print(
                f"{name} @ {E:g}: {row['epochs']:.1f} ep, {seconds:.2f} s, "
                f"rel. sq. error {row['rel_error']:.3e}",
                flush=True,
            )
        out[name] = {"package": package, "rows": rows}
    return {"methods": out, "versions": versions}


# ------------------------------------------------------------------------------------- memory
def _rss_kib(field_name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@contextlib.contextmanager
def peak_memory(interval: float = 0.001) -> Iterator[dict[str, Any]]:
    """Peak resident memory growth (MiB) of the block: a thread samples VmRSS (/proc/self/status)
    every ``interval`` seconds; the peak minus VmRSS before. The kernel's own high-water mark
    (VmHWM) cannot be reset in every container (``/proc/self/clear_refs`` is refused here), so it
    would report the process's all-time peak; sampling can miss spikes shorter than ``interval``.
    Allocations the process had already freed to its allocator and re-uses are not counted (the
    same for every method measured in one process)."""
    import threading

    info: dict[str, Any] = {}
    before = _rss_kib("VmRSS")
    if before is None:  # no /proc: ru_maxrss growth, a lower bound
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        yield info
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
        info.update(peak_mib=max(0, grown) / 1024, memory_method="ru_maxrss growth")
        return
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kib("VmRSS") or 0)
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield info
    finally:
        done.set()
        thread.join()
        peak[0] = max(peak[0], _rss_kib("VmRSS") or 0)
        info["peak_mib"] = max(0, peak[0] - before) / 1024
        info["memory_method"] = f"VmRSS sampled every {interval * 1e3:g} ms, peak - before"


# ------------------------------------------------------------------------------------- scaling
def _time_steps(make: Callable[[], Callable[[], Any]], repeats: int) -> dict[str, Any]:
    step = make()
    with peak_memory() as mem:  # the first step: later ones re-use what the allocator kept
        step()  # also the warm-up (constants, checks)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"seconds_per_step": statistics.median(times), "seconds_all": times, **mem}


def scaling_hyperparameters(cfg: dict, seed: int) -> list[dict[str, Any]]:
    """One ``SIDHyperOptimizer.step`` (t = k = ``scaling_steps`` minibatch steps of 64,
    two-phase, α given) on least squares with W ∈ R^{m×m}, m² = d, and per-element weight decay
    ½ Σ_j λ_{j mod h} W_j² with h hyperparameters; each h in its own process."""
    m = int(round(math.sqrt(cfg["scaling_d"])))
    rows = []
    for h in cfg["hyper_counts"]:
        if h > m * m:
            continue
        row = _isolated({"kind": "hyper", "h": h}, cfg, seed)
        rows.append(row)
        print(
            f"scaling h = {h}: {row['seconds_per_step'] * 1e3:.1f} ms/step, "
            f"peak +{row['peak_mib']:.1f} MiB",
            flush=True,
        )
    return rows


def _hyper_row(cfg: dict, seed: int, h: int) -> dict[str, Any]:
    from hypertorch_sid import SIDHyperOptimizer

    m = int(round(math.sqrt(cfg["scaling_d"])))
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(512, m, generator=gen, dtype=torch.float64) / math.sqrt(m)
    Y = torch.randn(512, m, generator=gen, dtype=torch.float64)
    batches = Minibatches(X, Y, 64, seed)

    def make() -> Callable[[], Any]:
        W = torch.zeros(m, m, dtype=torch.float64, requires_grad=True)
        log_lam = torch.full((h,), math.log(1e-2), dtype=torch.float64, requires_grad=True)
        group = (torch.arange(m * m) % h).reshape(m, m)

        def inner(b: Any) -> Tensor:
            lam = log_lam.exp()[group]
            return 0.5 * ((b[0] @ W - b[1]) ** 2).sum(1).mean() + 0.5 * (lam * W * W).sum()

        opt = SIDHyperOptimizer(
            [log_lam],
            [W],
            inner_loss=inner,
            outer_loss=lambda b: 0.5 * ((b[0] @ W - b[1]) ** 2).sum(1).mean(),
            outer_optimizer=torch.optim.SGD([log_lam], lr=1e-3),
            config=SIDConfig(
                inner_steps=cfg["scaling_steps"],
                adjoint_steps=cfg["scaling_steps"],
                step_size="two_phase",
                curvature=KnownCurvature(2.0, 1e-2),
            ),
        )
        return lambda: opt.step(batches, (X[:256], Y[:256]))

    return {"hyperparameters": h, "inner_parameters": m * m,
            **_time_steps(make, cfg["scaling_repeats"])}  # fmt: skip


N_TRAIN_METHODS = ("SID two_phase", "SID Batch (GD)")


def scaling_n_train(cfg: dict, seed: int, batch_size: int) -> list[dict[str, Any]]:
    """One step on the logistic problem (784 λ_j) as n_tr grows (synthetic data): SID two-phase
    with t = k = 100 minibatch steps, and SID Batch (GD) with t = k = 10 full-batch steps
    (``scaling_n_steps``); each in its own process."""
    rows = []
    for n in cfg["scaling_n"]:
        for name in N_TRAIN_METHODS:
            spec = {"kind": "n_train", "n": n, "method": name, "batch_size": batch_size}
            row = _isolated(spec, cfg, seed)
            rows.append(row)
            print(
                f"scaling n = {n}, {name}: {row['seconds_per_step'] * 1e3:.1f} ms/step, "
                f"peak +{row['peak_mib']:.1f} MiB",
                flush=True,
            )
    return rows


def _n_train_row(cfg: dict, seed: int, n: int, name: str, batch_size: int) -> dict[str, Any]:
    from hypertorch_sid import SIDHyperOptimizer

    train, val = synthetic_odd_even(n, min(n, 5000), seed)
    L = float(torch.linalg.matrix_norm(train[0][:2000], ord=2) ** 2) / (4 * min(n, 2000)) + 1e-2
    if name == "SID two_phase":
        kw: dict[str, Any] = dict(step_size="two_phase")
        steps = cfg["scaling_n_steps"][0]
    else:
        kw = dict(
            step_size="constant", eta=1.0, batches=Batches(inner="full", adjoint="full", d2="full")
        )
        steps = cfg["scaling_n_steps"][1]

    def make() -> Callable[[], Any]:
        w = torch.zeros(SYNTH_FEATURES, dtype=torch.float64, requires_grad=True)
        lam = torch.full((SYNTH_FEATURES,), 1e-2, dtype=torch.float64, requires_grad=True)
        opt = SIDHyperOptimizer(
            [lam],
            [w],
            inner_loss=lambda b: inner_loss(w, lam, b),
            outer_loss=lambda b: outer_loss(w, b),
            outer_optimizer=torch.optim.SGD([lam], lr=1e-4),
            full_train_batch=train,
            config=SIDConfig(
                **kw,
                inner_steps=steps,
                adjoint_steps=steps,
                curvature=KnownCurvature(L, 1e-2),
                feasible_set=FeasibleSet(project=lambda hs: hs[0].clamp_(min=1e-4)),
            ),
        )
        loader = Minibatches(*train, batch_size, seed)
        return lambda: opt.step(loader, val)

    return {"n_train": n, "method": name, "steps": steps,
            **_time_steps(make, cfg["scaling_repeats"])}  # fmt: skip


def _isolated(spec: dict[str, Any], cfg: dict, seed: int) -> dict[str, Any]:
    """One scaling row in a fresh Python process (``--scaling-row``): its peak memory is its
    own, not what an allocator kept from the configurations measured before it."""
    import subprocess

    arg = json.dumps({**spec, "cfg": cfg, "seed": seed, "threads": torch.get_num_threads()})
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--scaling-row", arg],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"scaling row {spec} failed:\n{done.stderr[-2000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process"] = "own"
    return row


def _scaling_row(arg: str) -> dict[str, Any]:
    spec = json.loads(arg)
    torch.set_num_threads(spec["threads"])
    if spec["kind"] == "hyper":
        return _hyper_row(spec["cfg"], spec["seed"], spec["h"])
    return _n_train_row(spec["cfg"], spec["seed"], spec["n"], spec["method"], spec["batch_size"])


# ------------------------------------------------------------------------------------- output
def _closest(rows: list[dict], budget: float) -> dict | None:
    ok = [r for r in rows if "rel_error" in r]
    return min(ok, key=lambda r: abs(r["budget"] - budget)) if ok else None


TARGETS = (1e-1, 1e-2, 1e-3)


def reach(rows: list[dict[str, Any]], target: float) -> dict[str, float] | None:
    """The cheapest measured budget whose error is ≤ ``target``: its epochs and seconds."""
    met = [r for r in rows if "rel_error" in r and r["rel_error"] <= target]
    return min(met, key=lambda r: r["epochs"]) if met else None


def reach_table(methods: dict[str, Any]) -> list[str]:
    """Markdown rows: epochs and seconds of the first measured budget reaching each target."""
    head = " | ".join(f"≤ {t:g}: ep, s" for t in TARGETS)
    out = [f"| method | {head} |", "|---|" + "---:|" * len(TARGETS)]
    for name, res in methods.items():
        if "rows" not in res:
            continue
        cells = []
        for t in TARGETS:
            r = reach(res["rows"], t)
            cells.append("not reached" if r is None else f"{r['epochs']:.0f}, {r['seconds']:.1f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def markdown(report: dict[str, Any]) -> str:
    acc = report.get("accuracy")
    out = []
    if acc:
        budgets = report["config"]["budgets"]
        head = " | ".join(f"E = {b:g}: rel. err (ep, s)" for b in budgets)
        out += [f"| method | {head} |", "|---|" + "---:|" * len(budgets)]
        for name, res in acc["methods"].items():
            if "skipped" in res:
                out.append(f"| {name} | " + " | ".join(["skipped"] * len(budgets)) + " |")
                continue
            cells = []
            for b in budgets:
                r = next((r for r in res["rows"] if r["budget"] == b), None)
                if r is None or "rel_error" not in r:
                    cells.append("failed")
                else:
                    cells.append(f"{r['rel_error']:.2e} ({r['epochs']:.0f}, {r['seconds']:.1f})")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += ["", *reach_table(acc["methods"])]
    scaling = report.get("scaling")
    if scaling:
        out += ["", "| hyperparameters h | d | ms / hyper step | peak memory (MiB) |",
                "|---:|---:|---:|---:|"]  # fmt: skip
        for r in scaling["hyperparameters"]:
            out.append(
                f"| {r['hyperparameters']} | {r['inner_parameters']} | "
                f"{r['seconds_per_step'] * 1e3:.1f} | {r['peak_mib']:.1f} |"
            )
        out += ["", "| n_tr | method | steps t = k | ms / hyper step | peak memory (MiB) |",
                "|---:|---|---:|---:|---:|"]  # fmt: skip
        for r in scaling["n_train"]:
            out.append(
                f"| {r['n_train']} | {r['method']} | {r['steps']} | "
                f"{r['seconds_per_step'] * 1e3:.1f} | {r['peak_mib']:.1f} |"
            )
    return "\n".join(out)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc, scaling = report.get("accuracy"), report.get("scaling")
    panels = (2 if acc else 0) + (2 if scaling else 0)
    if panels == 0:
        return
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
    axes = list(axes[0])
    if acc:
        styles = {"hypertorch_sid": "-", "torchopt": "--", "betty": ":", "higher": "-."}
        for i, (name, res) in enumerate(acc["methods"].items()):
            rows = [r for r in res.get("rows", []) if "rel_error" in r]
            if not rows:
                continue
            kw = dict(ls=styles.get(res["package"], "-"), marker="o", ms=3, label=name,
                      color=plt.cm.tab20(i % 20))  # fmt: skip
            err = [max(r["rel_error"], 1e-300) for r in rows]
            axes[0].plot([r["epochs"] for r in rows], err, **kw)
            axes[1].plot([r["seconds"] for r in rows], err, **kw)
        for ax, xl in zip(axes[:2], ("epochs of training data", "seconds (1 thread)")):
            ax.set(xscale="log", yscale="log", xlabel=xl, ylabel="‖ĝ − ∇f‖² / ‖∇f‖²")
            ax.grid(alpha=0.3)
        axes[0].set_title(f"{report['config']['data']}, n_tr = {report['config']['n']}", fontsize=9)
        axes[1].legend(fontsize=6, loc="best")
    if scaling:
        ax = axes[-2]
        rows = scaling["hyperparameters"]
        ax.plot([r["hyperparameters"] for r in rows], [r["seconds_per_step"] for r in rows], "o-",
                label="s / hyper step")  # fmt: skip
        ax2 = ax.twinx()
        ax2.plot([r["hyperparameters"] for r in rows], [r["peak_mib"] for r in rows], "s--",
                 color="C1", label="peak MiB")  # fmt: skip
        ax.set(xscale="log", xlabel="hyperparameters h", ylabel="seconds per hyper step",
               title=f"SID, d = {rows[0]['inner_parameters'] if rows else '?'}")  # fmt: skip
        ax2.set_ylabel("peak memory growth (MiB)")
        ax = axes[-1]
        for method in dict.fromkeys(r["method"] for r in scaling["n_train"]):
            rows = [r for r in scaling["n_train"] if r["method"] == method]
            ax.plot([r["n_train"] for r in rows], [r["seconds_per_step"] for r in rows], "o-",
                    label=method)  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="n_tr", ylabel="seconds per hyper step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (seconds), temp dir output")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="MNIST IDX .gz directory")
    parser.add_argument("--synthetic", action="store_true", help="synthetic data instead of MNIST")
    parser.add_argument("--features", type=int, default=SYNTH_FEATURES, help="synthetic d")
    parser.add_argument("--n", type=int, default=None, help="n_tr = n_val (default 5000)")
    parser.add_argument("--budgets", type=float, nargs="+", default=None, help="epoch budgets")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true", help="the library only")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--only", nargs="+", default=None,
                        help="run only the methods whose name contains one of these strings "
                        "(e.g. 'defaults, minibatches' VarianceReduced)")  # fmt: skip
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--scaling-row", default=None, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.scaling_row is not None:  # one scaling configuration, in this fresh process
        row = _scaling_row(args.scaling_row)
        print(json.dumps(row), flush=True)
        return row
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torchopt")
    warnings.filterwarnings("ignore", message=".*functorch.*")
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("n", "budgets", "batch_size"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="bench_peers_")) if args.quick else RESULTS)
    stem = (
        f"peers_n{cfg['n']}"
        + ("_quick" if args.quick else "")
        + ("_synthetic" if args.synthetic else "")
    )
    data_name = "synthetic" if args.synthetic else "MNIST odd/even"
    report: dict[str, Any] = {
        "experiment": "hypergradient accuracy per unit of compute, hypertorch_sid vs peers",
        "quick": args.quick,
        "config": {**cfg, "data": data_name, "seed": args.seed, "dtype": "float64",
                   "threads": args.threads, "lambda": "log-uniform in [1e-3, 1e-1] per pixel",
                   "metric": "||g - g*||^2 / ||g*||^2, one cold-started hypergradient",
                   "epochs": "samples read by gradients, HVPs and mixed products / n_tr"},
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "cpu_count": os.cpu_count()},
    }  # fmt: skip
    if not args.skip_accuracy:
        if args.synthetic:
            train, val = synthetic_odd_even(cfg["n"], cfg["n"], args.seed, args.features)
        else:
            train, val = load_mnist_odd_even(args.data, cfg["n"], cfg["n"], args.seed)
        start = time.perf_counter()
        ctx = make_context(train, val, cfg["batch_size"], args.seed)
        print(
            f"truth: {time.perf_counter() - start:.1f} s, "
            f"‖∇f‖² = {float((ctx.truth**2).sum()):.3e}, "
            f"L = {ctx.L:.4g}, μ = {ctx.mu:.3g}, κ = {ctx.L / ctx.mu:.3g}",
            flush=True,
        )
        report["truth"] = {"norm2": float((ctx.truth**2).sum()), "L": ctx.L, "mu": ctx.mu,
                           "seconds": time.perf_counter() - start}  # fmt: skip
        report["accuracy"] = run_accuracy(
            ctx, [float(b) for b in cfg["budgets"]], not args.no_peers, args.only
        )
    if not args.skip_scaling:
        report["scaling"] = {
            "memory": "process peak resident set size growth during the first step "
            "(VmRSS sampled every 1 ms by a thread, minus VmRSS before it); each configuration "
            "in its own fresh process",
            "hyperparameters": scaling_hyperparameters(cfg, args.seed),
            "n_train": scaling_n_train(cfg, args.seed, cfg["batch_size"]),
        }
    table = markdown(report)
    print(table)
    report["markdown"] = table
    return write_report(report, out_dir / f"{stem}.json", lambda png: plot(report, png))


def write_report(report: dict[str, Any], json_path: Path, plot_to: Callable[[Path], None]) -> dict:
    """Write the JSON at ``json_path`` and the figure beside it (``plot_to(png)``)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {json_path}")
    plot_to(json_path.with_suffix(".png"))
    report["json_path"] = str(json_path)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
