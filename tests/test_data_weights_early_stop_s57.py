"""Session 57: ``LearnedDataWeights`` holds an ``EarlyStopping`` stop until its weights can act
(docs/data_weights.md, "Session 57: EarlyStopping held until the weights act").

Plain training on noisy labels reaches its lowest validation loss before the first hyper step,
so on ``ckpt_cnn`` (session 56) the recipe's ``EarlyStopping`` ended 19 of 60 fits before the
weights moved. The drop-in now raises the fit's ``min_steps`` to the first hyper step plus two
epochs (capped by the fit's planned length) where an ``EarlyStopping`` is among the callbacks,
restores the user's value after, and lets a ``Timer`` stop the fit on time.

The toy fit: 128 rows in 8 batches of 16 (an epoch: 8 steps), 6 epochs planned (48 steps), the
first hyper step at step 16 (hold: 16 + 2 · 8 = 32); a validation metric that rises with the
step, so ``EarlyStopping(patience=2)`` asks to stop at step 24 (best at step 8).
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import EarlyStopping, Timer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.lightning.early_stop_hold import hold_step

HELD = "asked to stop the fit"


def _net(ns: Any = pl) -> Any:
    class Net(ns.LightningModule):
        """Logs ``val_metric`` = the optimizer step: the best is the first validation, as a
        noisy-label fit's validation loss after its minimum."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x), y, reduction="none")

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_metric", torch.tensor(float(self.trainer.global_step)))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def _loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    y[:40] = (y[:40] + 1) % 3  # noisy labels
    train = IndexedDataset(TensorDataset(x[:128], y[:128]))
    return (
        DataLoader(train, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)),
        DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32),
    )


def _fit(
    callbacks: list,
    ns: Any = pl,
    ckpt_path: str | None = None,
    **trainer_kw: Any,
) -> tuple[Any, list[str]]:
    kw = {"max_epochs": 6, **trainer_kw}
    trainer = ns.Trainer(
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, accelerator="cpu", **kw,
    )  # fmt: skip
    module = _net(ns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, *_loaders(), ckpt_path=ckpt_path)
    return trainer, [str(w.message) for w in caught if "LearnedDataWeights" in str(w.message)]


def _drop_in(**kw: Any) -> LearnedDataWeights:
    return LearnedDataWeights(**{"start_step": 16, "every_n_steps": 8, **kw})


def _stopper(patience: int = 2) -> EarlyStopping:
    return EarlyStopping(monitor="val_metric", patience=patience)


def test_hold_step_is_the_first_hyper_step_plus_two_epochs_capped_by_the_fit() -> None:
    assert hold_step(80, 32, 256) == 144  # ckpt_cnn: Trainer(min_steps=144) of session 56
    assert hold_step(80, 32, 120) == 120
    assert hold_step(80, 31.5, float("inf")) == 143


def test_a_stop_asked_before_the_weights_act_is_held_to_two_epochs_past_the_first_hyper_step() -> (
    None
):
    """EarlyStopping asks at step 24 (8 steps after the first hyper step): the fit goes on to
    step 32, the weights moved, one warning names the step, why, and the opt-out; the fit's
    min_steps is the user's (None) again."""
    callback = _drop_in()
    trainer, said = _fit([callback, _stopper()])
    assert trainer.global_step == 32
    assert trainer.fit_loop.epoch_loop.min_steps is None
    held = [s for s in said if HELD in s]
    assert len(held) == 1, said
    assert "at optimizer step 24" in held[0] and "goes on to step 32" in held[0]
    assert "first hyper step, at step 16" in held[0]
    assert "hold_early_stopping=False" in held[0]
    weights = callback.data_weights()
    assert float(weights.std()) > 0.01  # the weights moved
    assert not [s for s in said if "stopped at optimizer step" in s], said


def test_the_opt_out_stops_when_asked_and_advises_the_hold() -> None:
    trainer, said = _fit([_drop_in(hold_early_stopping=False), _stopper()])
    assert trainer.global_step == 24
    assert not [s for s in said if HELD in s]
    stopped = [s for s in said if "stopped at optimizer step 24" in s]
    assert len(stopped) == 1, said
    assert "hold_early_stopping=True" in stopped[0] and "Trainer(min_steps=32)" in stopped[0]


