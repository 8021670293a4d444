"""Per-sample data weights (core): oracles, the indexed dataset, the lazy outer step, bad input.

Oracles: a weighted ridge problem whose per-sample hypergradient is known in closed form
(float64, full batch and the expectation over a partition into minibatches, and an average of
stochastic hypergradients), and central finite differences on a small logistic model.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from problems import split_settings
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hypertorch_sid import (
    Batches,
    ConfigurationError,
    DivergenceError,
    SIDConfig,
    SIDHyperOptimizer,
)
from hypertorch_sid.core.directional import (
    ForwardDifference,
    ForwardMode,
    TrainingCrossTerm,
    directional_losses,
)
from hypertorch_sid.core.flag_rules import BelowWeight, TwoComponentSplit
from hypertorch_sid.core.indexing import Indexed, IndexedDataset, split_indexed
from hypertorch_sid.core.lazy_adam import LazyAdam
from hypertorch_sid.core.objectives import (
    AdaptiveMarginError,
    ClassRelativeError,
    ExpectedError,
    KeptEvidenceError,
    LabelledLosses,
    MarginError,
    MeanLoss,
    as_validation_objective,
)
from hypertorch_sid.core.parameterizations import SharedLossWeights
from hypertorch_sid.core.rows import RowSnapshot
from hypertorch_sid.core.sample_weights import SampleWeights, class_weights

RHO = 0.1  # the ridge's L2 coefficient: ℓ̂ = mean ωᵢ ½(aᵢᵀw − bᵢ)² + ½ρ‖w‖²


class WeightedRidge:
    """ℓ̂(w, x) = (1/n) Σ ωᵢ ½(aᵢᵀw − bᵢ)² + ½ρ‖w‖², E = ½ mean (A_v w − b_v)², ω = T(x).

    With H = Aᵀ diag(ω) A / n + ρI, w* = H⁻¹ Aᵀ diag(ω) b / n, rᵢ = aᵢᵀw* − bᵢ:

        ∂f/∂xᵢ = −(1/n) T'(xᵢ) rᵢ aᵢᵀ H⁻¹ ∇E(w*)        (sigmoid: T' = ω(1 − ω))
    """

    def __init__(
        self, n: int = 48, d: int = 5, seed: int = 0, parameterization="sigmoid", sparse_grad=False
    ):
        gen = torch.Generator().manual_seed(seed)
        self.A = torch.randn(n, d, generator=gen, dtype=torch.float64)
        self.b = self.A @ torch.randn(d, generator=gen, dtype=torch.float64)
        self.b += 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
        self.b[: n // 4] += 3.0  # corrupted targets
        self.Av = torch.randn(30, d, generator=gen, dtype=torch.float64)
        clean_fit = torch.linalg.lstsq(self.A[n // 4 :], self.b[n // 4 :]).solution
        self.bv = self.Av @ clean_fit  # validation: the clean rows' model
        self.weights = SampleWeights(
            n, parameterization, dtype=torch.float64, sparse_grad=sparse_grad
        )
        with torch.no_grad():
            self.weights.logits.copy_(0.5 * torch.randn(n, generator=gen, dtype=torch.float64))
        self.weights.projection()
        self.w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
        self.n = n

    def inner_loss(self, batch):
        index, (A, b) = split_indexed(batch)
        losses = 0.5 * (A @ self.w - b) ** 2
        return self.weights.weighted_mean(losses, index) + 0.5 * RHO * (self.w**2).sum()

    def outer_loss(self, batch):
        A, b = batch
        return 0.5 * ((A @ self.w - b) ** 2).mean()

    def full(self):
        return Indexed(torch.arange(self.n), (self.A, self.b))

    def batches(self, size: int, order=None):
        order = torch.arange(self.n) if order is None else order
        for i in range(0, self.n, size):
            idx = order[i : i + size]
            yield Indexed(idx, (self.A[idx], self.b[idx]))

    def hessian(self):
        om = self.weights.values()
        return self.A.T @ (om[:, None] * self.A) / self.n + RHO * torch.eye(self.A.shape[1])

    def w_star(self):
        om = self.weights.values()
        return torch.linalg.solve(self.hessian(), self.A.T @ (om * self.b) / self.n)

    def exact(self):
        x = self.weights.logits.detach()
        om = self.weights.values()
        w = self.w_star()
        grad_E = self.Av.T @ (self.Av @ w - self.bv) / self.Av.shape[0]
        u = torch.linalg.solve(self.hessian(), grad_E)
        r = self.A @ w - self.b
        if self.weights.parameterization.__class__.__name__ == "SigmoidWeights":
            dT = torch.sigmoid(x) * (1 - torch.sigmoid(x))
        elif self.weights.parameterization.__class__.__name__ == "NaturalSigmoidWeights":
            dT = torch.ones_like(x)  # eq. natsig: the gradient in ω, ∂f/∂ωᵢ
        else:  # softmax with log Z held fixed: T' = T
            dT = om
        return -(dT * r * (self.A @ u)) / self.n

    def sid(self, **kwargs):
        kwargs.setdefault("full_train_batch", self.full())
        outer_optimizer = kwargs.pop("outer_optimizer", None)
        kwargs, settings = split_settings(kwargs)
        return SIDHyperOptimizer(
            self.weights.hyperparameters,
            [self.w],
            self.inner_loss,
            self.outer_loss,
            outer_optimizer,
            **kwargs,
            config=SIDConfig(**settings),
        )


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("parameterization", "sparse_grad"),
    [
        ("sigmoid", False),
        ("softmax", False),
        ("sigmoid", True),
        ("natural_sigmoid", False),
        ("natural_sigmoid", True),
    ],
)
def test_weighted_ridge_full_batch_matches_closed_form(parameterization, sparse_grad):
    p = WeightedRidge(parameterization=parameterization, sparse_grad=sparse_grad)
    hopt = p.sid(
        inner_steps=600, adjoint_steps=600, step_size="constant", eta=1.0,
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )  # fmt: skip
    g = hopt.hypergradient([p.full()], (p.Av, p.bv))[0]
    assert g.is_sparse == sparse_grad
    g = g.to_dense()
    assert g.dtype == torch.float64 and g.shape == (p.n,)
    assert rel(g, p.exact()) < 1e-7


def test_weighted_ridge_minibatch_cross_term_is_unbiased_over_a_partition():
    """∂₂Φ̂ᵀv on a minibatch touches only its rows, scaled 1/|ζ|; averaged over the n/b batches
    of one partition (every row read once) it is the full-batch term exactly."""
    p = WeightedRidge()
    with torch.no_grad():
        p.w.copy_(p.w_star())
    order = torch.randperm(p.n, generator=torch.Generator().manual_seed(1))
    hopt = p.sid(
        inner_steps=0, adjoint_steps=600, step_size="constant", eta=1.0,
        batches=Batches(adjoint="full", d2=p.n // 8),
    )  # fmt: skip
    g = hopt.hypergradient(list(p.batches(8, order)) * 3, (p.Av, p.bv))[0]
    assert rel(g, p.exact()) < 1e-7


def test_weighted_ridge_minibatch_term_touches_only_its_rows():
    p = WeightedRidge()
    batch = next(p.batches(6, torch.arange(p.n).flip(0)))
    hopt = p.sid(inner_steps=0, adjoint_steps=50, alpha=0.2, batches=Batches(adjoint="full"))
    g = hopt.hypergradient([batch] * 3, (p.Av, p.bv))[0]
    outside = torch.ones(p.n, dtype=torch.bool)
    outside[batch.index] = False
    assert bool((g[outside] == 0).all()) and bool((g[batch.index] != 0).all())


@pytest.mark.parametrize("outer", ["sgd", "lazy_adam"])
def test_sparse_grad_hyper_step_reads_and_moves_only_the_batch_rows(outer):
    """sparse_grad=True: the hypergradient is a sparse tensor holding the minibatch's rows (the
    same values as the dense one), the outer step moves those rows and no other, and the
    snapshot kept to restore λ holds those rows only (counts, not timings)."""
    dense, sparse = WeightedRidge(), WeightedRidge(sparse_grad=True)
    batch = next(dense.batches(6, torch.arange(dense.n).flip(0)))
    settings = dict(inner_steps=0, adjoint_steps=50, alpha=0.2, batches=Batches(adjoint="full"))
    g_dense = dense.sid(**settings).hypergradient([batch] * 3, (dense.Av, dense.bv))[0]
    make = {"sgd": lambda hs: torch.optim.SGD(hs, lr=1.0), "lazy_adam": lambda hs: LazyAdam(hs)}
    hs = sparse.weights.hyperparameters
    hopt = sparse.sid(outer_optimizer=make[outer](hs), **settings)
    g = hopt.hypergradient([batch] * 3, (sparse.Av, sparse.bv))[0]
    assert g.is_sparse and g.coalesce().indices()[0].sort().values.tolist() == sorted(
        batch.index.tolist()
    )
    assert torch.allclose(g.to_dense(), g_dense, rtol=1e-12, atol=1e-15)
    snapshot = RowSnapshot(hs[0], g)
    assert snapshot.values.numel() == batch.index.numel()
    before = hs[0].detach().clone()
    hopt.apply([g])
    moved = torch.nonzero(hs[0].detach() != before).flatten()
    assert sorted(moved.tolist()) == sorted(batch.index.tolist())
    assert hs[0].grad is None


def test_sparse_grad_non_finite_hypergradient_leaves_the_weights_unchanged():
    p = WeightedRidge(sparse_grad=True)
    hs = p.weights.hyperparameters
    hopt = p.sid(outer_optimizer=LazyAdam(hs), alpha=0.2)
    before = hs[0].detach().clone()
    bad = torch.sparse_coo_tensor(
        torch.tensor([[1, 4]]), torch.tensor([0.5, float("nan")], dtype=torch.float64), (p.n,)
    )
    with pytest.raises(DivergenceError):
        hopt.apply([bad])
    assert torch.equal(hs[0].detach(), before) and not hopt.outer_optimizer.state


def test_weighted_ridge_stochastic_average_approaches_closed_form():
    """Fully stochastic SID (minibatch inner, adjoint and cross term), many draws averaged."""
    p = WeightedRidge()
    x0 = p.weights.logits.detach().clone()
    w_star = p.w_star()
    total = torch.zeros(p.n, dtype=torch.float64)
    draws, single = 40, []
    gen = torch.Generator().manual_seed(3)
    for _ in range(draws):
        with torch.no_grad():
            p.w.copy_(w_star)
        hopt = p.sid(inner_steps=50, adjoint_steps=150, step_size="decreasing", eta=1.0)
        stream = (b for _ in range(1000) for b in p.batches(8, torch.randperm(p.n, generator=gen)))
        g = hopt.hypergradient(stream, (p.Av, p.bv))[0]
        single.append(rel(g, p.exact()))
        total += g
        assert torch.equal(p.weights.logits.detach(), x0)
    error = rel(total / draws, p.exact())
    assert error < 0.3 and error < 0.3 * sum(single) / draws  # the noise averages out


def test_finite_differences_on_a_small_logistic_model():
    """f(x) = E(w*(x)) with w* solved to convergence: central differences on a few rows."""
    gen = torch.Generator().manual_seed(0)
    n, d = 40, 3
    X = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = (X[:, 0] + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64) > 0).double()
    y[:8] = 1 - y[:8]
    Xv = torch.randn(25, d, generator=gen, dtype=torch.float64)
    yv = (Xv[:, 0] > 0).double()
    weights = SampleWeights(n, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)

    def inner(batch):
        index, (A, t) = split_indexed(batch)
        losses = F.binary_cross_entropy_with_logits(A @ w, t, reduction="none")
        return weights.weighted_mean(losses, index) + 0.05 * (w**2).sum()

    def outer(batch):
        A, t = batch
        return F.binary_cross_entropy_with_logits(A @ w, t)

    full = Indexed(torch.arange(n), (X, y))

    def f_at(x):
        with torch.no_grad():
            weights.logits.copy_(x)
            w.zero_()
        for _ in range(600):
            (g,) = torch.autograd.grad(inner(full), w)
            with torch.no_grad():
                w.sub_(2.0 * g)
        with torch.no_grad():
            return float(outer((Xv, yv)))

    x0 = 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
    f_at(x0)
    hopt = SIDHyperOptimizer(
        weights.hyperparameters,
        [w],
        inner,
        outer,
        None,
        full_train_batch=full,
        config=SIDConfig(
            inner_steps=300,
            adjoint_steps=300,
            step_size="constant",
            eta=1.0,
            batches=Batches(inner="full", adjoint="full", d2="full"),
        ),
    )
    g = hopt.hypergradient([full], (Xv, yv))[0]
    h = 1e-5
    for i in (0, 3, 17, 39):
        e = torch.zeros(n, dtype=torch.float64)
        e[i] = h
        fd = (f_at(x0 + e) - f_at(x0 - e)) / (2 * h)
        assert abs(float(g[i]) - fd) < 1e-6 * max(1.0, abs(fd)) + 1e-9


# ---------------------------------------------------------------------- the indexed dataset
def _data(n=40):
    return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None] * 10, torch.arange(n) % 3)


def test_indexed_dataset_keeps_the_index_under_shuffling_and_workers():
    base = _data()
    loader = DataLoader(IndexedDataset(base), batch_size=7, shuffle=True, num_workers=2)
    seen = []
    for batch in loader:
        index, (x, y) = split_indexed(batch)
        assert torch.equal(x[:, 0], index.float() * 10) and torch.equal(y, index % 3)
        seen += index.tolist()
    assert sorted(seen) == list(range(len(base)))


def test_indexed_dataset_under_a_distributed_sampler():
    base = _data(41)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(IndexedDataset(base), num_replicas=3, rank=rank, seed=5)
        loader = DataLoader(IndexedDataset(base), batch_size=4, sampler=sampler)
        for batch in loader:
            index, (x, _) = split_indexed(batch)
            assert torch.equal(x[:, 0], index.float() * 10)
            seen += index.tolist()
    assert set(seen) == set(range(41))


def test_indexed_dataset_refuses_streams_and_non_datasets():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from range(3)

    with pytest.raises(ConfigurationError, match="IterableDataset.*stable example index"):
        IndexedDataset(Stream())
    with pytest.raises(ConfigurationError, match="map-style"):
        IndexedDataset(object())


def test_unindexed_batch_and_reduced_loss_are_refused_with_the_fix():
    weights = SampleWeights(10)
    with pytest.raises(ConfigurationError, match="IndexedDataset"):
        split_indexed((torch.zeros(3, 2), torch.zeros(3)))
    with pytest.raises(ConfigurationError, match="reduction='none'"):
        weights.weighted_mean(torch.tensor(1.0), torch.arange(3))
    with pytest.raises(ConfigurationError, match="one loss per sample"):
        weights.weighted_mean(torch.ones(2), torch.arange(3))
    with pytest.raises(ConfigurationError, match="out of range"):
        weights.weights(torch.tensor([3, 10]))
    with pytest.raises(ConfigurationError, match="integers"):
        weights.weights(torch.tensor([0.0]))
    with pytest.raises(ConfigurationError, match="sigmoid"):
        SampleWeights(10, "sigmoid", initial=1.0)


def test_softmax_weights_average_one_and_class_weights_index_by_label():
    w = SampleWeights(5, "softmax")
    assert torch.allclose(w.values(), torch.ones(5))
    with torch.no_grad():
        w.logits[0] = 2.0
    w.projection()
    assert abs(float(w.values().mean()) - 1.0) < 1e-6
    c = class_weights(3)
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.allclose(c.weighted_mean(losses, torch.tensor([0, 1, 2, 2])), losses.mean() / 2)


def test_lazy_adam_moves_only_the_rows_read_and_matches_adam_on_them():
    w = SampleWeights(6)
    ref = torch.zeros(2, requires_grad=True)
    lazy, adam = LazyAdam(w.hyperparameters, lr=0.1), torch.optim.Adam([ref], lr=0.1)
    for step in range(3):
        grad = torch.zeros(6)
        grad[[1, 4]] = torch.tensor([0.5, -2.0]) * (step + 1)
        w.logits.grad = grad
        ref.grad = grad[[1, 4]].clone()
        lazy.step()
        adam.step()
    x = w.logits.detach()
    assert torch.allclose(x[[1, 4]], ref.detach(), atol=1e-6)
    assert bool((x[[0, 2, 3, 5]] == 0).all())
    state = lazy.state_dict()
    again = LazyAdam([torch.zeros(6, requires_grad=True)], lr=0.1)
    again.load_state_dict(state)
    assert torch.equal(again.state_dict()["state"][0]["visits"], state["state"][0]["visits"])


def test_lazy_adam_takes_sparse_gradients_and_a_shared_scale():
    w = SampleWeights(5)
    lazy = LazyAdam(w.hyperparameters, lr=0.1, row_scale=False)
    w.logits.grad = torch.sparse_coo_tensor(
        torch.tensor([[1, 3, 3]]), torch.tensor([1.0, 1.0, 1.0]), (5,)
    )
    lazy.step()
    x = w.logits.detach()
    # one scale for both rows: row 3 (gradient 2, duplicates summed) moves twice as far as row 1
    assert bool((x[[0, 2, 4]] == 0).all()) and float(x[1]) < 0
    assert torch.allclose(x[3], 2 * x[1])


def test_lazy_adam_batch_scale_divides_by_the_rms_of_the_rows_of_this_step():
    """row_scale="batch" (eq. batchscale): x_i -= lr·g_i / RMS_j∈read(g_j), with β₁ = 0 (the
    drop-in's): rows read together keep the ratios of their gradients, each step has RMS lr,
    and a row read alone moves by exactly lr whatever its gradient's size."""
    w = SampleWeights(5)
    lazy = LazyAdam(w.hyperparameters, lr=0.5, betas=(0.0, 0.999), row_scale="batch")
    w.logits.grad = torch.tensor([3.0, -4.0, 0.0, 0.0, 0.0])
    lazy.step()
    rms = (12.5) ** 0.5
    x = w.logits.detach()
    assert torch.allclose(x[:2], torch.tensor([-0.5 * 3 / rms, 0.5 * 4 / rms]), atol=1e-6)
    assert bool((x[2:] == 0).all())
    assert abs(float(x[:2].pow(2).mean().sqrt()) - 0.5) < 1e-6
    w.logits.grad = torch.sparse_coo_tensor(torch.tensor([[4]]), torch.tensor([1e-3]), (5,))
    lazy.step()
    assert abs(float(w.logits[4]) + 0.5) < 1e-4 and torch.equal(w.logits.detach()[:4], x[:4])
    with pytest.raises(ConfigurationError, match="row_scale"):
        LazyAdam(w.hyperparameters, row_scale="rows")


@pytest.mark.parametrize("k", [0.0, 1.0, 4.0, 1e9])
def test_lazy_adam_scale_prior_shrinks_each_rows_second_moment_toward_the_population(k):
    """scale_prior = k (eq. scaleprior), β₁ = 0, first visit: s_i² = (g_i² + k·mean_j g_j²)/(1 + k);
    k = 0 is each row's own scale (every row moves by lr), k → ∞ the population's (the rows
    keep the ratios of their gradients); 0 < k between."""
    w = SampleWeights(5)
    lazy = LazyAdam(w.hyperparameters, lr=0.5, betas=(0.0, 0.999), scale_prior=k)
    g = torch.tensor([3.0, -0.5, 0.0, 0.0, 0.0])
    w.logits.grad = g.clone()
    lazy.step()
    mean_sq = float(g[:2].pow(2).mean())
    s = ((g[:2] ** 2 + k * mean_sq) / (1 + k)).sqrt()
    torch.testing.assert_close(w.logits.detach()[:2], -0.5 * g[:2] / s, rtol=1e-5, atol=1e-7)
    assert bool((w.logits.detach()[2:] == 0).all())
    if k == 0:
        torch.testing.assert_close(w.logits.detach()[:2].abs(), torch.full((2,), 0.5))
    with pytest.raises(ConfigurationError, match="scale_prior"):
        LazyAdam(w.hyperparameters, scale_prior=-1.0)


# ---------------------------------------------------------------------- the training's cross term
@pytest.mark.parametrize(
    ("parameterization", "sparse_grad"), [("sigmoid", True), ("softmax", False)]
)
def test_training_cross_term_is_eq_gradestim_minibatch_cross_term(parameterization, sparse_grad):
    """TrainingCrossTerm on a minibatch ζ equals ∂₂Φ̂(w, x; ζ)ᵀv = −α ∂ₓ⟨∇₁ℓ̂(w, x; ζ), v⟩ of the
    weighted ridge (float64, by double backward through ℓ̂), zero outside ζ's rows, and its
    outer step (LazyAdam) moves only those rows."""
    p = WeightedRidge(parameterization=parameterization, sparse_grad=sparse_grad)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        p.w.copy_(torch.randn(p.w.shape, generator=gen, dtype=torch.float64))
    v = torch.randn(p.w.shape, generator=gen, dtype=torch.float64)
    alpha, index = 0.37, torch.tensor([3, 17, 40, 8, 29])
    batch = Indexed(index, (p.A[index], p.b[index]))
    # the reference: eq. gradestim's cross term through the library's weighted ℓ̂ (dense x)
    x = p.weights.logits.detach().clone().requires_grad_(True)
    ref_weights = SampleWeights(p.n, parameterization, dtype=torch.float64, logits=x)
    losses = 0.5 * (p.A[index] @ p.w - p.b[index]) ** 2
    inner = ref_weights.weighted_mean(losses, index) + 0.5 * RHO * (p.w**2).sum()
    (grad_w,) = torch.autograd.grad(inner, p.w, create_graph=True)
    (expected,) = torch.autograd.grad(-alpha * (grad_w * v).sum(), x)

    def per_sample(w):
        return 0.5 * (p.A[index] @ w - p.b[index]) ** 2

    u = directional_losses(per_sample, [p.w], [v])
    assert torch.allclose(u, (p.A[index] @ v) * (p.A[index] @ p.w - p.b[index]), rtol=1e-12)
    outer = LazyAdam(p.weights.hyperparameters, lr=0.5)
    cross = TrainingCrossTerm(p.weights, outer)
    g = cross.gradient(batch.index, u, alpha)
    assert g.is_sparse and set(g.coalesce().indices()[0].tolist()) == set(index.tolist())
    assert torch.allclose(g.to_dense(), expected, rtol=1e-10, atol=1e-14)
    assert float(expected.abs().sum()) > 0
    before = p.weights.logits.detach().clone()
    assert cross.step(index, u, alpha)
    moved = torch.nonzero(p.weights.logits.detach() != before).flatten()
    assert set(moved.tolist()) == set(index.tolist())
    assert not cross.step(index, u, None)  # no α (no adjoint solve yet): nothing moves


def test_natural_sigmoid_steps_along_the_gradient_in_omega():
    """NaturalSigmoidWeights (eq. natsig): the same ω as the sigmoid, and the training cross term
    of each row is the sigmoid's divided by σ'(xᵢ) = ωᵢ(1 − ωᵢ) (float64; the self-normalised
    loss's closed form −α (uᵢ − ū_ω)/Σω in ω); a row far down (x = −4) still moves by about lr
    on its first visit, like a row at x = 0."""
    gen = torch.Generator().manual_seed(5)
    x0 = torch.tensor([0.0, -4.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    u = torch.randn(5, generator=gen, dtype=torch.float64)
    index, alpha = torch.arange(5), 0.7
    grads = {}
    for name in ("sigmoid", "natural_sigmoid"):
        w = SampleWeights(5, name, dtype=torch.float64, sparse_grad=True)
        with torch.no_grad():
            w.logits.copy_(x0)
        assert torch.allclose(w.values(), torch.sigmoid(x0))
        grads[name] = TrainingCrossTerm(w, LazyAdam([w.logits], lr=1.0), normalize=True)
        grads[name] = grads[name].gradient(index, u, alpha).to_dense()
    om = torch.sigmoid(x0)
    ubar = (om * u).sum() / om.sum()
    closed = -alpha * (u - ubar) / om.sum()
    assert torch.allclose(grads["natural_sigmoid"], closed, rtol=1e-12)
    assert torch.allclose(grads["sigmoid"], closed * om * (1 - om), rtol=1e-12)
    w = SampleWeights(5, "natural_sigmoid", dtype=torch.float64)
    with torch.no_grad():
        w.logits.copy_(x0)
    opt = LazyAdam([w.logits], lr=1.0, betas=(0.0, 0.999))
    TrainingCrossTerm(w, opt, normalize=True).step(index, u, alpha)
    assert torch.allclose((w.logits.detach() - x0).abs(), torch.ones(5, dtype=torch.float64))


def test_expected_error_is_one_minus_p_y_of_the_cross_entropy_and_its_gradient():
    """ExpectedError (eq. softerr) of cross-entropy losses: at q = 1 the mean of 1 − p_y, at q
    the mean GCE (1 − p_y^q)/q, q → 0 the mean loss; its gradient weights each ∇ℓⱼ by p_y^q
    (float64, closed forms)."""
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (7,), generator=gen)
    losses = F.cross_entropy(z, y, reduction="none")
    p_y = F.softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    assert torch.allclose(ExpectedError()(losses), (1 - p_y).mean(), rtol=1e-14)
    assert torch.allclose(ExpectedError(0.7)(losses), ((1 - p_y**0.7) / 0.7).mean(), rtol=1e-12)
    assert torch.allclose(ExpectedError(1e-9)(losses), MeanLoss()(losses), rtol=1e-6)
    (g,) = torch.autograd.grad(ExpectedError(0.5)(losses), z, retain_graph=True)
    (g_ce,) = torch.autograd.grad((p_y.detach() ** 0.5 * losses).mean(), z)
    assert torch.allclose(g, g_ce, rtol=1e-12)
    assert isinstance(as_validation_objective("expected_error"), ExpectedError)
    assert isinstance(as_validation_objective("mean_loss"), MeanLoss)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ConfigurationError, match="q must be a number > 0"):
            ExpectedError(bad)
    with pytest.raises(ConfigurationError, match="'mean_loss', 'expected_error'"):
        as_validation_objective("accuracy")
    with pytest.raises(ConfigurationError, match="negative one.*objective='mean_loss'"):
        ExpectedError()(torch.tensor([0.3, -0.2]))


def _ess_share(losses: torch.Tensor, q: float) -> float:
    w = torch.exp(-q * losses)
    return float(w.sum() ** 2 / (w * w).sum() / losses.numel())


def test_kept_evidence_error_is_the_expected_error_when_p_y_are_high_and_the_mean_loss_when_spread():
    """KeptEvidenceError (eq. keptevidence): every p_y high → ESS(q_max) ≈ |V|, q* = q_max and
    E = ExpectedError(q_max); p_y spread over orders of magnitude → q* falls toward 0, the mean loss,
    as 1/(the losses' scale); q* is the largest grid q with ESS(q) ≥ κ|V| (the next
    grid value misses it); q readable after the calls (float64)."""
    gen = torch.Generator().manual_seed(3)
    high = -torch.log(1 - 0.05 * torch.rand(50, generator=gen, dtype=torch.float64))
    objective = KeptEvidenceError()
    assert objective.q == 0.5 and repr(objective) == "KeptEvidenceError(q_max=0.5, kappa=0.5)"
    assert torch.equal(objective(high), ExpectedError(0.5)(high)) and objective.q == 0.5
    spread = 120 * torch.rand(200, generator=gen, dtype=torch.float64) ** 2  # p_y 1 to e^-120
    z = spread.clone().requires_grad_(True)
    q = float(objective.choose_q(spread))
    assert 0 < q < 0.05
    assert _ess_share(spread, q) >= 0.5 > _ess_share(spread, q + 0.5 / 64)
    (g,) = torch.autograd.grad(objective(z), z)
    assert torch.allclose(g, torch.exp(-q * spread) / 200, rtol=1e-12)  # ∇E = p_y^q* / |V|
    assert _ess_share(spread, 0.5) < 0.2 and objective.q == q  # q_max would keep < 20 %
    # ESS(q; cℓ) = ESS(cq; ℓ): losses c times larger slide q* c times nearer the mean loss
    assert abs(float(objective.choose_q(4 * spread)) - q / 4) <= 0.5 / 64
    assert len(objective.qs) == 2
    wild = torch.tensor([0.0, 0.0, 500.0, 900.0], dtype=torch.float64)  # ESS < |V|/2 at any q > 0
    assert float(KeptEvidenceError(kappa=0.9).choose_q(wild)) == 0.0
    assert torch.equal(KeptEvidenceError(kappa=0.9)(wild), MeanLoss()(wild))
    assert isinstance(as_validation_objective("kept_evidence"), KeptEvidenceError)


def test_kept_evidence_error_gradient_matches_finite_differences_and_refuses_bad_input():
    """∇E of eq. keptevidence through a cross entropy, q* held fixed, against central finite
    differences of E (float64; q* does not switch within ±h); clear errors for bad settings and
    negative losses."""
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(9, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (9,), generator=gen)
    objective = KeptEvidenceError(q_max=1.0, kappa=0.8)
    assert torch.autograd.gradcheck(
        lambda z: objective(F.cross_entropy(z, y, reduction="none")), (z,), eps=1e-6, atol=1e-8
    )
    for bad in ({"q_max": 0}, {"q_max": True}, {"kappa": 0}, {"kappa": 1.5}, {"grid": 0}):
        with pytest.raises(ConfigurationError, match="KeptEvidenceError: .* must"):
            KeptEvidenceError(**bad)
    with pytest.raises(ConfigurationError, match="negative one.*objective='mean_loss'"):
        KeptEvidenceError()(torch.tensor([0.3, -0.2]))


def test_margin_error_is_the_smoothed_error_count_and_its_gradient_reads_the_top_rival_only():
    """MarginError (eq. marginerr): mⱼ = z_y − max_{k≠y} z_k, E = mean σ(−mⱼ/τ) → the 0-1 error
    count as τ → 0; its gradient in the logits is −σ'(mⱼ/τ)/τ/|V| at the label, the opposite at
    the top rival, zero elsewhere (closed form), and matches central finite differences (float64);
    read() takes the logits from module(batch[0]) or ``logits=``; clear errors."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(11, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 4, (11,), generator=gen)
    objective = MarginError(tau=0.7)
    m = objective.margins(z, y)
    others = z.detach().clone()
    others[torch.arange(11), y] = -torch.inf
    rival = others.argmax(1)
    assert torch.equal(
        m.detach(), z.detach()[torch.arange(11), y] - z.detach()[torch.arange(11), rival]
    )
    wrong = (z.detach().argmax(1) != y).double().mean()
    assert torch.allclose(MarginError(1e-6)(m.detach()), wrong)  # τ → 0: the error count
    (g,) = torch.autograd.grad(objective(m), z)
    s = torch.sigmoid(m.detach() / 0.7)
    kernel = s * (1 - s) / 0.7 / 11
    exact = torch.zeros_like(g)
    exact[torch.arange(11), y] = -kernel
    exact[torch.arange(11), rival] = kernel
    assert torch.allclose(g, exact, rtol=1e-12, atol=1e-15)
    assert torch.autograd.gradcheck(
        lambda z: objective(objective.margins(z, y)), (z,), eps=1e-6, atol=1e-8
    )
    # softening: moving mass from class a to b changes E by the same kernel weight on both
    # sides of the boundary (m = ±δ), unlike the cross entropy (1 − p_y on the wrong side only)
    d = torch.tensor([0.3, -0.3], dtype=torch.float64, requires_grad=True)
    (gd,) = torch.autograd.grad(objective(d), d)
    assert torch.allclose(gd[0], gd[1])
    net = torch.nn.Linear(3, 4).double()
    x = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    yb = torch.tensor([0, 1, 2, 3, 0])
    read = objective.read(net, (x, yb), lambda: pytest.fail("the losses are not read"))
    assert torch.allclose(read, objective.margins(net(x), yb))
    custom = MarginError(logits=lambda module, batch: (module(batch["x"]), batch["y"]))
    assert torch.allclose(custom.read(net, {"x": x, "y": yb}, lambda: None), read)
    assert isinstance(as_validation_objective("margin_error"), MarginError)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(ConfigurationError, match="tau .* must be a number > 0"):
            MarginError(bad)
    with pytest.raises(ConfigurationError, match="logits must be a callable"):
        MarginError(logits=3)
    with pytest.raises(ConfigurationError, match=r"\(batch, classes\)"):
        objective.margins(torch.zeros(5), yb)
    with pytest.raises(ConfigurationError, match="integer class indices.*argmax"):
        objective.margins(net(x), F.one_hot(yb, 4))
    with pytest.raises(ConfigurationError, match="give logits="):
        objective.read(net, {"x": x}, lambda: None)


def test_adaptive_margin_error_takes_tau_from_silverman_s_rule_and_scales_with_the_logits():
    """AdaptiveMarginError (eq. marginbw): τ = √3/π · 0.9 min(sd, IQR/1.34) |V|^{−1/5} of the
    batch's margins, held fixed (∇E = σ'(m/τ)/τ/|V| · ∇m); logits c times larger give τ c times
    larger and the same E (scale-free); floored at min_tau for equal margins (float64)."""
    gen = torch.Generator().manual_seed(6)
    m = (3 * torch.randn(64, generator=gen, dtype=torch.float64)).requires_grad_(True)
    objective = AdaptiveMarginError()
    assert objective.last_tau is None
    e = objective(m)
    md = m.detach()
    iqr = (md.quantile(0.75) - md.quantile(0.25)) / 1.34
    tau = 3**0.5 / torch.pi * 0.9 * torch.minimum(md.std(), iqr) * 64**-0.2
    assert torch.allclose(objective.last_tau, tau, rtol=1e-12)
    assert torch.allclose(e, torch.sigmoid(-md / tau).mean(), rtol=1e-12)
    (g,) = torch.autograd.grad(e, m)
    s = torch.sigmoid(md / tau)
    assert torch.allclose(g, -s * (1 - s) / tau / 64, rtol=1e-12)  # τ not differentiated
    assert torch.allclose(AdaptiveMarginError()(5 * md), e, rtol=1e-12)
    assert float(objective(torch.zeros(8, dtype=torch.float64))) == 0.5
    assert float(objective.last_tau) == 0.05
    assert isinstance(as_validation_objective("adaptive_margin_error"), AdaptiveMarginError)


def test_class_relative_error_is_the_mean_log_of_shrunk_class_errors_and_its_gradient():
    """ClassRelativeError (eq. classrel): E = mean over the batch's classes of log Ē_c,
    Ē_c = (Σ_{y=c} eⱼ + ē)/(n_c + 1), eⱼ = (1 − e^{−qℓⱼ})/q (by hand, float64); ∇E in the losses
    is e^{−qℓⱼ} / ((n_c + 1) Ē_c |C|) with ē held fixed (closed form), and matches central finite
    differences of E along directions that leave ē unchanged; a class's gain counts relative to its error (the same
    absolute change in the easier class moves E more); read() takes batch[1] or labels=;
    clear errors."""
    gen = torch.Generator().manual_seed(7)
    losses = (2 * torch.rand(10, generator=gen, dtype=torch.float64)).requires_grad_(True)
    y = torch.tensor([0, 0, 0, 1, 1, 3, 3, 3, 3, 1])  # class 2 absent: |C| = 3
    objective = ClassRelativeError(q=0.5)
    e_all = (1 - torch.exp(-0.5 * losses.detach())) / 0.5
    bar = e_all.mean()
    per = {c: (e_all[y == c].sum() + bar) / (int((y == c).sum()) + 1) for c in (0, 1, 3)}
    e = objective(LabelledLosses(losses, y))
    assert torch.allclose(e, sum(torch.log(v) for v in per.values()) / 3, rtol=1e-12)
    (g,) = torch.autograd.grad(e, losses)
    exact = torch.stack(
        [torch.exp(-0.5 * losses[j].detach()) / ((int((y == y[j]).sum()) + 1) * per[int(y[j])] * 3)
         for j in range(10)]
    )  # fmt: skip
    assert torch.allclose(g, exact, rtol=1e-12)
    # central differences of E itself along directions that leave ē unchanged to first order
    # (Σⱼ ∂eⱼ/∂ℓⱼ δⱼ = 0), where ∇E with ē held fixed is the whole first-order change
    de = torch.exp(-0.5 * losses.detach())
    for _ in range(3):
        delta = torch.randn(10, generator=gen, dtype=torch.float64)
        delta -= de * (de @ delta) / (de @ de)
        h = 1e-6
        up = objective(LabelledLosses(losses.detach() + h * delta, y))
        down = objective(LabelledLosses(losses.detach() - h * delta, y))
        assert torch.allclose((up - down) / (2 * h), g @ delta, rtol=1e-6, atol=1e-10)
    # the easier class (smaller Ē_c) weighs the same change in its examples' error more
    easy_hard = torch.tensor([0.05, 0.05, 1.5, 1.5], dtype=torch.float64, requires_grad=True)
    (g2,) = torch.autograd.grad(
        objective(LabelledLosses(easy_hard, torch.tensor([0, 0, 1, 1]))), easy_hard
    )
    slope = torch.exp(-0.5 * easy_hard.detach())  # ∂eⱼ/∂ℓⱼ
    assert float((g2 / slope)[0]) > 3 * float((g2 / slope)[2])
    read = objective.read(None, (torch.zeros(10, 2), y), lambda: losses)
    assert read.losses is losses and torch.equal(read.labels, y)
    by = ClassRelativeError(labels=lambda b: b["y"]).read(None, {"y": y}, lambda: losses)
    assert torch.equal(by.labels, y)
    assert isinstance(as_validation_objective("class_relative_error"), ClassRelativeError)
    for bad in (0, -1.0, True):
        with pytest.raises(ConfigurationError, match="q must be a number > 0"):
            ClassRelativeError(bad)
    with pytest.raises(ConfigurationError, match="labels must be a callable"):
        ClassRelativeError(labels=1)
    with pytest.raises(ConfigurationError, match="batch\\[1\\].*labels="):
        objective.read(None, {"x": 1}, lambda: losses)
    with pytest.raises(ConfigurationError, match="integer class indices.*argmax"):
        objective(LabelledLosses(losses, F.one_hot(y, 4)))
    with pytest.raises(ConfigurationError, match="needs the validation labels.*validation_loss"):
        objective(losses)
    with pytest.raises(ConfigurationError, match="negative one"):
        objective(LabelledLosses(torch.tensor([0.3, -0.2]), torch.tensor([0, 1])))


def test_weighted_ridge_hypergradient_under_the_expected_error_matches_closed_form():
    """The weighted ridge with E = mean (1 − e^{−ℓⱼ}) of its validation residuals ℓⱼ = ½rⱼ²:
    ∇E(w*) = Σⱼ e^{−ℓⱼ} rⱼ aⱼ / m in the closed form of the per-sample hypergradient (float64,
    full batch)."""
    p = WeightedRidge()
    objective = ExpectedError()
    p.outer_loss = lambda batch: objective(0.5 * (batch[0] @ p.w - batch[1]) ** 2)
    hopt = p.sid(
        inner_steps=600, adjoint_steps=600, step_size="constant", eta=1.0,
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )  # fmt: skip
    g = hopt.hypergradient([p.full()], (p.Av, p.bv))[0]
    x = p.weights.logits.detach()
    w = p.w_star()
    rv = p.Av @ w - p.bv
    grad_E = p.Av.T @ (torch.exp(-0.5 * rv**2) * rv) / p.Av.shape[0]
    r = p.A @ w - p.b
    exact = (
        -(
            torch.sigmoid(x)
            * (1 - torch.sigmoid(x))
            * r
            * (p.A @ torch.linalg.solve(p.hessian(), grad_E))
        )
        / p.n
    )
    assert rel(g, exact) < 1e-7
    assert rel(g, p.exact()) > 1e-2  # not the mean loss's


# ---------------------------------------------------------------------- flag rules
def _family(x: torch.Tensor, parameterization: str = "sigmoid") -> SampleWeights:
    w = SampleWeights(len(x), parameterization)
    with torch.no_grad():
        w.logits.copy_(x)
    w.projection()
    return w


def _precision_recall(flagged: torch.Tensor, corrupted: torch.Tensor) -> tuple[float, float]:
    mask = torch.zeros(len(corrupted), dtype=torch.bool)
    mask[flagged] = True
    tp = int((mask & corrupted).sum())
    return tp / max(int(mask.sum()), 1), tp / int(corrupted.sum())


def test_two_component_split_flags_the_drifting_bump_not_the_random_walk_tail():
    """What LazyAdam without momentum leaves: corrupted logits in a tight bump that drifted
    down (−5.5 ± 0.5), clean ones random-walking around the start (0 ± 3, a tail reaching
    below −5). A fixed weight threshold (ω < ω₀/2) flags that tail; the split does not."""
    gen = torch.Generator().manual_seed(0)
    corrupted = torch.arange(1000) < 300
    x = torch.where(
        corrupted,
        -5.5 + 0.5 * torch.randn(1000, generator=gen),
        3.0 * torch.randn(1000, generator=gen),
    )
    w = _family(x)
    precision, recall = _precision_recall(w.flagged(), corrupted)
    assert precision > 0.85 and recall > 0.9, (precision, recall)
    half_precision, _ = _precision_recall(w.flagged("below_half"), corrupted)
    assert half_precision < 0.75  # what the split is for
    assert torch.equal(w.flagged(0.25), w.flagged(BelowWeight(0.25)))
    assert torch.equal(w.flagged(), w.flagged(TwoComponentSplit()))


def test_two_component_split_ignores_how_far_saturated_logits_ran():
    """A fifth of the logits run off to ±100s (weights saturated at 0 / 1 long before): the
    split still finds the corrupted bump (without the clip it flags nothing: the far tails
    dwarf the two bumps)."""
    gen = torch.Generator().manual_seed(4)
    corrupted = torch.rand(5000, generator=gen) < 0.45
    x = torch.where(corrupted, -8.0, 6.0) + 3.0 * torch.randn(5000, generator=gen)
    x = torch.where(torch.rand(5000, generator=gen) < 0.2, 12 * x, x)
    precision, recall = _precision_recall(_family(x).flagged(), corrupted)
    assert precision > 0.95 and recall > 0.95, (precision, recall)
    assert _family(x).flagged(TwoComponentSplit(clip=1e6)).numel() == 0


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(50),  # nothing moved
        3.0 * torch.randn(2000, generator=torch.Generator().manual_seed(1)),  # one bump
        torch.cat([torch.full((100,), 2.0), torch.full((100,), 6.0)])  # both went up
        + 0.3 * torch.randn(200, generator=torch.Generator().manual_seed(2)),
    ],
    ids=["unmoved", "unimodal", "both-up"],
)
def test_two_component_split_flags_nothing_without_a_separated_low_bump(x):
    assert _family(x).flagged().numel() == 0


def test_two_component_split_under_softmax_weights_and_bad_rules_refused():
    corrupted = torch.arange(400) < 100
    x = torch.where(corrupted, torch.tensor(-4.0), torch.tensor(1.0))
    x = x + 0.3 * torch.randn(400, generator=torch.Generator().manual_seed(3))
    assert _precision_recall(_family(x, "softmax").flagged(), corrupted) == (1.0, 1.0)
    with pytest.raises(ConfigurationError, match="flag rule"):
        _family(x).flagged("lowest")
    with pytest.raises(ConfigurationError, match="min_separation"):
        TwoComponentSplit(min_separation=-1)
    with pytest.raises(ConfigurationError, match="clip"):
        TwoComponentSplit(clip=0)


# ---------------------------------------------------------------------- a shared loss term
def shared_ridge(theta=(0.7, -0.4), **kwargs) -> WeightedRidge:
    """The weighted ridge under ω = σ(x + θᵀφ(z)) (eq. sharedloss), θ ≠ 0."""
    p = WeightedRidge(parameterization=SharedLossWeights(), **kwargs)
    with torch.no_grad():
        p.weights.parameterization.theta.copy_(torch.tensor(theta, dtype=torch.float64))
    return p


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_shared_loss_weights_full_batch_match_the_closed_form(sparse_grad):
    """At the inner solution w* (z held at its losses there): the per-sample part is the
    weighted ridge's closed form with T' = ω(1 − ω) at the effective logit, and θ's
    hypergradient is Σᵢ (∂f/∂xᵢ) φ(zᵢ) (s enters beside xᵢ), float64."""
    p = shared_ridge(sparse_grad=sparse_grad)
    param = p.weights.parameterization
    hopt = p.sid(
        inner_steps=600, adjoint_steps=600, step_size="constant", eta=1.0,
        batches=Batches(inner="full", adjoint="full", d2="full"),
    )  # fmt: skip
    gx, gtheta = hopt.hypergradient([p.full()], (p.Av, p.bv))
    assert gx.is_sparse == sparse_grad and not gtheta.is_sparse
    # the closed form at w*: ω from the rows' last z (that of w*), T' = ω(1 − ω)
    w = p.w.detach()
    torch.testing.assert_close(w, p.w_star(), rtol=0, atol=1e-7)  # the fixed point w*
    z = param.standardised(0.5 * (p.A @ w - p.b) ** 2)
    torch.testing.assert_close(param.last_z, z, rtol=0, atol=1e-12)
    om = p.weights.values()
    grad_E = p.Av.T @ (p.Av @ w - p.bv) / p.Av.shape[0]
    u = torch.linalg.solve(p.hessian(), grad_E)
    exact_x = -(om * (1 - om) * (p.A @ w - p.b) * (p.A @ u)) / p.n
    assert rel(gx.to_dense(), exact_x) < 1e-7
    phi = torch.stack([z, z.clamp_min(0)], 1)
    assert rel(gtheta, phi.T @ exact_x) < 1e-7
    assert float(gtheta.abs().min()) > 0


def test_shared_loss_cross_term_matches_finite_differences_in_theta():
    """TrainingCrossTerm's θ part equals the central finite difference in θ of
    −α⟨∇₁ℓ̂(w, x, θ; ζ), v⟩ (z fixed by the batch's losses), float64; θ = 0 is SigmoidWeights."""
    p = shared_ridge()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        p.w.copy_(torch.randn(p.w.shape, generator=gen, dtype=torch.float64))
    v = torch.randn(p.w.shape, generator=gen, dtype=torch.float64)
    alpha, index = 0.37, torch.tensor([3, 17, 40, 8, 29, 11])
    theta = p.weights.parameterization.theta

    def per_sample(w):
        return 0.5 * (p.A[index] @ w - p.b[index]) ** 2

    losses = per_sample(p.w).detach()

    def cross(t):  # −α⟨∇₁ℓ̂, v⟩ at θ = t
        with torch.no_grad():
            theta.copy_(t)
        w = p.w.detach().clone().requires_grad_(True)
        inner = p.weights.weighted_mean(per_sample(w), index)
        (gw,) = torch.autograd.grad(inner, w)
        return float(-alpha * (gw * v).sum())

    u = directional_losses(per_sample, [p.w], [v])
    theta0 = theta.detach().clone()
    cross_term = TrainingCrossTerm(p.weights, LazyAdam(p.weights.hyperparameters, lr=0.1))
    gx, gtheta = cross_term.gradients(index, u, alpha, losses)
    h = 1e-6
    fd = torch.stack(
        [
            torch.tensor((cross(theta0 + h * e) - cross(theta0 - h * e)) / (2 * h))
            for e in torch.eye(2, dtype=torch.float64)
        ]
    ).to(torch.float64)
    assert rel(gtheta, fd) < 1e-6 and float(fd.abs().min()) > 1e-4
    # the per-sample part is still sparse on the rows read; at θ = 0 the weights are σ(x)
    assert set(gx.coalesce().indices()[0].tolist()) == set(index.tolist())
    with torch.no_grad():
        theta.zero_()
    sigmoid = SampleWeights(p.n, "sigmoid", dtype=torch.float64, logits=p.weights.logits)
    torch.testing.assert_close(p.weights.weights(index, losses), sigmoid.weights(index))


def test_shared_loss_weights_outer_groups_and_bad_settings():
    """θ gets its own Adam group (lr, betas); flags read the effective logits; bad settings are
    refused."""
    p = shared_ridge()
    param = p.weights.parameterization
    opt = LazyAdam(param.param_groups(p.weights.hyperparameters), lr=1.0, betas=(0.0, 0.999))
    assert [g["lr"] for g in opt.param_groups] == [1.0, param.lr]
    assert opt.param_groups[1]["betas"] == param.betas
    assert p.weights.hyperparameters[1] is param.theta
    with torch.no_grad():
        param.last_z.copy_(torch.linspace(-3, 3, p.n, dtype=torch.float64))
    expected = torch.sigmoid(p.weights.logits.detach() + param.shift(param.last_z))
    torch.testing.assert_close(p.weights.values(), expected.detach())
    for kwargs in ({"lr": 0.0}, {"clip": -1.0}):
        with pytest.raises(ConfigurationError, match="SharedLossWeights"):
            SharedLossWeights(**kwargs)


# ---------------------------------------------------------------------- uᵢ by a forward difference
def _tanh_losses(seed: int = 0, dtype=torch.float64, scale: float = 1.0):
    """Per-sample squared losses of a tanh network, its parameters (scaled by ``scale``) and v."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(12, 4, generator=gen, dtype=dtype)
    y = torch.randn(12, generator=gen, dtype=dtype)
    params = [scale * torch.randn(s, generator=gen, dtype=dtype) for s in ((4, 6), (6,), (6,))]
    v = [torch.randn(p.shape, generator=gen, dtype=dtype) for p in params]

    def losses(W, b, a):
        return 0.5 * (torch.tanh(X @ W + b) @ a - y) ** 2

    return losses, params, v


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_forward_difference_matches_forward_mode_in_float64_at_any_scale(scale):
    """Eq. fdcross in float64: (ℓᵢ(w + hv) − ℓᵢ(w))/h with h‖v‖ = c‖w‖ agrees with the
    dual-number uᵢ to ~1e-5 relative, whatever the scale of w (and of v: ×1e4)."""
    losses, params, v = _tanh_losses(scale=scale)
    for v_scale in (1.0, 1e4):
        tangents = [v_scale * t for t in v]
        exact = ForwardMode()(losses, params, tangents)
        at = losses(*params)
        approx = ForwardDifference()(losses, params, tangents, at)
        assert float((approx - exact).norm() / exact.norm()) < 1e-5
        # without the training step's losses it computes ℓ(w) itself
        again = ForwardDifference()(losses, params, tangents)
        assert torch.allclose(again, approx, rtol=0, atol=1e-12 * float(exact.abs().max()))


def test_forward_difference_step_is_relative_and_zero_v_gives_zero():
    losses, params, v = _tanh_losses()
    fd = ForwardDifference(relative_step=1e-4)
    w_norm = float(torch.sqrt(sum((p**2).sum() for p in params)))
    assert w_norm > 1
    v_norm = float(torch.sqrt(sum((t**2).sum() for t in v)))
    assert fd.step(params, v) == pytest.approx(1e-4 * w_norm / v_norm)
    assert ForwardDifference().step(params, v) == pytest.approx(
        torch.finfo(torch.float64).eps ** 0.5 * w_norm / v_norm
    )
    zero = [torch.zeros_like(t) for t in v]
    assert torch.equal(fd(losses, params, zero), torch.zeros(12, dtype=torch.float64))


def test_forward_difference_falls_back_to_forward_mode_for_half_precision_and_autocast():
    """bfloat16 parameters, or an autocast region: a difference of losses rounds to nothing,
    so it says so (once) and computes the dual-number uᵢ instead."""
    low_losses, low, low_v = _tanh_losses(dtype=torch.bfloat16)
    fd = ForwardDifference()
    with pytest.warns(UserWarning, match="bfloat16.*ForwardMode"):
        u = fd(low_losses, low, low_v)
    assert torch.equal(u, ForwardMode()(low_losses, low, low_v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        fd(low_losses, low, low_v)
    losses, params, v = _tanh_losses(dtype=torch.float32)
    with pytest.warns(UserWarning, match="autocast"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ForwardDifference()(losses, params, v)
    assert ForwardDifference().inaccurate(params) is None


@pytest.mark.parametrize("bad", [0.0, -1e-3, 1.0])
def test_forward_difference_refuses_a_bad_step(bad):
    with pytest.raises(ConfigurationError, match="relative_step"):
        ForwardDifference(relative_step=bad)
    with pytest.raises(ConfigurationError, match="check_every"):
        ForwardDifference(check_every=0)


def test_forward_difference_watches_that_the_losses_reproduce_and_falls_back_when_not():
    """The difference's premise, ℓ recomputed at w gives back the step's own ℓ(w), is checked at
    the first call and every ``check_every`` calls: losses that start to carry randomness of
    their own (here from call 3 on; checked at calls 0, 2, 4) are caught at the next check, said
    once, and from then on uᵢ is the dual-number one, not noise / h."""
    losses, params, v = _tanh_losses()
    calls = {"n": 0}
    noise = torch.Generator().manual_seed(5)

    def drifting(*ps):  # reproducible until its 4th evaluation, then a fresh draw each time
        calls["n"] += 1
        jitter = 0.3 * torch.rand(12, generator=noise, dtype=torch.float64)
        return losses(*ps) + (jitter if calls["n"] > 3 else 0.0)

    fd = ForwardDifference(check_every=2)
    exact = ForwardMode()(losses, params, v)
    at = losses(*params)
    for _ in range(2):  # calls 0 (checked) and 1: the difference itself
        u = fd(drifting, params, v, at)
        assert float((u - exact).norm() / exact.norm()) < 1e-5
    with pytest.warns(UserWarning, match="recomputed at the same weights.*ForwardMode"):
        u = fd(drifting, params, v, at)  # call 2, checked: the 4th evaluation drifts
    assert fd.inaccurate(params) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once; the fallback from now on
        later = fd(drifting, params, v, at)
    for got in (u, later):  # ForwardMode of a constant jitter: the exact uᵢ again
        torch.testing.assert_close(got, exact)
