"""Where a hyper step's time goes, from profile.sh's cProfile files (cumulative seconds over one
mnist_mlp seed): the callback's hyper steps, their logging (``_log``), its ``hyper_metrics``
and the λ summary's quantiles, the per-element outer step and λ's penalty.
usage: python profile_summary.py PROF... > profile.txt"""

import pstats
import sys

PARTS = {
    "hyper steps": "callback.py:_hyper_step",
    "  logging (_log)": "callback.py:_log",
    "    hyper_metrics": "metrics.py:hyper_metrics",
    "  outer step (TrustShrinkageStep.step)": "decay.py:step",
    "  penalty (λ ⊙ w²)": "decay.py:penalty",
    "  inner_loss": "weight_decay.py:inner_loss",
    "training steps' decay (apply)": "weight_decay.py:apply",
}

for path in sys.argv[1:]:
    stats = pstats.Stats(path).stats
    found = {}
    for (f, _, fn), (_, nc, _, ct, _) in stats.items():
        key = f"{f.rsplit('/', 1)[-1]}:{fn}"
        for label, want in PARTS.items():
            if key == want:
                n, t = found.get(label, (0, 0.0))
                found[label] = (n + nc, t + ct)
    print(f"== {path}")
    for label in PARTS:
        n, t = found.get(label, (0, 0.0))
        print(f"{label:42s} {t:7.2f} s  {n:5d} calls  {1000 * t / max(n, 1):7.1f} ms/call")
