"""Per-batch masks under the data weights, detected at the fit's start (session 63,
docs/data_weights.md "Session 63: per-batch masks, detected at the fit's start").

A ``training_step`` returning ``losses * keep`` (keep the hardest k rows of each batch: online
hard example mining) gave each masked row's weight a push down at every masked visit through the
self-normalised loss's Σ ω, and ``flagged()`` named clean rows 1.3-4.1× as often. Session 62's
fix went by the value (loss and uᵢ exactly 0) and was reverted: a cross entropy rounds to 0 in
float32 on rows fitted with certainty. Now the signal is structural: exact zeros in one of the
fit's first batches that stay 0 with the network's weights shrunk 1000-fold
(:class:`~hypertorch_sid.lightning.batch_masks.MaskDetection`); only then does a loss exactly 0
mean masked (:class:`~hypertorch_sid.core.weighted_loss.ZeroLossMasks`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning_problems import TOY_X, TOY_Y, ToyClassifier, end_ddp_worker, trainer
from test_data_weights_networks import Classifier, noisy_digits
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.sample_weights import SampleWeights, TrainingCrossTerm
from hypertorch_sid.core.weighted_loss import RowMasks, ZeroLossMasks
from hypertorch_sid.lightning.batch_masks import MaskDetection

#: the share of each batch's rows OHEM trains on (the hardest)
KEEP = 0.7


def _hardest(loss: Tensor) -> Tensor:
    """OHEM's 0/1 mask of a batch: its hardest ``KEEP`` share of rows."""
    k = max(1, int(KEEP * len(loss)))
    return (loss.detach() >= loss.detach().topk(k).values[-1]).to(loss.dtype)


# ---------------------------------------------------------------- the core
def test_the_cross_term_leaves_a_masked_row_where_it_was_only_under_zero_loss_masks() -> None:
    """``TrainingCrossTerm`` on a batch whose rows 1 and 3 have loss and u exactly 0: with the
    default :class:`RowMasks` they get ĝ = α ω′ û / Σ ω (pushed down, as before); with
    :class:`ZeroLossMasks` they are left out of the sparse gradient and the others' ĝ is the
    exact −α ω′ᵢ(uᵢ − û)/Σ ω of the batch as the training weighted it. A row of loss 0 whose u
    is not 0 (its loss depends on the network) stays in."""
    gen = torch.Generator().manual_seed(0)
    w = SampleWeights(12)
    with torch.no_grad():
        w.logits.copy_(torch.randn(12, generator=gen))
    index = torch.tensor([0, 2, 5, 7, 9])
    u = torch.randn(5, generator=gen).abs() + 0.5
    losses = torch.rand(5, generator=gen) + 0.1
    u[[1, 3]], losses[[1, 3]] = 0.0, 0.0
    cross = TrainingCrossTerm(w, torch.optim.SGD([w.logits], lr=0.5), normalize=True)
    g = cross.gradients(index, u, 0.3, losses)[0].coalesce()
    assert sorted(g.indices()[0].tolist()) == [0, 2, 5, 7, 9]
    assert float(g.to_dense()[[2, 7]].min()) > 0  # before: pushed down at the masked visit
    w.use_masks(ZeroLossMasks())
    g = cross.gradients(index, u, 0.3, losses)[0].coalesce()
    assert sorted(g.indices()[0].tolist()) == [0, 5, 9]
    x = w.logits.detach()[index].clone().requires_grad_(True)
    omega = torch.sigmoid(x)
    (exact,) = torch.autograd.grad((omega * u).sum() / omega.sum(), [x])
    torch.testing.assert_close(g.to_dense()[[0, 5, 9]], -0.3 * exact[[0, 2, 4]])
    u[1] = 0.7
    assert 2 in cross.gradients(index, u, 0.3, losses)[0].coalesce().indices()[0].tolist()
    with pytest.raises(ConfigurationError, match="use_masks takes a RowMasks"):
        w.use_masks("zero")  # type: ignore[arg-type]


