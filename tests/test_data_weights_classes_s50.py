"""Per-sample data weights that push whole classes away from the validation's (session 50):
the watch (:meth:`DataWeightsProblem.class_shift`, eq. classshift) and the option that prevents
it, ``gauge="class"`` (:class:`ClassMeanLogitGauge`, eq. classgauge: each class's mean logit
held at its start after every outer step)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_data_weights_lightning import NOISY, Data, callback, fit

from hypertorch_sid import ConfigurationError, LearnedDataWeights
from hypertorch_sid.core.normalisers import ClassMeanLogitGauge
from hypertorch_sid.core.sample_weights import SampleWeights
from hypertorch_sid.lightning.data_weights import _UNSEEN
from hypertorch_sid.lightning.data_weights_problem import DataWeightsProblem

PUSHED = "pushed"


# ---------------------------------------------------------------------- the gauge, exactly
def outer_steps(sparse: bool, labels: torch.Tensor, steps: int = 6, push: float = 0.0):
    """SampleWeights under the class gauge, moved by SGD (lr 1, no momentum: it moves only the
    rows of a sparse gradient) on random minibatches of a loss whose rows of class 1 are all
    pushed down by ``push`` on top of a row's own noise; the class means after every step."""
    n = labels.numel()
    w = SampleWeights(n, sparse_grad=sparse)
    w.use_class_gauge(lambda: labels)
    opt = torch.optim.SGD([w.logits], lr=1.0)
    gen = torch.Generator().manual_seed(0)
    means = []
    for _ in range(steps):
        index = torch.randperm(n, generator=gen)[: n // 3]
        losses = (
            torch.rand(index.numel(), generator=gen) - 0.5 + push * (labels[index] == 1).float()
        )
        opt.zero_grad()
        # the outer objective's gradient stands in: ∂/∂x of Σ ωᵢ (noise − push·[class 1])
        (w.weights(index) * losses).sum().backward()
        opt.step()
        w.projection()
        means.append(w.normaliser.class_means())
    return w, means


@pytest.mark.parametrize("sparse", [False, True])
def test_each_class_mean_logit_is_held_at_its_start_after_every_outer_step(sparse):
    """The oracle: x̄_c = x₀ = 0 for every class after each outer step (float32 rounding); the
    rows move (the weights learned something within each class); unlabelled rows (negative
    labels: not yet visited) are not shifted by the gauge."""
    labels = torch.arange(60) % 3
    labels[-6:] = -1
    w, means = outer_steps(sparse, labels)
    assert isinstance(w.normaliser, ClassMeanLogitGauge)
    for m in means:
        assert m[:3].abs().max() < 1e-6
    x = w.logits.detach()
    assert x[labels >= 0].std() > 0.05  # the rows were moved
    ungauged = SampleWeights(60, sparse_grad=sparse)  # the same steps without the gauge
    opt = torch.optim.SGD([ungauged.logits], lr=1.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        index = torch.randperm(60, generator=gen)[:20]
        losses = torch.rand(20, generator=gen) - 0.5
        opt.zero_grad()
        (ungauged.weights(index) * losses).sum().backward()
        opt.step()
    assert torch.equal(x[-6:], ungauged.logits.detach()[-6:])  # unlabelled: untouched


def test_sparse_and_dense_paths_agree():
    labels = torch.arange(45) % 4
    dense, _ = outer_steps(False, labels)
    sparse, _ = outer_steps(True, labels)
    assert torch.allclose(dense.values(), sparse.values(), atol=1e-6)


def test_a_class_pushed_down_collapses_without_the_gauge_and_not_with_it():
    """Every row of class 1 pushed down on top of its own noise: without the gauge the class's
    mean weight falls far below the others (the symptom of session 50's 20 Newsgroups fit);
    with it the class keeps its mean logit, and the rows within it are still ordered by their
    own noise."""
    labels = torch.arange(60) % 3
    held, _ = outer_steps(False, labels, steps=24, push=1.0)
    free = SampleWeights(60)
    opt = torch.optim.SGD([free.logits], lr=1.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(24):
        index = torch.randperm(60, generator=gen)[:20]
        losses = torch.rand(20, generator=gen) - 0.5 + 1.0 * (labels[index] == 1).float()
        opt.zero_grad()
        (free.weights(index) * losses).sum().backward()
        opt.step()
    mean = lambda w, c: float(w.values()[labels == c].mean())  # noqa: E731
    assert mean(free, 1) < mean(free, 0) - 0.3  # collapsed
    assert abs(mean(held, 1) - mean(held, 0)) < 0.05  # held
    assert held.values()[labels == 1].std() > 0.05


def test_the_class_gauge_is_refused_where_it_cannot_be_held():
    with pytest.raises(ConfigurationError, match="sigmoid"):
        SampleWeights(5, "softmax").use_class_gauge(lambda: None)
    with pytest.raises(ConfigurationError, match="use_class_gauge"):
        SampleWeights(5).use_gauge("class")
    with pytest.raises(ConfigurationError, match="per='class'"):
        LearnedDataWeights(per="class", num_classes=3, gauge="class")
    with pytest.raises(ConfigurationError, match="sigmoid"):
        LearnedDataWeights(parameterization="softmax", gauge="class")


# ---------------------------------------------------------------------- the watch
def shares_problem(train_counts, val_counts, class_weights) -> DataWeightsProblem:
    """A per-sample problem whose visited rows hold ``train_counts`` of each class, all at
    that class's weight, and whose hyper steps read ``val_counts``."""
    problem = LearnedDataWeights(seed=0).problem
    labels = torch.cat([torch.full((k,), c) for c, k in enumerate(train_counts)])
    n = labels.numel() + 3
    problem._labels = torch.cat([labels, torch.full((3,), _UNSEEN)])  # 3 rows not visited
    problem.weights = SampleWeights(n)
    omega = torch.tensor(class_weights, dtype=torch.float)[labels]
    with torch.no_grad():
        problem.weights.logits[: labels.numel()] = torch.logit(omega)
    problem._val_counts = torch.tensor(val_counts)
    problem._val_rows = sum(val_counts)
    return problem


@pytest.mark.parametrize(
    ("train", "val", "omega", "pushed"),
    [
        # balanced classes, two collapsed: s_c/π_c = 0.2 < ⅓
        ([100, 100, 100, 100], [75, 75, 75, 75], [0.9, 0.9, 0.1, 0.1], [2, 3]),
        # the same classes moved less: s_c/π_c = 0.36 ≥ ⅓, not said
        ([100, 100, 100, 100], [75, 75, 75, 75], [0.9, 0.9, 0.2, 0.2], []),
        # imbalance: the minority up-weighted TOWARD the balanced validation set: not said
        ([180, 20], [50, 50], [0.2, 0.9], []),
        # ... and the minority pushed further from it: said (s⁰/π = 0.2, s/π = 0.05 < 0.067)
        ([180, 20], [50, 50], [0.9, 0.2], [1]),
        # equal weights: nothing moved
        ([10, 30, 60], [1, 1, 1], [0.5, 0.5, 0.5], []),
    ],
)
def test_classes_pushed_away_from_the_validation_shares_are_said(train, val, omega, pushed):
    problem = shares_problem(train, val, omega)
    said = problem.class_shift()
    assert (said is not None) == bool(pushed), said
    if pushed:
        for c in pushed:
            assert f"class {c}:" in said
        assert "gauge='class'" in said and "mean_loss" in said and "plainly" in said
        assert f"{len(pushed)} whole class" in said


def test_the_shares_count_the_training_loaders_draws():
    """A sampler that draws the minority nine times as often (the imbalanced recipe's
    WeightedRandomSampler): per row the minority at ω 0.25 against 0.9 is 3 % of the weight,
    below ⅓ of its 10 % of the rows (said); over the draws it is 22 % against the draws' 50 %
    and the validation's 50 % (not said)."""
    problem = shares_problem([180, 20], [50, 50], [0.9, 0.05])
    assert problem.class_shift() is not None
    problem._visits = torch.cat([torch.ones(180), torch.full((20,), 9.0), torch.zeros(3)])
    shares = problem.class_shares()
    assert torch.allclose(shares["unweighted"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert problem.class_shift() is not None  # ω 0.05: 5 % of the draws' weight, < ⅓ · 50 %
    problem = shares_problem([180, 20], [50, 50], [0.9, 0.25])
    problem._visits = torch.cat([torch.ones(180), torch.full((20,), 9.0), torch.zeros(3)])
    assert problem.class_shift() is None  # 22 % of the weighted draws
    problem._visits = None  # per row: s/π = 0.06 < ⅓ · 0.2
    assert problem.class_shift() is not None


def test_the_watch_needs_labels_and_validation_counts():
    problem = shares_problem([100, 100], [50, 50], [0.9, 0.1])
    assert problem.class_shift() is not None
    problem._labels = None
    assert problem.class_shift() is None and problem.class_shares() is None
    problem = shares_problem([100, 100], [50, 50], [0.9, 0.1])
    problem._val_counts, problem._val_rows = None, 0
    assert problem.class_shift() is None


def class_warnings(cb: LearnedDataWeights, epochs: int, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(cb, epochs, **kwargs)
    return [str(w.message) for w in caught if PUSHED in str(w.message)]


def test_a_healthy_fit_is_not_said_and_the_class_gauge_holds_through_the_drop_in():
    """The tests' noisy toy (30 % labels shifted by one class): the default fit separates the
    corrupted rows without moving a class away from the validation's (no warning); under
    gauge='class' each class's mean logit ends at 0 (the labels read through the drop-in) and
    the corrupted rows still end below the clean ones."""
    plain = callback()
    assert class_warnings(plain, 15) == []
    shares = plain.problem.class_shares()
    assert shares is not None and (shares["weighted"] / shares["validation"]).min() > 0.5
    cb = callback(gauge="class")
    assert class_warnings(cb, 15) == []
    x = cb.problem.weights.logits.detach()
    labels = cb.problem._labels
    for c in range(3):
        assert abs(float(x[labels == c].mean())) < 1e-5
    w = cb.data_weights()
    assert w[:NOISY].mean() < w[NOISY:].mean() - 0.2


def test_a_class_gauge_without_labels_says_it_held_nothing():
    """A collate_fn of the user's hides the labels; gauge='class' then holds nothing: said."""

    class OwnCollate(Data):
        def train_dataloader(self):
            loader = super().train_dataloader()
            return torch.utils.data.DataLoader(
                loader.dataset,
                batch_size=24,
                shuffle=True,
                collate_fn=lambda s: torch.utils.data.default_collate(s),
            )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(callback(gauge="class"), 2, data=OwnCollate())
    assert any("held nothing" in str(w.message) for w in caught)
