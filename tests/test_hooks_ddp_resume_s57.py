"""The session-56 step hook under DDP, a killed-and-resumed fit, and reused Trainers (session 57).

Session 56 moved ``LearnedWeightDecay``'s decay and the step-size probe into one global optimizer
step pre-hook per fit (:func:`hypertorch_sid.lightning.in_step.hook_steps`), after Lightning's
gradient clipping; it was tested in one process. Here, with ``gradient_clip_val`` binding at
every step:

* **DDP, 2 CPU processes** (this file run as a script; Lightning launches rank 1): λ held, the
  drop-in's fit is the optimizer's own ``weight_decay=λ`` fit under DDP and the single-process
  one on the same global batches; with hyper steps, λ and the weights are bitwise equal on the
  ranks and equal the single-process ones; both drop-ins in one fit; manual optimisation; one
  hook per process during a fit, none after it, after a reused callback's second fit, or after
  a failed fit.
* **Kill and resume**: a fit with both drop-ins killed (SIGKILL) after hyper steps past its last
  checkpoint and resumed from it in a new process ends bitwise where the uninterrupted fit
  does (λ, data weights, weights, histories); so does ``fit`` → ``fit(ckpt_path=...)`` in one
  process with the same callback objects.
* **In sequence**: two Trainers, a callback reused, ``validate``/``test`` between fits.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning_problems
import pytest
import pytorch_lightning as pl
import torch
from _kill_resume_job import EpochSeededSampler, KillPoint, kill_at_marker
from lightning_problems import LIGHTNING_NOISE, rank_batches, ridge_data
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch import Tensor
from torch.optim.optimizer import _global_optimizer_pre_hooks
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import (
    ConfigurationError,
    IndexedDataset,
    LearnedDataWeights,
    LearnedWeightDecay,
)
from hypertorch_sid.core.outer_step import ShrinkFallRprop

pytestmark = [
    *LIGHTNING_NOISE,
    pytest.mark.filterwarnings("ignore:.*callbacks used to create the checkpoint.*"),
]

D, N, N_VAL = 4, 96, 48
PER_RANK_BATCH, WORLD = 8, 2  # global batches of 16: 6 optimizer steps per epoch
HELD = dict(every_n_steps=10**9, start_step=10**9, max_overhead=None)  # λ fixed
LAM = 0.3  # large enough that λw moves the clipped gradient
CLIP = 0.05  # below every step's gradient norm: the clip binds at every step
DECAY = dict(every_n_steps=2, max_overhead=None, adjoint_steps=4, seed=3)
#: for a fit continued into a longer plan than it started with, which ends where the straight fit
#: does only with an outer step that does not size itself by the hyper steps left (the default,
#: ReachRprop, does: docs/bilevel-module.md)
CONTINUED = dict(
    DECAY, outer_optimizer=functools.partial(ShrinkFallRprop, lr=0.3, step_sizes=(0.01, 2.0))
)
WEIGHTS = dict(every_n_steps=2, start_step=0, max_overhead=None, seed=0, objective="mean_loss")


def hooks() -> int:
    """The process's global optimizer step pre-hooks."""
    return len(_global_optimizer_pre_hooks)


