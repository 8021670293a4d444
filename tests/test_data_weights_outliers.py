"""A squared error with outlying regression targets under the drop-in's defaults (session 44,
docs/data_weights.md "Other tasks"). Under the minibatch's centre (``gauge="batch"``, the exact
derivative of Σ ωᵢℓᵢ / Σ ωᵢ) row i moves by ω′ᵢ(uᵢ − û), uᵢ = ⟨∇ℓᵢ, v⟩: with a squared error the
outliers' uᵢ carry û (measured: 30 % of the rows, 59 % of Σ|ωᵢuᵢ|; û's spread across minibatches
20 against a clean row's |uᵢ| of 13), so every row of a minibatch swings with its outliers and
nothing was learned (0 flagged). ``gauge="mean_logit"`` moves each row by its own ω′ᵢuᵢ and holds
the mean logit instead; ``gauge="auto"`` (default) picks it for real-valued targets and keeps
``"batch"`` for classification, whose path is unchanged bit for bit."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from test_data_weights_recipes import blobs
from test_data_weights_tasks import BAD, Task, fit, flagged_quietly, mlp, regression, separation
from test_optimizer_decay_modelled import fit_weighted_ridge
from torch import Tensor

from hypertorch_sid import ConfigurationError, LearnedDataWeights
from hypertorch_sid.core.directional import TrainingCrossTerm
from hypertorch_sid.core.sample_weights import SampleWeights
from hypertorch_sid.core.weighted_loss import weighted_loss


@pytest.mark.parametrize(
    "outputs, cross_term", [(1, "training"), (3, "training"), (1, "hyper_step")]
)
def test_squared_error_with_outlying_targets_flags_them_under_the_defaults(outputs, cross_term):
    """Before (gauge="batch"): outliers 0.37 / clean 0.36 (D = 1), 0.32 / 0.37 (D = 3), 0.38 /
    0.30 (D = 1, the hyper steps' cross term only), nothing flagged, with a warning. Measured
    now: 0.05 / 0.83, 75 flagged of which 69 of the 72 outliers (D = 1); 0.07 / 0.83, 88
    flagged, 70 outliers (D = 3); 0.06 / 0.82, 81 flagged, 69 outliers (hyper steps only)."""

    def step(z: Tensor, y: Tensor) -> Tensor:
        out = F.mse_loss(z, y, reduction="none")
        return out[:, 0] if outputs == 1 else out

    data = regression(outputs)
    cb = fit(Task(mlp(4, outputs), step), data, objective="mean_loss", cross_term=cross_term)
    assert cb.problem.weights is not None and cb.problem.weights.gauge == "mean_logit"
    outliers, clean = separation(cb)
    assert outliers < 0.15 and clean > 0.7, (outliers, clean)
    flagged = flagged_quietly(cb)
    found = int((flagged < BAD).sum())
    assert found >= 0.9 * BAD and found >= 0.75 * len(flagged), (found, len(flagged))


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def test_a_classification_holds_each_class_bit_for_bit():
    """Integer labels: "auto" is "class" (session 51; "batch" before it), and the learned
    weights equal, bit for bit, those of a fit that asks for "class"."""
    data = blobs()
    runs = {}
    for gauge in ("auto", "class"):
        cb = fit(Classifier(), data, gauge=gauge)
        assert cb.problem.weights is not None and cb.problem.weights.gauge == "class"
        runs[gauge] = cb.data_weights()
    assert torch.equal(runs["auto"], runs["class"])
    assert float(runs["auto"][:72].mean()) < float(runs["auto"][72:].mean())  # it learned


def _old_cross_term(x: Tensor, u: Tensor, alpha: float) -> Tensor:
    """The training cross term as written before the gauge (session 43's code)."""
    x = x.detach().clone().requires_grad_(True)
    omega = torch.sigmoid(x)
    inner = (omega * u).sum() / omega.sum().clamp_min(1e-12)
    (g,) = torch.autograd.grad(inner, [x])
    return -alpha * g


def test_the_cross_term_under_each_gauge():
    """ "batch": the old code's −α ω′ᵢ(uᵢ − û)/Σ ω exactly; "mean_logit": −α ω′ᵢuᵢ/Σ ω, and
    after the outer step the mean logit is back at x₀ (a common shift of every row)."""
    gen = torch.Generator().manual_seed(0)
    n, index = 12, torch.tensor([1, 4, 5, 9])
    x = torch.randn(n, generator=gen)
    u = 10 * torch.randn(4, generator=gen)
    for gauge in ("batch", "mean_logit"):
        w = SampleWeights(n, gauge=gauge)
        with torch.no_grad():
            w.logits.copy_(x)
        opt = torch.optim.SGD([w.logits], lr=0.5)
        cross = TrainingCrossTerm(w, opt, normalize=True)
        g = cross.gradient(index, u, alpha=0.3).to_dense()[index]
        omega = torch.sigmoid(x[index])
        if gauge == "batch":
            assert torch.equal(g, _old_cross_term(x[index], u, 0.3))
        else:
            own = -0.3 * omega * (1 - omega) * u / omega.sum()
            torch.testing.assert_close(g, own)
        cross.step(index, u, 0.3)
        moved = w.logits.detach()
        if gauge == "mean_logit":
            assert abs(float(moved.mean())) < 1e-6  # x₀ = 0 (ω₀ = ½)
            shift = moved - x  # the rows read moved by −lr·g, then every row by one shift
            rest = torch.ones(n, dtype=torch.bool)
            rest[index] = False
            c = shift[rest]
            torch.testing.assert_close(c, c[:1].expand_as(c))
            torch.testing.assert_close(shift[index] - c[0], -0.5 * g)


def test_holding_the_normaliser_keeps_the_loss_and_its_gradient_in_w():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, requires_grad=True)
    feats = torch.randn(5, 3, generator=gen)
    omega = torch.rand(5, generator=gen)
    out = []
    for held in (False, True):
        loss = weighted_loss((feats @ w) ** 2, omega, normalize=True, hold_normaliser=held)
        out.append((loss.detach(), torch.autograd.grad(loss, [w])[0]))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_a_gauge_the_weights_cannot_hold_is_refused():
    with pytest.raises(ConfigurationError, match="not a sigmoid.*gauge='batch'"):
        SampleWeights(4, "softmax", gauge="mean_logit")
    with pytest.raises(ConfigurationError, match="not a sigmoid"):
        LearnedDataWeights(parameterization="softmax", gauge="mean_logit")
    with pytest.raises(ConfigurationError, match="normalize=False the loss sees it"):
        LearnedDataWeights(normalize=False, gauge="mean_logit")
    with pytest.raises(ConfigurationError, match="gauge must be 'auto', 'batch' or 'mean_logit'"):
        LearnedDataWeights(gauge="global")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LearnedDataWeights(parameterization="softmax")  # "auto" stays "batch" there


def test_the_mean_logit_gauge_is_the_exact_hypergradient_up_to_a_common_shift():
    """The weighted least-squares oracle of tests/test_optimizer_decay_modelled.py (the
    hypergradient of E(w*(x)) by autograd through the closed form) under the regression's
    default gauge: at x = 0 every ω′ᵢ is ¼, so the two gauges differ by one constant over the
    rows, −α ω′ û / Σ ω (the common shift the mean-logit projection then removes)."""
    cb, _, _, exact = fit_weighted_ridge()
    n = len(exact)
    assert cb.problem.weights is not None and cb.problem.weights.gauge == "mean_logit"
    shift = cb.last_hypergradient[0] - exact
    scale = float(exact.abs().max())
    torch.testing.assert_close(shift, shift.mean().expand(n), rtol=0, atol=1e-7 * scale)
    assert abs(float(shift.mean())) > 1e-3 * scale  # the centre is really left out
