"""Faults, Lightning half of issue 5: SIGKILL and resume, checkpoints, corruption, determinism.

The job (``tests/_kill_resume_job.py``): a BatchNorm network trained by Adam, a per-feature
penalty exp(log_lam) tuned by :class:`HyperOptimizationCallback` (Adam outer optimizer, curvature
estimated, then re-estimated every 3 hyper steps), a hyper step every 2 optimizer steps, 5 steps
per epoch, 30 steps, ``ModelCheckpoint`` every 5 steps with ``save_last=True``.

* **SIGKILL**: a subprocess is killed after step 19 (last checkpoint: step 15, hyper step 7;
  hyper steps 8 and 9 are lost with it); a new subprocess resumes with
  ``trainer.fit(ckpt_path=last.ckpt)``. Oracle: an uninterrupted run. The λ of every hyper step
  of both processes (hyper steps 8, 9 computed twice), the final weights and the callback's
  history are bitwise those of the uninterrupted run.
* **Checkpoints** load with ``torch.load(weights_only=True)``; the callback's state holds λ, the
  outer optimizer, v, the counters, constants and both samplers; each of these is needed (a stale
  one changes the resumed trajectory), and a resume from any checkpoint is exact.
* **Corruption**: a truncated file, a flipped byte in any record, and tampered callback states
  (missing keys, wrong shapes, NaN λ, a foreign sampler state, ...) give an error on resume
  before any training step and load nothing into the callback (λ, v, outer optimizer, samplers).
* **Determinism**: the same seed gives a bitwise-equal λ trajectory with 1 and with 2 DDP
  processes; another seed gives another one.

Mid-epoch checkpoints are not used for the bitwise resume: Lightning restarts an epoch's training
batches from the start when resuming mid-epoch from an ordinary DataLoader (only stateful loaders
resume mid-epoch), which changes w for reasons outside the callback. Checkpoints here fall on
epoch ends; the hyper steps do not (every 2 steps, epochs of 5), so a checkpoint holds the
callback between hyper steps, in the middle of its samplers' permutations.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _kill_resume_job as job
import pytest
import pytorch_lightning as pl
import torch
from lightning_problems import end_ddp_worker

from hypertorch_sid import ConfigurationError, HyperOptimizationCallback

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*callbacks used to create the checkpoint.*"),
]

JOB = Path(job.__file__).resolve()
KILL_AFTER = 19  # optimizer steps done when the job is killed
LAST_CKPT_STEP = 15  # the last checkpoint before the kill
KEY = "HyperOptimizationCallback"  # the callback's entry in checkpoint["callbacks"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted job (in this process): ref.jsonl, ref_final.pt, ref_ckpt/*.ckpt."""
    out = tmp_path_factory.mktemp("reference")
    job.run(out, "ref")
    return out


