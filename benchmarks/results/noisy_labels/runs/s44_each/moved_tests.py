"""Session 44: the three tests of tests/test_data_weights_tasks.py that moved when LearnedDataWeights'
curvature estimate read the union of the minibatches' spectra (minibatches="each") instead of their mean Hessian's
("mean"). For each arm: the estimated L and alpha at every estimate, the adjoint residuals, the weights' separation,
what flagged() returns (and why it returns nothing: its warning), and the numbers each test asserts.
Usage (repository root): PYTHONPATH=$PWD:$PWD/tests OMP_NUM_THREADS=1 python benchmarks/results/noisy_labels/runs/s44_each/moved_tests.py
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

import test_data_weights_tasks as T
from hypertorch_sid.core.sample_weights import TwoComponentSplit
from hypertorch_sid.lightning.callback import CALLBACK_CONFIG

torch.set_num_threads(1)


def curvature(arm: str):
    return dataclasses.replace(CALLBACK_CONFIG.curvature, minibatches=arm)


def describe(cb) -> str:
    h = cb.history
    Ls = sorted({round(float(r["hyper/L"]), 3) for r in h if "hyper/L" in r})
    lm = sorted({round(float(r["hyper/lambda_min"]), 3) for r in h if "hyper/lambda_min" in r})
    dm = [float(r["hyper/damping"]) for r in h if "hyper/damping" in r]
    al = [float(r["hyper/alpha"]) for r in h if "hyper/alpha" in r]
    res = [float(r["hyper/relative_adjoint_residual"]) for r in h if "hyper/relative_adjoint_residual" in r]
    retries = sum(int(r.get("hyper/retries", 0)) for r in h)
    return (
        f"hyper steps {len(h)}; L values {Ls[:8]}{'...' if len(Ls) > 8 else ''}; lambda_min {lm[:8]}; "
        f"damping median {statistics.median(dm) if dm else float('nan'):.4g}; "
        f"alpha median {statistics.median(al):.4g} (min {min(al):.4g}, max {max(al):.4g}); "
        f"rel. adjoint residual median {statistics.median(res):.3g} max {max(res):.3g}; retries {retries}"
    )


def split(cb) -> str:
    """TwoComponentSplit's fit on the learned logits: the two bumps, Ashman's D (flags need D >= 2)."""
    rule = TwoComponentSplit()
    w = cb.problem.weights
    x = w.parameterization.effective_logits(w).to(torch.float64).reshape(-1).clamp(-rule.clip, rule.clip)
    _, (mu, sd) = rule.fit(x)
    lo, hi = int(mu.argmin()), int(mu.argmax())
    D = 2**0.5 * float(mu[hi] - mu[lo]) / float(sd.pow(2).sum().sqrt())
    q = lambda t: [round(float(v), 2) for v in torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=t.dtype))]  # noqa: E731
    return (f"split: mu low {float(mu[lo]):.2f} (sd {float(sd[lo]):.2f}), high {float(mu[hi]):.2f} (sd {float(sd[hi]):.2f}), "
            f"D {D:.2f}; logit quantiles 10/50/90 % corrupted {q(x[:T.BAD])} clean {q(x[T.BAD:])}")


def flags(cb):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = cb.flagged()
    said = [str(w.message) for w in caught if "flagged" in str(w.message)]
    return f, said


def mse(outputs: int):
    def step(z, y):
        out = F.mse_loss(z, y, reduction="none")
        return out[:, 0] if outputs == 1 else out

    return step


for arm in sys.argv[1:] or ["mean", "each"]:
    print(f"==================== minibatches={arm!r}")
    for outputs in (1, 3):
        cb = T.fit(T.Task(T.mlp(4, outputs), mse(outputs)), T.regression(outputs), objective="mean_loss",
                   normalize=False, curvature=curvature(arm))
        o, c = T.separation(cb)
        f, said = flags(cb)
        print(f"MSE outputs={outputs} normalize=False: outliers {o:.3f} clean {c:.3f} (test: outliers < clean - 0.25)")
        print(f"   flagged {len(f)}, of them outliers {int((f < T.BAD).sum())} (test: >= 20, all outliers); {said}")
        print("  ", describe(cb))
        print("  ", split(cb))
    for outputs in (1, 3):  # the default normalize=True: gauge "auto" -> "mean_logit" for real targets (session 44)
        cb = T.fit(T.Task(T.mlp(4, outputs), mse(outputs)), T.regression(outputs), objective="mean_loss",
                   curvature=curvature(arm))
        o, c = T.separation(cb)
        f, said = flags(cb)
        print(f"MSE outputs={outputs} normalize=True (gauge auto): outliers {o:.3f} clean {c:.3f}; flagged {len(f)}, "
              f"outliers {int((f < T.BAD).sum())}; {said}")
        print("  ", describe(cb))
    data = T.imbalanced()
    cb = T.fit(T.Task(T.mlp(2, 3), T.cross_entropy), data, curvature=curvature(arm))
    o, c = T.separation(cb)
    tiny = T.BAD + torch.nonzero(data[1][T.BAD:] == 2).flatten()
    f, said = flags(cb)
    w = cb.data_weights()
    print(f"tiny class per sample: corrupted {o:.3f} clean {c:.3f}; clean tiny-class weights min {float(w[tiny].min()):.3f}")
    print(f"   flagged {len(f)}, corrupted among them {int((f < T.BAD).sum())} of {T.BAD} (test: >= 65), "
          f"clean tiny flagged {len(set(tiny.tolist()) & set(f.tolist()))}; {said}")
    missed = sorted(set(range(T.BAD)) - set(f.tolist()))
    print("  ", split(cb))
    print(f"   corrupted not flagged: {missed}; their weights {[round(float(w[i]), 3) for i in missed]}; "
          f"labels given {[int(data[1][i]) for i in missed]}")
    print("  ", describe(cb))
    cb = T.fit(T.Task(T.mlp(2, 3), T.cross_entropy), T.imbalanced(), indexed=False, per="class", num_classes=3,
               curvature=curvature(arm))
    w = cb.data_weights()
    f, said = flags(cb)
    given, true = data[1], data[1].clone()
    true[: T.BAD] = (true[: T.BAD] - 1) % 3
    comp = [(int((given == c).sum()), int(((given == c) & (given != true)).sum())) for c in range(3)]
    print(f"tiny class per class: training labels per class (given, of them wrong): {comp}")
    print(f"tiny class per class: weights {[round(float(v), 3) for v in w]} (start {float(cb.problem.weights.initial) if hasattr(cb.problem.weights, 'initial') else '?'}); flagged {f.tolist()}; {said}")
    print("  ", describe(cb))
