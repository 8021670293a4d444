"""The label-shift class prior (session 54): r_c = π̂_c / p_c of each training row's label,
multiplied into its learned weight (``LearnedDataWeights(prior=LabelShift())``).

Oracles: on known class frequencies r is the closed form and the r-weighted training loss's
expectation is the validation distribution's loss (eq. labelshift); the shrinkage (eq.
shiftshrink) leaves r ≡ 1 where the validation frequencies match the training's. Behaviour:
the drop-in counts the labels, sets each row's factor, a balanced toy is bit-identical to no
prior, a class-balancing sampler gives r ≈ 1, a class missing from the validation set is said,
and the refusals."""

from __future__ import annotations

import pytest
import torch
from test_data_weights_imbalance_s53 import RareClass
from test_data_weights_lightning import Classifier, Data, callback, fit
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from hypertorch_sid import ConfigurationError, IndexedDataset
from hypertorch_sid.core.directional import TrainingCrossTerm
from hypertorch_sid.core.label_shift import LabelShift
from hypertorch_sid.core.sample_weights import SampleWeights
from hypertorch_sid.core.weighted_loss import weighted_loss


# ---------------------------------------------------------------------- the core: r
def test_r_is_the_closed_form_and_the_weighted_loss_expectation_is_the_validation_loss():
    """Known frequencies p (training) and π (validation): r_c = π_c / p_c exactly, and
    Σ_c p_c r_c ℓ_c = Σ_c π_c ℓ_c for any per-class losses (the label-shift identity);
    the mean factor over the training rows is 1."""
    train = torch.tensor([500.0, 300.0, 150.0, 40.0, 10.0])
    val = torch.tensor([10.0, 10.0, 20.0, 30.0, 30.0])
    found = LabelShift(shrink=False).ratios(train, val)
    p, pi = train / train.sum(), val / val.sum()
    torch.testing.assert_close(found.ratios, (pi / p).double())
    losses = torch.tensor([0.3, 1.2, 0.7, 2.5, 0.1], dtype=torch.float64)
    torch.testing.assert_close(
        (p.double() * found.ratios * losses).sum(), (pi.double() * losses).sum()
    )
    torch.testing.assert_close(
        (p.double() * found.ratios).sum(), torch.tensor(1.0, dtype=torch.float64)
    )
    # by sampling: rows drawn from p, weighted by r, estimate the validation loss
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    estimate = (found.ratios[y] * losses[y]).mean()
    assert abs(float(estimate) - float((pi.double() * losses).sum())) < 0.01


def test_the_shrinkage_is_eq_shiftshrink_and_leaves_r_at_one_without_a_shift():
    """s = max(0, 1 − (K − 3)/X²) with Pearson's X²; validation counts proportional to the
    training's give X² = 0 and r ≡ 1 exactly; a small shift within the noise is shrunk to
    nothing; a large one is kept nearly whole; with K ≤ 3 classes nothing is shrunk."""
    train = torch.full((10,), 600.0)
    same = LabelShift().ratios(train, torch.full((10,), 30.0))
    assert same.identity and same.shrinkage == 0.0 and same.statistic == 0.0
    noisy = torch.tensor([33.0, 27, 30, 31, 29, 28, 32, 30, 30, 30])  # X² = 0.93 < 7
    assert LabelShift().ratios(train, noisy).identity
    imbalanced = train.clone()
    imbalanced[5:] = 60.0
    found = LabelShift().ratios(imbalanced, torch.full((10,), 30.0))
    p = imbalanced.double() / imbalanced.sum()
    x2 = float(((300 * 0.1 - 300 * p) ** 2 / (300 * p)).sum())
    assert found.statistic == pytest.approx(x2)
    assert found.shrinkage == pytest.approx(1 - 7 / x2)
    target = p + found.shrinkage * (0.1 - p)
    torch.testing.assert_close(found.ratios, target / p)
    assert 9.0 < float(found.ratios[9] / found.ratios[0]) < 10.0  # the raw ratio is 10
    three = LabelShift().ratios(torch.tensor([80.0, 80, 80]), torch.tensor([22.0, 19, 19]))
    assert three.shrinkage == 1.0 and not three.identity


def test_classes_missing_from_one_set_are_named_and_handled():
    """A class with training rows and no validation example gets r = 1 − s (0 unshrunk); a
    class in the validation set only has no rows: its share is left out, r renormalised."""
    found = LabelShift(shrink=False).ratios(
        torch.tensor([100.0, 100, 100, 0]), torch.tensor([10.0, 10, 0, 10])
    )
    assert found.missing() == ([2], [3])
    assert float(found.ratios[2]) == 0.0
    torch.testing.assert_close(found.ratios[:2], torch.tensor([1.5, 1.5], dtype=torch.float64))
    assert float(found.ratios[3]) == 1.0  # no rows: any value, kept neutral
    shrunk = LabelShift().ratios(torch.tensor([100.0] * 6), torch.tensor([10.0] * 5 + [0.0]))
    assert float(shrunk.ratios[5]) == pytest.approx(1 - shrunk.shrinkage)
    with pytest.raises(ConfigurationError, match="validation set holds no labelled"):
        LabelShift().ratios(torch.tensor([1.0, 2.0]), torch.zeros(2))
    with pytest.raises(ConfigurationError, match="shrink"):
        LabelShift(shrink=1)  # type: ignore[arg-type]


