"""Per hyper step of the main job's learned run: what the curvature estimate read, and the truth.

One run of ``examples/lightning_digits.py``'s learned arm (as :mod:`main_job_spread` runs it),
with every curvature estimate recorded: why it ran (first, at w_t, scheduled refresh, Recover),
the Lanczos iterations made, the batches averaged, the Ritz value θ_max, its residual bound r and
the L it gave; per hyper step whether the adjoint solve diverged. After the fit, each estimate's
point (w, λ, its batches) is read again, outside the run (no effect on the budget's clock), by 40
Lanczos steps: λ_max of the mean of the estimate's own batches' Hessians (``mean``), the largest
of theirs (``each``), of the whole training set's Hessian (``full``), and the largest and median
over 10 single minibatches of 32 (what one stochastic adjoint step applies)::

    python benchmarks/curvature_trace.py --out benchmarks/results/main_job_spread/s44/trace.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import main_job_spread as spread  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402
from hypertorch_sid.core import constants, divergence, estimation, optimizer  # noqa: E402
from hypertorch_sid.lightning import callback  # noqa: E402

job = spread.job
CTX: dict[str, Any] = {"step": None, "why": None}
ESTIMATES: list[dict[str, Any]] = []
STEPS: list[dict[str, Any]] = []
MAPS: list[Any] = []


def patch() -> None:
    """Record every estimate and hyper step (wrappers around the library's own functions)."""
    lanczos_extremes = estimation.lanczos_extremes

    def traced_extremes(matvec, like, iters, seed=0, more=None):  # type: ignore[no-untyped-def]
        res = lanczos_extremes(matvec, like, iters, seed, more)
        CTX["lanczos"] = res
        return res

    estimation.lanczos_extremes = traced_extremes
    estimate = estimation.estimate_curvature

    def traced_estimate(phi, batches, iters=20, **kw):  # type: ignore[no-untyped-def]
        est = estimate(phi, batches, iters, **kw)
        real = phi
        while hasattr(real, "phi"):
            real = real.phi
        if not MAPS:
            MAPS.append(real)
        res = CTX["lanczos"]
        ESTIMATES.append(
            dict(
                step=CTX["step"],
                why=CTX["why"],
                iters=res.steps,
                asked=iters,
                batches=len(batches),
                theta_max=res.theta_max,
                residual=res.error_max,
                theta_min=res.theta_min,
                L=est.L,
                w=[p.detach().clone() for p in real.inner_parameters],
                lam=[h.detach().clone() for h in real.hyperparameters],
                data=list(batches),
            )
        )
        return est

    estimation.estimate_curvature = traced_estimate

    def label(cls: Any, name: str, why: str) -> None:
        original = getattr(cls, name)

        def wrapped(self, *a, **kw):  # type: ignore[no-untyped-def]
            before, CTX["why"] = CTX["why"], why
            try:
                return original(self, *a, **kw)
            finally:
                CTX["why"] = before

        setattr(cls, name, wrapped)

    prepare = constants.StepConstants.prepare

    def traced_prepare(self, hyper_step, first):  # type: ignore[no-untyped-def]
        refresh = self.config.curvature.needs_refresh(hyper_step) and self._refresh_fits()
        CTX["why"] = "first" if first else ("refresh" if refresh else "due, not resolved")
        try:
            return prepare(self, hyper_step, first)
        finally:
            CTX["why"] = None

    constants.StepConstants.prepare = traced_prepare
    label(constants.StepConstants, "at_w_t", "at w_t")
    label(constants.StepConstants, "recover", "Recover")
    adapt = divergence.Recover.adapt

    def traced_adapt(self, optimizer, err):  # type: ignore[no-untyped-def]
        STEPS[-1]["divergences"].append(str(err).split(":")[0][:80])
        return adapt(self, optimizer, err)

    divergence.Recover.adapt = traced_adapt
    hyper_step = callback.HyperOptimizationCallback._hyper_step

    def traced_hyper_step(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        CTX["step"] = trainer.global_step
        n = len(self.history)
        STEPS.append(dict(step=trainer.global_step, divergences=[]))
        hyper_step(self, trainer, pl_module)
        done = len(self.history) > n
        STEPS[-1]["completed"] = done
        if done:
            h = self.history[-1]
            lam = [v for k, v in h.items() if k.startswith("hyper/weight_decay/") and "mean" in k]
            STEPS[-1].update(L=h.get("hyper/L"), lam=sum(lam) / max(len(lam), 1))

    callback.HyperOptimizationCallback._hyper_step = traced_hyper_step
    hypergradient = optimizer.SIDHyperOptimizer._hypergradient

    def traced_hypergradient(self, stream, val_batch):  # type: ignore[no-untyped-def]
        try:
            return hypergradient(self, stream, val_batch)
        except divergence.DivergenceError as err:
            STEPS[-1]["divergences"].append("given up: " + str(err).split(":")[0][:80])
            raise

    optimizer.SIDHyperOptimizer._hypergradient = traced_hypergradient


def top_eigenvalue(phi: Any, batches: list[Any], iters: int = 40) -> float:
    """λ_max of the batches' mean Hessian by ``iters`` Lanczos steps (its Ritz value + bound)."""

    def hessian(v: Any) -> list[torch.Tensor]:
        acc = [torch.zeros_like(x) for x in v]
        for b in batches:
            for a, h in zip(acc, phi.hessian_vector_product(b, v)):
                a.add_(h.detach(), alpha=1.0 / len(batches))
        return acc

    res = lanczos_extremes_untraced(hessian, phi.inner_parameters, iters, seed=123)
    return res.theta_max


lanczos_extremes_untraced = estimation.lanczos_extremes


def truth(data: dict) -> None:
    """Each estimate's point read again by converged Lanczos (after the fit)."""
    phi = MAPS[0]
    x, y = data["train"].tensors
    full = [(x, y)]
    gen = torch.Generator().manual_seed(7)
    singles = [
        (x[i], y[i]) for i in (torch.randperm(len(y), generator=gen)[:32] for _ in range(10))
    ]
    with torch.no_grad():
        saved = [p.detach().clone() for p in phi.inner_parameters]
    for e in ESTIMATES:
        with torch.no_grad():
            for p, v in zip(phi.inner_parameters, e.pop("w")):
                p.copy_(v)
            for h, v in zip(phi.hyperparameters, e.pop("lam")):
                h.copy_(v)
        own = e.pop("data")
        e["own_mean_lmax"] = top_eigenvalue(phi, own)
        e["own_each_lmax"] = max(top_eigenvalue(phi, [b]) for b in own)
        e["full_lmax"] = top_eigenvalue(phi, full)
        per = [top_eigenvalue(phi, [b], 30) for b in singles]
        e["single_batch_lmax_max"] = max(per)
        e["single_batch_lmax_median"] = sorted(per)[len(per) // 2]
    with torch.no_grad():
        for p, v in zip(phi.inner_parameters, saved):
            p.copy_(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="the callback's sampling seed")
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    args = spread.example_args("curvature_trace_logs")
    data = job.splits(args.n_train, args.n_val, args.seed)
    patch()
    kw = {} if a.seed is None else {"seed": a.seed}
    result = job.train(data, args, "trace", callbacks=[LearnedWeightDecay(**kw)])
    truth(data)
    print(f"test loss {result['test_loss']:.4f}")
    print(
        "step  why                 it/asked bat  theta_max  resid      L   mean  each  full  "
        "1-batch max/med"
    )
    for e in ESTIMATES:
        print(
            f"{e['step']:4d}  {e['why']:<18s} {e['iters']:3d}/{e['asked']:<3d} {e['batches']:3d} "
            f"{e['theta_max']:9.3f} {e['residual']:6.3f} {e['L']:6.2f} {e['own_mean_lmax']:5.2f}"
            f" {e['own_each_lmax']:5.2f}"
            f" {e['full_lmax']:5.2f}  {e['single_batch_lmax_max']:5.2f}/"
            f"{e['single_batch_lmax_median']:.2f}"
        )
    print("hyper steps:")
    for s in STEPS:
        print(
            f"{s['step']:4d} completed={s.get('completed')} L={s.get('L')} "
            f"lam={s.get('lam')} diverged={s['divergences']}"
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            dict(
                command=" ".join(sys.argv),
                test_loss=result["test_loss"],
                estimates=ESTIMATES,
                hyper_steps=STEPS,
            ),
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
