"""Oracle tests of the forward sensitivity z = ∂w_T/∂λ (eq. fwdcoupled, eq. fwddecoupled) along
trainings by torch's own SGD (momentum, Nesterov), Adam and AdamW-like decoupled decay."""

import pytest
import torch

from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.forward_sensitivity import (
    ForwardSensitivity,
    StaticStep,
    update_rule,
)

D = torch.float64
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.9, dampening=0.1),
    "nesterov": lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.8, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.9)),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, betas=(0.8, 0.9), weight_decay=0.0),
}


def _data(seed=0, n=20, d=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=D) for s in ((n, d), (n,), (n, d), (n,))]


def _ridge(x, y):
    """ℓ(w) = ½|Xw − y|²/n: its gradient and its Hessian–vector product."""
    h = x.T @ x / len(y)
    return (lambda w: h @ w - x.T @ y / len(y)), (lambda v: [h @ v[0]])


def _linear(x, y):
    """ℓ(w) = ⟨c, w⟩: H = 0, so the decay path is the whole derivative."""
    c = x.T @ y / len(y)
    return (lambda w: c), None


def _train(lam, make, loss, decoupled=False, steps=30, sens=None, hvp=None):
    """Train w from 1 with torch's optimizer, the decay added as LearnedWeightDecay adds it:
    coupled g = ∇ℓ + λw, or decoupled w ← (1 − lr λ) w before the step; feed ``sens``."""
    grad_of, _ = loss
    w = torch.ones(5, dtype=D, requires_grad=True)
    opt = make([w])
    for _ in range(steps):
        with torch.no_grad():
            g = grad_of(w) if decoupled else grad_of(w) + lam * w
            group = opt.param_groups[0]
            if sens is not None:
                rule = StaticStep() if decoupled and hvp is None else update_rule(opt, group, w, g)
                sens.step([w], [lam], [rule], [group["lr"]] if decoupled else None, hvp)
            if decoupled:
                w.mul_(1 - group["lr"] * lam)
            w.grad = g.clone()
        opt.step()
    return w.detach()


def _fd(f, lam, eps=1e-6):
    return (f(lam + eps) - f(lam - eps)) / (2 * eps)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("decoupled", [False, True])
