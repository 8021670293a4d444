"""TrainedWeights: the validation gradient at the weights the training will reach (eq. trainedgrad).

On a quadratic whose validation loss has the training loss's curvature, E(w) = ½(w − c)ᵀH(w − c)
with H = ∇²ℓ̂, T gradient steps of step η from w_t reach w_{t+T} = w_t − Σ_T(H)∇₁ℓ̂(w_t) exactly,
so ∇₁E(w_{t+T}) = ∇₁E(w_t) − (I − (I − ηH)^T)∇₁ℓ̂(w_t): the strategy's target is exact where its
filter is (converged training; or ∇₁ℓ̂ along one eigenvector, the Rayleigh filter). float64.

ValidationCurvature (eq. valcurvgrad) moves ∇₁E by the validation curvature instead: on a
quadratic E(w) = ½(w − c)ᵀH_E(w − c) with H_E ≠ H, ∇₁E(w_{t+T}) = ∇₁E(w_t) + H_E(w_{t+T} − w_t)
exactly, and w_{t+T} − w_t = −Σ_T(h)∇₁ℓ̂(w_t) where ∇₁ℓ̂(w_t) is an eigenvector of H.
"""

from __future__ import annotations

import math

import lightning_problems
import pytest
import torch
from lightning_problems import RidgeData, TanhRegressor
from problems import symmetric_with_spectrum

from hypertorch_sid import (
    Batches,
    CurrentWeights,
    EstimatedCurvature,
    LearnedWeightDecay,
    NoDamping,
    SIDConfig,
    SIDHyperOptimizer,
    StepReads,
    TrainedWeights,
    TrajectoryWeights,
    ValidationCurvature,
)
from hypertorch_sid.core.errors import ConfigurationError

D = torch.float64


