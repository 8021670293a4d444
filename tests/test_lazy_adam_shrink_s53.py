"""LazyAdam(shrink=z²), eq. shrunkstep (session 53): each row moves by its cumulative normalised
evidence S shrunk by max(0, 1 − z² Q / S²), Q its sum of squares."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from hypertorch_sid import LearnedDataWeights
from hypertorch_sid.core.errors import ConfigurationError
from hypertorch_sid.core.lazy_adam import LazyAdam


def _visits(grads: torch.Tensor, **settings) -> torch.Tensor:
    """The logits after one LazyAdam step per row of ``grads`` (shape (visits, n)); a zero
    entry leaves its row unread at that step."""
    x = torch.zeros(grads.shape[1], requires_grad=True)
    opt = LazyAdam([x], lr=1.0, betas=(0.0, 0.999), **settings)
    for g in grads:
        x.grad = g.clone()
        opt.step()
    return x.detach()


def test_shrink_zero_is_the_plain_step_bit_for_bit():
    g = torch.randn(30, 50) * (torch.rand(30, 50) < 0.3)
    assert torch.equal(_visits(g), _visits(g, shrink=0.0))


def test_one_sign_keeps_all_but_z2_of_its_steps():
    # constant gradient: every normalised step is 1, so S = Q = t and J = t − z² (t ≥ z²)
    g = torch.full((5, 3), 0.3)
    for z2 in (1.0, 2.0):
        x = _visits(g, shrink=z2)
        assert torch.allclose(x, torch.full((3,), -(5 - z2)), atol=1e-5)
    # the plain step moves it by all five
    assert torch.allclose(_visits(g), torch.full((3,), -5.0), atol=1e-5)


def test_alternating_signs_never_move_the_row():
    g = torch.tensor([[1.0], [-1.0]] * 6)
    assert float(_visits(g, shrink=1.0).abs().max()) == 0.0
    assert float(_visits(g[:-1]).abs().max()) > 0.5  # the plain step ends a visit away


def test_rows_of_noise_stay_near_their_start_and_the_ranking_is_kept():
    """The mechanism of docs/failures.md (session 53) on the outer step alone: seven visits,
    rows of three kinds — pushed down (mean 0.6 of the noise), noise only (a hard clean row
    whose evidence the validation data cannot read), pushed up. With ±1 steps a fifth of the
    noise rows end two logits below the start (ω = σ(−2) ≈ 0.12 from ½), where most of the
    pushed-down rows are; eq. shrunkstep moves the noise rows a third as far and the pushed rows
    still most of their way, and the ranking of the pushed kinds (the flags) is kept."""
    gen = torch.Generator().manual_seed(0)
    n = 3000
    # a positive hypergradient pushes a logit down (x ← x − lr·step)
    mean = torch.cat([torch.full((n,), 0.6), torch.zeros(n), torch.full((n,), -0.6)])
    g = mean + torch.randn(7, 3 * n, generator=gen)
    down, noise, up = slice(0, n), slice(n, 2 * n), slice(2 * n, 3 * n)
    plain, shrunk = _visits(g), _visits(g, shrink=1.0)

    def sunk(x: torch.Tensor) -> float:
        return float((x[noise] < -2).float().mean())

    assert sunk(plain) > 0.15 and sunk(shrunk) < 0.5 * sunk(plain)
    assert float(shrunk[noise].abs().mean()) < 0.4 * float(plain[noise].abs().mean())
    assert float(shrunk[down].mean()) < 0.5 * float(plain[down].mean()) < 0  # still down
    for x in (plain, shrunk):  # the pushed-down rows below the pushed-up ones, either way
        assert float((x[down].unsqueeze(1) < x[up][:500]).float().mean()) > 0.9


def test_bad_shrink_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="shrink"):
        LazyAdam([torch.zeros(2, requires_grad=True)], shrink=-1.0)
    with pytest.raises(ConfigurationError, match="shrink"):
        LearnedDataWeights(shrink=-0.5)
    with pytest.raises(ConfigurationError, match="shrink"):
        LearnedDataWeights(shrink=1.0, outer_optimizer=functools.partial(torch.optim.SGD, lr=0.1))


def test_the_shrunk_sums_resume_from_a_checkpoint():
    g = torch.randn(8, 20)
    x = torch.zeros(20, requires_grad=True)
    opt = LazyAdam([x], lr=1.0, betas=(0.0, 0.999), shrink=1.0)
    for k in range(4):
        x.grad = g[k].clone()
        opt.step()
    y = x.detach().clone().requires_grad_(True)
    resumed = LazyAdam([y], lr=1.0, betas=(0.0, 0.999), shrink=1.0)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))  # a checkpoint: its own copy
    for k in range(4, 8):
        x.grad, y.grad = g[k].clone(), g[k].clone()
        opt.step()
        resumed.step()
    # to float32 rounding: torch's load_state_dict casts the visit counts to the logits' dtype,
    # as it does without shrink
    assert torch.allclose(x, y, atol=1e-4)
    for key in ("evidence_sum", "evidence_sq"):
        assert torch.allclose(resumed.state[y][key], opt.state[x][key], atol=1e-4)