def test_under_the_class_gauge_a_masked_row_is_left_out_not_centred() -> None:
    """A classifier's default gauge (``"class"``) centres u on each row's class first: a masked
    row's uᵢ = 0 becomes û − ū_c ≠ 0, so holding its ω by value in Σ ω alone would still move
    it at every masked visit (the OHEM probe's part A alone: flags as with no masks, precision
    0.645 against 0.648, 18 seeds). The mask is read from u before the centring, so the row is
    left out, and the other rows' ĝ are those the default gives them."""
    gen = torch.Generator().manual_seed(2)
    labels = torch.tensor([0, 1] * 6)
    w = SampleWeights(12)
    with torch.no_grad():
        w.logits.copy_(torch.randn(12, generator=gen))
    w.use_class_gauge(lambda: labels, "class")
    w.projection()  # each class's mean logit back at x₀
    index = torch.tensor([0, 1, 2, 3, 4, 5])
    u = torch.randn(6, generator=gen).abs() + 0.5
    losses = torch.rand(6, generator=gen) + 0.1
    u[[2, 3]], losses[[2, 3]] = 0.0, 0.0
    cross = TrainingCrossTerm(w, torch.optim.SGD([w.logits], lr=0.5), normalize=True)
    g0 = cross.gradients(index, u, 0.3, losses)[0].to_dense()
    assert float(g0[[2, 3]].abs().min()) > 0  # the default: moved by the class's centre
    w.use_masks(ZeroLossMasks())
    g = cross.gradients(index, u, 0.3, losses)[0].coalesce()
    assert sorted(g.indices()[0].tolist()) == [0, 1, 4, 5]
    torch.testing.assert_close(g.to_dense()[[0, 1, 4, 5]], g0[[0, 1, 4, 5]])


def test_the_hyper_steps_weighted_mean_holds_a_masked_rows_weight_by_value() -> None:
    """``weighted_mean`` (what ``cross_term="hyper_step"`` differentiates) under
    :class:`ZeroLossMasks`: the same value and gradient in w as without; the cross term
    ∂ₓ⟨∇_w ℓ̂, v⟩ is 0 at the masked rows (−ω′ᵢ⟨∇_w ℓ̂, v⟩/Σ ω without) and unchanged at the
    others."""
    gen = torch.Generator().manual_seed(1)
    index = torch.arange(6)
    features, targets = torch.randn(6, 3, generator=gen), torch.randn(6, generator=gen)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    theta, v = torch.randn(3, generator=gen, requires_grad=True), torch.randn(3, generator=gen)
    logits = torch.randn(8, generator=gen)

    def cross(masks: RowMasks) -> tuple[Tensor, Tensor, Tensor]:
        weights = SampleWeights(8, logits=logits.clone().requires_grad_(True))
        weights.use_masks(masks)
        loss = weights.weighted_mean((features @ theta - targets).pow(2) * keep, index, True)
        (grad_w,) = torch.autograd.grad(loss, [theta], create_graph=True)
        (c,) = torch.autograd.grad(grad_w @ v, [weights.logits])
        return loss, grad_w, c

    loss0, grad0, c0 = cross(RowMasks())
    loss1, grad1, c1 = cross(ZeroLossMasks())
    assert float(c0[[1, 4]].abs().min()) > 0 and float(c1[[1, 4]].abs().max()) == 0
    torch.testing.assert_close(loss1, loss0)
    torch.testing.assert_close(grad1, grad0)
    torch.testing.assert_close(c1[[0, 2, 3, 5]], c0[[0, 2, 3, 5]])


def test_a_corrupted_detection_state_is_refused() -> None:
    for state in ({"detected": 1, "left": 3}, {"detected": True}, {"detected": False, "left": 99}):
        with pytest.raises(ConfigurationError, match="data_batch_masks .*corrupted"):
            MaskDetection.from_state(state)
    assert MaskDetection.from_state({"detected": True, "left": 7}).state_dict() == {
        "detected": True,
        "left": 7,
    }


# ---------------------------------------------------------------- a fit: each visit
class WatchedOHEM(ToyClassifier):
    """OHEM on the careless-user toy (the training rows carry their position); records, at
    each training step, which of the batch's rows the step's own cross term moved (the logits
    before the step against after it, before the optimizer and any hyper step)."""

    def __init__(self, cb: LearnedDataWeights, masking: bool = True) -> None:
        super().__init__("none")
        self.cb, self.masking = cb, masking
        self.moved: list[tuple[Tensor, Tensor]] = []  # per step: (masked rows', kept rows')
        self.masks_at_start: list[type] = []  # the weights' RowMasks at each step's start
        self.exact_zeros = 0  # losses exactly 0 before the mask (rows fitted with certainty)
        self._visit = None

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y, *position = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        if not position:  # a validation batch the hyper steps read: not masked
            return loss
        keep = _hardest(loss) if self.masking else torch.ones_like(loss)
        w = self.cb.weights
        if self._visit is None:  # the loop's own call (not a replay, nor a hyper step's)
            self.exact_zeros += int((loss.detach() == 0).sum())
            self.masks_at_start.append(type(w.masks))  # type: ignore[union-attr]
            self._visit = (position[0], keep.bool(), w.logits.detach().clone())  # type: ignore[union-attr]
        return loss * keep

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._visit: tuple[Tensor, Tensor, Tensor] | None = None

    def on_after_backward(self) -> None:
        assert self._visit is not None
        rows, keep, before = self._visit
        moved = self.cb.weights.logits.detach()[rows] != before[rows]  # type: ignore[union-attr]
        self.moved.append((moved[~keep], moved[keep]))


