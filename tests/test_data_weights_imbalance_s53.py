"""Imbalanced training labels without a class-rebalancing sampler (session 53): what
``gauge="auto"`` chooses there and which settings let a rare class's weight rise.

A rare class under a plain shuffled DataLoader (docs/data_weights.md, "Session 53"): the default
chooses ``"class"`` (labels read, no ``WeightedRandomSampler``), which holds each class's mean
logit, so the weights reorder examples within a class but leave the classes' balance as it is;
``gauge="batch"`` and ``per="class"`` let the rare class's weight rise above the common ones'
(what inverse-frequency weighting does by hand)."""

from __future__ import annotations

import torch
from test_data_weights_lightning import Classifier, Data, callback, fit


class RareClass(Data):
    """Three overlapping Gaussian classes, clean labels; class 2 kept at one row in ten in the
    training set (about 10 of 100 rows), the validation set balanced (20 of each)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        centres = torch.tensor([[1.0, 0.0], [-0.5, 0.9], [-0.5, -0.9]])

        def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.arange(n) % 3
            return centres[y] + 0.9 * torch.randn(n, 2, generator=gen), y

        X, y = draw(270)
        keep = (y != 2) | (torch.arange(270) % 30 == 2)  # class 2: 9 of its 90 rows
        self.X, self.y = X[keep], y[keep]
        self.Xv, self.yv = draw(60)


def class_means(cb) -> torch.Tensor:
    """Each class's mean learned weight over its training rows (per class: the weights)."""
    w = cb.data_weights().detach()
    if cb.per == "class":
        return w
    y = RareClass().y
    return torch.stack([w[y == c].mean() for c in range(3)])


def test_auto_holds_each_class_on_imbalanced_labels_without_a_sampler():
    """``"auto"`` → ``"class"``: the weights move within a class (the rare class's spread
    wide), but each class's mean logit stays at its start, x₀ = logit(½) = 0, so the rare class
    is not lifted as a whole (its mean weight within Jensen's gap of the others')."""
    cb = callback()
    fit(cb, 6, data=RareClass())
    assert cb.weights is not None and cb.weights.gauge == "class"
    logits, y = cb.weights.logits.detach(), RareClass().y
    assert logits.std() > 0.5  # it learned
    for c in range(3):
        assert abs(float(logits[y == c].mean())) < 1e-4, c
    means = class_means(cb)
    assert means[2] < 1.2 * means[:2].max(), means


def test_the_batch_gauge_and_per_class_weights_raise_the_rare_class():
    """Without the hold the balanced validation set's evidence lifts the rare class above
    the common ones: per sample under ``gauge="batch"``, and per class."""
    for cb in (callback(gauge="batch"), callback(per="class", num_classes=3, outer_lr=0.2)):
        fit(cb, 6, model=Classifier(), data=RareClass())
        means = class_means(cb)
        assert means[2] > 1.2 * means[:2].max(), (cb.per, means)
