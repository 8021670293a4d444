"""The two exact Hessian–vector product forms of the GD map, and buffers under the adjoint solve.

∂₁Φ̂ᵀv = v − α∇²₁₁ℓ̂ v (section 2) needs ∇²₁₁ℓ̂ v. ``hvp="reverse"`` (double backward) and
``hvp="forward"`` (torch.func forward-over-reverse) must give the same product — checked here
against each other and against an independent oracle, central finite differences of the gradient
in float64 — on an MLP and on a CNN with BatchNorm in train mode (batch statistics) and eval mode
(running statistics). The adjoint solve must leave BatchNorm's running statistics unchanged
(issue 2, item 6; :func:`frozen_mode`).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hypertorch_sid import (
    ConfigurationError,
    ConstantStep,
    EstimatedCurvature,
    GradientDescentMap,
    SIDConfig,
    SIDHyperOptimizer,
    adjoint_solve,
    assemble_hypergradient,
    frozen_mode,
)
from hypertorch_sid.core.batches import BatchStream

DTYPE = torch.float64


def make_model(kind: str, act: type[nn.Module] = nn.Tanh) -> nn.Module:
    if kind == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(36, 12), act(), nn.Linear(12, 3))
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 3, 3, padding=1),
            nn.BatchNorm2d(3),
            act(),
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            act(),
            nn.Flatten(),
            nn.Linear(4 * 6 * 6, 3),
        )
    return model.to(DTYPE)


def batches(n: int = 6, size: int = 10) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(size, 1, 6, 6, generator=g, dtype=DTYPE),
            torch.randint(0, 3, (size,), generator=g),
        )
        for _ in range(n)
    ]


def weight_decay_loss(model: nn.Module, log_lam: list[torch.Tensor]):
    """CE + ½ Σ_i exp(log λ_i) ‖w_i‖², parameters read at call time (as forward mode needs)."""

    def inner_loss(batch):
        x, y = batch
        penalty = sum(ll.exp() * (p * p).sum() for ll, p in zip(log_lam, model.parameters()))
        return F.cross_entropy(model(x), y) + 0.5 * penalty

    return inner_loss


def setup(kind: str, act: type[nn.Module] = nn.Tanh):
    torch.manual_seed(0)
    model = make_model(kind, act)
    # non-trivial running statistics, so that eval mode differs from train mode
    with torch.no_grad():
        for x, _ in batches(3, 20):
            model(x)
    params = list(model.parameters())
    log_lam = [torch.tensor(math.log(0.05), dtype=DTYPE, requires_grad=True) for _ in params]
    loss = weight_decay_loss(model, log_lam)
    rev = GradientDescentMap(loss, params, log_lam, alpha=0.1, hvp="reverse")
    fwd = GradientDescentMap(loss, params, log_lam, alpha=0.1, hvp="forward", module=model)
    return model, params, log_lam, rev, fwd


def buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().clone() for n, b in model.named_buffers()}


def assert_same_buffers(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"buffer {k} changed"


def rel_err(a, b) -> float:
    num = sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b))
    return math.sqrt(num / sum(float((y**2).sum()) for y in b))


def fd_hvp(phi: GradientDescentMap, batch, v, eps: float = 1e-5):
    """(∇ℓ̂(w + εv) − ∇ℓ̂(w − εv)) / 2ε: an oracle independent of both HVP forms."""
    w = phi.inner_parameters
    w0 = [p.detach().clone() for p in w]
    out = []
    for sign in (1.0, -1.0):
        with torch.no_grad():
            for p, p0, vi in zip(w, w0, v):
                p.copy_(p0 + sign * eps * vi)
        out.append(phi.gradient(batch))
    with torch.no_grad():
        for p, p0 in zip(w, w0):
            p.copy_(p0)
    return [(a - b) / (2 * eps) for a, b in zip(*out)]


@pytest.mark.parametrize("kind, mode", [("mlp", "train"), ("cnn_bn", "train"), ("cnn_bn", "eval")])
def test_forward_and_reverse_hvp_agree_and_match_finite_differences(kind, mode):
    model, params, _, rev, fwd = setup(kind)
    batch = batches()[0]
    v = [torch.randn_like(p) for p in params]
    with frozen_mode(model, mode):
        h_rev = rev.hessian_vector_product(batch, v)
        h_fwd = fwd.hessian_vector_product(batch, v)
        h_fd = fd_hvp(rev, batch, v)
    assert rel_err(h_fwd, h_rev) < 1e-12
    assert rel_err(h_rev, h_fd) < 1e-7
    assert rel_err(h_fwd, h_fd) < 1e-7
    # the weight-decay term is part of the product (λ_i v_i alone would be far off)
    assert rel_err(h_rev, [0.05 * vi for vi in v]) > 1e-2


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_forward_and_reverse_hvp_agree_with_relu_bn_cnn(mode):
    model, params, _, rev, fwd = setup("cnn_bn", nn.ReLU)
    batch = batches()[1]
    v = [torch.randn_like(p) for p in params]
    with frozen_mode(model, mode):
        assert (
            rel_err(fwd.hessian_vector_product(batch, v), rev.hessian_vector_product(batch, v))
            < 1e-12
        )


def test_forward_hvp_never_writes_the_module_buffers_even_in_train_mode():
    model, params, _, rev, fwd = setup("cnn_bn")
    model.train()
    batch = batches()[2]
    v = [torch.randn_like(p) for p in params]
    before = buffers(model)
    fwd.hessian_vector_product(batch, v)
    assert_same_buffers(before, buffers(model))
    # control: a reverse product outside frozen_mode does update the running statistics
    rev.hessian_vector_product(batch, v)
    assert not torch.equal(before["1.running_mean"], model[1].running_mean)
    assert int(model[1].num_batches_tracked) > int(before["1.num_batches_tracked"])


@pytest.mark.parametrize("hvp", ["reverse", "forward"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_adjoint_solve_in_frozen_mode_keeps_running_stats_and_flags(hvp, mode):
    model, params, log_lam, rev, fwd = setup("cnn_bn")
    phi = rev if hvp == "reverse" else fwd
    model.train()
    model[4].eval()  # a mixed state, which must come back as it was
    flags = [m.training for m in model.modules()]
    before = buffers(model)
    stream = BatchStream(batches(), "train_batches")
    g_w = [0.1 * torch.randn_like(p) for p in params]
    with frozen_mode(model, mode):
        # "train" on a module in training mode keeps its submodules' flags (the map its
        # training iterates, session 50); "eval" switches every one off
        assert [m.training for m in model.modules()] == (
            flags if mode == "train" else [False] * len(flags)
        )
        v, result = adjoint_solve(
            phi, g_w, [torch.zeros_like(p) for p in params], stream, 4, ConstantStep(1.0)
        )
        hg = assemble_hypergradient(
            phi, v, [torch.zeros_like(ll) for ll in log_lam], stream.take(2)
        )
    assert result.steps == 4 and math.isfinite(result.residual)
    assert all(torch.isfinite(h).all() for h in hg)
    assert_same_buffers(before, buffers(model))
    assert [m.training for m in model.modules()] == flags


def test_adjoint_solve_forward_and_reverse_give_the_same_v():
    model, params, _, rev, fwd = setup("cnn_bn")
    g_w = [0.1 * torch.randn_like(p) for p in params]
    out = []
    for phi in (rev, fwd):
        with frozen_mode(model, "train"):
            v, _ = adjoint_solve(
                phi,
                g_w,
                [torch.zeros_like(p) for p in params],
                BatchStream(batches()),
                5,
                ConstantStep(0.5),
            )
        out.append(v)
    assert rel_err(out[1], out[0]) < 1e-12


def test_forward_hvp_rejects_a_closure_that_reads_captured_parameters():
    """A penalty over a parameter list captured once bypasses the module: forward mode would drop
    its Hessian silently, so the first product must raise instead."""
    model = make_model("mlp")
    params = list(model.parameters())
    log_lam = torch.tensor(0.0, dtype=DTYPE, requires_grad=True)

    def captured(batch):
        x, y = batch
        return F.cross_entropy(model(x), y) + 0.5 * log_lam.exp() * sum(
            (p * p).sum() for p in params
        )

    fwd = GradientDescentMap(captured, params, [log_lam], alpha=0.1, hvp="forward", module=model)
    with pytest.raises(ConfigurationError, match="directly"):
        fwd.hessian_vector_product(batches()[0], [torch.ones_like(p) for p in params])


def _bn_sid(model, log_lam, hvp, mode, estimate=False):
    inner = weight_decay_loss(model, log_lam)

    def outer(batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    constants = {} if estimate else {"alpha": 0.1, "eta": 0.5}  # estimate: power iteration for L, μ
    return SIDHyperOptimizer(
        log_lam,
        model.parameters(),
        inner,
        outer,
        None,
        module=model,
        config=SIDConfig(
            **constants,
            inner_steps=0,
            adjoint_steps=3,
            step_size="constant",
            hvp=hvp,
            mode=mode,
            curvature=EstimatedCurvature(iters=5),
        ),
    )


@pytest.mark.parametrize(
    "hvp, mode, estimate",
    [("reverse", "train", False), ("forward", "train", False), ("reverse", "eval", False),
     ("reverse", "train", True), ("forward", "train", True)],
)  # fmt: skip
def test_hypergradient_with_zero_inner_steps_keeps_running_stats(hvp, mode, estimate):
    """With t = 0 (Lightning's own steps are the inner solver) a hypergradient is adjoint solve +
    assembly only, so the model's buffers must not move — also on the first call, which checks
    the inputs and may estimate L and μ by power iteration."""
    model, _, log_lam, _, _ = setup("cnn_bn")
    model.train()
    hopt = _bn_sid(model, log_lam, hvp, mode, estimate)
    before = buffers(model)
    for _ in range(2):
        g = hopt.hypergradient(batches(), batches()[5])
        assert all(torch.isfinite(x).all() for x in g)
    assert_same_buffers(before, buffers(model))
    assert model.training