def _lambda_log(path: Path) -> dict[int, dict[str, Any]]:
    """hyper_step → {global_step, hyper_step, lam (hex floats)} of one JSONL file."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_step = {line["hyper_step"]: line for line in lines}
    assert len(by_step) == len(lines), "a hyper step was logged twice by one process"
    return by_step


def _final(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def _assert_same_final(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    assert a["history"] == b["history"]  # every logged float equal


def _ckpt(reference: Path, step: int) -> Path:
    (path,) = (reference / "ref_ckpt").glob(f"epoch=*-step={step}.ckpt")
    return path


# ====================================================================== SIGKILL and resume
def _job_command(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(JOB), "--out", str(out), *args]


def test_sigkill_mid_training_then_resume_equals_uninterrupted_run(tmp_path, reference):
    command = _job_command(tmp_path, "--tag", "killed", "--kill-after", str(KILL_AFTER))
    job.kill_at_marker(command, tmp_path, tmp_path / "killed.log")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    assert not (tmp_path / "killed_final.pt").exists()  # it did not finish

    # the last checkpoint is from before the kill, with hyper steps done after it
    last = torch.load(tmp_path / "killed_ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == LAST_CKPT_STEP
    assert last["callbacks"][KEY]["sid"]["hyper_step"] == LAST_CKPT_STEP // 2
    killed = _lambda_log(tmp_path / "killed.jsonl")
    assert sorted(killed) == list(range(KILL_AFTER // 2 + 1))  # λ₀, then hyper steps 1..9

    proc = subprocess.run(
        _job_command(
            tmp_path, "--tag", "resumed", "--resume", str(tmp_path / "killed_ckpt" / "last.ckpt")
        ),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = _lambda_log(tmp_path / "resumed.jsonl")
    ref = _lambda_log(reference / "ref.jsonl")
    assert sorted(ref) == list(range(16))
    redone = sorted(set(killed) & set(resumed))
    assert redone == [8, 9]  # computed before the kill, lost, recomputed after the resume
    assert sorted(set(killed) | set(resumed)) == sorted(ref)
    for name, log_ in (("killed", killed), ("resumed", resumed)):
        for step, line in log_.items():
            assert line == ref[step], f"{name} run, hyper step {step}"  # bitwise (hex floats)
    assert len({tuple(line["lam"]) for line in ref.values()}) == len(ref)  # λ moved every step
    _assert_same_final(_final(tmp_path / "resumed_final.pt"), _final(reference / "ref_final.pt"))


# ====================================================================== checkpoint contents
def test_checkpoints_load_weights_only_with_the_complete_callback_state(reference):
    paths = sorted((reference / "ref_ckpt").glob("*.ckpt"))
    assert len(paths) == 7  # steps 5, 10, ..., 30 and last
    for path in paths:
        torch.load(path, weights_only=True)
    ckpt = torch.load(_ckpt(reference, LAST_CKPT_STEP), weights_only=True)
    state = ckpt["callbacks"][KEY]
    hyper_steps = LAST_CKPT_STEP // 2
    ref = _lambda_log(reference / "ref.jsonl")
    assert set(state) == {"sid", "train_sampler", "val_sampler", "val_samples", "history", "budget"}
    assert state["budget"] == {}  # no max_overhead: no accounting to keep

    sid = state["sid"]
    (lam,) = sid["hyperparameters"]
    assert [float.hex(x) for x in lam.tolist()] == ref[hyper_steps]["lam"]
    assert torch.equal(lam, ckpt["state_dict"]["log_lam"])
    (adam,) = sid["outer_optimizer"]["state"].values()
    assert int(adam["step"]) == hyper_steps
    assert adam["exp_avg"].shape == lam.shape and bool((adam["exp_avg_sq"] > 0).all())
    model = job.Net()
    shapes = [tuple(p.shape) for p in model.inner_parameters()]
    assert [tuple(x.shape) for x in sid["v"]] == shapes
    assert all(bool(torch.isfinite(x).all()) for x in sid["v"]) and any(x.any() for x in sid["v"])
    assert sid["hyper_step"] == hyper_steps
    assert all(math.isfinite(sid["constants"][c]) for c in ("alpha", "L", "mu", "q"))
    assert sid["cost"]["hypergradients"] == hyper_steps

    for key, n, batch in (("train_sampler", job.N, 12), ("val_sampler", job.N_VAL, 10)):
        sampler = state[key]
        assert sampler["generator"].dtype == torch.uint8
        assert torch.equal(sampler["perm"].sort().values, torch.arange(n))
        assert (sampler["n"], sampler["global_batch"]) == (n, batch)
        assert 0 < sampler["pos"] <= n and sampler["epoch"] >= 1
    assert state["val_samples"] == hyper_steps * 10
    assert [h["hyper/step"] for h in state["history"]] == list(range(1, hyper_steps + 1))


class Run:
    """A resume of the job in this process, recording λ after every hyper step."""

    def __init__(self, ckpt: Path | None) -> None:
        pl.seed_everything(0, verbose=False)
        self.model, self.hyper = job.Net(), HyperOptimizationCallback(**job.SETTINGS)
        self.initial = copy.deepcopy(self.model.state_dict())
        self.lam: dict[int, list[str]] = {}
        self.trainer = job.make_trainer([self.hyper, _Recorder(self)])
        self.error: BaseException | None = None
        try:
            self.trainer.fit(self.model, datamodule=job.Data(), ckpt_path=ckpt)
        except Exception as err:  # noqa: BLE001 - inspected by the tests
            self.error = err


class _Recorder(pl.Callback):
    def __init__(self, run: Run) -> None:
        self.run = run

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        sid = self.run.hyper.sid
        if sid is not None:
            lam = sid.hyperparameters[0].detach().tolist()
            self.run.lam[sid.hyper_step] = [float.hex(x) for x in lam]


@pytest.mark.parametrize("step", [5, 20])
def test_resume_from_any_checkpoint_is_exact(reference, step):
    run = Run(_ckpt(reference, step))
    assert run.error is None
    ref = _lambda_log(reference / "ref.jsonl")
    assert sorted(run.lam) == list(range((step + 1) // 2, 16))  # from the first step after
    for hyper_step, lam in run.lam.items():
        assert lam == ref[hyper_step]["lam"], hyper_step
    final = _final(reference / "ref_final.pt")
    for key, value in run.model.state_dict().items():
        assert torch.equal(value, final["state_dict"][key]), key


STALE_PARTS = {  # a part of the step-15 state replaced by the (valid) one of step 10
    "train sampler": ("train_sampler",),
    "validation sampler": ("val_sampler",),
    "adjoint warm start v": ("sid", "v"),
    "outer optimizer": ("sid", "outer_optimizer"),
    "curvature constants (α, L, μ, q)": ("sid", "constants"),
}


@pytest.mark.parametrize("part", list(STALE_PARTS))
def test_every_part_of_the_callback_state_is_needed(reference, tmp_path, part):
    """If the callback did not save ``part``, the resume would not be exact: shown by resuming
    with a stale (step-10) copy of it, which must change the λ trajectory."""
    ckpt = torch.load(_ckpt(reference, LAST_CKPT_STEP), weights_only=True)
    older = torch.load(_ckpt(reference, 10), weights_only=True)
    *parents, last = STALE_PARTS[part]
    target, source = ckpt["callbacks"][KEY], older["callbacks"][KEY]
    for key in parents:
        target, source = target[key], source[key]
    target[last] = source[last]
    torch.save(ckpt, tmp_path / "stale.ckpt")
    run = Run(tmp_path / "stale.ckpt")
    assert run.error is None  # a valid state: loads without complaint
    ref = _lambda_log(reference / "ref.jsonl")
    assert any(lam != ref[step]["lam"] for step, lam in run.lam.items()), part


# ====================================================================== corrupted checkpoints
def _assert_nothing_loaded(run: Run, ckpt: dict[str, Any] | None) -> None:
    """The fit stopped before any training step and the callback holds none of the bad state."""
    hyper, model, trainer = run.hyper, run.model, run.trainer
    assert model.log_lam.requires_grad  # given back after the failed fit
    if hyper.sid is None:  # refused while loading: no training state restored, nothing built
        assert trainer.global_step == 0
        return
    # refused at on_train_start (the module and training state were restored by Lightning)
    assert ckpt is not None and trainer.global_step == ckpt["global_step"]  # no step after
    assert hyper.sid.hyper_step == 0 and hyper.sid.v is None and hyper.history == []
    assert hyper.sid.outer_optimizer.state_dict()["state"] == {}
    assert torch.equal(model.log_lam.detach(), ckpt["state_dict"]["log_lam"])  # the module's λ
    fresh = torch.Generator().manual_seed(job.SETTINGS["seed"]).get_state()
    assert torch.equal(hyper.data.train.sampler.generator.get_state(), fresh)
    assert hyper.data.train.sampler.perm is None and hyper.data.train.sampler.pos == 0


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_truncated_checkpoint_file_is_refused_before_anything_loads(reference, tmp_path, keep):
    raw = _ckpt(reference, LAST_CKPT_STEP).read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(raw[: int(len(raw) * keep)])
    run = Run(tmp_path / "cut.ckpt")
    # Lightning reads the file with torch.load, which refuses it with a bare OSError / EOFError;
    # the callback adds a note saying what is wrong with the file
    assert isinstance(run.error, (OSError, RuntimeError, EOFError)), run.error
    notes = " ".join(getattr(run.error, "__notes__", []))
    assert re.search(r"is empty \(0 bytes\)|bytes\) is truncated or corrupted", notes), notes
    assert "cut.ckpt" in notes
    _assert_nothing_loaded(run, None)
    for key, value in run.model.state_dict().items():
        assert torch.equal(value, run.initial[key]), key  # the module was not touched


def _records(raw: bytes) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every record of a zip-format checkpoint."""
    out = []
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for info in archive.infolist():
            head = info.header_offset
            name_len, extra_len = struct.unpack("<HH", raw[head + 26 : head + 30])
            start = head + 30 + name_len + extra_len
            out.append((info.filename, start, info.file_size))
    return out


