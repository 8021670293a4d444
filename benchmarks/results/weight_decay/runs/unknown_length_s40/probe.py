"""A fit of unknown length (``max_epochs=-1``, stopped by a callback at the step the known fit
ends) against the same fit with its length known, on the main job's recipe
(examples/lightning_digits.py: 300 digits, MLP 64-128-128-10, SGD+momentum, 40 epochs = 400
steps). Held-out test loss and the learned λ per layer, per seed.

    python benchmarks/results/weight_decay/runs/unknown_length_s40/probe.py OUT.json BUDGET SEED...

BUDGET: ``none`` (``max_overhead=None``, a bit-repeatable fit) or ``default``.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(REPO / "examples"))
from lightning_digits import MLP, evaluate, splits  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402

STEPS = 400


class StopAt(pl.Callback):
    """Ends the fit after ``steps`` optimizer steps, as an early-stopping rule would: the
    trainer cannot know it in advance."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


def fit(seed: int, known: bool, budget) -> dict:
    data = splits(300, 300, seed)
    pl.seed_everything(seed, verbose=False)
    model = MLP(0.0, hidden=128, lr=0.05)
    cb = LearnedWeightDecay(1e-4, **({} if budget == "default" else {"max_overhead": None}))
    trainer = pl.Trainer(
        max_epochs=STEPS // 10 if known else -1,
        callbacks=[cb] if known else [cb, StopAt(STEPS)],
        logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False, num_sanity_val_steps=0,
    )  # fmt: skip
    loader = DataLoader(data["train"], batch_size=32, shuffle=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer.fit(model, loader, DataLoader(data["val"], batch_size=300))
    test_loss, test_acc = evaluate(model, data["test"])
    lam = [float(v.mean()) for v in cb.decay_values().values()]
    return {
        "seed": seed, "known": known, "budget": str(budget), "steps": trainer.global_step,
        "test_loss": test_loss, "test_acc": test_acc, "lambda": lam,
        "warnings": sorted({str(w.message)[:160] for w in said if "Learned" in str(w.message)}),
    }  # fmt: skip


if __name__ == "__main__":
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    out, budget, seeds = Path(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3:]]
    rows = []
    for seed in seeds:
        for known in (True, False):
            rows.append(fit(seed, known, budget))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "warnings"}), flush=True)
    out.write_text(json.dumps(rows, indent=1))