def _toy_fit(
    cb: LearnedDataWeights,
    model: WatchedOHEM,
    max_epochs: int = 2,
    ckpt_path: str | None = None,
    save: str | None = None,
) -> list[str]:
    """Fit the toy (10 batches an epoch), from ``ckpt_path``, saved to ``save``; the warnings."""
    data = TensorDataset(TOY_X, TOY_Y, torch.arange(len(TOY_Y)))
    train = DataLoader(IndexedDataset(data), batch_size=24, shuffle=True)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    tr = trainer([cb], max_epochs=max_epochs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.fit(model, train, val, ckpt_path=ckpt_path)
    if save is not None:
        tr.save_checkpoint(save)
    return [str(w.message) for w in caught]


def _cb() -> LearnedDataWeights:
    return LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None, gauge="batch")


def test_a_per_batch_mask_is_detected_and_a_masked_visit_moves_no_row() -> None:
    """OHEM's ``losses * keep``: detected at the fit's first batch; from the first hyper step
    on, each step's cross term moves the batch's kept rows and never a row it masked. Before:
    every masked row was pushed down at each masked visit."""
    cb = _cb()
    model = WatchedOHEM(cb)
    said = [m for m in _toy_fit(cb, model) if "exactly 0" in m]
    assert cb.problem.masks.detected and isinstance(cb.weights.masks, ZeroLossMasks)  # type: ignore[union-attr]
    assert len(said) == 1 and "needs no change" in said[0]
    active = [(m, k) for m, k in model.moved if bool(k.any())]  # after the first hyper step
    assert len(active) >= 8
    assert not any(bool(m.any()) for m, _ in active)
    assert sum(float(k.float().mean()) for _, k in active) / len(active) > 0.9


def test_no_mask_the_fit_is_bit_identical_to_one_that_never_watches(monkeypatch) -> None:
    """Control: without a mask nothing is detected, the weights keep :class:`RowMasks` and end
    bit for bit where a fit that never watches its first batches puts them (the check and its
    shrunk re-run change nothing); a loss exactly 0 on rows fitted with certainty from the
    first step (logits × 50) is no mask either (the shrunk re-run is not 0)."""
    cb = _cb()
    _toy_fit(cb, WatchedOHEM(cb, masking=False))
    assert not cb.problem.masks.detected and type(cb.weights.masks) is RowMasks  # type: ignore[union-attr]
    monkeypatch.setattr(MaskDetection, "watching", property(lambda self: False))
    unwatched = _cb()
    _toy_fit(unwatched, WatchedOHEM(unwatched, masking=False))
    assert torch.equal(cb.data_weights(), unwatched.data_weights())
    monkeypatch.undo()

    class Sharp(WatchedOHEM):
        def forward(self, x: Tensor) -> Tensor:
            return 50 * self.net(x)

    cb = _cb()
    model = Sharp(cb, masking=False)
    _toy_fit(cb, model)
    assert model.exact_zeros > 0 and not cb.problem.masks.detected


def test_a_resumed_fit_keeps_the_detection_and_its_window(tmp_path: Path) -> None:
    """The detection is in the checkpoint: a fit resumed from a masked fit's checkpoint reads a
    loss of 0 as masked from its first step (and does not say it again); one resumed from a fit
    whose window closed without a mask does not open a new one, even where its loss now masks
    rows, as the uninterrupted fit would not have (a fresh fit of that loss detects it).
    Before: no state kept, each fit watched its own first batches."""
    for masking in (True, False):
        cb = _cb()
        path = str(tmp_path / f"masking_{masking}.ckpt")
        _toy_fit(cb, WatchedOHEM(cb, masking), max_epochs=3, save=path)  # 30 batches
        assert cb.state_dict()["data_batch_masks"]["detected"] is masking
        resumed = _cb()
        model = WatchedOHEM(resumed, masking=True)  # the resumed loss masks rows either way
        said = _toy_fit(resumed, model, max_epochs=5, ckpt_path=path)
        assert resumed.problem.masks.detected is masking
        want = ZeroLossMasks if masking else RowMasks
        assert len(model.masks_at_start) == 20
        assert all(m is want for m in model.masks_at_start)
        assert not [m for m in said if "near the fit's start" in m]
        if masking:
            assert not [m for m in said if "exactly 0" in m]
    fresh = _cb()
    _toy_fit(fresh, WatchedOHEM(fresh, masking=True), max_epochs=1)
    assert fresh.problem.masks.detected


