"""What the drop-ins add to a training step without a hyper step, counted (not timed).

On a GPU a small network is launch-bound: a step costs about the operations it dispatches, and
each value read back to the host waits for the device (session 49: ``LearnedDataWeights`` at
2.0-2.8x the plain wall time on an H200; ``benchmarks/bench_step_ops.py``)."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch

from hypertorch_sid.lightning.isolation import LossWatch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step_ops.py"
spec = importlib.util.spec_from_file_location("bench_step_ops", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
count = bench.count


def _scan(sequence: list[tuple[int, float]]) -> tuple[float | None, float | None, int | None]:
    """The first finite loss, the last finite one before the first non-finite, its step."""
    finite = [v for _, v in sequence if math.isfinite(v)]
    bad = next((s for s, v in sequence if not math.isfinite(v)), None)
    last = None
    for s, v in sequence:
        if bad is not None and s >= bad:
            break
        last = v
    return (finite[0] if finite else None), last, bad


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
def test_the_loss_watch_folded_in_chunks_finds_what_a_scan_finds(monkeypatch, chunk):
    monkeypatch.setattr(LossWatch, "CHUNK", chunk)
    rng = random.Random(chunk)
    for _ in range(60):
        n = rng.randint(1, 400)
        first_bad = rng.choice([None, rng.randrange(n)])
        sequence = []
        for i in range(n):
            v = rng.uniform(0.1, 5.0)
            if first_bad is not None and i >= first_bad and (i == first_bad or rng.random() < 0.8):
                v = float("nan") if rng.random() < 0.5 else float("inf")
            sequence.append((i + 5, v))
        watch = LossWatch()
        for step, v in sequence:
            watch.observe(torch.tensor(v), step)
        watch._fold()
        first, last, bad = (float(x) for x in watch._first)
        want_first, want_last, want_bad = _scan(sequence)
        assert (bad < 0) if want_bad is None else bad == want_bad
        if want_first is not None:
            assert first == pytest.approx(want_first, rel=1e-6)
        if want_last is not None:
            assert last == pytest.approx(want_last, rel=1e-6)


def test_the_loss_watch_holds_at_most_one_chunk_of_losses(monkeypatch):
    monkeypatch.setattr(LossWatch, "CHUNK", 16)
    watch = LossWatch()
    for step in range(100):
        watch.observe({"loss": torch.tensor(1.0 + step)}, step)
        assert len(watch._held) < 16
    assert watch.cause() is None  # no bad step


def test_the_drop_ins_training_steps_dispatch_few_operations_and_read_the_device_little():
    """Before session 49 a step under LearnedWeightDecay dispatched 67 operations (plain: 46)
    and under LearnedDataWeights 214 with 7 reads of the device; now 48 / 174 with 2."""
    plain = count("plain", epochs=3, from_step=10)
    decay = count("weight_decay", epochs=3, from_step=10)
    weights = count("data_weights", epochs=8, from_step=55)  # the cross term from step 50
    assert plain["host_reads_per_step"] == 0
    assert decay["host_reads_per_step"] == 0
    assert decay["ops_per_step"] <= plain["ops_per_step"] + 4
    assert weights["host_reads_per_step"] <= 2
    assert weights["ops_per_step"] <= plain["ops_per_step"] + 140
