"""The class-centred cross term (session 51, eq. classcentre): under the class gauge each
training row's hypergradient is taken against its own class's weighted mean in the batch, so a
part of the cross term common to a class (which class the validation minibatch happens to
favour: 71–98 % of its variance on session 50's 20 Newsgroups recipe, noise between two halves
of the validation set) moves no row, and what is left orders the rows within their class."""

from __future__ import annotations

import warnings

import torch
from test_data_weights_lightning import NOISY, Data, callback, fit
from torch.utils.data import DataLoader, TensorDataset, default_collate

from hypertorch_sid import IndexedDataset, LearnedDataWeights, indexed_collate
from hypertorch_sid.core.directional import TrainingCrossTerm
from hypertorch_sid.core.sample_weights import SampleWeights
from hypertorch_sid.core.weighted_loss import class_centred

LABELS = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 1, 2, 2, 0])


def cross_term_gradient(u: torch.Tensor, gauge: str) -> torch.Tensor:
    """The training cross term's gradient of the logits on every row (a batch of all 12),
    the weights spread so that they differ from row to row."""
    w = SampleWeights(12)
    with torch.no_grad():
        w.logits.copy_(torch.linspace(-1.0, 1.5, 12))
    if gauge == "class":
        w.use_class_gauge(lambda: LABELS)
    else:
        w.use_gauge(gauge)
    opt = torch.optim.SGD([w.logits], lr=1.0)
    index = torch.arange(12)
    return TrainingCrossTerm(w, opt, normalize=True).gradient(index, u, 0.5).to_dense()


def test_a_part_common_to_a_class_moves_no_row_under_the_class_gauge():
    """u and u + c[label] (a shift per class) give the same gradient under the class gauge;
    under the batch gauge they do not (that shift is what pushed whole classes down)."""
    u = torch.randn(12, generator=torch.Generator().manual_seed(0))
    shifted = u + torch.tensor([3.0, -2.0, 5.0])[LABELS]
    g, gs = cross_term_gradient(u, "class"), cross_term_gradient(shifted, "class")
    assert torch.allclose(g, gs, atol=1e-6)
    b, bs = cross_term_gradient(u, "batch"), cross_term_gradient(shifted, "batch")
    assert (b - bs).abs().max() > 0.05  # 0.08 here, the gradients themselves ~0.03


def test_the_class_gauge_gradient_is_each_row_against_its_class_mean():
    """The oracle by hand: ĝᵢ = −α ω′ᵢ (uᵢ − ū_c(i)) / Σ ω, ū_c the class's ω-weighted mean;
    so the gradient of each class sums, weighted by 1/ω′, to zero."""
    u = torch.randn(12, generator=torch.Generator().manual_seed(1))
    x = torch.linspace(-1.0, 1.5, 12)
    omega = torch.sigmoid(x)
    means = torch.stack(
        [(omega * u)[LABELS == c].sum() / omega[LABELS == c].sum() for c in range(3)]
    )
    slope = omega * (1 - omega)
    expected = -0.5 * slope * (u - means[LABELS]) / omega.sum()
    assert torch.allclose(cross_term_gradient(u, "class"), expected, atol=1e-6)


def test_rows_without_a_label_keep_the_batch_centre():
    """A negative label (a row not yet visited) is left as it is; None leaves u unchanged."""
    u = torch.tensor([1.0, 2.0, 3.0, 4.0])
    omega = torch.ones(4)
    out = class_centred(u, omega, torch.tensor([0, 0, -1, 1]))
    assert torch.allclose(out, torch.tensor([1 - 1.5 + 2.5, 2 - 1.5 + 2.5, 3.0, 4 - 4 + 2.5]))
    assert torch.equal(class_centred(u, omega, None), u)


# ---------------------------------------------------------------------- the drop-in's default
class SkewedValidation(Data):
    """The toy's validation set with class 0 tripled: E rewards a prior towards class 0, which
    the batch gauge's weights learn by pushing whole classes (session 50's 20 Newsgroups)."""

    def val_dataloader(self) -> DataLoader:
        zero = self.yv == 0
        Xv = torch.cat([self.Xv, self.Xv[zero], self.Xv[zero]])
        yv = torch.cat([self.yv, self.yv[zero], self.yv[zero]])
        return DataLoader(TensorDataset(Xv, yv), batch_size=100)


def class_mean_logits(cb: LearnedDataWeights, labels: torch.Tensor) -> torch.Tensor:
    x = torch.logit(cb.data_weights().double())
    return torch.stack([x[labels == c].mean() for c in range(3)])


def test_by_default_the_weights_cannot_push_a_class_down_where_labels_are_read():
    """LearnedDataWeights() on integer labels (default collation) holds each class's mean logit
    at its start (ω₀ = ½: 0) and still learns which rows of a class to trust; asked for
    gauge="batch" (the default before), the same fit moves the classes' means apart."""
    data = SkewedValidation()
    cb = callback()
    fit(cb, 6, data=data)
    assert cb.weights is not None and cb.weights.gauge == "class"
    means = class_mean_logits(cb, data.y)
    assert means.abs().max() < 1e-4
    w = cb.data_weights()
    assert float(w[:NOISY].mean()) < float(w[NOISY:].mean()) - 0.1  # it learned
    batch = callback(gauge="batch")
    fit(batch, 6, data=SkewedValidation())
    spread = class_mean_logits(batch, data.y)
    assert float(spread.max() - spread.min()) > 0.3


def test_the_default_is_the_class_gauge_bit_for_bit():
    runs = {}
    for gauge in ("auto", "class"):
        cb = callback(gauge=gauge)
        fit(cb, 3)
        runs[gauge] = cb.data_weights()
    assert torch.equal(runs["auto"], runs["class"])


def _own_collate(samples):
    """A collate_fn of a user's over (x, y, w) samples, which name no label to read before
    collation (three entries): (x, y) as torch would, but not torch's own function."""
    return default_collate([(x, y) for x, y, _ in samples])


class OwnCollate(Data):
    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(0)
        data = IndexedDataset(TensorDataset(self.X, self.y, torch.ones(len(self.y))))
        return DataLoader(
            data,
            batch_size=24,
            shuffle=True,
            generator=gen,
            collate_fn=indexed_collate(_own_collate),
        )


def test_without_labels_the_default_keeps_the_batch_gauge_and_says_what_it_costs():
    """A collate_fn of the user's and no target=: no label is read, the gauge stays "batch",
    and the warning says the weights can push whole classes down and names target=; with
    target= the class gauge holds."""
    cb = callback()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(cb, 2, data=OwnCollate())
    assert cb.weights is not None and cb.weights.gauge == "batch"
    told = [str(w.message) for w in said if "collate_fn of yours" in str(w.message)]
    assert told and "push whole classes down" in told[0] and "target=" in told[0]
    labelled = callback(target=lambda batch: batch[1])
    fit(labelled, 2, data=OwnCollate())
    assert labelled.weights is not None and labelled.weights.gauge == "class"