def test_rows_masked_at_every_visit_are_still_said_and_keep_their_start() -> None:
    """``ignore_index`` (rows labelled -100, masked at every visit): still said once, with the
    advice to leave them out; under ``gauge="batch"`` their weights now stay at ω₀ = ½ (before:
    pushed below the corrupted rows')."""
    unlabelled = torch.arange(len(TOY_Y)) % 6 == 0
    labels = TOY_Y.clone()
    labels[unlabelled] = -100
    train = DataLoader(IndexedDataset(TensorDataset(TOY_X, labels)), batch_size=24, shuffle=True)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    cb = _cb()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=2).fit(ToyClassifier("none"), train, val)
    said = [str(w.message) for w in caught if "exactly 0" in str(w.message)]
    assert len(said) == 1 and "labelled -100: ignore_index?" in said[0]
    assert "leave unlabelled examples out of the training set" in said[0]
    omega = cb.data_weights()
    assert torch.equal(omega[unlabelled], torch.full((int(unlabelled.sum()),), 0.5))
    assert float((omega[~unlabelled] - 0.5).abs().mean()) > 0.01


# ---------------------------------------------------------------- a fit: the flags
class OHEMDigits(Classifier):
    """The tests' noisy digits (30 % wrong labels) under OHEM: each batch's hardest 70 %."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, reduction="none")
        return loss * _hardest(loss)


def _ohem_digits(network: str, optimizer: str) -> tuple[Tensor, Tensor, Tensor]:
    """(ω, the flagged rows as a mask, the corrupted rows) of 40 epochs (400 steps), seed 0."""
    X, y, Xv, yv, corrupted = noisy_digits(0)
    train = DataLoader(
        IndexedDataset(TensorDataset(X, y)),
        batch_size=40,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    cb = LearnedDataWeights(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=40).fit(
            OHEMDigits(network, optimizer), train, DataLoader(TensorDataset(Xv, yv), batch_size=150)
        )
    flags = torch.zeros(len(y), dtype=torch.bool)
    with warnings.catch_warnings():  # the code before's flags: "may be mostly hard clean rows"
        warnings.simplefilter("ignore")
        flags[cb.flagged()] = True
    return cb.data_weights(), flags, corrupted


def test_ohem_on_noisy_digits_flags_fewer_clean_rows(monkeypatch) -> None:
    """Every default, an MLP under SGD: against the same fit with the detection's masks off
    (the code before: every masked visit pushed its row down), the clean rows' mean weight
    rises and ``flagged()`` names far fewer of them. Measured: clean ω 0.603 → 0.686,
    corrupted 0.243 → 0.171; clean rows flagged 0.396 → 0.146 (precision 0.45 → 0.70, recall
    0.77 → 0.80)."""
    omega, flags, bad = _ohem_digits("mlp", "sgd")
    monkeypatch.setattr(MaskDetection, "row_masks", lambda self: RowMasks())
    omega0, flags0, _ = _ohem_digits("mlp", "sgd")
    gap, gap0 = (float(w[~bad].mean() - w[bad].mean()) for w in (omega, omega0))
    assert gap > gap0 + 0.08, (gap, gap0)
    clean, clean0 = (float(f[~bad].float().mean()) for f in (flags, flags0))
    assert clean < 0.6 * clean0, (clean, clean0)
    assert float(flags[bad].float().mean()) > 0.7  # the corrupted rows still flagged


# ---------------------------------------------------------------- DDP: a mask one rank sees
class RankZeroMasks(ToyClassifier):
    """OHEM on rank 0 only: the other rank's loss shows no zero (a mask rare enough that one
    rank's first batches miss it reads the same)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * _hardest(loss) if self.global_rank == 0 else loss


def _ddp_worker(out: Path) -> None:
    """Fit on 2 CPU processes (Lightning's DDP); each rank saves what it detected and ω."""
    torch.set_num_threads(1)
    cb = _cb()
    train = DataLoader(IndexedDataset(TensorDataset(TOY_X, TOY_Y)), batch_size=12, shuffle=True)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    t = trainer([cb], devices=2, strategy="ddp", max_epochs=2)
    t.fit(RankZeroMasks("none"), train, val)
    kept = {"detected": cb.problem.masks.detected, "masks": type(cb.weights.masks).__name__}  # type: ignore[union-attr]
    torch.save({**kept, "omega": cb.data_weights()}, out / f"rank{t.global_rank}.pt")
    end_ddp_worker()


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_ddp_every_rank_takes_a_mask_one_rank_saw(tmp_path: Path) -> None:
    """Only rank 0's loss masks rows: both ranks detect it at the same step (one all_gather of
    a flag at each step of the window) and learn identical weights. Without the sharing rank 1
    would keep pushing its masked rows down (the loss is the same code on every rank, so one
    rank's evidence holds for all)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["detected"] for r in ranks] == [True, True]
    assert [r["masks"] for r in ranks] == ["ZeroLossMasks", "ZeroLossMasks"]
    assert torch.equal(ranks[0]["omega"], ranks[1]["omega"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True, help="folder for per-rank results")
    _ddp_worker(parser.parse_args().worker)
