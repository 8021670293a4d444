"""Per-batch masks under the data weights (session 62, docs/data_weights.md, "Per-batch
masks"): a row whose loss is exactly 0 and does not depend on the network's weights at a visit
(``losses * keep``: online hard example mining, a curriculum, loss truncation; an unlabelled
row's ``ignore_index``) is not moved by that visit. Before, through the self-normalised loss's
Σ ω, its weight was pushed down at every masked visit: on OHEM (MNIST, 30 % wrong labels) clean
rows were flagged 1.3-4.1× as often as in the same fit with every row kept."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from lightning_problems import TOY_X, TOY_Y, ToyClassifier, trainer
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import IndexedDataset, LearnedDataWeights
from hypertorch_sid.core.directional import TrainingCrossTerm
from hypertorch_sid.core.sample_weights import SampleWeights

#: the rows of the toy masked at every visit (a fixed mask: unlabelled rows' losses times 0)
MASKED = torch.arange(len(TOY_Y)) % 6 == 0


def _batch(n: int = 12) -> tuple[SampleWeights, Tensor, Tensor, Tensor]:
    """Sigmoid weights of ``n`` rows at random logits, a batch of 5 of them, the batch's u
    (directional derivatives) and its losses, rows 1 and 3 masked (loss and u exactly 0)."""
    gen = torch.Generator().manual_seed(0)
    w = SampleWeights(n)
    with torch.no_grad():
        w.logits.copy_(torch.randn(n, generator=gen))
    index = torch.tensor([0, 2, 5, 7, 9])
    u = torch.randn(5, generator=gen).abs() + 0.5
    losses = torch.rand(5, generator=gen) + 0.1
    u[[1, 3]], losses[[1, 3]] = 0.0, 0.0
    return w, index, u, losses


@pytest.mark.parametrize("gauge", ["batch", "class"])
def test_the_training_cross_term_leaves_a_row_masked_at_this_visit_where_it_was(gauge: str) -> None:
    """``TrainingCrossTerm`` (``cross_term="training"``): the masked rows get no ĝ (left out of
    the sparse gradient, so the outer step does not move them); the others' ĝ is the batch's
    exact −α ω′ᵢ(uᵢ − û)/Σ ω. Before: the masked rows got α ω′ᵢ û / Σ ω > 0 (under the class
    gauge, their class's mean), pushed down at each masked visit."""
    w, index, u, losses = _batch()
    if gauge == "class":
        labels = torch.tensor([0, 1] * 6)
        w.use_class_gauge(lambda: labels)
        w.projection()  # each class's mean logit at x₀, as after an outer step
    opt = torch.optim.SGD([w.logits], lr=0.5)
    before = w.logits.detach().clone()
    cross = TrainingCrossTerm(w, opt, normalize=True)
    g = cross.gradients(index, u, 0.3, losses)[0].coalesce()
    assert sorted(g.indices()[0].tolist()) == [0, 5, 9]  # rows 2 and 7 masked: no gradient
    if gauge == "batch":
        x = before[index].clone().requires_grad_(True)
        omega = torch.sigmoid(x)
        (exact,) = torch.autograd.grad((omega * u).sum() / omega.sum(), [x])
        torch.testing.assert_close(g.to_dense()[[0, 5, 9]], -0.3 * exact[[0, 2, 4]])
    cross.apply(cross.gradients(index, u, 0.3, losses))
    moved = w.logits.detach() - before
    if gauge == "batch":  # no gauge's shift: the masked rows exactly where they were
        assert moved[[2, 7]].abs().max() == 0
    assert moved[[0, 5, 9]].abs().min() > 0
    # a row of loss 0 whose u is not 0 (fitted, or a mask that flips) is not masked
    u[1] = 0.7
    assert 2 in cross.gradients(index, u, 0.3, losses)[0].coalesce().indices()[0].tolist()


def test_the_hyper_steps_weighted_loss_gives_a_masked_row_no_hypergradient() -> None:
    """The hyper steps' ℓ̂ = Σ ωᵢℓᵢ / Σ ωᵢ (``SampleWeights.weighted_mean``, what
    ``cross_term="hyper_step"`` differentiates): the same value and gradient in w, and the
    cross term ∂ₓ⟨∇_w ℓ̂, v⟩ is 0 at the masked rows, the exact one at the others. Before: at a
    masked row −ω′ᵢ⟨∇_w ℓ̂, v⟩/Σ ω, not 0."""
    gen = torch.Generator().manual_seed(1)
    n, index = 8, torch.tensor([0, 1, 2, 3, 4, 5])
    weights = SampleWeights(n)
    with torch.no_grad():
        weights.logits.copy_(torch.randn(n, generator=gen))
    features, targets = torch.randn(6, 3, generator=gen), torch.randn(6, generator=gen)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    theta, v = torch.randn(3, generator=gen, requires_grad=True), torch.randn(3, generator=gen)

    def losses() -> Tensor:
        return (features @ theta - targets).pow(2) * keep

    loss = weights.weighted_mean(losses(), index, normalize=True)
    (grad_w,) = torch.autograd.grad(loss, [theta], create_graph=True)
    (cross,) = torch.autograd.grad(grad_w @ v, [weights.logits])
    assert cross[[1, 4]].abs().max() == 0
    # the others' as the plain Σ ωℓ / Σ ω gives them, its value and w-gradient unchanged
    x = weights.logits.detach()[index].clone().requires_grad_(True)
    omega = torch.sigmoid(x)
    plain = (omega * losses()).sum() / omega.sum()
    (plain_w,) = torch.autograd.grad(plain, [theta], create_graph=True)
    (plain_x,) = torch.autograd.grad(plain_w @ v, [x])
    torch.testing.assert_close(loss, plain)
    torch.testing.assert_close(grad_w, plain_w)
    torch.testing.assert_close(cross[[0, 2, 3, 5]], plain_x[[0, 2, 3, 5]])


class FixedMask(ToyClassifier):
    """The careless-user toy with the rows :data:`MASKED` multiplied by 0 at every visit (the
    training rows carry their position; the validation rows, without it, are not masked)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y, *position = batch
        loss = F.cross_entropy(self(x), y, reduction="none")
        return loss * (~MASKED[position[0]]).float() if position else loss


@pytest.mark.parametrize("cross_term", ["training", "hyper_step"])
def test_rows_masked_at_every_visit_keep_their_starting_weight(cross_term: str) -> None:
    """A fixed mask (``gauge="batch"``: no gauge shifts any row): the masked rows end exactly
    at ω₀ = ½ whichever cross term moves the weights, the others moved. Before: they drifted
    down (0.007-0.045 on this toy with -100 labels), below the corrupted rows."""
    data = TensorDataset(TOY_X, TOY_Y, torch.arange(len(TOY_Y)))
    train = DataLoader(IndexedDataset(data), batch_size=24, shuffle=True)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    cb = LearnedDataWeights(
        start_step=4, every_n_steps=4, max_overhead=None, gauge="batch", cross_term=cross_term
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer([cb], max_epochs=2).fit(FixedMask("none"), train, val)
    omega = cb.data_weights()
    assert torch.equal(omega[MASKED], torch.full((int(MASKED.sum()),), 0.5))
    assert float((omega[~MASKED] - 0.5).abs().mean()) > 0.01


def test_the_masked_rows_warning_tells_every_visit_from_a_per_batch_mask() -> None:
    """The warning's advice ("leave unlabelled examples out") is for rows masked at every
    visit; a mask chosen anew in each batch (online hard example mining) is said to need no
    change. Before: only the first, with "the normalised loss pushes it down like a
    misfit's", which per-batch masks no longer do."""
    labels = TOY_Y.clone()
    labels[MASKED] = -100
    train = DataLoader(IndexedDataset(TensorDataset(TOY_X, labels)), batch_size=24, shuffle=True)
    val = DataLoader(TensorDataset(TOY_X[:60], TOY_Y[:60]), batch_size=20)
    cb = LearnedDataWeights(start_step=4, every_n_steps=4, max_overhead=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer([cb], max_epochs=1).fit(ToyClassifier("none"), train, val)
    said = [str(w.message) for w in caught if "exactly 0" in str(w.message)]
    assert len(said) == 1
    assert "masked at EVERY visit" in said[0] and "leave unlabelled examples out" in said[0]
    assert "chosen anew in each batch" in said[0] and "needs no change" in said[0]
    assert "pushes it down" not in said[0]
    assert torch.equal(cb.data_weights()[MASKED], torch.full((int(MASKED.sum()),), 0.5))
