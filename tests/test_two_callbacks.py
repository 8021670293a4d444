"""``LearnedWeightDecay`` and ``LearnedDataWeights`` in one fit: each callback's hyper steps see
the training the other shapes (the weighted loss; the learned decay), E of the decay is the
validation batches' unweighted loss, and only the Trainer's own training steps move the data
weights. Before, the decay's first hyper step failed inside the data weights' training step
("the training batch carries no example indices") although the training set was indexed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning_problems import end_ddp_worker, trainer
from test_data_weights_lightning import NOISY, Classifier, Data, precision_recall
from test_data_weights_networks import assert_separates, fit_noisy_digits

from hypertorch_sid import LearnedDataWeights, LearnedWeightDecay
from hypertorch_sid.core.budget import OverheadBudget


def both(order: str) -> tuple[LearnedWeightDecay, LearnedDataWeights, list[Any]]:
    decay = LearnedWeightDecay(1e-3, every_n_steps=2, seed=0, max_overhead=None)
    weights = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
    return decay, weights, ([decay, weights] if order == "decay_first" else [weights, decay])


class Counted(Classifier):
    """Counts the training steps Lightning runs (the loop's calls of ``training_step``)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.steps += 1


@pytest.mark.parametrize("order", ["decay_first", "weights_first"])
def test_both_callbacks_learn_in_one_fit(order):
    decay, weights, callbacks = both(order)
    model, data = Counted(), Data()
    seen = []
    record = weights.problem._seen
    weights.problem._seen = lambda index, *a: (seen.append(index.numel()), record(index, *a))
    trainer(callbacks, max_epochs=15).fit(model, datamodule=data)

    w = weights.data_weights()
    assert w[:NOISY].mean() < w[NOISY:].mean() - 0.2, (w[:NOISY].mean(), w[NOISY:].mean())
    precision, recall = precision_recall(weights.flagged())
    assert precision > 0.8 and recall > 0.8, (precision, recall)
    lam = torch.stack([v.reshape(-1)[0] for v in decay.decay_values().values()])
    assert torch.isfinite(lam).all() and not torch.allclose(lam, torch.full_like(lam, 1e-3))
    assert len(decay.history) > 5 and len(weights.history) > 5
    # the data weights recorded the loop's batches only, none of the decay's hyper-step draws
    assert len(seen) == model.steps


@pytest.mark.parametrize("order", ["decay_first", "weights_first"])
def test_the_decays_budget_counts_the_data_weights_work_as_hyper_work_not_training(order):
    """The decay's budget (max_overhead=0.5) beside the data weights (no budget of their own),
    counted in work, not timed: one unit per training step, two per Hessian–vector product and
    one per validation gradient of either callback. The data weights' hyper steps are hyper
    work: the decay's training is the steps alone, and its own hyper steps stay within half of
    it. Before, it counted them as training (a training of 1 + their units), and the decay's
    allowance grew with them: costs multiplied (2.7–2.8× a plain CPU fit, against 1.9–2.0× for
    the data weights alone)."""
    state: dict[str, Any] = {}

    def units(callback: Any) -> float:
        if callback.sid is None:
            return 0.0
        c = callback.sid.cost
        return 2.0 * (c.jacobian_vector_products + c.curvature_products) + c.hypergradients

    def clock() -> float:
        return float(state["trainer"].global_step) + units(state["decay"]) + units(state["dw"])

    decay = LearnedWeightDecay(
        1e-3, every_n_steps=1, seed=0, max_overhead=OverheadBudget(0.5, clock=clock)
    )
    weights = LearnedDataWeights(every_n_steps=2, start_step=0, seed=0)
    callbacks = [decay, weights] if order == "decay_first" else [weights, decay]
    fit = trainer(callbacks, max_epochs=8)
    state.update(trainer=fit, decay=decay, dw=weights)
    fit.fit(Classifier(), datamodule=Data())

    budget, steps = decay.budget, float(fit.global_step)
    assert units(weights) > steps  # the data weights' hyper work outweighs the training
    assert budget.spent_training == steps == budget.training_steps
    dearest = 2.0 * decay.sid.minimum_products() + 40  # one hyper step, its curvature estimate
    assert budget.spent_hyper <= 0.5 * steps + dearest
    assert budget.spent_hyper == units(decay) and budget.skipped > 0


def test_budgets_share_only_the_work_of_one_fit():
    """A later fit starts from its own callbacks' work: a callback reused alone records nothing
    in the old fit's shared work (nobody reads it: it is not timed), reused together they share
    a new one."""
    decay, weights, _ = both("decay_first")
    decay.budget = OverheadBudget(100.0)
    trainer([decay, weights], max_epochs=1).fit(Classifier(), datamodule=Data())
    shared, spent = decay.budget.work, decay.budget.work.spent
    assert weights.budget.work is shared and spent > 0
    trainer([weights], max_epochs=1).fit(Classifier(), datamodule=Data())
    assert weights.budget.work is None and shared.spent == spent
    trainer([weights, decay], max_epochs=1).fit(Classifier(), datamodule=Data())
    assert weights.budget.work is decay.budget.work is not shared and shared.spent == spent


class DecoupledAdamW(Classifier):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.02, weight_decay=0.0)