def test_a_bad_opt_out_is_refused() -> None:
    with pytest.raises(Exception, match="hold_early_stopping"):
        LearnedDataWeights(hold_early_stopping="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(("user", "stopped"), [(40, 40), (20, 32)])
def test_the_users_min_steps_is_kept_where_larger_and_restored_after(
    user: int, stopped: int
) -> None:
    """min_steps=40 (beyond the hold) is left alone; min_steps=20 is raised to 32 for the fit
    and is 20 again after it."""
    trainer, said = _fit([_drop_in(), _stopper()], min_steps=user)
    assert trainer.global_step == stopped
    assert trainer.fit_loop.epoch_loop.min_steps == user
    assert bool([s for s in said if HELD in s]) == (user < 32), said


def test_max_steps_caps_the_hold() -> None:
    trainer, _ = _fit([_drop_in(), _stopper(1)], max_steps=28)
    assert trainer.global_step == 28


def test_the_hold_follows_the_fit_length_schedule() -> None:
    """schedule='fit_length' on 48 planned steps: start_step 7, every 5, the first hyper step at
    step 10, the hold at 10 + 16 = 26; EarlyStopping(patience=1) asks at step 16."""
    callback = LearnedDataWeights(schedule="fit_length")
    trainer, said = _fit([callback, _stopper(1)])
    assert trainer.global_step == 26
    assert [s for s in said if "goes on to step 26" in s], said


class _StepTimer(Timer):
    """A Timer whose clock is the optimizer step (one step: one second), read before each
    batch, so a test can say when its time is up."""

    def __init__(self, seconds: int) -> None:
        super().__init__(duration=timedelta(seconds=seconds))
        self.now = 0.0

    def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.now = float(trainer.global_step + 1)  # the step this batch ends at

    def time_elapsed(self, stage: Any = "train") -> float:
        return self.now


def test_a_timer_still_stops_a_held_fit_on_time() -> None:
    """EarlyStopping asks at 24 (held to 32); the Timer's time is up at step 28: the fit
    stops at 28."""
    trainer, _ = _fit([_drop_in(), _stopper(), _StepTimer(28)])
    assert trainer.global_step == 28
    assert trainer.fit_loop.epoch_loop.min_steps is None


def test_a_fit_without_early_stopping_is_unchanged_to_the_bit() -> None:
    runs = []
    for hold in (True, False):
        callback = _drop_in(hold_early_stopping=hold)
        trainer, _ = _fit([callback], max_epochs=4)
        assert trainer.fit_loop.epoch_loop.min_steps is None
        runs.append((trainer.global_step, callback.data_weights()))
    assert runs[0][0] == runs[1][0] == 32
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=0, atol=0)


def test_a_resumed_fit_holds_from_its_restored_step(tmp_path: Path) -> None:
    """A fit checkpointed at step 8 (before any hyper step) resumes with EarlyStopping(patience=1),
    which asks at step 24 (best at 16): held to 32, as the uninterrupted fit."""
    first, _ = _fit([_drop_in()], max_steps=8)
    path = str(tmp_path / "step8.ckpt")
    first.save_checkpoint(path)
    trainer, said = _fit([_drop_in(), _stopper(1)], ckpt_path=path)
    assert trainer.global_step == 32
    assert [s for s in said if "at optimizer step 24" in s and HELD in s], said
    old, _ = _fit([_drop_in(hold_early_stopping=False), _stopper(1)], ckpt_path=path)
    assert old.global_step == 24


def test_the_hold_under_the_unified_lightning_package() -> None:
    L = pytest.importorskip("lightning.pytorch")
    stopper = L.callbacks.EarlyStopping(monitor="val_metric", patience=2)
    trainer, said = _fit([_drop_in(), stopper], ns=L)
    assert trainer.global_step == 32
    assert trainer.fit_loop.epoch_loop.min_steps is None
    assert [s for s in said if HELD in s], said


def _ddp_worker(out: Path) -> None:
    """Under DDP on 2 CPU ranks (an epoch: 4 steps per rank, the hold at 16 + 8 = 24):
    EarlyStopping asks at step 12 (where the opt-out stops); the default holds to 24, a Timer up
    at step 20 stops it at 20. Each rank writes where it stopped."""
    import json

    from lightning_problems import end_ddp_worker

    runs = [
        ("held", {}, []),
        ("timer", {}, [_StepTimer(20)]),
    ]
    for case, kw, timer in runs:
        trainer, _ = _fit([_drop_in(**kw), _stopper(), *timer], devices=2, strategy="ddp")
        result = {"step": trainer.global_step, "min_steps": trainer.fit_loop.epoch_loop.min_steps}
        (out / f"{case}_{trainer.global_rank}.json").write_text(json.dumps(result))
    end_ddp_worker()


@pytest.mark.ddp
def test_every_ddp_rank_holds_to_the_same_step(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for case, step in (("held", 24), ("timer", 20)):
        for rank in (0, 1):
            got = json.loads((tmp_path / f"{case}_{rank}.json").read_text())
            assert got == {"step": step, "min_steps": None}, (case, rank, got)


if __name__ == "__main__":
    import sys

    _ddp_worker(Path(sys.argv[1]))