def test_flipped_byte_in_any_record_is_refused(reference, tmp_path):
    """``torch.load`` does not check CRC-32s: a flipped byte inside a tensor loads silently
    (e.g. the sampler's random-generator state). The callback checks the file's CRC-32s, so every
    corrupted record is refused — by ``torch.load``'s unpickler or by the callback."""
    raw = _ckpt(reference, LAST_CKPT_STEP).read_bytes()
    records = [r for r in _records(raw) if r[2] > 0]
    assert len(records) > 10
    silent_for_torch = []
    for name, start, size in records:
        bad = bytearray(raw)
        bad[start + size // 2] ^= 0xFF
        path = tmp_path / "flipped.ckpt"
        path.write_bytes(bytes(bad))
        try:
            torch.load(path, weights_only=True)
            silent_for_torch.append(name)
        except Exception:  # noqa: BLE001 - torch itself noticed
            pass
        run = Run(path)
        assert run.error is not None, f"a flipped byte in {name} went unnoticed"
        if name in silent_for_torch:
            assert isinstance(run.error, ConfigurationError), (name, run.error)
            assert "CRC-32" in str(run.error)
        assert run.trainer.global_step == 0 and run.hyper.sid is None, name
    assert any("data/" in name for name in silent_for_torch)  # the check is needed


def test_checkpoint_saved_without_crc32_is_not_a_false_alarm(reference, tmp_path):
    ckpt = torch.load(_ckpt(reference, LAST_CKPT_STEP), weights_only=True)
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(ckpt, tmp_path / "no_crc.ckpt")
    finally:
        torch.serialization.set_crc32_options(before)
    with zipfile.ZipFile(tmp_path / "no_crc.ckpt") as archive:
        assert all(info.CRC == 0 for info in archive.infolist() if info.file_size > 0)
    run = Run(tmp_path / "no_crc.ckpt")
    assert run.error is None
    ref = _lambda_log(reference / "ref.jsonl")
    assert all(lam == ref[step]["lam"] for step, lam in run.lam.items())


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """Tamper: set (or, with DELETE, remove) ``state[path]``; a callable value maps the old."""

    def tamper(state: dict[str, Any]) -> None:
        *parents, last = path
        for key in parents:
            state = state[key]
        if value is DELETE:
            del state[last]
        else:
            state[last] = value(state[last]) if callable(value) else value

    return tamper


DELETE = object()
f64 = torch.float64

TAMPERED = {  # name: (tamper the callback's state, expected message)
    "missing sid": (_set(("sid",), DELETE), r"\['sid'\] missing"),
    "missing train sampler": (_set(("train_sampler",), DELETE), r"\['train_sampler'\] missing"),
    "missing val sampler": (_set(("val_sampler",), DELETE), r"\['val_sampler'\] missing"),
    "missing history": (_set(("history",), DELETE), r"\['history'\] missing"),
    "missing val_samples": (_set(("val_samples",), DELETE), r"\['val_samples'\] missing"),
    "state not a dict": (None, "expected a dict"),
    "NaN λ": (_set(("sid", "hyperparameters", 0), lambda t: t.fill_(math.nan)), "non-finite"),
    "λ of another shape": (
        _set(("sid", "hyperparameters", 0), torch.zeros(3, dtype=f64)),
        "shapes",
    ),
    "missing v": (_set(("sid", "v"), DELETE), r"\['v'\] are missing"),
    "v of another shape": (_set(("sid", "v", 0), torch.zeros(2, dtype=f64)), "shapes"),
    "Inf in v": (_set(("sid", "v", 1), lambda t: t.fill_(math.inf)), "non-finite"),
    "negative hyper_step": (_set(("sid", "hyper_step"), -3), "hyper_step"),
    "NaN curvature constant": (_set(("sid", "constants", "alpha"), math.nan), "constants"),
    "Adam moment of another shape": (
        _set(("sid", "outer_optimizer", "state", 0, "exp_avg"), torch.zeros(1, 6, dtype=f64)),
        "'exp_avg'.*shape",
    ),
    "NaN Adam moment": (
        _set(("sid", "outer_optimizer", "state", 0, "exp_avg_sq"), lambda t: t.fill_(math.nan)),
        "non-finite",
    ),
    "sampler without position": (_set(("train_sampler", "pos"), DELETE), r"missing \['pos'\]"),
    "sampler position past the data": (_set(("val_sampler", "pos"), 10**6), "pos"),
    "sampler of another data set": (_set(("train_sampler", "n"), 81), "from 81 samples"),
    "truncated generator state": (
        _set(("train_sampler", "generator"), lambda t: t[:100].clone()),
        "generator state is corrupted",
    ),
    "not a permutation": (
        _set(("val_sampler", "perm"), lambda t: torch.zeros_like(t)),
        "not a permutation",
    ),
    "short permutation": (
        _set(("train_sampler", "perm"), lambda t: t[:5].clone()),
        "not a permutation",
    ),
    "sampler state dropped": (_set(("val_sampler",), None), "has no val sampler state"),
    "history not a list of dicts": (_set(("history",), "lost"), "history"),
    "negative val_samples": (_set(("val_samples",), -1), "val_samples"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_tampered_callback_state_is_refused_and_nothing_is_loaded(reference, tmp_path, case):
    ckpt = torch.load(_ckpt(reference, LAST_CKPT_STEP), weights_only=True)
    tamper, match = TAMPERED[case]
    if tamper is None:
        ckpt["callbacks"][KEY] = list(ckpt["callbacks"][KEY].items())
    else:
        tamper(ckpt["callbacks"][KEY])
    torch.save(ckpt, tmp_path / "tampered.ckpt")
    run = Run(tmp_path / "tampered.ckpt")
    assert isinstance(run.error, ConfigurationError), run.error
    assert re.search(match, str(run.error)), str(run.error)
    _assert_nothing_loaded(run, ckpt)


def test_checkpoint_without_callback_state_warns(reference, tmp_path):
    ckpt = torch.load(_ckpt(reference, LAST_CKPT_STEP), weights_only=True)
    del ckpt["callbacks"][KEY]
    torch.save(ckpt, tmp_path / "plain.ckpt")
    with pytest.warns(UserWarning, match="holds no state of this callback"):
        run = Run(tmp_path / "plain.ckpt")
    assert run.error is None and run.hyper.sid.hyper_step == 30 // 2 - LAST_CKPT_STEP // 2


def test_reused_callback_object_resumes_from_the_checkpoint(reference):
    """A callback object that already ran a fit, resumed with ckpt_path: the checkpoint's state
    (not the object's) continues, exactly like the uninterrupted run."""
    pl.seed_everything(0, verbose=False)
    hyper = HyperOptimizationCallback(**job.SETTINGS)
    job.make_trainer([hyper], max_epochs=1).fit(job.Net(), datamodule=job.Data())
    pl.seed_everything(0, verbose=False)
    model = job.Net()
    job.make_trainer([hyper]).fit(
        model, datamodule=job.Data(), ckpt_path=_ckpt(reference, LAST_CKPT_STEP)
    )
    final = _final(reference / "ref_final.pt")
    assert hyper.sid.hyper_step == 15 and hyper.history == final["history"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, final["state_dict"][key]), key


# ====================================================================== determinism
def test_same_seed_same_lambda_trajectory_single_process(reference, tmp_path):
    job.run(tmp_path, "again")
    job.run(tmp_path, "other", seed=8)
    ref = _lambda_log(reference / "ref.jsonl")
    assert _lambda_log(tmp_path / "again.jsonl") == ref
    _assert_same_final(_final(tmp_path / "again_final.pt"), _final(reference / "ref_final.pt"))
    other = _lambda_log(tmp_path / "other.jsonl")
    assert other[0] == ref[0] and other[15]["lam"] != ref[15]["lam"]  # the seed matters


DDP_FITS = {"a": 7, "b": 7, "c": 8}  # tag: the callback's seed
DDP_EPOCHS = 4  # 3 steps per epoch and process (40 of the 80 samples, batches of 16)


def _ddp_worker(out: Path) -> None:
    """Three fits on 2 DDP processes (this file re-run by Lightning as rank 1)."""
    torch.set_num_threads(1)
    for tag, seed in DDP_FITS.items():
        pl.seed_everything(0, verbose=False)
        model = job.Net()
        hyper = HyperOptimizationCallback(**{**job.SETTINGS, "seed": seed})
        log = job.LambdaLog(hyper, out / f"{tag}_rank{{rank}}.jsonl")
        trainer = job.make_trainer([hyper, log], devices=2, strategy="ddp", max_epochs=DDP_EPOCHS)
        trainer.fit(model, datamodule=job.Data())
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        torch.save(weights, out / f"{tag}_rank{trainer.global_rank}_final.pt")
    end_ddp_worker()


@pytest.mark.ddp
def test_same_seed_same_lambda_trajectory_two_ddp_processes(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--ddp-worker", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    logs = {
        (tag, rank): _lambda_log(tmp_path / f"{tag}_rank{rank}.jsonl")
        for tag in DDP_FITS
        for rank in (0, 1)
    }
    hyper_steps = DDP_EPOCHS * 3 // 2
    assert sorted(logs["a", 0]) == list(range(hyper_steps + 1))
    for tag in DDP_FITS:  # λ identical on the two ranks
        assert logs[tag, 0] == logs[tag, 1], tag
    assert logs["a", 0] == logs["b", 0]  # same seed: bitwise the same trajectory
    assert logs["c", 0][hyper_steps]["lam"] != logs["a", 0][hyper_steps]["lam"]  # seed matters
    assert len({tuple(line["lam"]) for line in logs["a", 0].values()}) == hyper_steps + 1
    for rank in (0, 1):
        a = torch.load(tmp_path / f"a_rank{rank}_final.pt", weights_only=True)
        b = torch.load(tmp_path / f"b_rank{rank}_final.pt", weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ddp-worker", type=Path, required=True, help="folder for the results")
    _ddp_worker(parser.parse_args().ddp_worker)