def adamw_p(model: Classifier, name: str) -> Any:
    """AdamW's √v̂ + ε for the parameter ``name`` (P of the decoupled decay's fixed point)."""
    opt = model.trainer.optimizers[0]
    p = dict(model.named_parameters())[name]
    state, group = opt.state[p], opt.param_groups[0]
    v = state["exp_avg_sq"] / (1 - group["betas"][1] ** float(state["step"]))
    return v.sqrt() + group["eps"]


@pytest.mark.parametrize("decoupled", [False, True])
def test_the_decay_is_in_the_data_weights_inner_loss_and_e_is_the_unweighted_loss(decoupled):
    """ℓ̂ of the data weights' hyper steps = the weighted loss + ½ Σ λ‖w‖² at the decay's
    current λ (per layer; decoupled, AdamW: ½ Σ λ P⊙w² with P = √v̂ + ε); E of the decay's hyper
    steps on a validation batch = the mean cross entropy, no weight and no index."""
    decay, weights, callbacks = both("decay_first")
    if decoupled:
        decay = LearnedWeightDecay(1e-3, every_n_steps=2, seed=0, max_overhead=None, decoupled=True)
        callbacks = [decay, weights]
    model, data = (DecoupledAdamW() if decoupled else Classifier()), Data()
    trainer(callbacks, max_epochs=3).fit(model, datamodule=data)
    batch = next(iter(data.train_dataloader()))
    weights.problem._wrap(model)  # the fit gave the module its own training_step back
    try:
        with torch.no_grad():
            inner = weights._active.inner_loss(batch)
            weighted = weights.problem.weighted_loss(model, batch)
            lams = decay.decay_values()
            penalty = sum(
                0.5 * (lams[name] * (adamw_p(model, name) if decoupled else 1) * p.pow(2)).sum()
                for name, p in model.named_parameters()
                if name in lams
            )
            assert float(penalty) > 0
            torch.testing.assert_close(inner, weighted + penalty, rtol=1e-6, atol=1e-9)

            x, y = next(iter(data.val_dataloader()))
            e = decay.problem.data_loss(model, (x, y), "validation")
            torch.testing.assert_close(e, F.cross_entropy(model.net(x), y))
    finally:
        weights.problem.unwrap()


def test_the_decay_penalty_reads_the_tensors_swapped_into_the_module():
    """Under ``hvp="forward"`` the core swaps the inner tensors into the module: the penalty must
    read those (by name), not the tensors the decay was built on. Doubling every weight
    quadruples it."""
    from torch.nn.utils.stateless import _reparametrize_module

    decay, weights, callbacks = both("decay_first")
    model = Classifier()
    trainer(callbacks, max_epochs=1).fit(model, datamodule=Data())
    penalty = decay.training_penalty(model)
    with torch.no_grad():
        plain = penalty()
        doubled = {n: 2 * p for n, p in model.named_parameters()}
        with _reparametrize_module(model, doubled):
            swapped = penalty()
    assert float(plain) > 0
    torch.testing.assert_close(swapped, 4 * plain)


