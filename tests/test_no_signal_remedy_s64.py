"""Data weights that find no signal are acted on during the fit (session 64, issue 27).

``LearnedDataWeights(no_signal=ResetWeights())`` (an option; the default is ``WarnAtEnd()``)
reads eq. drift once, after half the fit's planned hyper steps (at least four intervals); where the weights moved no more than a random
walk of their own steps it puts every weight back at its start and learns them no further, so
the rest of the fit trains plainly. Where they separate (flipped labels, a clean validation
set) it does nothing: the fit is the default's to the last digit. The decision and eq. drift's
sums travel in the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_problems import digits_split, end_ddp_worker, trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.lightning.no_signal import (
    ResetWeights,
    ShrinkWeights,
    WarnAtEnd,
    planned_intervals,
)

N, N_VAL, EPOCHS = 400, 150, 12  # 10 batches an epoch: hyper steps at 50, 60, ..., 120


class Regression(pl.LightningModule):
    """A linear regression with per-sample squared errors, SGD with momentum."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y, reduction="none")

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Classifier(Regression):
    """A small MLP with per-sample cross entropy."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")


def noise() -> tuple[Tensor, ...]:
    """Targets of pure noise, drawn alike for training and validation: no row helps the
    validation loss more than another (session 63's no-signal problem)."""
    gen = torch.Generator().manual_seed(1)
    X, Xv = torch.randn(N, 4, generator=gen), torch.randn(N_VAL, 4, generator=gen)
    return X, torch.randn(N, generator=gen), Xv, torch.randn(N_VAL, generator=gen)


def flipped() -> tuple[Tensor, ...]:
    """40 % of the digits' training labels moved to another class, a clean validation set."""
    X, y, Xv, yv = digits_split(N, N_VAL, seed=0)
    gen = torch.Generator().manual_seed(0)
    bad = torch.randperm(N, generator=gen)[: int(0.4 * N)]
    y = y.clone()
    y[bad] = (y[bad] + torch.randint(1, 10, (len(bad),), generator=gen)) % 10
    return X, y, Xv, yv


def fit(
    model: pl.LightningModule,
    data: tuple[Tensor, ...],
    cb: LearnedDataWeights,
    ckpt_path: str | None = None,
    **trainer_kw: Any,
) -> list[str]:
    """Fit ``model`` on ``data`` = (X, y, X_val, y_val) with ``cb``; the warnings about the
    weights' random walk."""
    X, y, Xv, yv = data
    train = DataLoader(
        IndexedDataset(TensorDataset(X, y)),
        batch_size=40,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    settings = {"max_epochs": EPOCHS, **trainer_kw}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb, *settings.pop("callbacks", [])], **settings).fit(
            model,
            train,
            DataLoader(TensorDataset(Xv, yv), batch_size=N_VAL),
            ckpt_path=ckpt_path,
        )
    return [str(w.message) for w in caught if "random walk" in str(w.message)]


def drop_in(policy: Any = None, **kwargs: Any) -> LearnedDataWeights:
    """The drop-in of these tests: a new v every epoch (``every_n_steps=10``)."""
    return LearnedDataWeights(seed=0, every_n_steps=10, no_signal=policy, **kwargs)


def test_the_default_learns_to_the_end():
    """The default is session 63's ``WarnAtEnd``: ``ResetWeights`` reset 5 of 6 fits whose
    weights separated weakly on session 64's unseen recipes (hinge loss, trusted + untrusted
    data), so it is an option."""
    assert isinstance(LearnedDataWeights().no_signal, WarnAtEnd)


def test_reset_weights_without_a_signal():
    """Half the 8 planned intervals: judged at the 5th hyper step (step 90), reset, and no
    hyper step after it; said once, with the numbers and how to switch it off."""
    cb = drop_in(ResetWeights(), objective="mean_loss")
    assert cb.no_signal == ResetWeights(after=0.5) and cb.no_signal.keep == 0
    said = fit(Regression(), noise(), cb)
    settled = cb.settled()
    assert settled is not None and settled["step"] == 90 and settled["steps"] == 4, settled
    assert settled["drift"] <= 1.25 and settled["median"] <= 1.3
    assert [h["global_step"] for h in cb.history] == [50, 60, 70, 80]  # none from 90 on
    w = cb.data_weights()
    assert torch.allclose(w, torch.full_like(w, 0.5))  # every weight at its start
    assert len(said) == 1 and "learned no further" in said[0]
    assert "no_signal=WarnAtEnd()" in said[0] and "optimizer step 90" in said[0]
    reading = cb.weight_signal()
    assert reading is not None and reading.steps == 4  # the reading it acted on
    with pytest.warns(UserWarning, match="settled at optimizer step 90"):
        assert len(cb.flagged()) == 0


def test_shrink_keeps_a_share_of_each_logits_move():
    """``ShrinkWeights(keep=0.5)``: each logit halfway back to its start, then held."""
    ref = drop_in(ResetWeights(), objective="mean_loss")
    fit(Regression(), noise(), ref)
    cb = drop_in(ShrinkWeights(keep=0.5), objective="mean_loss")
    fit(Regression(), noise(), cb)
    assert cb.settled() == ref.settled()  # the same fit up to the decision
    x = torch.logit(cb.data_weights().double())
    assert 0 < float(x.abs().max()) and float(x.std()) > 0.1  # the weights kept a spread


