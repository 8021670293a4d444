"""Cost of one step: plain SGD vs. a SID inner step vs. a SID adjoint step, on CPU.

For two models with a per-tensor weight-decay hyperparameter λ_i = exp(log λ_i) in the inner loss

    ℓ̂(w, λ; ζ) = CE(model(x), y) + ½ Σ_i λ_i ‖w_i‖²

it times, side by side and in one run,

(a) ``plain``       a plain PyTorch training step: forward, backward, ``torch.optim.SGD`` step;
(b) ``inner``       one step of :func:`inner_solve` with the gradient-descent map
                    (one KM step on Φ̂ = w − α∇₁ℓ̂, eq. inneralg; with η = 1 it is SGD);
(c) ``adj_reverse`` one step of :func:`adjoint_solve` (eq. backalg): ∂₁Φ̂ᵀv = v − α∇²₁₁ℓ̂ v with the
                    Hessian–vector product by reverse-over-reverse (double backward);
(d) ``adj_forward`` the same with forward-over-reverse (``torch.func.jvp`` of ``torch.func.grad``);
(e) ``d2_assembly`` one batch of the ∂₂Φ̂ᵀv term of the hypergradient (eq. gradestim);
(f) ``d2_regularizer`` the same term from the weight decay R(w, λ) alone (``regularizer=``, what
                    ``LearnedWeightDecay`` runs): −α∇²₂₁R v, exact, no batch.

Models: an MLP 784-256-256-10 and a small CNN (2 × conv3×3 + BatchNorm + ReLU + max-pool, then a
linear layer) on MNIST-shaped random batches (128 × 1 × 28 × 28). The adjoint steps run inside
:func:`frozen_mode` in train mode, as :class:`SIDHyperOptimizer` runs them.

Timing: every operation is warmed up, then the operations are timed in interleaved rounds (each
round runs every operation for a block of ~``--block-seconds``), so load changes on a shared
machine hit all of them alike. Times are medians over rounds; ratios are medians over rounds of
the per-round ratios. Before timing, the forward and reverse Hessian–vector products are checked
to agree (relative error < 1e-4 in float32), and the BatchNorm buffers are checked to be left
untouched by the adjoint steps.

Run from the repository root::

    python -m benchmarks.bench_step_cost            # or: python benchmarks/bench_step_cost.py

It prints a table and writes ``benchmarks/results/step_cost/step_cost.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hypertorch_sid import (
    ConstantStep,
    CurvatureDamping,
    GradientDescentMap,
    adjoint_solve,
    assemble_hypergradient,
    frozen_mode,
    inner_solve,
)
from hypertorch_sid.core.batches import BatchStream

OPS = ("plain", "inner", "adj_reverse", "adj_forward", "d2_assembly", "d2_regularizer")
GOAL_RATIO = 3.0  # issue 2: adjoint step ≤ 3 × inner step on the MLP
HVP_RTOL = 1e-4
ALPHA = 0.05
RESULTS = Path(__file__).resolve().parent / "results" / "step_cost" / "step_cost.json"


def make_mlp() -> nn.Module:
    """784-256-256-10 multilayer perceptron."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def make_cnn_bn() -> nn.Module:
    """Two conv3×3 + BatchNorm + ReLU + max-pool blocks (16, 32 channels) and a linear head."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": make_mlp, "cnn_bn": make_cnn_bn}


def make_penalty(model: nn.Module, log_lam: list[Tensor]) -> Callable[[], Tensor]:
    """R(w, λ) = ½ Σ_i exp(log λ_i) ‖w_i‖², the only part of ℓ̂ that reads λ."""
    return lambda: 0.5 * sum(ll.exp() * (p * p).sum() for ll, p in zip(log_lam, model.parameters()))


def make_inner_loss(
    model: nn.Module, log_lam: list[Tensor], detach_lam: bool = False
) -> Callable[[Any], Tensor]:
    """ℓ̂(w, λ; ζ) = CE + ½ Σ_i exp(log λ_i) ‖w_i‖², reading the parameters at call time.

    The parameters are read through ``model.parameters()`` inside the closure (not a list captured
    once), which forward-over-reverse needs: it swaps them inside the module.
    """

    def inner_loss(batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        penalty = sum(
            (ll.detach() if detach_lam else ll).exp() * (p * p).sum()
            for ll, p in zip(log_lam, model.parameters())
        )
        return F.cross_entropy(model(x), y) + 0.5 * penalty

    return inner_loss


def random_batches(
    n: int, batch_size: int, device: torch.device, generator: torch.Generator
) -> list[tuple[Tensor, Tensor]]:
    """``n`` MNIST-shaped random batches (x ~ N(0, 1), 10 classes)."""
    out = []
    for _ in range(n):
        x = torch.randn(batch_size, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (batch_size,), generator=generator)
        out.append((x.to(device), y.to(device)))
    return out


def relative_error(a: list[Tensor], b: list[Tensor]) -> float:
    num = math.sqrt(sum(float(((x - y).detach().double() ** 2).sum()) for x, y in zip(a, b)))
    den = math.sqrt(sum(float((y.detach().double() ** 2).sum()) for y in b))
    return num / max(den, 1e-30)


def buffers_of(model: nn.Module) -> dict[str, Tensor]:
    return {n: b.detach().clone() for n, b in model.named_buffers()}


def same_buffers(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@dataclass
class Setup:
    """A model, its weight-decay hyperparameters, both GD maps and a stream of batches."""

    model: nn.Module
    params: list[Tensor]
    log_lam: list[Tensor]
    plain_loss: Callable[[Any], Tensor]
    phi_rev: GradientDescentMap
    phi_fwd: GradientDescentMap
    phi_reg: GradientDescentMap
    pool: list[tuple[Tensor, Tensor]]
    stream: BatchStream
    g_w: list[Tensor]
    v0: list[Tensor]
    g_lam: list[Tensor]


def make_setup(name: str, batch_size: int, device: torch.device, seed: int) -> Setup:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = MODELS[name]().to(device).train()
    params = list(model.parameters())
    log_lam = [torch.full((), math.log(1e-3), device=device, requires_grad=True) for _ in params]
    inner_loss = make_inner_loss(model, log_lam)
    pool = random_batches(8, batch_size, device, gen)
    return Setup(
        model=model,
        params=params,
        log_lam=log_lam,
        plain_loss=make_inner_loss(model, log_lam, detach_lam=True),
        phi_rev=GradientDescentMap(inner_loss, params, log_lam, ALPHA, hvp="reverse"),
        phi_fwd=GradientDescentMap(inner_loss, params, log_lam, ALPHA, hvp="forward", module=model),
        phi_reg=GradientDescentMap(
            inner_loss, params, log_lam, ALPHA, regularizer=make_penalty(model, log_lam)
        ),
        pool=pool,
        stream=BatchStream(itertools.cycle(pool), "bench batches"),
        g_w=[0.01 * torch.randn(p.shape, generator=gen).to(device) for p in params],
        v0=[torch.randn(p.shape, generator=gen).to(device) for p in params],
        g_lam=[torch.zeros_like(ll) for ll in log_lam],
    )


def check(s: Setup, name: str) -> dict[str, Any]:
    """Forward and reverse HVPs agree (train and eval mode); the adjoint keeps the buffers."""
    before = buffers_of(s.model)
    errors = {}
    for mode, batch in (("train", s.pool[0]), ("eval", s.pool[1])):
        with frozen_mode(s.model, mode):
            hv_r = s.phi_rev.hessian_vector_product(batch, s.v0)
            hv_f = s.phi_fwd.hessian_vector_product(batch, s.v0)
        errors[mode] = relative_error(hv_f, hv_r)
        assert errors[mode] < HVP_RTOL, (
            f"{name}: forward and reverse HVPs differ in {mode} mode (rel. err {errors[mode]:.2e})"
        )
    with frozen_mode(s.model, "train"):
        for phi in (s.phi_rev, s.phi_fwd):
            adjoint_solve(phi, s.g_w, s.v0, s.stream, 2, ConstantStep(1.0))
            assemble_hypergradient(phi, s.v0, s.g_lam, s.stream.take(1))
    kept = same_buffers(before, buffers_of(s.model))
    assert kept, f"{name}: the adjoint solve changed the module's buffers"
    with frozen_mode(s.model, "train"):
        sampled = assemble_hypergradient(s.phi_rev, s.v0, s.g_lam, [s.pool[0]])
        from_r = assemble_hypergradient(s.phi_reg, s.v0, s.g_lam, [])
    d2_err = relative_error(from_r, sampled)
    assert d2_err < HVP_RTOL, f"{name}: ∂₂Φ̂ᵀv from R differs from the minibatch one ({d2_err:.1e})"
    return {
        "hvp_rel_err_train": errors["train"],
        "hvp_rel_err_eval": errors["eval"],
        "adjoint_keeps_buffers": kept,
        "d2_regularizer_rel_err": d2_err,
    }


def adjoint_step(s: Setup, phi: GradientDescentMap, mode: str) -> Callable[[], None]:
    """One step of eq. backalg, run as the optimizer runs it (inside ``frozen_mode``)."""

    def step() -> None:
        with frozen_mode(s.model, mode):
            adjoint_solve(phi, s.g_w, s.v0, s.stream, 1, ConstantStep(1.0))

    return step


def step_ops(s: Setup) -> dict[str, Callable[[], Any]]:
    """The six timed operations (a)-(f) for one model."""
    sgd = torch.optim.SGD(s.params, lr=ALPHA)
    schedule = ConstantStep(1.0)

    def plain() -> None:
        sgd.zero_grad(set_to_none=True)
        s.plain_loss(next(s.stream)).backward()
        sgd.step()

    def inner() -> None:
        inner_solve(s.phi_rev, s.stream, 1, schedule)

    def d2_assembly() -> None:
        with frozen_mode(s.model, "train"):
            assemble_hypergradient(s.phi_rev, s.v0, s.g_lam, [next(s.stream)])

    def d2_regularizer() -> None:
        assemble_hypergradient(s.phi_reg, s.v0, s.g_lam, [])

    return {
        "plain": plain,
        "inner": inner,
        "adj_reverse": adjoint_step(s, s.phi_rev, "train"),
        "adj_forward": adjoint_step(s, s.phi_fwd, "train"),
        "d2_assembly": d2_assembly,
        "d2_regularizer": d2_regularizer,
    }


def timed(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    """Seconds per call of ``fn`` over ``n`` back-to-back calls."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n