def test_a_resumed_fit_continues_both_callbacks(tmp_path):
    """Checkpointed after 2 epochs and resumed to 4, both callbacks end where the straight fit's
    do (data weights by a forward difference: up to its ~1e-3 rounding; λ alike)."""

    def run(epochs: int, ckpt: Any = None, save: Any = None) -> tuple[dict, torch.Tensor]:
        decay, weights, callbacks = both("decay_first")
        t = trainer(callbacks, max_epochs=epochs)
        t.fit(Classifier(), datamodule=Data(shuffle=False), ckpt_path=ckpt)
        if save is not None:
            t.save_checkpoint(save)
        return decay.decay_values(), weights.data_weights()

    lam, w = run(4)
    run(2, save=tmp_path / "half.ckpt")
    lam_resumed, w_resumed = run(4, ckpt=tmp_path / "half.ckpt")
    torch.testing.assert_close(w_resumed, w, rtol=5e-3, atol=5e-4)  # one of 240: 3.6e-3 on AVX-512
    for name in lam:
        torch.testing.assert_close(lam_resumed[name], lam[name], rtol=2e-3, atol=1e-7)


@pytest.mark.parametrize(
    ("network", "optimizer", "seed"),
    [("cnn_bn", "momentum", 0), ("cnn_bn", "adam", 1), ("mlp", "sgd", 1), ("mlp", "adam", 0)],
)
def test_both_drop_ins_on_real_networks(network, optimizer, seed):
    """Both drop-ins with their defaults on noisy digits (30 % wrong labels), a CNN with
    BatchNorm and an MLP under SGD, momentum and Adam: the data weights separate the corrupted
    examples as they do alone (test_data_weights_networks' bounds), λ stays finite and moves.
    The decay's budget is off: it reads the clock, so which due hyper steps run varies from run
    to run, and with it this tiny fit's path (the CNN's corrupted-vs-clean gap of mean weights
    ranged 0.10–0.48 over six runs); the shared budget is counted in test_budget."""
    decay = LearnedWeightDecay(1e-4, seed=seed, max_overhead=None)
    weights = LearnedDataWeights(seed=seed)
    _, corrupted = fit_noisy_digits(network, optimizer, seed, [decay, weights])
    assert_separates(weights, corrupted)
    lam = torch.cat([v.reshape(-1) for v in decay.decay_values().values()])
    assert bool(torch.isfinite(lam).all()) and not torch.allclose(lam, torch.full_like(lam, 1e-4))
    assert len(decay.history) > 5


def _ddp_worker(out: Path) -> None:
    """Both drop-ins on 2 CPU processes (Lightning's DDP); each rank saves what it learned."""
    torch.set_num_threads(1)
    decay, weights, callbacks = both("decay_first")
    t = trainer(callbacks, devices=2, strategy="ddp", max_epochs=6)
    t.fit(Classifier(), datamodule=Data())
    lam = torch.stack([v.reshape(-1)[0] for v in decay.decay_values().values()])
    torch.save((weights.data_weights(), lam), out / f"rank{t.global_rank}.pt")
    end_ddp_worker()


@pytest.mark.ddp
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_both_callbacks_under_ddp_learn_the_same_on_every_rank(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (w0, lam0), (w1, lam1) = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert torch.equal(w0, w1) and torch.equal(lam0, lam1)
    assert w0[:NOISY].mean() < w0[NOISY:].mean() - 0.1
    assert not torch.allclose(lam0, torch.full_like(lam0, 1e-3))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", type=Path, required=True, help="folder for per-rank results")
    _ddp_worker(parser.parse_args().worker)