def test_z_equals_the_finite_difference_of_the_whole_training(name, decoupled):
    """With the exact H, z is ∂w_T/∂λ of the training that ran: torch's step, moments and all."""
    x, y, _, _ = _data()
    loss, lam = _ridge(x, y), 0.3
    sens = ForwardSensitivity()
    _train(lam, OPTIMIZERS[name], loss, decoupled, sens=sens, hvp=loss[1])
    fd = _fd(lambda v: _train(v, OPTIMIZERS[name], loss, decoupled), lam)
    assert fd.abs().max() > 1e-2  # λ moves w_T
    assert torch.allclose(sens.z[0], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("decoupled", [False, True])
def test_decay_path_hypergradient_equals_the_finite_difference_where_h_is_zero(name, decoupled):
    """ℓ linear in w (H = 0): the decay path (hvp=None, StaticStep decoupled) is the whole
    derivative, so ⟨∇E(w_T), z_T⟩ equals the finite difference of the validation loss."""
    x, y, xv, yv = _data(1)
    loss, lam = _linear(x, y), 0.2

    def val(w):
        return 0.5 * ((xv @ w - yv) ** 2).mean()

    sens = ForwardSensitivity()
    w = _train(lam, OPTIMIZERS[name], loss, decoupled, sens=sens).requires_grad_()
    (g,) = torch.autograd.grad(val(w), w)
    fd = _fd(lambda v: val(_train(v, OPTIMIZERS[name], loss, decoupled)), lam)
    assert abs(fd.item()) > 1e-3
    assert sens.hypergradient([g]).item() == pytest.approx(fd.item(), rel=1e-6, abs=1e-10)


def test_decay_path_is_not_the_whole_derivative_where_h_is_not_zero():
    """The oracle above is not vacuous: on ridge (H ≠ 0) dropping H z changes z."""
    x, y, _, _ = _data()
    loss = _ridge(x, y)
    exact, path = ForwardSensitivity(), ForwardSensitivity()
    _train(0.3, OPTIMIZERS["momentum"], loss, sens=exact, hvp=loss[1])
    _train(0.3, OPTIMIZERS["momentum"], loss, sens=path)
    assert not torch.allclose(exact.z[0], path.z[0], rtol=1e-2)


def test_decoupled_pure_decay_is_the_closed_form():
    """ℓ = 0, decoupled: w_T = (1 − ηλ)^T w₀, so ∂w_T/∂λ = −Tη(1 − ηλ)^(T−1) w₀ (per element λ)."""
    w0 = torch.tensor([1.0, -2.0, 3.0], dtype=D)
    lam = torch.tensor([0.7, 0.1, 2.0], dtype=D)
    eta, steps = 0.05, 25
    sens = ForwardSensitivity()
    w = w0.clone()
    for _ in range(steps):
        sens.step([w], [lam], [StaticStep()], [eta])
        w = (1 - eta * lam) * w
    expected = -steps * eta * (1 - eta * lam) ** (steps - 1) * w0
    assert torch.allclose(sens.z[0], expected, rtol=1e-12)


def test_forgetting_weights_recent_steps():
    """Pure decoupled decay with forgetting f: z_{t+1} = f(1 − ηλ) z_t − ηw_t, by hand."""
    w, lam, eta, f = torch.tensor([2.0], dtype=D), 0.5, 0.1, 0.9
    sens, z = ForwardSensitivity(forgetting=f), torch.zeros(1, dtype=D)
    for _ in range(10):
        sens.step([w], [lam], [StaticStep()], [eta])
        z = f * (1 - eta * lam) * z - eta * w
        w = (1 - eta * lam) * w
    assert torch.allclose(sens.z[0], z, rtol=1e-12)


def test_state_round_trip_continues_the_same_z():
    """z and the moments' tangents are state: a sensitivity restored mid-training ends where
    an uninterrupted one does (Adam: ṁ and v̇ matter)."""
    x, y, _, _ = _data()
    loss, make = _ridge(x, y), OPTIMIZERS["adam"]
    whole = ForwardSensitivity()
    _train(0.3, make, loss, sens=whole, steps=20)
    first = ForwardSensitivity()
    w = torch.ones(5, dtype=D, requires_grad=True)
    opt = make([w])
    for t in range(20):
        if t == 10:
            saved = first.state_dict()
            first = ForwardSensitivity()
            first.load_state_dict(saved)
        with torch.no_grad():
            g = loss[0](w) + 0.3 * w
            first.step([w], [0.3], [update_rule(opt, opt.param_groups[0], w, g)])
            w.grad = g.clone()
        opt.step()
    assert set(first.moments[0]) == {"m", "v"}
    assert torch.allclose(first.z[0], whole.z[0], rtol=1e-12)


def test_bad_input_names_the_fix():
    with pytest.raises(ConfigurationError, match="forgetting"):
        ForwardSensitivity(forgetting=0.0)
    sens = ForwardSensitivity()
    sens.step([torch.ones(2)], [0.1], [StaticStep()], [0.1])
    with pytest.raises(ConfigurationError, match="same decayed weights"):
        sens.step([torch.ones(2), torch.ones(3)], [0.1, 0.1], [None, None], [0.1, 0.1])
    with pytest.raises(ConfigurationError, match="one per weight"):
        ForwardSensitivity().step([torch.ones(2)], [0.1, 0.2], [StaticStep()])
    with pytest.raises(ConfigurationError, match="not a ForwardSensitivity state"):
        ForwardSensitivity().load_state_dict({"z": None})
    w = torch.ones(2, requires_grad=True)
    for opt, match in (
        (torch.optim.RMSprop([w]), "SGD, Adam, AdamW only, not RMSprop"),
        (torch.optim.Adam([w], amsgrad=True), "amsgrad=False"),
        (torch.optim.SGD([w], lr=0.1, weight_decay=1e-3), "weight_decay=0"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            update_rule(opt, opt.param_groups[0], w, torch.ones(2))
