"""Session 44: the tests of tests/test_data_weights_tasks.py that moved when LearnedDataWeights'
curvature estimate read the union of the minibatches' spectra (minibatches="each") instead of
their mean Hessian's ("mean"). For each arm: the estimated L, lambda_min, damping and alpha, the
adjoint residuals, the weights' separation, TwoComponentSplit's fit, what flagged() returns, and
the numbers each test asserts. Usage (repository root):
PYTHONPATH=$PWD:$PWD/tests OMP_NUM_THREADS=1 python <this folder>/moved_tests.py > moved_tests.txt
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import warnings

import test_data_weights_tasks as T
import torch
import torch.nn.functional as F

from hypertorch_sid.core.flag_rules import TwoComponentSplit
from hypertorch_sid.lightning.callback import CALLBACK_CONFIG

torch.set_num_threads(1)


def curvature(arm: str):
    return dataclasses.replace(CALLBACK_CONFIG.curvature, minibatches=arm)


def describe(cb) -> str:
    h = cb.history

    def values(key: str) -> list[float]:
        return [float(r[key]) for r in h if key in r]

    Ls = sorted({round(v, 3) for v in values("hyper/L")})
    lm = sorted({round(v, 3) for v in values("hyper/lambda_min")})
    dm, al = values("hyper/damping"), values("hyper/alpha")
    res = values("hyper/relative_adjoint_residual")
    retries = sum(int(r.get("hyper/retries", 0)) for r in h)
    return (
        f"hyper steps {len(h)}; L values {Ls[:8]}{'...' if len(Ls) > 8 else ''}; "
        f"lambda_min {lm[:8]}; damping median {statistics.median(dm):.4g}; "
        f"alpha median {statistics.median(al):.4g} (min {min(al):.4g}, max {max(al):.4g}); "
        f"rel. adjoint residual median {statistics.median(res):.3g} max {max(res):.3g}; "
        f"retries {retries}"
    )


def split(cb) -> str:
    """TwoComponentSplit's fit on the learned logits: the two bumps, Ashman's D (needs >= 2)."""
    rule = TwoComponentSplit()
    w = cb.problem.weights
    x = w.parameterization.effective_logits(w).to(torch.float64).reshape(-1)
    x = x.clamp(-rule.clip, rule.clip)
    _, (mu, sd) = rule.fit(x)
    lo, hi = int(mu.argmin()), int(mu.argmax())
    D = 2**0.5 * float(mu[hi] - mu[lo]) / float(sd.pow(2).sum().sqrt())

    def q(t: torch.Tensor) -> list[float]:
        levels = torch.tensor([0.1, 0.5, 0.9], dtype=t.dtype)
        return [round(float(v), 2) for v in torch.quantile(t, levels)]

    return (
        f"split: mu low {float(mu[lo]):.2f} (sd {float(sd[lo]):.2f}), high {float(mu[hi]):.2f} "
        f"(sd {float(sd[hi]):.2f}), D {D:.2f}; logit quantiles 10/50/90 % "
        f"corrupted {q(x[: T.BAD])} clean {q(x[T.BAD :])}"
    )


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


def regression(arm: str, outputs: int, **kwargs):
    model = T.Task(T.mlp(4, outputs), mse(outputs))
    data = T.regression(outputs)
    return T.fit(model, data, objective="mean_loss", curvature=curvature(arm), **kwargs)


for arm in sys.argv[1:] or ["mean", "each"]:
    print(f"==================== minibatches={arm!r}")
    for outputs in (1, 3):
        cb = regression(arm, outputs, normalize=False)
        o, c = T.separation(cb)
        f, said = flags(cb)
        print(
            f"MSE outputs={outputs} normalize=False: outliers {o:.3f} clean {c:.3f} "
            "(test: outliers < clean - 0.25)"
        )
        print(
            f"   flagged {len(f)}, of them outliers {int((f < T.BAD).sum())} "
            f"(test before session 44: >= 20, all outliers); {said}"
        )
        print("  ", describe(cb))
        print("  ", split(cb))
    for outputs in (1, 3):  # normalize=True: gauge "auto" -> "mean_logit" for real targets
        cb = regression(arm, outputs)
        o, c = T.separation(cb)
        f, said = flags(cb)
        print(
            f"MSE outputs={outputs} normalize=True (gauge auto): outliers {o:.3f} clean {c:.3f}; "
            f"flagged {len(f)}, outliers {int((f < T.BAD).sum())}; {said}"
        )
        print("  ", describe(cb))
    data = T.imbalanced()
    cb = T.fit(T.Task(T.mlp(2, 3), T.cross_entropy), data, curvature=curvature(arm))
    o, c = T.separation(cb)
    tiny = T.BAD + torch.nonzero(data[1][T.BAD :] == 2).flatten()
    f, said = flags(cb)
    w = cb.data_weights()
    print(
        f"tiny class per sample: corrupted {o:.3f} clean {c:.3f}; "
        f"clean tiny-class weights min {float(w[tiny].min()):.3f}"
    )
    print(
        f"   flagged {len(f)}, corrupted among them {int((f < T.BAD).sum())} of {T.BAD} "
        f"(test before session 44: >= 65), "
        f"clean tiny flagged {len(set(tiny.tolist()) & set(f.tolist()))}; {said}"
    )
    print("  ", split(cb))
    missed = sorted(set(range(T.BAD)) - set(f.tolist()))
    print(
        f"   corrupted not flagged: {missed}; their weights "
        f"{[round(float(w[i]), 3) for i in missed]}; labels given "
        f"{[int(data[1][i]) for i in missed]}"
    )
    print("  ", describe(cb))
    cb = T.fit(
        T.Task(T.mlp(2, 3), T.cross_entropy),
        T.imbalanced(),
        indexed=False,
        per="class",
        num_classes=3,
        curvature=curvature(arm),
    )
    w = cb.data_weights()
    f, said = flags(cb)
    given, true = data[1], data[1].clone()
    true[: T.BAD] = (true[: T.BAD] - 1) % 3
    comp = [
        (int((given == c).sum()), int(((given == c) & (given != true)).sum())) for c in (0, 1, 2)
    ]
    print(f"tiny class per class: training labels per class (given, of them wrong): {comp}")
    print(
        f"tiny class per class: weights {[round(float(v), 3) for v in w]} "
        f"(start {cb.problem.weights.initial_weight}); flagged {f.tolist()}; {said}"
    )
    print("  ", describe(cb))
