"""Careless users of the two other entry points, session 53 (second round): a hand-made bilevel
loop over ``SIDHyperOptimizer``, and a ``BilevelModule`` under ``HyperOptimizationCallback``.

Each case failed before its fix (a silent zero hypergradient, a raw crash or a message naming
the wrong cause); see docs/failures.md, "Careless users, the core and BilevelModule (session
53)".
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from hypertorch_sid import SIDConfig, SIDHyperOptimizer
from hypertorch_sid.core.errors import ConfigurationError

D = 5


def _data() -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(200, D, generator=g), torch.randn(200, generator=g)
    return [(X[i : i + 20], y[i : i + 20]) for i in range(0, 160, 20)], (X[160:], y[160:])


def _fit(w: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    X, y = batch
    return 0.5 * ((X @ w - y) ** 2).mean()


def _ridge(w0: torch.Tensor | None = None, log_lam0: torch.Tensor | None = None, inner=None):
    """The README's ridge: ℓ̂ = fit + ½ Σ exp(log λ) w², E = fit on validation data."""
    w = torch.zeros(D, requires_grad=True) if w0 is None else w0
    log_lam = torch.zeros(D, requires_grad=True) if log_lam0 is None else log_lam0

    def inner_loss(batch):
        return _fit(w, batch) + 0.5 * (log_lam.exp() * w**2).sum()

    hopt = SIDHyperOptimizer(
        hyperparameters=[log_lam],
        inner_parameters=[w],
        inner_loss=inner(w, log_lam) if inner else inner_loss,
        outer_loss=lambda batch: _fit(w, batch),
        outer_optimizer=torch.optim.Adam([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=10, adjoint_steps=10),
    )
    return hopt, w, log_lam


# ---------------------------------------------------------------- λ that cannot move w(λ)
@pytest.mark.parametrize(
    "penalty",
    [
        # a penalty computed from the weights' values: ∂ℓ̂/∂λ = ½w² is cut from w
        lambda w, log_lam: 0.5 * (log_lam.exp() * w.detach() ** 2).sum(),
        lambda w, log_lam: 0.5 * (log_lam.exp() * w.data**2).sum(),
        # λ added to the loss on its own, beside a fixed decay
        lambda w, log_lam: 0.5 * (w**2).sum() + log_lam.exp().sum(),
    ],
    ids=["w.detach()", "w.data", "additive"],
)
def test_a_hyperparameter_that_cannot_move_the_trained_weights_is_refused(penalty):
    """Before: ℓ̂ read λ, so the check passed; ∂²ℓ̂/∂w∂λ = 0 and the hypergradient was exactly
    0 at every step: λ never moved, silently."""
    batches, val = _data()
    hopt, w, log_lam = _ridge(inner=lambda w, lam: lambda b: _fit(w, b) + penalty(w, lam))
    with pytest.raises(ConfigurationError, match=r"positions \[0\].*only in terms without w"):
        hopt.hypergradient(batches, val)


def test_such_a_hyperparameter_read_by_the_outer_loss_keeps_its_direct_gradient():
    """Legitimate: λ that does not move w but is read by E gets ∇₂E (here 2λ = 0.6)."""
    batches, val = _data()
    w = torch.zeros(D, requires_grad=True)
    lam = torch.full((D,), 0.3, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        lambda b: _fit(w, b) + 0.5 * (w**2).sum() + lam.sum(),
        lambda b: _fit(w, b) + (lam**2).sum(),
        config=SIDConfig(inner_steps=10, adjoint_steps=10),
    )
    (g,) = hopt.hypergradient(batches, val)
    assert torch.allclose(g, torch.full((D,), 0.6))


def test_a_bilevel_module_whose_penalty_reads_detached_weights_is_refused():
    """Before: the fit ran to its end with log λ where it started (−2.3026 in every entry)."""
    pytest.importorskip("pytorch_lightning")
    from lightning_problems import Ridge, loaders, ridge_data, trainer

    from hypertorch_sid import HyperOptimizationCallback

    class Detached(Ridge):
        def inner_loss(self, batch):
            w = self.lin.weight.detach()[0]
            return self._fit(batch) + 0.5 * (self.log_lam.exp() * w**2).sum()

    train, val = loaders(ridge_data(), 20)
    callback = HyperOptimizationCallback(every_n_steps=2, adjoint_steps=5)
    with pytest.raises(ConfigurationError, match=r"only in terms without w.*w\.detach\(\)"):
        trainer([callback], max_epochs=2).fit(Detached(), train, val)


# ---------------------------------------------------------------- non-finite λ or w
@pytest.mark.parametrize("bad", [-math.inf, math.nan])
def test_a_non_finite_starting_lambda_is_refused_at_construction(bad):
    """Before: "the inner solve w_t diverged at step 0 … The fixed-point map is probably not a
    contraction: lower the inner step size", at the first hypergradient (log λ₀ = log 0)."""
    log_lam = torch.full((D,), bad, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"hyperparameters.*NaN or Inf.*log 0"):
        _ridge(log_lam0=log_lam)


def test_non_finite_starting_weights_are_refused_at_construction():
    w = torch.full((D,), math.nan, requires_grad=True)
    with pytest.raises(ConfigurationError, match=r"inner_parameters.*NaN or Inf.*re-initialise"):
        _ridge(w0=w)


def test_a_lambda_written_non_finite_between_steps_is_named():
    batches, val = _data()
    hopt, _, log_lam = _ridge()
    hopt.step(batches, val)
    with torch.no_grad():
        log_lam[2] = math.nan
    with pytest.raises(ConfigurationError, match=r"hyperparameters.*1 of 5 entries"):
        hopt.hypergradient(batches, val)


# ---------------------------------------------------------------- apply() given the wrong thing
@pytest.mark.parametrize(
    "given",
    [lambda g: [], lambda g: g[0], lambda g: [g[0][:3]], lambda g: [g[0], g[0]]],
    ids=["empty list", "bare tensor", "wrong shape", "one too many"],
)
def test_apply_refuses_what_is_not_one_gradient_per_hyperparameter(given):
    """Before: an empty list stepped nothing and counted a hyper step, silently; a bare tensor
    or a wrong shape was torch's "attempting to assign a gradient of size"; one too many was
    zipped away."""
    batches, val = _data()
    hopt, _, log_lam = _ridge()
    g = hopt.hypergradient(batches, val)
    before = log_lam.detach().clone()
    with pytest.raises(ConfigurationError, match=r"apply\(\)"):
        hopt.apply(given(g))
    assert torch.equal(log_lam.detach(), before) and hopt.hyper_step == 0


# ---------------------------------------------------------------- called under no_grad
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_hyper_step_called_under_no_grad_gives_the_same_hypergradient(mode):
    """Before: "inner_loss does not depend on the inner parameters" (a wrong cause) at the
    first call, a raw autograd error at a later one. Now autograd is on inside, as in
    torch.optim's closures: the same hypergradient, bit for bit."""
    batches, val = _data()
    plain, _, _ = _ridge()
    expected = plain.step(batches, val)
    hopt, _, _ = _ridge()
    with mode():
        got = hopt.step(batches, val)
    assert torch.equal(got[0], expected[0])


# ---------------------------------------------------------------- a dataset as val_batch
def test_a_dataset_given_as_the_validation_batch_is_named():
    """Before: the dataset object went to outer_loss: "too many values to unpack" from the
    user's ``X, y = batch``."""
    batches, (Xv, yv) = _data()
    hopt, _, _ = _ridge()
    with pytest.raises(ConfigurationError, match=r"val_batch is a TensorDataset.*DataLoader"):
        hopt.hypergradient(batches, TensorDataset(Xv, yv))


# ---------------------------------------------------------------- a projection not in place
def _projected(project):
    """λ learned directly (a decay ≥ 0) with E pulling it down (E reads λ: ∇₂E = 1)."""
    from hypertorch_sid.core.config import FeasibleSet

    batches, val = _data()
    w = torch.zeros(D, requires_grad=True)
    lam = torch.full((D,), 0.01, requires_grad=True)
    hopt = SIDHyperOptimizer(
        [lam],
        [w],
        lambda b: _fit(w, b) + 0.5 * (lam * w**2).sum(),
        lambda b: _fit(w, b) + lam.sum(),
        torch.optim.SGD([lam], lr=0.01),
        config=SIDConfig(
            inner_steps=10, adjoint_steps=10, feasible_set=FeasibleSet(project=project)
        ),
    )
    return hopt, lam, batches, val


def _rebinds(hs):
    hs[0] = hs[0].clamp(min=0)


@pytest.mark.parametrize(
    "project, match",
    [
        (lambda hs: hs[0].clamp(min=0), "returned new values"),
        (lambda hs: [h.clamp(min=0) for h in hs], "returned new values"),
        (_rebinds, "replaced items of the list"),
    ],
    ids=["clamp", "list of clamps", "rebinds"],
)
def test_a_projection_that_does_not_write_lambda_in_place_is_refused(project, match):
    """Before: ``hs[0].clamp(min=0)`` returned the projected values and λ stayed where the step
    put it: −0.04 after five steps, a negative decay, silently; ``hs[0] = ...`` swapped a
    tensor without grad into the optimizer's list: "no longer require grad", a wrong cause."""
    with pytest.raises(ConfigurationError, match=match + r".*clamp_"):
        hopt, lam, batches, val = _projected(project)
        for _ in range(5):
            hopt.step(batches, val)
        raise AssertionError(f"λ = {lam.detach()}")


def test_an_in_place_projection_keeps_lambda_in_the_set():
    hopt, lam, batches, val = _projected(lambda hs: hs[0].clamp_(min=0))
    for _ in range(5):
        hopt.step(batches, val)
    assert bool((lam.detach() >= 0).all())


# ---------------------------------------------------------------- λ computed once, outside
def test_a_lambda_computed_once_outside_the_loss_is_named():
    """Before: autograd's bare "Trying to backward through the graph a second time … Specify
    retain_graph=True" (whose advice would have hidden a stale λ: the loss would never see
    λ's updates)."""
    batches, val = _data()
    w = torch.zeros(D, requires_grad=True)
    log_lam = torch.zeros(D, requires_grad=True)
    lam = log_lam.exp()  # once, before the loop
    hopt = SIDHyperOptimizer(
        [log_lam],
        [w],
        lambda b: _fit(w, b) + 0.5 * (lam * w**2).sum(),
        lambda b: _fit(w, b),
        torch.optim.Adam([log_lam], lr=0.1),
        config=SIDConfig(inner_steps=10, adjoint_steps=10),
    )
    with pytest.raises(ConfigurationError, match=r"outside the loss.*inside inner_loss"):
        for _ in range(3):  # the first may run: only its cross term frees λ's part of the graph
            hopt.step(batches, val)


def test_the_cut_check_gives_no_verdict_through_an_op_without_a_double_backward():
    """The check that λ can move w differentiates ∂ℓ̂/∂λ once more. Through an op without a
    double backward (a user's custom kernel; such models run the data weights with
    ``directional="forward_difference"``) it cannot: no verdict and no refusal, not autograd's
    raw error (session 53, the lead's review)."""
    from hypertorch_sid.core.validation import check_dependencies

    class CubeGrad(torch.autograd.Function):  # 3x²·g, itself not differentiable
        @staticmethod
        def forward(ctx, x, g):
            return 3 * x**2 * g

        @staticmethod
        def backward(ctx, _):
            raise RuntimeError("CubeGrad has no double backward")

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return CubeGrad.apply(x, g)

    w, lam = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    assert check_dependencies(lambda b: Cube.apply(w * lam).sum(), None, [w], [lam]) == []
    # a λ whose ∂ℓ̂/∂λ does not reach w is still found where the graph can be read
    assert check_dependencies(lambda b: (w**2).sum() + lam.sum(), None, [w], [lam]) == [0]
