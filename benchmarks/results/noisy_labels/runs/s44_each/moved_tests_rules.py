"""Session 44: the flag rules on two moved tests' learned weights, minibatches="mean" against
"each": the MSE task (normalize=False) with BelowWeight() (omega < omega_0 / 2) and
TwoComponentSplit, and test_data_weights_lightning's ClassRelativeError task (TwoComponentSplit's
rows and flagged()'s evidence gate). Usage (repository root):
PYTHONPATH=$PWD:$PWD/tests OMP_NUM_THREADS=1 python <this folder>/moved_tests_rules.py
"""

from __future__ import annotations

import dataclasses
import warnings

import test_data_weights_lightning as TL
import test_data_weights_tasks as T
import torch
import torch.nn.functional as F

from hypertorch_sid.core.flag_rules import BelowWeight, TwoComponentSplit
from hypertorch_sid.lightning.callback import CALLBACK_CONFIG

torch.set_num_threads(1)
warnings.simplefilter("ignore")


def curvature(arm):
    return dataclasses.replace(CALLBACK_CONFIG.curvature, minibatches=arm)


def mse(outputs):
    def step(z, y):
        out = F.mse_loss(z, y, reduction="none")
        return out[:, 0] if outputs == 1 else out

    return step


for arm in ("mean", "each"):
    for outputs in (1, 3):
        model, data = T.Task(T.mlp(4, outputs), mse(outputs)), T.regression(outputs)
        cb = T.fit(model, data, objective="mean_loss", normalize=False, curvature=curvature(arm))
        for rule in (BelowWeight(), TwoComponentSplit()):
            f = cb.flagged(rule)
            print(
                f"{arm} MSE outputs={outputs} {rule!r}: flagged {len(f)}, "
                f"outliers {int((f < T.BAD).sum())}"
            )
        w = cb.data_weights()
        print(
            f"   omega_0 {cb.problem.weights.initial_weight:.3f}; outliers with omega < 0.5: "
            f"{int((w[: T.BAD] < 0.5).sum())}, clean: {int((w[T.BAD :] < 0.5).sum())}"
        )
    cb = TL.callback(objective="class_relative_error", curvature=curvature(arm))
    TL.fit(cb, 15)
    w = cb.data_weights()
    split = cb.flagged(TwoComponentSplit())
    p, r = TL.precision_recall(split)
    default = cb.flagged()
    print(
        f"{arm} ClassRelativeError: omega corrupted {float(w[: TL.NOISY].mean()):.3f} "
        f"clean {float(w[TL.NOISY :].mean()):.3f}; TwoComponentSplit {len(split)} rows, "
        f"P/R {p:.2f}/{r:.2f}; flagged() {len(default)}; gate: "
        f"{cb.problem.flag_evidence(split)}"
    )