def test_reset_leaves_weights_that_separate_alone():
    """Flipped labels: eq. drift reads a signal at step 90, nothing is reset and the fit is
    session 63's (``WarnAtEnd``) to the last digit."""
    cb, default = drop_in(ResetWeights()), drop_in(WarnAtEnd())
    assert fit(Classifier(), flipped(), cb) == []
    fit(Classifier(), flipped(), default)
    assert cb.settled() is None and cb._judged
    assert len(cb.history) == len(default.history) == 8
    assert torch.equal(cb.data_weights(), default.data_weights())


def test_warn_at_end_learns_to_the_end_and_warns_there():
    """``WarnAtEnd`` is session 63's default: the weights learned to the fit's end, said
    there."""
    cb = drop_in(WarnAtEnd(), objective="mean_loss")
    said = fit(Regression(), noise(), cb)
    assert cb.settled() is None and len(cb.history) == 8
    assert len(said) == 1 and "Compare with a fit without LearnedDataWeights" in said[0]


def test_rows_moved_in_too_few_intervals_are_not_judged():
    """``cross_term="hyper_step"``: rows move only in the hyper steps' own minibatches (4 of
    the 10 batches), so by the decision the median row has taken fewer than 1.5 effective steps
    and Sᵢ² = Qᵢ for most rows whatever their drift: nothing is judged, nothing reset (without
    the guard R read about 1 and the fit was reset)."""
    cb = drop_in(ResetWeights(), objective="mean_loss", cross_term="hyper_step")
    fit(Regression(), noise(), cb)
    assert cb._judged and cb.settled() is None
    assert len(cb.history) == 8  # every hyper step ran
    assert cb._signal._prefixes[0][3] < 1.5  # the median row's effective steps at k = 4


def test_a_resumed_fit_keeps_the_decision_and_the_sums(tmp_path: Path):
    """Checkpoints before the decision (epoch 7: three intervals read) and after it (epoch 10):
    resumed with a new callback, the first settles at step 90 on the same reading as the
    uninterrupted fit (eq. drift's sums travel in the checkpoint; read anew, it would need four
    more intervals), the second stays settled and learns nothing more."""
    saver = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)
    whole = drop_in(ResetWeights(), objective="mean_loss")
    fit(Regression(), noise(), whole, callbacks=[saver], enable_checkpointing=True)
    before, after = (str(tmp_path / f"epoch={e}-step={10 * (e + 1)}.ckpt") for e in (6, 9))
    resumed = drop_in(ResetWeights(), objective="mean_loss")
    said = fit(Regression(), noise(), resumed, ckpt_path=before)
    assert resumed.settled() is not None and len(said) == 1
    assert resumed.settled()["step"] == whole.settled()["step"] == 90
    assert resumed.settled()["drift"] == pytest.approx(whole.settled()["drift"], rel=1e-3)
    late = drop_in(ResetWeights(), objective="mean_loss")
    assert fit(Regression(), noise(), late, ckpt_path=after) == []  # said before, not again
    assert late.settled() == whole.settled()
    assert [h["global_step"] for h in late.history] == [50, 60, 70, 80]
    w = late.data_weights()
    assert torch.allclose(w, torch.full_like(w, 0.5))


def test_settings_are_checked():
    with pytest.raises(ConfigurationError, match="no_signal must be a NoSignalPolicy"):
        LearnedDataWeights(no_signal="reset")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="keep must be a number in"):
        ShrinkWeights(keep=1.0)
    with pytest.raises(ConfigurationError, match="after must be a number in"):
        ResetWeights(after=0)
    assert planned_intervals(120, 50, 10) == 8  # hyper steps at 50, ..., 120
    assert planned_intervals(320, 50, 40) == 7 and planned_intervals(float("inf"), 50, 40) > 99
    assert ResetWeights().judged_at(7) == 4 and ResetWeights().judged_at(10) == 5
    assert WarnAtEnd().judged_at(7) is None


# ---------------------------------------------------------------- DDP: every rank settles alike
def _ddp_worker(out: Path) -> None:
    """Fit the noise regression on 2 CPU processes (Lightning's DDP), each rank 200 rows, a
    hyper step every epoch from step 20 (9 intervals: judged after 5, at step 45); each rank
    saves its decision and ω."""
    torch.set_num_threads(1)
    cb = LearnedDataWeights(
        seed=0, start_step=20, every_n_steps=5, objective="mean_loss", no_signal=ResetWeights()
    )
    X, y, Xv, yv = noise()
    train = DataLoader(IndexedDataset(TensorDataset(X, y)), batch_size=40, shuffle=True)
    t = trainer([cb], devices=2, strategy="ddp", max_epochs=12)
    t.fit(Regression(), train, DataLoader(TensorDataset(Xv, yv), batch_size=N_VAL))
    kept = {"settled": cb.settled(), "hyper": [h["global_step"] for h in cb.history]}
    torch.save({**kept, "omega": cb.data_weights()}, out / f"rank{t.global_rank}.pt")
    end_ddp_worker()


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_ddp_every_rank_settles_at_the_same_step(tmp_path: Path) -> None:
    """Both ranks reset at the same hyper step (rank 0's reading, broadcast) and hold the
    same uniform weights after it; neither takes a hyper step after it."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["settled"] is not None and ranks[0]["settled"]["step"] == 45
    assert ranks[0]["settled"] == ranks[1]["settled"]
    assert ranks[0]["hyper"] == ranks[1]["hyper"] == [20, 25, 30, 35, 40]
    assert torch.equal(ranks[0]["omega"], ranks[1]["omega"])
    assert torch.allclose(ranks[0]["omega"], torch.full((N,), 0.5))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True, help="folder for per-rank results")
    _ddp_worker(parser.parse_args().worker)
