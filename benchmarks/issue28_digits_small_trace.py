"""Trace of the learned λ on the main job's recipe (``bench_weight_decay.py --settings
digits_small``): per hyper step the step, λ per layer, the hypergradient per layer (sign and
size), the damping δ and the horizon the adjoint solve looks ahead over; and the held-out test
loss of the deployed (best-validation-epoch) weights.

    python benchmarks/issue28_digits_small_trace.py --seed 0 --kwargs '{"max_overhead": null}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_weight_decay as bw  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402
from hypertorch_sid.core.horizon import effective_step_size  # noqa: E402
from hypertorch_sid.lightning.training_length import remaining_steps  # noqa: E402


class Traced(LearnedWeightDecay):
    """The drop-in, keeping λ and the hypergradient per slot after every hyper step."""

    trace: list[dict]

    def _log(self, trainer, pl_module) -> None:
        super()._log(trainer, pl_module)
        if not hasattr(self, "trace"):
            self.trace = []
        h = self.history[-1]
        eta = effective_step_size(trainer.optimizers)
        self.trace.append(
            {
                "step": int(trainer.global_step),
                "lambda": [float(x) for r in self.rho for x in r.detach().exp().flatten()],
                "hypergradient": [float(x) for g in self.last_hypergradient for x in g.flatten()],
                "damping": h.get("hyper/damping"),
                "alpha": h.get("hyper/alpha"),
                "eta": eta,
                "remaining": remaining_steps(trainer),
            }
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setting", default="digits_small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kwargs", type=json.loads, default={})
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--damping", default="default", choices=("default", "horizon", "horizon_solver"))
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    s = bw.SETTINGS[a.setting]
    data = bw.make_data(s, bw.DEFAULT_DATA, a.seed)
    holder = {}

    strategies = bw._with_strategies(a.kwargs, a.damping)

    def kwargs(model):
        return strategies(model) if callable(strategies) else strategies

    orig = bw.LearnedWeightDecay if hasattr(bw, "LearnedWeightDecay") else None
    import hypertorch_sid

    real = hypertorch_sid.LearnedWeightDecay

    def make(*args, **kw):
        cb = Traced(*args, **kw)
        holder["cb"] = cb
        return cb

    hypertorch_sid.LearnedWeightDecay = make
    try:
        rec = bw.train_once(s, data, a.seed, granularity="per_layer", learned_kwargs=kwargs)
    finally:
        hypertorch_sid.LearnedWeightDecay = real
    del orig
    cb = holder["cb"]
    out = {
        "test_loss": rec["test_loss"],
        "best_epoch": rec["best_epoch"],
        "lambda_by_slot": rec["lambda_by_slot"],
        "trace": getattr(cb, "trace", []),
        "kwargs": a.kwargs,
        "seed": a.seed,
        "setting": a.setting,
    }
    print(f"test {rec['test_loss']:.4f} epoch {rec['best_epoch']} err {rec['error']}")
    for t in out["trace"]:
        lam = " ".join(f"{x:.2e}" for x in t["lambda"])
        hg = " ".join(f"{x:+.1e}" for x in t["hypergradient"])
        print(
            f"{t['step']:4d} λ {lam} | hg {hg} | δ {t['damping']:.3g} α {t['alpha']:.3g} "
            f"η {t['eta']} T {t['remaining']}"
        )
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