def measure(
    ops: dict[str, Callable[[], Any]],
    rounds: int,
    block_seconds: float,
    warmup: int,
    sync: Callable[[], None],
) -> dict[str, list[float]]:
    """Per-call seconds of every op in each of ``rounds`` interleaved rounds."""
    calls = {}
    for name, fn in ops.items():
        timed(fn, warmup, sync)
        single = min(timed(fn, 1, sync) for _ in range(3))
        calls[name] = max(1, round(block_seconds / max(single, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, fn in ops.items():
            samples[name].append(timed(fn, calls[name], sync))
    return samples


def summarise(samples: dict[str, list[float]]) -> tuple[dict[str, Any], dict[str, float]]:
    times = {}
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        times[name] = {
            "median_ms": 1e3 * statistics.median(xs),
            "q1_ms": 1e3 * q[0],
            "q3_ms": 1e3 * q[2],
        }

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    best = [min(r, f) for r, f in zip(samples["adj_reverse"], samples["adj_forward"])]
    ratios = {
        "inner/plain": ratio("inner", "plain"),
        "adj_reverse/inner": ratio("adj_reverse", "inner"),
        "adj_forward/inner": ratio("adj_forward", "inner"),
        "adj_best/inner": statistics.median(b / i for b, i in zip(best, samples["inner"])),
        "adj_reverse/plain": ratio("adj_reverse", "plain"),
        "adj_forward/plain": ratio("adj_forward", "plain"),
        "adj_forward/adj_reverse": ratio("adj_forward", "adj_reverse"),
        "d2_assembly/inner": ratio("d2_assembly", "inner"),
        "d2_assembly/plain": ratio("d2_assembly", "plain"),
        "d2_regularizer/plain": ratio("d2_regularizer", "plain"),
        "d2_regularizer/d2_assembly": ratio("d2_regularizer", "d2_assembly"),
    }
    return times, ratios


def sweep(
    names: list[str],
    batch_sizes: list[int],
    device: torch.device,
    seed: int,
    rounds: int,
    block_seconds: float,
    sync: Callable[[], None],
) -> list[dict[str, Any]]:
    """Adjoint step, reverse vs forward HVP, across batch sizes and module modes."""
    rows = []
    for name in names:
        modes = ("train", "eval") if name == "cnn_bn" else ("train",)  # the MLP has no BN
        for bs in batch_sizes:
            s = make_setup(name, bs, device, seed)
            for mode in modes:
                ops = {
                    "adj_reverse": adjoint_step(s, s.phi_rev, mode),
                    "adj_forward": adjoint_step(s, s.phi_fwd, mode),
                }
                samples = measure(ops, rounds, block_seconds, 2, sync)
                rev = statistics.median(samples["adj_reverse"])
                fwd = statistics.median(samples["adj_forward"])
                ratio = statistics.median(
                    f / r for f, r in zip(samples["adj_forward"], samples["adj_reverse"])
                )
                rows.append(
                    {
                        "model": name,
                        "batch_size": bs,
                        "mode": mode,
                        "adj_reverse_ms": 1e3 * rev,
                        "adj_forward_ms": 1e3 * fwd,
                        "forward/reverse": ratio,
                        "faster": "forward" if ratio < 1 else "reverse",
                    }
                )
    return rows


def print_table(results: dict[str, Any]) -> None:
    names = list(results)
    print(f"\nmedian ms per call [interquartile range], {torch.get_num_threads()} thread(s)")
    print(f"{'op':<14}" + "".join(f"{n:>28}" for n in names))
    for op in OPS:
        row = ""
        for n in names:
            t = results[n]["times"][op]
            row += f"{t['median_ms']:>12.2f} [{t['q1_ms']:6.2f}, {t['q3_ms']:6.2f}]"
        print(f"{op:<14}{row}")
    print(f"\n{'ratio (median per round)':<26}" + "".join(f"{n:>12}" for n in names))
    for key in results[names[0]]["ratios"]:
        print(f"{key:<26}" + "".join(f"{results[n]['ratios'][key]:>12.2f}" for n in names))
    print(f"\n{'check':<26}" + "".join(f"{n:>12}" for n in names))
    for key in results[names[0]]["checks"]:
        vals = [results[n]["checks"][key] for n in names]
        cells = [f"{v:>12.1e}" if isinstance(v, float) else f"{v!s:>12}" for v in vals]
        print(f"{key:<26}" + "".join(cells))


def print_sweep(rows: list[dict[str, Any]]) -> None:
    print("\nadjoint step, reverse vs forward HVP (median ms)")
    head = f"{'model':<8}{'batch':>6}{'mode':>7}{'reverse':>10}{'forward':>10}{'fwd/rev':>9}"
    print(head + "  faster")
    for r in rows:
        print(
            f"{r['model']:<8}{r['batch_size']:>6}{r['mode']:>7}{r['adj_reverse_ms']:>10.2f}"
            f"{r['adj_forward_ms']:>10.2f}{r['forward/reverse']:>9.2f}  {r['faster']}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--block-seconds", type=float, default=0.15, help="time per op per round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per op")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--sweep-batch-sizes",
        nargs="*",
        type=int,
        default=[32, 128, 512],
        help="batch sizes of the reverse-vs-forward sweep (none: skip it)",
    )
    parser.add_argument("--sweep-rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON output path")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="instead: the cost of the per-step checks of issue 29 in a whole hyper step",
    )
    args = parser.parse_args(argv)
    if args.watch:
        return watch_cost(args)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    results: dict[str, Any] = {}
    for name in args.models:
        setup = make_setup(name, args.batch_size, device, args.seed)
        checks = check(setup, name)
        samples = measure(step_ops(setup), args.rounds, args.block_seconds, args.warmup, sync)
        times, ratios = summarise(samples)
        results[name] = {
            "parameters": sum(p.numel() for p in setup.params),
            "times": times,
            "ratios": ratios,
            "checks": checks,
            "samples_ms": {k: [1e3 * x for x in xs] for k, xs in samples.items()},
        }
        print(f"{name}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = sweep(
        args.models,
        args.sweep_batch_sizes,
        device,
        args.seed,
        args.sweep_rounds,
        args.block_seconds,
        sync,
    )
    print_table(results)
    if rows:
        print_sweep(rows)

    goal: dict[str, Any] = {"target_adjoint_over_inner": GOAL_RATIO}
    if "mlp" in results:
        r = results["mlp"]["ratios"]
        goal.update(
            mlp_adj_reverse_over_inner=r["adj_reverse/inner"],
            mlp_adj_forward_over_inner=r["adj_forward/inner"],
            met_with_reverse=r["adj_reverse/inner"] <= GOAL_RATIO,
            met_with_forward=r["adj_forward/inner"] <= GOAL_RATIO,
        )
        goal["met"] = goal["met_with_reverse"] or goal["met_with_forward"]
        print(
            f"\ngoal (MLP adjoint step <= {GOAL_RATIO:g} x inner step): "
            f"reverse {r['adj_reverse/inner']:.2f}x, forward {r['adj_forward/inner']:.2f}x -> "
            f"{'met' if goal['met'] else 'NOT met'}"
        )
    report = {
        "config": {
            "device": str(device),
            "threads": torch.get_num_threads(),
            "batch_size": args.batch_size,
            "rounds": args.rounds,
            "block_seconds": args.block_seconds,
            "warmup": args.warmup,
            "sweep_rounds": args.sweep_rounds,
            "alpha": ALPHA,
            "dtype": "float32",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "wall_seconds": time.perf_counter() - start,
        },
        "goal": goal,
        "models": results,
        "hvp_sweep": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['config']['wall_seconds']:.0f} s)")
    return report