def test_the_prior_multiplies_the_weights_the_loss_reads_not_the_learned_values():
    """``use_prior``: ``weights`` / ``weighted_mean`` read r_i ω_i (and its gradient in the
    logits is r_i ω′_i(ℓ_i − ℓ̂)/Σ rω), ``values`` the learned ω; the training batches' cross
    term differentiates the same r ω; bad factors are refused."""
    w = SampleWeights(5)
    with torch.no_grad():
        w.logits.copy_(torch.tensor([0.3, -1.0, 0.5, 2.0, -0.2]))
    r = torch.tensor([1.0, 4.0, 0.5, 0.25, 2.0])
    w.use_prior(r)
    index, losses = torch.tensor([0, 1, 3, 4]), torch.tensor([0.5, 2.0, 1.0, 3.0])
    omega = torch.sigmoid(w.logits.detach())
    torch.testing.assert_close(w.values(), omega)
    eff = (r * omega)[index]
    expected = (eff * losses).sum() / eff.sum()
    got = w.weighted_mean(losses, index, normalize=True)
    torch.testing.assert_close(got, expected)
    (g,) = torch.autograd.grad(got, w.logits)
    dsig = omega[index] * (1 - omega[index])
    torch.testing.assert_close(g[index], r[index] * dsig * (losses - expected) / eff.sum())
    # the cross term: −α ∂ₓ weighted_loss(u, r ω)
    u = torch.tensor([0.1, -0.4, 0.3, 0.2])
    cross = TrainingCrossTerm(w, torch.optim.SGD([w.logits], lr=0.1), normalize=True)
    ghat = cross.gradient(index, u, alpha=2.0).to_dense()
    x = w.logits.detach().clone().requires_grad_(True)
    ref = weighted_loss(u, r[index] * torch.sigmoid(x[index]), normalize=True)
    (gx,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(ghat, -2.0 * gx)
    with pytest.raises(ConfigurationError, match="non-negative float factors of shape"):
        w.use_prior(torch.ones(4))
    with pytest.raises(ConfigurationError, match="non-negative float factors"):
        w.use_prior(torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0]))
    w.use_prior(None)
    assert w.prior is None


# ---------------------------------------------------------------------- the drop-in
def test_the_drop_in_sets_each_rows_factor_from_the_labels_it_reads():
    """A rare class (9 of 189 rows) and a balanced validation set: the prior is the closed
    form (three classes: no shrinkage), each row's factor is r of its label, readable after
    the fit, and the learned weights stay within class under the class gauge."""
    data = RareClass()
    cb = callback(prior="label_shift")
    fit(cb, 3, model=Classifier(), data=data)
    found = cb.label_shift()
    assert found is not None
    p = torch.bincount(data.y, minlength=3).double() / len(data.y)
    pi = torch.bincount(data.yv, minlength=3).double() / len(data.yv)
    torch.testing.assert_close(found.ratios, pi / p)
    assert float(found.ratios[2]) > 5 * float(found.ratios[0])
    torch.testing.assert_close(cb.weights.prior.double(), found.ratios[data.y])
    assert cb.weights.gauge == "class"
    assert torch.equal(cb.data_weights(), cb.weights.values())  # ω without r


def test_balanced_labels_leave_the_fit_bit_identical():
    """Training and validation class frequencies equal (the noisy toy: 80 rows and 20
    validation examples of each class): r ≡ 1, no factor set, and the learned weights are
    those of a fit without the prior, bit for bit."""
    a, b = callback(), callback(prior="label_shift")
    fit(a, 3)
    fit(b, 3)
    assert b.label_shift() is not None and b.label_shift().identity
    assert b.weights.prior is None
    assert torch.equal(a.data_weights(), b.data_weights())


class SampledRare(RareClass):
    """RareClass drawn by a WeightedRandomSampler that balances the classes."""

    def train_dataloader(self) -> DataLoader:
        counts = torch.bincount(self.y).double()
        sampler = WeightedRandomSampler(
            (1.0 / counts)[self.y], len(self.y), generator=torch.Generator().manual_seed(0)
        )
        data = IndexedDataset(TensorDataset(self.X, self.y))
        return DataLoader(data, batch_size=24, sampler=sampler)


def test_a_class_balancing_sampler_is_not_corrected_twice():
    """Under a WeightedRandomSampler the training distribution is the sampler's draws:
    balanced classes against a balanced validation set give r ≈ 1."""
    cb = callback(prior=LabelShift())
    fit(cb, 2, model=Classifier(), data=SampledRare())
    found = cb.label_shift()
    assert found is not None
    torch.testing.assert_close(found.training, torch.full((3,), 1 / 3, dtype=torch.float64))
    torch.testing.assert_close(found.ratios, torch.ones(3, dtype=torch.float64))


class NoValidationOfTwo(Data):
    """The noisy toy with class 2 absent from the validation set."""

    def val_dataloader(self) -> DataLoader:
        keep = self.yv != 2
        return DataLoader(TensorDataset(self.Xv[keep], self.yv[keep]), batch_size=60)


def test_a_class_absent_from_the_validation_set_is_said():
    cb = callback(prior=LabelShift())
    with pytest.warns(UserWarning, match=r"class\(es\) \[2\] have training rows but no validation"):
        fit(cb, 1, data=NoValidationOfTwo())
    assert float(cb.label_shift().ratios[2]) == 0.0  # three classes: no shrinkage
    y = Data().y
    assert float(cb.weights.prior[y == 2].max()) == 0.0  # its rows leave the loss
    torch.testing.assert_close(cb.weights.prior[y != 2], torch.full((160,), 1.5))


def test_refusals():
    with pytest.raises(ConfigurationError, match="correct the class balance twice"):
        callback(per="class", num_classes=3, prior=LabelShift())
    with pytest.raises(ConfigurationError, match="prior must be None"):
        callback(prior="inverse_frequency")
    assert callback().label_shift() is None
