"""λ after each hyper step of one learned per-layer training (bench_weight_decay.py's setting):
R (training steps left when it ran), λ (first layer), Δ (its Rprop step) and whether eq.
decaytrust held the step back.

usage (from the repository root): python .../s45_fastfall/trace.py SETTING 'KWARGS_JSON' SEED...
    e.g. trace.py news_mlp '{}' 0      (the default)
         trace.py news_mlp '{"outer_optimizer": {"class_path":
             "hypertorch_sid.core.outer_step.TrustRprop", "init_args": {"fall_eta": 2.0}}}' 0
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import bench_weight_decay as bench  # noqa: E402

from hypertorch_sid.core.outer_step import TrustRprop  # noqa: E402

trace: list = []
_observe, _step = TrustRprop.observe, TrustRprop.step


def observe(self, remaining, eta):
    self.traced_remaining = remaining
    return _observe(self, remaining, eta)


def step(self, closure=None):
    out = _step(self, closure)
    p = self.param_groups[0]["params"][0]
    size = float(self.state[p]["step_size"].mean())
    trace.append((getattr(self, "traced_remaining", None), float(p.exp().mean()), size, self.bound))
    return out


def main() -> None:
    TrustRprop.observe, TrustRprop.step = observe, step
    name, kwargs, seeds = sys.argv[1], json.loads(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    s = bench.SETTINGS[name]
    roots = {"fashion": bench.DEFAULT_FASHION, "news": bench.DEFAULT_NEWS}
    for seed in seeds:
        trace.clear()
        data = bench.make_data(s, roots.get(s.data, bench.DEFAULT_DATA), seed)
        kw = bench._with_strategies(kwargs, "default")
        rec = bench.train_once(s, data, seed, granularity="per_layer", learned_kwargs=kw)
        print(
            f"{name} seed {seed}: test loss {rec['test_loss']:.4f}, {rec['optimizer_steps']} steps"
        )
        for remaining, lam, size, bound in trace:
            step_at = rec["optimizer_steps"] - remaining if remaining is not None else None
            print(f"  step {step_at} (R={remaining}): λ={lam:.2e} Δ={size:.2f} bound={bound}")


if __name__ == "__main__":
    main()