# ---------------------------------------------------------------- the checks' cost (issue 29)
WATCH_STEPS = 10  # t = k of the timed hyper step
WATCH_GOAL = 0.05  # the checks may cost at most 5 % of a hyper step
WATCH_RESULTS = Path(__file__).resolve().parent / "results" / "step_cost" / "watch_cost.json"


def _watch_functions() -> list[tuple[Any, str]]:
    """(owner, name) of every function the per-step checks run (where they are looked up)."""
    import sys

    from hypertorch_sid.core import divergence, watch

    found: list[tuple[Any, str]] = [
        (watch.ResidualWatch, "see"),
        (watch.ResidualWatch, "finish"),
        (watch.ResidualWatch, "converged"),
        (watch.Buffers, "snapshot"),
        (divergence.DivergenceGuard, "note_convergence"),
    ]
    for name in ("warn_if_lambda_stuck", "unconverged_message", "rounding_floor"):
        fn = getattr(watch, name)
        found += [(m, name) for m in list(sys.modules.values()) if getattr(m, name, None) is fn]
    return found


@contextlib.contextmanager
def clocked(total: list[float]) -> Any:
    """Adds the seconds spent in the checks (:func:`_watch_functions`, and ``Buffers.restore``)
    to ``total[0]``."""
    from hypertorch_sid.core import watch

    originals = [(o, n, o.__dict__[n] if isinstance(o, type) else getattr(o, n))
                 for o, n in _watch_functions()]  # fmt: skip

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_fn(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start

        return timed_fn

    restore = watch.Buffers.__dict__["restore"]
    try:
        for owner, name, fn in originals:
            setattr(owner, name, wrap(fn))
        watch.Buffers.restore = staticmethod(wrap(restore.__func__))
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        watch.Buffers.restore = restore


@contextlib.contextmanager
def unwatched() -> Any:
    """The hyper step without the checks that run at every step (``core/watch.py``): the
    residual watch of each solver step, the buffer snapshot, the λ-unchanged test."""
    import sys

    from hypertorch_sid.core import watch

    stubs = {
        (watch.ResidualWatch, "see"): lambda self, step, residual, delta=None: None,
        (watch.ResidualWatch, "finish"): lambda self: None,
        (watch.ResidualWatch, "converged"): lambda self: True,
        (watch.Buffers, "snapshot"): lambda self: [],
        (watch.Buffers, "restore"): staticmethod(lambda saved: None),
    }
    stuck = watch.warn_if_lambda_stuck
    holders = [
        m for m in list(sys.modules.values()) if getattr(m, "warn_if_lambda_stuck", None) is stuck
    ]
    saved = {key: key[0].__dict__[key[1]] for key in stubs}
    try:
        for (owner, name), stub in stubs.items():
            setattr(owner, name, stub)
        for m in holders:
            m.warn_if_lambda_stuck = lambda *args, **kwargs: False
        yield
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
        for m in holders:
            m.warn_if_lambda_stuck = stuck


def watch_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per ``SIDHyperOptimizer.step`` (t = k = 10, one ∂₂Φ̂ batch, Adam on log λ, the
    default estimated α and schedules, damping past the negative curvature with a 0.1·L̂ floor
    — with a given α = 0.05, or the default damping and constant steps, the MLP's adjoint map
    expands on these random-label batches, which the checks report —, no ``module=`` so the
    buffer snapshot runs too) with and without the per-step checks, timed in interleaved rounds
    (the median over rounds of (with − without)/without: on a loaded machine its noise is a few
    %), and the time spent inside the checks, clocked around each of them during whole hyper
    steps (the number the 5 % goal is judged on)."""
    from hypertorch_sid import SIDConfig, SIDHyperOptimizer

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results: dict[str, Any] = {}
    for name in args.models:
        s = make_setup(name, args.batch_size, device, args.seed)
        outer = make_inner_loss(s.model, s.log_lam, detach_lam=True)
        config = SIDConfig(
            inner_steps=WATCH_STEPS, adjoint_steps=WATCH_STEPS,
            damping=CurvatureDamping(margin=2.0, relative=0.1),
        )  # fmt: skip
        sid = SIDHyperOptimizer(
            s.log_lam, s.params, make_inner_loss(s.model, s.log_lam), outer,
            torch.optim.Adam(s.log_lam, lr=1e-3), config=config,
        )  # fmt: skip
        step = functools.partial(sid.step, s.stream, s.pool[0])
        step()  # the first step's one-off checks, untimed

        def bare(step: Callable[[], Any] = step) -> None:
            with unwatched():
                step()

        ops = {"watched": step, "unwatched": bare}
        samples = measure(ops, args.rounds, args.block_seconds, 2, sync)
        overhead = statistics.median(
            w / u - 1 for w, u in zip(samples["watched"], samples["unwatched"])
        )
        spent, steps = [0.0], max(3, args.rounds)  # the checks' own time, clocked inside a step
        start = time.perf_counter()
        with clocked(spent):
            for _ in range(steps):
                step()
        inside = spent[0] / (time.perf_counter() - start)
        results[name] = {
            "watched_ms": 1e3 * statistics.median(samples["watched"]),
            "unwatched_ms": 1e3 * statistics.median(samples["unwatched"]),
            "overhead_ab": overhead,
            "checks_ms_per_step": 1e3 * spent[0] / steps,
            "overhead_clocked": inside,
            "met": inside < WATCH_GOAL,
        }
        r = results[name]
        print(
            f"{name}: hyper step {r['watched_ms']:.1f} ms with the checks, "
            f"{r['unwatched_ms']:.1f} ms without ({100 * overhead:+.2f} %, A/B); the checks "
            f"themselves {r['checks_ms_per_step']:.2f} ms per step = {100 * inside:.2f} % "
            f"(goal < {100 * WATCH_GOAL:.0f} %)",
            flush=True,
        )
    report = {
        "config": {
            "device": str(device),
            "threads": torch.get_num_threads(),
            "batch_size": args.batch_size,
            "rounds": args.rounds,
            "block_seconds": args.block_seconds,
            "inner_steps": WATCH_STEPS,
            "adjoint_steps": WATCH_STEPS,
            "torch": torch.__version__,
        },  # fmt: skip
        "models": results,
    }
    out = args.out if args.out != RESULTS else WATCH_RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
