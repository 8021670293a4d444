"""The data weights' hyper-step schedule scaled to the fit's length (session 51, issue 27).

``LearnedDataWeights(schedule="fit_length")`` resolves ``start_step`` / ``every_n_steps`` (those
not given) at the fit's start from ``trainer.estimated_stepping_batches`` T:
``min(50, ⌈13 T / 100⌉)`` / ``min(40, ⌈5 T / 48⌉)``, the proportions of the benchmark where 50 /
40 were chosen (bench_noisy_labels, T = 384). ``schedule="fixed"`` keeps 50 / 40."""

from __future__ import annotations

import types
import warnings
from typing import Any

import pytest
import torch
from lightning_problems import trainer
from test_data_weights_lightning import Classifier, Data, StopAt

from hypertorch_sid import ConfigurationError, LearnedDataWeights


def scaled(**kwargs: Any) -> LearnedDataWeights:
    return LearnedDataWeights(schedule="fit_length", **kwargs)


def first_hyper_step(cb: LearnedDataWeights) -> int:
    """The first optimizer step the callback runs a hyper step at (step ≥ start, step % n = 0)."""
    n = cb.every_n_steps
    return -(-max(cb.start_step, 1) // n) * n


def resolve(cb: LearnedDataWeights, total: float) -> tuple[int, int]:
    cb._resolve_schedule(types.SimpleNamespace(estimated_stepping_batches=total))
    return cb.start_step, cb.every_n_steps


def quiet_fit(cb: LearnedDataWeights, ckpt: Any = None, extra: tuple = (), **kwargs: Any):
    t = trainer([cb, *extra], **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(Classifier(), datamodule=Data(shuffle=False), ckpt_path=ckpt)
    return t


def test_the_benchmarks_length_keeps_50_and_40():
    """T = 384 (bench_noisy_labels: 2000 examples, batch 64, 12 epochs) resolves exactly the
    fixed defaults, so the benchmark's fits are unchanged; longer fits keep them too."""
    assert LearnedDataWeights.fit_length_schedule(384) == (50, 40)
    for total in (385, 1000, 10**6):
        assert LearnedDataWeights.fit_length_schedule(total) == (50, 40)
    assert LearnedDataWeights.fit_length_schedule(383) == (50, 40)
    assert LearnedDataWeights.fit_length_schedule(300) == (39, 32)
    assert resolve(scaled(), 384) == (50, 40)


def test_an_unknown_or_infinite_length_keeps_50_and_40():
    """max_steps=-1 with max_epochs=-1 (estimated_stepping_batches = inf) keeps the caps."""
    assert resolve(scaled(), float("inf")) == (50, 40)
    assert LearnedDataWeights.fit_length_schedule(float("nan")) == (50, 40)


def test_every_short_fit_gets_its_first_hyper_step_early_and_several_after():
    """From 10 optimizer steps on, the first hyper step comes in the fit's first 26 % (at step
    80 of 384 on the benchmark: 21 %) and at least 5 hyper steps follow."""
    for total in range(10, 2000):
        start, every = LearnedDataWeights.fit_length_schedule(total)
        first = -(-start // every) * every
        assert 1 <= start <= 50 and 1 <= every <= 40
        assert first <= 0.26 * total, total
        assert (total - first) // every + 1 >= 5, total


def test_a_short_fit_resolves_its_schedule_and_the_weights_move():
    """96 optimizer steps (10 batches an epoch, accumulated by 2, stopped at 96): the fit-length
    schedule's first hyper step at step 20, in the first third, and 8 hyper steps run; the
    fixed schedule's first at step 80 (without accumulation, 1.6 epochs before the end: the
    late-start warning), one hyper step."""
    cb = scaled(seed=0)
    quiet_fit(cb, max_steps=96, accumulate_grad_batches=2)
    assert (cb.start_step, cb.every_n_steps) == (13, 10)
    assert first_hyper_step(cb) == 20 <= 96 / 3
    assert len(cb.history) == 8
    assert not torch.allclose(cb.data_weights(), torch.full((240,), 0.5))

    fixed = LearnedDataWeights(seed=0, schedule="fixed")
    with pytest.warns(UserWarning, match="at optimizer step 80.*Or .*schedule='fit_length'"):
        trainer([fixed], max_steps=96).fit(Classifier(), datamodule=Data(shuffle=False))
    assert (fixed.start_step, fixed.every_n_steps) == (50, 40)
    assert len(fixed.history) == 1


def test_the_resolved_schedule_is_said_at_the_fit_start(caplog):
    cb = scaled(seed=0)
    with caplog.at_level("INFO"):
        quiet_fit(cb, max_steps=30)
    said = [r.getMessage() for r in caplog.records if "schedule='fit_length'" in r.getMessage()]
    assert said == [
        "LearnedDataWeights: schedule='fit_length' for a fit of 30 optimizer steps: "
        "start_step=4, every_n_steps=4; the first hyper step (from which the weights move) at "
        "optimizer step 4."
    ]


def test_explicit_values_win():
    """A value given is kept whatever the length; the other is still scaled."""
    assert resolve(scaled(start_step=50, every_n_steps=40), 96) == (50, 40)
    assert resolve(scaled(start_step=0), 96) == (0, 10)
    assert resolve(scaled(every_n_steps=7), 96) == (13, 7)
    assert resolve(LearnedDataWeights(schedule="fixed"), 96) == (50, 40)
    # a user's explicit late start still gets the late-start warning
    with pytest.warns(UserWarning, match="at optimizer step 80") as caught:
        trainer([scaled(start_step=50, every_n_steps=40, seed=0)], max_steps=96).fit(
            Classifier(), datamodule=Data(shuffle=False)
        )
    assert not any("Or LearnedDataWeights(schedule=" in str(w.message) for w in caught)


def test_the_hyper_step_cross_terms_cap_is_its_every_10():
    cb = scaled(cross_term="hyper_step")
    assert resolve(cb, 384) == (50, 10)
    assert resolve(cb, 96) == (13, 10)
    assert resolve(cb, 40) == (6, 5)


def test_each_fit_resolves_anew_from_its_own_length():
    """The same callback in a second, longer fit is not left with the first fit's schedule."""
    cb = scaled()
    assert resolve(cb, 96) == (13, 10)
    assert resolve(cb, 384) == (50, 40)


def test_a_bad_schedule_is_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match="'fit_length'.*'fixed'.*got 'short'"):
        LearnedDataWeights(schedule="short")


def test_a_resumed_fit_resolves_the_uninterrupted_ones_schedule(tmp_path):
    """Stopped at step 50 of a 100-step fit and resumed: the same schedule (13 / 11 from T = 100,
    not 7 / 6 from the 50 steps left), the same hyper steps, the same weights."""
    straight = scaled(seed=0, directional="forward_mode")
    quiet_fit(straight, max_epochs=10)

    half = scaled(seed=0, directional="forward_mode")
    t = quiet_fit(half, max_epochs=10, extra=(StopAt(50),))
    assert t.global_step == 50
    t.save_checkpoint(tmp_path / "half.ckpt")
    resumed = scaled(seed=0, directional="forward_mode")
    quiet_fit(resumed, max_epochs=10, ckpt=tmp_path / "half.ckpt")

    assert (straight.start_step, straight.every_n_steps) == (13, 11)
    assert (resumed.start_step, resumed.every_n_steps) == (13, 11)
    assert len(resumed.history) == len(straight.history) == 8
    torch.testing.assert_close(
        resumed.data_weights(), straight.data_weights(), rtol=1e-4, atol=1e-5
    )


def test_the_default_stays_fixed():
    """schedule="fit_length" missed its adoption rule on the 20 Newsgroups recipe's accuracy
    (−1.2 points, fresh seeds 6-11; docs/data_weights.md): ``LearnedDataWeights()`` keeps 50 /
    40 in a short fit, and logs no resolved schedule."""
    cb = LearnedDataWeights()
    assert cb.schedule == "fixed"
    assert resolve(cb, 96) == (50, 40)