class Net(pl.LightningModule):
    """A float64 tanh MLP under SGD with momentum; ``per_sample`` returns the examples' losses
    (for ``LearnedDataWeights``). Records the gradient norm Lightning clips and the number of
    global step pre-hooks at every step."""

    def __init__(self, weight_decay: float = 0.0, per_sample: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.l1 = torch.nn.Linear(D, 6, dtype=torch.float64)
        self.l2 = torch.nn.Linear(6, 1, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        self.weight_decay, self.per_sample = weight_decay, per_sample
        self.norms: list[float] = []
        self.hooks: list[int] = []

    def losses(self, batch: Any) -> Tensor:
        x, y = batch
        return 0.5 * (self.l2(torch.tanh(self.l1(x))).squeeze(-1) - y) ** 2

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        losses = self.losses(batch)
        return losses if self.per_sample else losses.mean()

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.norms.append(float(torch.cat([p.grad.flatten() for p in self.parameters()]).norm()))
        self.hooks.append(hooks())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def test_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            self.parameters(), lr=0.1, momentum=0.5, weight_decay=self.weight_decay
        )


class RMSNet(Net):
    """RMSprop gives no reading of its step size: the callbacks probe it inside the step."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(self.parameters(), lr=0.01)


class Manual(Net):
    """Manual optimisation: one optimizer per layer, each step clipped by the module."""

    def __init__(self, weight_decay: float = 0.0) -> None:
        super().__init__(weight_decay)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        loss = self.losses(batch).mean()
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        self.hooks.append(hooks())
        for opt in opts:
            self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
            opt.step()

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(layer.parameters(), lr=0.1, weight_decay=self.weight_decay)
            for layer in (self.l1, self.l2)
        ]


def probed(cb: LearnedWeightDecay) -> list[float | None]:
    """The step sizes η̂ the probe measured, one per hyper step (read as the hyper step takes
    it)."""
    seen: list[float | None] = []
    observe = cb._observe_horizon

    def recording(trainer: pl.Trainer) -> None:
        seen.append(cb._step_size)
        observe(trainer)

    cb._observe_horizon = recording  # type: ignore[method-assign]
    return seen


def manual_loss(module: pl.LightningModule, batch: Any) -> Tensor:
    return Net.losses(module, batch).mean()


class Data(pl.LightningDataModule):
    """Sequential global batches of 16 (indexed for the data weights); under DDP rank r gets rows [8r, 8r + 8) of each
    (as in test_lightning_ddp: the single-process reference sees the same global batches)."""

    def __init__(self, indexed: bool = True) -> None:
        super().__init__()
        X, y, Xv, yv = ridge_data(N, N_VAL, d=D, seed=0, noise=0.3)
        train = TensorDataset(X, y)
        self.train = IndexedDataset(train) if indexed else train
        self.val = TensorDataset(Xv, yv)

    def train_dataloader(self) -> DataLoader:
        world, rank = self.trainer.world_size, self.trainer.global_rank
        batches = rank_batches(N, PER_RANK_BATCH * WORLD, world, rank)
        return DataLoader(self.train, batch_sampler=batches)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=12)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=12)


class Fails(Net):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.global_step == 3:
            raise ConfigurationError("stop")
        return super().training_step(batch, batch_idx)


def fit(
    model: Net,
    callbacks: list[Any],
    devices: int = 1,
    epochs: int = 2,
    ckpt_path: Path | None = None,
    **kwargs: Any,
) -> pl.Trainer:
    """``model`` fitted on :class:`Data` with the clip on ``devices`` CPU processes (resumed
    from ``ckpt_path``)."""
    if not model.automatic_optimization:
        kwargs.setdefault("gradient_clip_val", None)  # the module clips
    trainer = lightning_problems.trainer(
        callbacks,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=epochs,
        limit_val_batches=0,
        use_distributed_sampler=False,
        **{"gradient_clip_val": CLIP, **kwargs},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=Data(model.per_sample), ckpt_path=ckpt_path)
    return trainer


def sizes(devices: int) -> dict[str, int]:
    """The hyper steps' per-process batches: the same global batches on 1 or 2 processes."""
    return dict(batch_size=16 // devices, val_batch_size=12 // devices)


def weights(model: pl.LightningModule) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def lambdas(cb: LearnedWeightDecay) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in cb.decay_values().items()}


# ============================================================================ DDP worker
def ddp_runs(devices: int, folder: Path) -> dict[str, Any]:
    """Every DDP case of this file, in one sequence (both ranks run it); a checkpoint goes to
    ``folder``."""
    out: dict[str, Any] = {"hooks_before": hooks()}
    # λ held: the drop-in, then the optimizer's own decay
    held = LearnedWeightDecay(LAM, **HELD, **sizes(devices))
    model = Net()
    trainer = fit(model, [held], devices)
    out.update(rank=trainer.global_rank, world=trainer.world_size)
    out["held"] = dict(w=weights(model), norms=model.norms, hooks=model.hooks, after=hooks())
    model = Net(weight_decay=LAM)
    fit(model, [], devices)
    out["own"] = dict(w=weights(model), hooks=model.hooks)
    # the data weights first (held: equal weights), the held decay second: the hook's holder is
    # the data weights, which run the decay's change of the gradient
    model = Net(per_sample=True)
    dw = LearnedDataWeights(**{**WEIGHTS, **HELD}, **sizes(devices))
    fit(model, [dw, LearnedWeightDecay(LAM, **HELD, **sizes(devices))], devices)
    out["weights_first"] = dict(w=weights(model), hooks=model.hooks)
    # the held callback reused in a second fit: the same fit again, one hook
    model = Net()
    fit(model, [held], devices)
    out["reused"] = dict(w=weights(model), hooks=model.hooks, after=hooks())
    # hyper steps on λ, with the clip
    decay = LearnedWeightDecay(1e-2, granularity="per_element", **DECAY, **sizes(devices))
    model = Net()
    fit(model, [decay], devices, epochs=3)
    out["hyper"] = dict(w=weights(model), lam=lambdas(decay), history=decay.history)
    # hyper steps under RMSprop: the step-size probe, taken in the step hook after the clip
    decay = LearnedWeightDecay(1e-2, **DECAY, **sizes(devices))
    model, eta = RMSNet(), probed(decay)
    fit(model, [decay], devices, epochs=3)
    out["probe"] = dict(w=weights(model), lam=lambdas(decay), eta=eta)
    # both drop-ins in one fit, and the data weights alone
    decay = LearnedWeightDecay(1e-2, **DECAY, **sizes(devices))
    dw = LearnedDataWeights(**WEIGHTS, **sizes(devices))
    model = Net(per_sample=True)
    fit(model, [decay, dw], devices, epochs=3)
    out["both"] = dict(
        w=weights(model), lam=lambdas(decay), omega=dw.data_weights(), hooks=model.hooks,
        decay_steps=len(decay.history), weight_steps=len(dw.history), after=hooks(),
    )  # fmt: skip
    dw = LearnedDataWeights(**WEIGHTS, **sizes(devices))
    model = Net(per_sample=True)
    fit(model, [dw], devices, epochs=3)
    out["weights"] = dict(w=weights(model), omega=dw.data_weights(), hooks=model.hooks)
    # manual optimisation, two optimizers, the module's own clip
    model = Manual()
    fit(
        model,
        [LearnedWeightDecay(LAM, training_loss=manual_loss, **HELD, **sizes(devices))],
        devices,
    )
    out["manual"] = dict(w=weights(model), hooks=model.hooks)
    model = Manual(weight_decay=LAM)
    fit(model, [], devices)
    out["manual_own"] = dict(w=weights(model))
    # both drop-ins, fit → save → fit(ckpt_path=...) in a new Trainer, against a straight fit
    out["resume"] = {}
    for tag, epochs in (("straight", 4), ("half", 2), ("resumed", 4)):
        decay = LearnedWeightDecay(1e-2, **CONTINUED, **sizes(devices))
        dw = LearnedDataWeights(**WEIGHTS, **sizes(devices))
        model = Net(per_sample=True)
        ckpt = folder / "half.ckpt" if tag == "resumed" else None
        trainer = fit(model, [decay, dw], devices, epochs=epochs, ckpt_path=ckpt)
        if tag == "half":
            trainer.save_checkpoint(folder / "half.ckpt")
        out["resume"][tag] = dict(
            w=weights(model), lam=lambdas(decay), omega=dw.data_weights(), hooks=model.hooks,
            histories=(decay.history, dw.history), step=trainer.global_step,
        )  # fmt: skip
    # a fit that fails at step 3 (on every rank): its hook is gone
    with pytest.raises(ConfigurationError, match="stop"):
        fit(Fails(), [LearnedWeightDecay(LAM, **HELD, **sizes(devices))], devices)
    out["after_failure"] = hooks()
    return out


def _ddp_worker(out: Path) -> None:
    torch.set_num_threads(1)
    result = ddp_runs(WORLD, out)
    torch.save(result, out / f"rank{result['rank']}.pt")
    lightning_problems.end_ddp_worker()


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both ranks' results of :func:`ddp_runs` on 2 CPU processes (a subprocess)."""
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--ddp", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert (r0["world"], r0["rank"], r1["rank"]) == (2, 0, 1)
    return r0, r1


def assert_same(a: dict[str, Tensor], b: dict[str, Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=key)


@pytest.mark.ddp
def test_ddp_held_decay_after_the_clip_is_the_optimizers_own(ddp):
    """λ held, ``gradient_clip_val`` binding at every step: the DDP fit with the drop-in is the
    DDP fit with ``SGD(weight_decay=λ)``, and the single-process one on the same global batches
    (the clip sees the averaged data gradient on both ranks; the decay comes after it); so is
    the fit with held data weights listed before the decay (the hook held by the data
    weights)."""
    r0, r1 = ddp
    for r in (r0, r1):
        assert len(r["held"]["norms"]) == 12 and min(r["held"]["norms"]) > 2 * CLIP
        assert_same(r["held"]["w"], r["own"]["w"], atol=1e-12)
        assert_same(r["weights_first"]["w"], r["own"]["w"], atol=1e-12)
    assert_same(r0["held"]["w"], r1["held"]["w"])
    single = Net(weight_decay=LAM)
    fit(single, [])
    assert_same(r0["held"]["w"], weights(single), atol=1e-12)
    unclipped = Net(weight_decay=LAM)  # the clip moves this fit
    fit(unclipped, [], gradient_clip_val=None)
    assert (unclipped.l1.weight - single.l1.weight).abs().max() > 1e-3


@pytest.mark.ddp
def test_ddp_one_step_hook_per_process_during_a_fit_and_none_after(ddp):
    """One global step pre-hook per process during a fit (both drop-ins: still one), none left
    after it, after the reused callback's second fit, or after a fit that failed."""
    for r in ddp:
        before = r["hooks_before"]
        assert set(r["held"]["hooks"]) == set(r["reused"]["hooks"]) == {before + 1}
        assert set(r["both"]["hooks"]) == set(r["manual"]["hooks"]) == {before + 1}
        assert set(r["weights_first"]["hooks"]) == {before + 1}
        assert set(r["own"]["hooks"]) == {before}
        assert r["held"]["after"] == r["reused"]["after"] == r["both"]["after"] == before
        assert r["after_failure"] == before
        # the reused callback did its fit again, once: not twice decayed
        assert_same(r["reused"]["w"], r["held"]["w"])


@pytest.mark.ddp
def test_ddp_hyper_steps_with_the_clip_equal_one_process_and_both_ranks(ddp):
    """With hyper steps (every 2 steps, 9 of them) and the clip, λ and the weights are bitwise
    equal on the two ranks and equal the single-process fit on the same global batches."""
    r0, r1 = ddp
    assert_same(r0["hyper"]["lam"], r1["hyper"]["lam"])
    assert_same(r0["hyper"]["w"], r1["hyper"]["w"])
    assert len(r0["hyper"]["history"]) == 9
    decay = LearnedWeightDecay(1e-2, granularity="per_element", **DECAY, **sizes(1))
    model = Net()
    fit(model, [decay], epochs=3)
    for key, lam in lambdas(decay).items():
        torch.testing.assert_close(r0["hyper"]["lam"][key], lam, rtol=1e-9, atol=1e-14)
        assert not torch.allclose(lam, torch.full_like(lam, 1e-2))  # λ moved
    for key, w in weights(model).items():
        torch.testing.assert_close(r0["hyper"]["w"][key], w, rtol=1e-9, atol=1e-12)


@pytest.mark.ddp
def test_ddp_step_size_probe_after_the_clip_equals_one_process(ddp):
    """RMSprop with the clip: the probed step size η̂ (taken in the step hook), λ and the weights
    are bitwise equal on the two ranks and equal the single-process fit's."""
    r0, r1 = ddp
    assert len(r0["probe"]["eta"]) == 9 and None not in r0["probe"]["eta"]
    assert r0["probe"]["eta"] == r1["probe"]["eta"]
    assert_same(r0["probe"]["lam"], r1["probe"]["lam"])
    assert_same(r0["probe"]["w"], r1["probe"]["w"])
    decay = LearnedWeightDecay(1e-2, **DECAY, **sizes(1))
    model, eta = RMSNet(), probed(decay)
    fit(model, [decay], epochs=3)
    assert r0["probe"]["eta"] == pytest.approx(eta, rel=1e-9)
    for key, lam in lambdas(decay).items():
        torch.testing.assert_close(r0["probe"]["lam"][key], lam, rtol=1e-9, atol=1e-14)
    for key, w in weights(model).items():
        torch.testing.assert_close(r0["probe"]["w"][key], w, rtol=1e-9, atol=1e-12)


@pytest.mark.ddp
def test_ddp_data_weights_with_the_hook_and_beside_the_decay(ddp):
    """``LearnedDataWeights`` alone and beside the decay under DDP with the clip: every rank holds
    the same ω, λ and weights, and both learned."""
    r0, r1 = ddp
    for case in ("both", "weights"):
        assert torch.equal(r0[case]["omega"], r1[case]["omega"])
        assert_same(r0[case]["w"], r1[case]["w"])
        assert r0[case]["omega"].std() > 1e-3
    assert_same(r0["both"]["lam"], r1["both"]["lam"])
    assert r0["both"]["decay_steps"] == r0["both"]["weight_steps"] == 9
    assert not torch.equal(r0["both"]["w"]["l1.weight"], r0["weights"]["w"]["l1.weight"])


@pytest.mark.ddp
def test_ddp_fit_then_fit_from_its_checkpoint_ends_where_the_straight_fit_does(ddp):
    """Both drop-ins with the clip under DDP: 2 epochs, a checkpoint, a new Trainer's
    ``fit(ckpt_path=...)`` to 4 ends bitwise where the straight 4-epoch fit does, on both
    ranks (the resumed fit decays from its first step: one hook at every step)."""
    for r in ddp:
        straight, half, resumed = (r["resume"][t] for t in ("straight", "half", "resumed"))
        assert straight["step"] == resumed["step"] == 24 and half["step"] == 12
        assert len(resumed["hooks"]) == 12 and set(resumed["hooks"]) == {r["hooks_before"] + 1}
        assert_same(resumed["w"], straight["w"])
        assert_same(resumed["lam"], straight["lam"])
        assert torch.equal(resumed["omega"], straight["omega"])
        assert resumed["histories"] == straight["histories"]
        assert not torch.equal(half["omega"], straight["omega"])  # hyper steps after the resume
    assert_same(ddp[0]["resume"]["resumed"]["w"], ddp[1]["resume"]["resumed"]["w"])


@pytest.mark.ddp
def test_ddp_manual_optimisation_held_decay_is_the_optimizers_own(ddp):
    r0, r1 = ddp
    for r in (r0, r1):
        assert_same(r["manual"]["w"], r["manual_own"]["w"], atol=1e-12)
    assert_same(r0["manual"]["w"], r1["manual"]["w"])


# ============================================================================ kill and resume
EPOCHS, PER_EPOCH = 6, 6  # 36 optimizer steps; hyper steps of each drop-in every 2
KILL_AFTER, LAST_CKPT = 15, 12  # killed after step 15: hyper steps 7 of each lost past step 12


class ResumeData(Data):
    """:class:`Data` in one process, shuffled by a sampler seeded with the epoch (a resumed
    process draws the same order)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=16, sampler=EpochSeededSampler(N, seed=5))


def job(out: Path, tag: str, kill_after: int | None = None, resume: Path | None = None,
        callbacks: list[Any] | None = None, epochs: int = EPOCHS) -> list[Any]:  # fmt: skip
    """Both drop-ins with the clip; checkpoints at every epoch end; ``<out>/<tag>_final.pt``."""
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model = Net(per_sample=True)
    ours = callbacks or [LearnedWeightDecay(1e-2, **CONTINUED), LearnedDataWeights(**WEIGHTS)]
    extra: list[Callback] = [] if kill_after is None else [KillPoint(kill_after, out / "marker")]
    save = ModelCheckpoint(
        dirpath=out / f"{tag}_ckpt", every_n_train_steps=PER_EPOCH, save_top_k=-1, save_last=True
    )
    trainer = lightning_problems.trainer(
        [*ours, *extra, save], max_epochs=epochs, limit_val_batches=0, gradient_clip_val=CLIP,
        enable_checkpointing=True, default_root_dir=out,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=ResumeData(), ckpt_path=resume)
    decay, dw = ours
    final = dict(
        w=weights(model), lam=lambdas(decay), omega=dw.data_weights(), step=trainer.global_step,
        histories=(decay.history, dw.history), hooks=model.hooks, norms=model.norms,
    )  # fmt: skip
    torch.save(final, out / f"{tag}_final.pt")
    return ours


def assert_same_end(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bitwise the same λ, ω, weights, step and hyper-step histories."""
    assert a["step"] == b["step"] == EPOCHS * PER_EPOCH
    assert_same(a["w"], b["w"])
    assert_same(a["lam"], b["lam"])
    assert torch.equal(a["omega"], b["omega"])
    assert a["histories"] == b["histories"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("reference")
    job(out, "ref")
    ref = torch.load(out / "ref_final.pt", weights_only=False)
    assert len(ref["histories"][0]) == len(ref["histories"][1]) == EPOCHS * PER_EPOCH // 2
    assert min(ref["norms"]) > 2 * CLIP  # the clip binds at every step
    return ref


def _command(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--job", str(out), *args]


def test_sigkill_after_hyper_steps_then_resume_ends_where_the_uninterrupted_fit_does(
    tmp_path, reference
):
    """Killed after step 15 (hyper steps at 14 past the last checkpoint, step 12), resumed in a
    new process: the step hook is registered again and decays from the first resumed step
    after the clip — the end is bitwise the uninterrupted fit's."""
    command = _command(tmp_path, "--tag", "killed", "--kill-after", str(KILL_AFTER))
    kill_at_marker(command, tmp_path, tmp_path / "killed.log")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    assert not (tmp_path / "killed_final.pt").exists()
    last = tmp_path / "killed_ckpt" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == LAST_CKPT
    assert len(ckpt["callbacks"]["LearnedWeightDecay"]["history"]) == LAST_CKPT // 2
    proc = subprocess.run(
        _command(tmp_path, "--tag", "resumed", "--resume", str(last)),
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = torch.load(tmp_path / "resumed_final.pt", weights_only=False)
    assert len(resumed["hooks"]) == EPOCHS * PER_EPOCH - LAST_CKPT
    assert set(resumed["hooks"]) == {resumed["hooks"][0]} and resumed["hooks"][0] >= 1
    assert_same_end(resumed, reference)


def test_fit_then_fit_from_its_checkpoint_in_one_process_with_the_same_callbacks(
    tmp_path, reference
):
    """``fit`` to epoch 3, then a new Trainer's ``fit(ckpt_path=...)`` to epoch 6 with the same
    callback objects, in this process: the end is the uninterrupted fit's, bitwise, and no hook
    is left after either fit."""
    before = hooks()
    ours = job(tmp_path, "first", epochs=3)
    assert hooks() == before
    job(tmp_path, "second", resume=tmp_path / "first_ckpt" / "last.ckpt", callbacks=ours)
    assert hooks() == before
    second = torch.load(tmp_path / "second_final.pt", weights_only=False)
    assert set(second["hooks"]) == {before + 1}
    assert_same_end(second, reference)


# ============================================================================ in sequence
def test_two_trainers_in_sequence_with_validate_and_test_between_decay_once():
    """A held decay: a first Trainer's fit, its ``validate`` and ``test``, a second Trainer's fit
    of a fresh module with the same callback, then a third with a fresh callback: each fit is
    the optimizer's own ``weight_decay=λ`` fit, and no hook runs outside a fit."""
    before = hooks()
    own = Net(weight_decay=LAM)
    fit(own, [])
    held = LearnedWeightDecay(LAM, **HELD, **sizes(1))
    first = Net()
    trainer = fit(first, [held])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.validate(first, datamodule=Data(indexed=False), verbose=False)
        trainer.test(first, datamodule=Data(indexed=False), verbose=False)
    assert hooks() == before
    for callback in (held, LearnedWeightDecay(LAM, **HELD, **sizes(1))):
        model = Net()
        fit(model, [callback])
        assert set(model.hooks) == {before + 1} and hooks() == before
        assert_same(weights(model), weights(own), atol=1e-12)
    assert_same(weights(first), weights(own), atol=1e-12)


def test_a_second_fit_of_the_same_trainer_decays_once():
    """``trainer.fit``, ``trainer.validate``, ``trainer.fit`` on one Trainer (the second fit
    continues to a larger ``max_epochs``): the decay stays the optimizer's own."""
    settings = dict(max_epochs=1, limit_val_batches=0, gradient_clip_val=CLIP)
    own, learned = Net(weight_decay=LAM), Net()
    decay = LearnedWeightDecay(LAM, **HELD, **sizes(1))
    for model, callbacks in ((own, []), (learned, [decay])):
        trainer = lightning_problems.trainer(callbacks, **settings)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, datamodule=Data(indexed=False))
            trainer.validate(model, datamodule=Data(indexed=False), verbose=False)
            trainer.fit_loop.max_epochs = 2
            trainer.fit(model, datamodule=Data(indexed=False))
    assert len(learned.norms) == 12
    assert_same(weights(learned), weights(own), atol=1e-12)


class ManualRMSprop(Manual):
    """Manual optimisation, RMSprop per layer (no reading of its step size: probed); records
    each optimizer step's response ⟨w_before − w_after, g⟩/‖g‖² on the tensors it steps."""

    def __init__(self) -> None:
        super().__init__()
        self.responses: list[float] = []
        self.parts: list[tuple[float, float]] = []  # (moved, ‖g‖²) of each optimizer step

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(self.losses(batch).mean())
        for opt, layer in zip(opts, (self.l1, self.l2)):
            before = [p.detach().clone() for p in layer.parameters()]
            opt.step()
            moved = sum(
                float(((b - p.detach()) * p.grad).sum()) for b, p in zip(before, layer.parameters())
            )
            grad_sq = sum(float(p.grad.pow(2).sum()) for p in layer.parameters())
            self.responses.append(moved / grad_sq)
            self.parts.append((moved, grad_sq))

    def configure_optimizers(self) -> Any:
        return [torch.optim.RMSprop(layer.parameters(), lr=0.01) for layer in (self.l1, self.l2)]


def test_the_step_size_probe_reads_the_update_of_the_optimizer_it_probes():
    """Manual optimisation, one RMSprop per layer: the step hook's probe measures each
    optimizer's update on the tensors it steps, over its own step. Before session 57 it held
    every layer's gradient after the first optimizer had already moved its layer, and measured
    0.77 × the second layer's response (0.15 for 0.19): a mixture that is no optimizer's step
    size; session 57 measured the batch's last optimizer alone; since session 58 the batch's
    optimizers are pooled, Σ_o ⟨Δw_o, g_o⟩ / Σ_o ‖g_o‖² (``tests/test_left_s58.py``); since
    session 61 per step of R, each optimizer making half of them (eq. stepshare)."""
    model = ManualRMSprop()
    decay = LearnedWeightDecay(1e-2, training_loss=manual_loss, **DECAY, **sizes(1))
    eta = probed(decay)
    fit(model, [decay], epochs=1)
    assert len(eta) == 6
    batches = list(zip(model.parts[0::2], model.parts[1::2]))
    pooled = [(a[0] + b[0]) / (a[1] + b[1]) / 2 for a, b in batches]
    assert eta == pytest.approx(pooled, rel=1e-9)
    assert max(model.responses[0::2]) > 2 * max(model.responses[1::2])  # the layers differ


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ddp", type=Path, help="folder for the DDP ranks' results")
    parser.add_argument("--job", type=Path, help="folder of a kill-and-resume job")
    parser.add_argument("--tag", default="job")
    parser.add_argument("--kill-after", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    args = parser.parse_args()
    if args.ddp is not None:
        _ddp_worker(args.ddp)
    else:
        job(args.job, args.tag, args.kill_after, args.resume)