class _Quadratic:
    """ℓ̂(w) = ½ wᵀAw − bᵀw + ½ Σ e^ρ w², E(w) = ½ (w − c)ᵀ H (w − c), H = A + diag(e^ρ)."""

    def __init__(self, d: int = 8, low: float = 0.05, high: float = 4.0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        spectrum = torch.logspace(math.log10(low), math.log10(high), d, dtype=D)
        self.A = symmetric_with_spectrum(spectrum, g)
        self.b = torch.randn(d, generator=g, dtype=D)
        self.c = torch.randn(d, generator=g, dtype=D)
        self.rho = torch.full((d,), math.log(1e-2), dtype=D, requires_grad=True)
        self.w = torch.zeros(d, dtype=D, requires_grad=True)  # an underfit start

    def H(self) -> torch.Tensor:
        return self.A + torch.diag(self.rho.detach().exp())

    def grad_l(self, w: torch.Tensor) -> torch.Tensor:
        return self.H() @ w - self.b

    def grad_E(self, w: torch.Tensor) -> torch.Tensor:
        return self.H() @ (w - self.c)

    def after(self, eta: float, steps: int) -> torch.Tensor:
        """w_{t+T}: T gradient steps on ℓ̂ from the current w."""
        w = self.w.detach().clone()
        for _ in range(steps):
            w = w - eta * self.grad_l(w)
        return w

    def train_gradient(self, n: int, curvature: bool) -> tuple[list[torch.Tensor], float | None]:
        g = self.grad_l(self.w.detach())
        h = float(g @ self.H() @ g / (g @ g)) if curvature else None
        return [g], h

    def inner_loss(self, batch: object) -> torch.Tensor:
        w = self.w
        return 0.5 * w @ self.A @ w - self.b @ w + 0.5 * (self.rho.exp() * w**2).sum()

    def outer_loss(self, batch: object) -> torch.Tensor:
        r = self.w - self.c
        return 0.5 * r @ self.H() @ r


def test_the_target_is_the_validation_gradient_after_a_converged_training() -> None:
    q, eta = _Quadratic(), 0.2
    look = TrainedWeights()
    look.observe(remaining_steps=3000, step_size=eta)  # ηh_min·T = 30: converged
    (target,) = look.target([q.grad_E(q.w.detach())], StepReads(q.train_gradient))
    truth = q.grad_E(q.after(eta, 3000))
    torch.testing.assert_close(target, truth, rtol=1e-9, atol=1e-12)
    # the validation gradient at the (underfit) current weights is far from it
    assert float((q.grad_E(q.w.detach()) - truth).norm()) > 10 * float((target - truth).norm())


@pytest.mark.parametrize("steps", [1, 7, 60])
def test_the_rayleigh_filter_is_exact_along_an_eigenvector(steps: int) -> None:
    """w_t − w* along one eigenvector of H: ∇₁ℓ̂ is that eigenvector, its Rayleigh quotient the
    eigenvalue, and 1 − (1 − ηh)^T the exact share of it that T steps remove."""
    q, eta = _Quadratic(), 0.2
    h, V = torch.linalg.eigh(q.H())
    w_star = torch.linalg.solve(q.H(), q.b)
    with torch.no_grad():
        q.w.copy_(w_star + 1.5 * V[:, 3])
    look = TrainedWeights(filter="rayleigh")
    look.observe(remaining_steps=steps, step_size=eta)
    (target,) = look.target([q.grad_E(q.w.detach())], StepReads(q.train_gradient))
    torch.testing.assert_close(target, q.grad_E(q.after(eta, steps)), rtol=1e-9, atol=1e-12)
    assert math.isclose(look.shrink(float(h[3])), 1 - (1 - eta * float(h[3])) ** steps)


def test_the_filter_ends_and_unknowns() -> None:
    look, converged = TrainedWeights(filter="rayleigh"), TrainedWeights()
    assert look.shrink(0.3) == 1.0  # T and η unknown: the training is taken to converge
    look.observe(remaining_steps=0, step_size=0.1)
    converged.observe(remaining_steps=0, step_size=0.1)
    assert look.shrink(0.3) == 0.0  # no step left: the current weights are the trained ones
    assert converged.shrink(0.3) == 1.0  # "converged" does not read the training's length
    look.observe(remaining_steps=10, step_size=0.1)
    assert look.shrink(-1.0) == 0.0  # negative curvature: the training does not remove it
    assert look.shrink(30.0) == 1.0 and look.train_batches == 1
    assert CurrentWeights().train_batches == 0


def _hopt(q: _Quadratic, look, outer=None) -> SIDHyperOptimizer:
    return SIDHyperOptimizer(
        [q.rho], [q.w], q.inner_loss, outer or q.outer_loss, None, full_train_batch=0,
        config=SIDConfig(
            inner_steps=0, adjoint_steps=1500, step_size="constant", damping=NoDamping(),
            look_ahead=look, curvature=EstimatedCurvature(iters=10),
            batches=Batches(adjoint="full", d2="full"),
        ),
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:.*far from a fixed point")
def test_sid_solves_the_adjoint_system_for_the_trained_weights_gradient() -> None:
    """Through Algorithm 1 the hypergradient with TrainedWeights is the implicit one of the
    outer loss E − ℓ̂ (λ held in ℓ̂): the adjoint system's right-hand side is eq. trainedgrad.
    At underfit weights (a fifth of the way to w*) it differs from the current-weights one."""
    q = _Quadratic()
    with torch.no_grad():
        q.w.copy_(0.2 * torch.linalg.solve(q.H(), q.b))

    def gap(batch: object) -> torch.Tensor:  # E − ℓ̂ with ℓ̂'s λ held: ∇₁ is the target
        w, lam = q.w, q.rho.detach().exp()
        inner = 0.5 * w @ q.A @ w - q.b @ w + 0.5 * (lam * w**2).sum()
        return q.outer_loss(batch) - inner

    g_trained = _hopt(q, TrainedWeights()).hypergradient([0], None)[0]
    g_gap = _hopt(q, CurrentWeights(), gap).hypergradient([0], None)[0]
    torch.testing.assert_close(g_trained, g_gap, rtol=1e-7, atol=1e-12)
    g_now = _hopt(q, CurrentWeights()).hypergradient([0], None)[0]
    assert float((g_trained - g_now).norm()) > 0.1 * float(g_now.norm())


@pytest.mark.parametrize("kwargs", [{"batches": 0}, {"filter": "exact"}])
def test_trained_weights_refuses_bad_settings(kwargs) -> None:
    with pytest.raises(ConfigurationError):
        TrainedWeights(**kwargs)
    with pytest.raises(ConfigurationError, match="look_ahead"):
        SIDConfig(look_ahead="trained")


def test_the_drop_in_with_trained_weights_on_a_tanh_network() -> None:
    """Seconds: a tanh network through LearnedWeightDecay(look_ahead=TrainedWeights()) trains
    with finite weights and λ, hears the horizon, and reads one training batch more per hyper
    step than the default (the ∇₁ℓ̂ of eq. trainedgrad)."""
    samples = {}
    for name, look in (("now", CurrentWeights()), ("trained", TrainedWeights())):
        cb = LearnedWeightDecay(1e-2, every_n_steps=5, look_ahead=look, max_overhead=None)
        trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
        trainer.fit(TanhRegressor(), datamodule=RidgeData())
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
        assert bool(torch.isfinite(lam).all()) and len(cb.history) == 6
        samples[name] = cb.sid.cost.samples
    assert look.remaining_steps == 0 and look.step_size is not None
    assert samples["trained"] == samples["now"] + 6 * 20  # one batch of 20 per hyper step


class _OtherCurvature(_Quadratic):
    """The quadratic with a validation loss of its own curvature, E(w) = ½(w − c)ᵀH_E(w − c)."""

    def __init__(self, H_E: torch.Tensor, **kwargs) -> None:
        super().__init__(**kwargs)
        self.H_E = H_E

    def grad_E(self, w: torch.Tensor) -> torch.Tensor:
        return self.H_E @ (w - self.c)

    def outer_loss(self, batch: object) -> torch.Tensor:
        r = self.w - self.c
        return 0.5 * r @ self.H_E @ r

    def validation_product(self, u: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.H_E @ u[0]]

    def train_product(self, u: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.H() @ u[0]]

    def reads(self) -> StepReads:
        return StepReads(self.train_gradient, self.validation_product, self.train_product)

    def along_eigenvector(self, k: int) -> float:
        """w_t − w* along the k-th eigenvector of H; its eigenvalue."""
        h, V = torch.linalg.eigh(self.H())
        with torch.no_grad():
            self.w.copy_(torch.linalg.solve(self.H(), self.b) + 1.5 * V[:, k])
        return float(h[k])


def _validation_hessians() -> dict[str, torch.Tensor]:
    """H_E ≠ H: another random spectrum, and one flat along H's 4th eigenvector (a direction the
    training fits and the validation loss does not curve along: memorising)."""
    g = torch.Generator().manual_seed(5)
    other = symmetric_with_spectrum(torch.logspace(-1.5, 0.5, 8, dtype=D), g)
    H = _Quadratic().H()
    v = torch.linalg.eigh(H)[1][:, 3]
    flat = H - float(v @ H @ v) * torch.outer(v, v)  # H with v's eigenvalue set to 0
    return {"other": other, "flat": flat}


def _exact_target(q: _OtherCurvature, eta: float, steps: int) -> torch.Tensor:
    """∇₁E(w_{t+T}) = ∇₁E(w_t) + H_E(w_{t+T} − w_t): T gradient steps on the quadratic ℓ̂."""
    return q.grad_E(q.after(eta, steps))


@pytest.mark.parametrize("steps", [1, 7, 60])
@pytest.mark.parametrize("which", ["other", "flat"])
def test_validation_curvature_is_exact_along_an_eigenvector(steps: int, which: str) -> None:
    """∇₁ℓ̂ along an eigenvector of H, E with another Hessian: eq. valcurvgrad with one Lanczos
    step (the Rayleigh quotient) is the validation gradient after T steps exactly;
    TrainedWeights (which takes H_E = H) is not."""
    q, eta = _OtherCurvature(_validation_hessians()[which]), 0.2
    h = q.along_eigenvector(3)
    look = ValidationCurvature(iters=1)
    look.observe(remaining_steps=steps, step_size=eta)
    now = q.grad_E(q.w.detach())
    (target,) = look.target([now], q.reads())
    truth = _exact_target(q, eta, steps)
    torch.testing.assert_close(target, truth, rtol=1e-9, atol=1e-12)
    trained = TrainedWeights(filter="rayleigh")
    trained.observe(remaining_steps=steps, step_size=eta)
    (gap_target,) = trained.target([now], StepReads(q.train_gradient))
    assert float((gap_target - truth).norm()) > 1e-3 * float(truth.norm())
    if which == "flat":  # E does not curve along what the training still fits: nothing removed
        torch.testing.assert_close(target, now, rtol=1e-9, atol=1e-12)
    assert math.isclose(look.shrink(h) / h, (1 - (1 - eta * h) ** steps) / h)


@pytest.mark.parametrize("steps", [3, 25])
def test_validation_curvature_is_exact_in_any_direction_with_a_full_krylov_space(steps) -> None:
    """An underfit start (∇₁ℓ̂ along every eigenvector; ηh_min·T < 1, far from converged) and
    as many Lanczos steps as dimensions: Σ_T(H)g is exact, and so is eq. valcurvgrad, for a
    validation Hessian of another spectrum; fewer steps approximate it."""
    q, eta = _OtherCurvature(_validation_hessians()["other"]), 0.2
    now, truth = q.grad_E(q.w.detach()), _exact_target(q, eta, steps)
    errors = []
    for iters in (1, 3, 8):
        look = ValidationCurvature(iters=iters)
        look.observe(remaining_steps=steps, step_size=eta)
        (target,) = look.target([now], q.reads())
        errors.append(float((target - truth).norm()))
    torch.testing.assert_close(target, truth, rtol=1e-9, atol=1e-11)
    assert errors[0] > 1e-3 * float(truth.norm())


def test_validation_curvature_with_the_training_curvature_is_trained_weights() -> None:
    """H_E = H along an eigenvector: the same target as TrainedWeights' Rayleigh filter; with no
    step left, or negative training curvature, the current weights' gradient."""
    q = _OtherCurvature(_Quadratic().H())
    q.along_eigenvector(2)
    now = q.grad_E(q.w.detach())
    look, trained = ValidationCurvature(), TrainedWeights(filter="rayleigh")
    for x in (look, trained):
        x.observe(remaining_steps=20, step_size=0.3)
    (a,) = look.target([now], q.reads())
    (b,) = trained.target([now], StepReads(q.train_gradient))
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    look.observe(remaining_steps=0, step_size=0.3)
    (kept,) = look.target([now], q.reads())
    torch.testing.assert_close(kept, now)
    look.observe(remaining_steps=20, step_size=0.3)
    negative = StepReads(q.train_gradient, q.validation_product, lambda u: [-u[0]])
    (kept,) = look.target([now], negative)
    torch.testing.assert_close(kept, now)


@pytest.mark.filterwarnings("ignore:.*far from a fixed point")
def test_sid_reads_the_validation_curvature_on_the_validation_batch() -> None:
    """Through Algorithm 1 the hypergradient with ValidationCurvature is the current-weights one
    of E(w) − ⟨H_E Σ_T(H)g, w⟩ (g held): the hyper step's products are H on the training batch
    and H_E on the validation batch."""
    q = _OtherCurvature(_validation_hessians()["other"])
    with torch.no_grad():  # underfit weights, a fifth of the way to w*
        q.w.copy_(0.2 * torch.linalg.solve(q.H(), q.b))
    look = ValidationCurvature(iters=8)
    look.observe(remaining_steps=9, step_size=0.2)
    g = q.grad_l(q.w.detach())
    h, V = torch.linalg.eigh(q.H())
    sigma = V @ torch.diag((1 - (1 - 0.2 * h) ** 9) / h) @ V.T
    shift = q.H_E @ sigma @ g

    def moved(batch: object) -> torch.Tensor:
        return q.outer_loss(batch) - shift @ q.w

    g_look = _hopt(q, look).hypergradient([0], None)[0]
    g_moved = _hopt(q, CurrentWeights(), moved).hypergradient([0], None)[0]
    torch.testing.assert_close(g_look, g_moved, rtol=1e-7, atol=1e-12)
    g_now = _hopt(q, CurrentWeights()).hypergradient([0], None)[0]
    assert float((g_look - g_now).norm()) > 0.01 * float(g_now.norm())


@pytest.mark.parametrize("kwargs", [{"batches": 0}, {"iters": 0}, {"filter": "converged"}])
def test_validation_curvature_refuses_bad_settings(kwargs) -> None:
    with pytest.raises(ConfigurationError):
        ValidationCurvature(**kwargs)
    q = _OtherCurvature(_Quadratic().H())
    with pytest.raises(ConfigurationError, match="validation curvature"):
        ValidationCurvature().target([q.grad_E(q.w.detach())], StepReads(q.train_gradient))


def test_the_drop_in_with_validation_curvature_on_a_tanh_network() -> None:
    """Seconds: a tanh network through LearnedWeightDecay(look_ahead=ValidationCurvature())
    trains with finite weights and λ, and reads iters training products and one validation
    product per hyper step with steps left (none at the last, T = 0)."""
    products = {}
    for name, look in (("now", CurrentWeights()), ("validation", ValidationCurvature(iters=2))):
        cb = LearnedWeightDecay(1e-2, every_n_steps=5, look_ahead=look, max_overhead=None)
        trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
        trainer.fit(TanhRegressor(), datamodule=RidgeData())
        lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
        assert bool(torch.isfinite(lam).all()) and len(cb.history) == 6
        products[name] = cb.sid.cost.jacobian_vector_products
    assert look.remaining_steps == 0 and look.step_size is not None
    assert 5 * 3 <= products["validation"] - products["now"] <= 6 * 3


def _step_along(q: _Quadratic, k: int, eta: float, steps: int) -> tuple[float, torch.Tensor]:
    """w_t − w* along the k-th eigenvector of H, then ``steps`` gradient steps (which stay
    along it): its eigenvalue and the weights before the steps."""
    h, V = torch.linalg.eigh(q.H())
    with torch.no_grad():
        q.w.copy_(torch.linalg.solve(q.H(), q.b) + 1.5 * V[:, k])
        before = q.w.detach().clone()
        q.w.copy_(q.after(eta, steps))
    return float(h[k]), before


class _PathReads(StepReads):
    def at(self, weights: list[torch.Tensor]) -> StepReads:
        return StepReads(self.train_gradient, None, self.train_product, weights)


def _path_reads(q: _Quadratic) -> _PathReads:
    """What TrajectoryWeights reads on the quadratic: ∇₁ℓ̂ and H·u (with the weights: ``at``)."""
    return _PathReads(q.train_gradient, None, lambda u: [q.H() @ u[0]])


def _trajectory_target(look: TrajectoryWeights, q: _Quadratic, before: torch.Tensor):
    """The look-ahead's target at w_t after a first hyper step at ``before``."""
    reads = _path_reads(q)
    now = q.w.detach().clone()
    with torch.no_grad():
        q.w.copy_(before)
    (first,) = look.target([q.grad_E(before)], reads.at([q.w]))
    torch.testing.assert_close(first, q.grad_E(before))  # no path yet: the current weights
    with torch.no_grad():
        q.w.copy_(now)
    return look.target([q.grad_E(now)], reads.at([q.w]))[0]


@pytest.mark.parametrize(("k", "steps"), [(0, 40), (3, 7), (7, 60)])
def test_trajectory_weights_is_exact_along_the_path_of_an_eigenvector(k: int, steps: int) -> None:
    """The training's path along one eigenvector of H (E with H's curvature): the Rayleigh
    quotient along the movement is its eigenvalue, and eq. pathgrad is ∇₁E after the T
    remaining steps exactly — also along the flattest direction (k = 0, ηhT = 0.4: the training
    removes a third of g there, TrainedWeights all of it)."""
    q, eta, remaining = _Quadratic(), 0.2, 40
    h, before = _step_along(q, k, eta, 5)
    look = TrajectoryWeights()
    look.observe(remaining_steps=remaining, step_size=eta)
    target = _trajectory_target(look, q, before)
    truth = q.grad_E(q.after(eta, remaining))
    torch.testing.assert_close(target, truth, rtol=1e-9, atol=1e-12)
    assert math.isclose(look.last_curvature, h, rel_tol=1e-9)
    assert math.isclose(look.last_filter, 1 - (1 - eta * h) ** remaining, rel_tol=1e-9)
    if k == 0:
        now = q.grad_E(q.w.detach())
        converged = now - q.grad_l(q.w.detach())  # TrainedWeights()
        assert float((converged - truth).norm()) > float((now - truth).norm())


def test_trajectory_weights_starts_its_path_where_the_hyper_optimizer_was_built() -> None:
    """SIDHyperOptimizer hands the look-ahead the weights it starts from: the first hyper step's
    path runs from there (here 5 gradient steps along an eigenvector: exact, as above)."""
    q, eta = _Quadratic(), 0.2
    h, before = _step_along(q, 2, eta, 5)
    now = q.w.detach().clone()
    with torch.no_grad():
        q.w.copy_(before)
    look = TrajectoryWeights()
    _hopt(q, look)  # built at `before`
    assert look.previous is not None
    with torch.no_grad():
        q.w.copy_(now)
    look.observe(remaining_steps=20, step_size=eta)
    reads = _path_reads(q)
    (target,) = look.target([q.grad_E(now)], reads.at([q.w]))
    torch.testing.assert_close(target, q.grad_E(q.after(eta, 20)), rtol=1e-9, atol=1e-12)
    assert math.isclose(look.last_curvature, h, rel_tol=1e-9)


def test_trajectory_weights_on_a_retry_and_at_the_end() -> None:
    """A retried hyper step (same weights again) reuses the filter it read; with no step left
    the current weights' gradient; bad settings and a missing product are refused."""
    q, eta = _Quadratic(), 0.2
    _, before = _step_along(q, 4, eta, 5)
    look = TrajectoryWeights()
    look.observe(remaining_steps=30, step_size=eta)
    target = _trajectory_target(look, q, before)
    reads = _path_reads(q)
    (again,) = look.target([q.grad_E(q.w.detach())], reads.at([q.w]))
    torch.testing.assert_close(again, target)
    # along negative curvature the filter reads the time scale 1/(η|h_d|) of the movement
    h, before = _step_along(q, 4, eta, 5)
    look = TrajectoryWeights()
    look.observe(remaining_steps=30, step_size=eta)
    look.target([q.grad_E(before)], reads.at([before]))
    negative = StepReads(q.train_gradient, None, lambda u: [-(q.H() @ u[0])], [q.w])
    (flipped,) = look.target([q.grad_E(q.w.detach())], negative)
    torch.testing.assert_close(flipped, target)
    assert math.isclose(look.last_curvature, -h, rel_tol=1e-9)
    look.observe(remaining_steps=0, step_size=eta)
    (end,) = look.target([q.grad_E(q.w.detach())], reads.at([q.w]))
    torch.testing.assert_close(end, q.grad_E(q.w.detach()))
    for kwargs in ({"batches": 0}, {"filter": "converged"}):
        with pytest.raises(ConfigurationError):
            TrajectoryWeights(**kwargs)
    with pytest.raises(ConfigurationError, match="weights"):
        TrajectoryWeights().target([q.grad_E(q.w.detach())], StepReads(q.train_gradient))


def test_the_drop_in_with_trajectory_weights_on_a_tanh_network() -> None:
    """Seconds: a tanh network through LearnedWeightDecay(look_ahead=TrajectoryWeights())
    trains with finite weights and λ; from the second hyper step on the filter is read along
    the weights' movement (a curvature, a filter in [0, 1])."""
    look = TrajectoryWeights()
    cb = LearnedWeightDecay(1e-2, every_n_steps=5, look_ahead=look, max_overhead=None)
    trainer = lightning_problems.trainer([cb], max_steps=30, limit_val_batches=0)
    trainer.fit(TanhRegressor(), datamodule=RidgeData())
    lam = torch.cat([v.flatten() for v in cb.decay_values().values()])
    assert bool(torch.isfinite(lam).all()) and len(cb.history) == 6
    assert look.last_curvature is not None and 0.0 <= look.last_filter <= 1.0
    assert look.previous is not None and look.remaining_steps == 0
