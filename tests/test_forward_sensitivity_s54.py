"""Oracle tests of the forward sensitivity ∂w_T/∂λ (eq. forwardsens) on ridge trained by SGD."""

import pytest
import torch

from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.forward_sensitivity import ForwardSensitivity

D = torch.float64


def _ridge(seed=0, n=20, d=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=D)
    y = torch.randn(n, generator=g, dtype=D)
    xv = torch.randn(n, d, generator=g, dtype=D)
    yv = torch.randn(n, generator=g, dtype=D)
    return x, y, xv, yv


def _train(lam, x, y, steps=30, eta=0.05, sens=None):
    """Full-batch SGD on ½|Xw − y|²/n + ½λ|w|² from w₀ = 1; feeds ``sens`` each step."""
    w = torch.ones(x.shape[1], dtype=D)
    h = x.T @ x / len(y)
    for _ in range(steps):
        if sens is not None:
            sens.step([w], eta, lam, hvp=lambda v: [h @ v[0]])
        w = w - eta * (h @ w - x.T @ y / len(y) + lam * w)
    return w


def test_sensitivity_equals_the_finite_difference_of_the_whole_training():
    x, y, _, _ = _ridge()
    lam, eps = 0.3, 1e-6
    sens = ForwardSensitivity()
    _train(lam, x, y, sens=sens)
    fd = (_train(lam + eps, x, y) - _train(lam - eps, x, y)) / (2 * eps)
    assert torch.allclose(sens.z[0], fd, atol=1e-8)


def test_hypergradient_equals_the_finite_difference_of_the_validation_loss():
    x, y, xv, yv = _ridge(1)
    lam, eps = 0.2, 1e-6

    def val(w):
        return 0.5 * ((xv @ w - yv) ** 2).mean()

    sens = ForwardSensitivity()
    w = _train(lam, x, y, sens=sens).requires_grad_()
    (g,) = torch.autograd.grad(val(w), w)
    fd = (val(_train(lam + eps, x, y)) - val(_train(lam - eps, x, y))) / (2 * eps)
    assert sens.hypergradient([g]).item() == pytest.approx(fd.item(), rel=1e-6, abs=1e-10)


def test_decay_path_alone_is_the_closed_form_of_pure_decay():
    """ℓ = 0: w_T = (1 − ηλ)^T w₀, so ∂w_T/∂λ = −Tη(1 − ηλ)^(T−1) w₀, per-element η."""
    w0 = torch.tensor([1.0, -2.0, 3.0], dtype=D)
    eta = torch.tensor([0.1, 0.01, 0.05], dtype=D)
    lam, steps = 0.7, 25
    sens = ForwardSensitivity()
    w = w0.clone()
    for _ in range(steps):
        sens.step([w], [eta], lam)
        w = (1 - eta * lam) * w
    expected = -steps * eta * (1 - eta * lam) ** (steps - 1) * w0
    assert torch.allclose(sens.z[0], expected, rtol=1e-12)


def test_bad_input_names_the_fix():
    with pytest.raises(ConfigurationError, match="forgetting"):
        ForwardSensitivity(forgetting=0.0)
    sens = ForwardSensitivity()
    sens.step([torch.ones(2)], 0.1, 0.1)
    with pytest.raises(ConfigurationError, match="same decayed group"):
        sens.step([torch.ones(2), torch.ones(3)], 0.1, 0.1)
    with pytest.raises(ConfigurationError, match="one step-size tensor per weight"):
        ForwardSensitivity().step([torch.ones(2)], [torch.ones(2), torch.ones(2)], 0.1)
