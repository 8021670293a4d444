"""Validation gaps found by a careless-user probe: each is now a clear error (or a warning).

Every check is tested by calling its function directly and, where ``SIDHyperOptimizer`` already
routes through it, through the optimizer too. Each ``match`` asserts that the message names both
the problem and the fix.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from problems import full_batch_sid, make_ridge, relative_error
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hypertorch_sid import ConfigurationError, KnownCurvature, SIDConfig, SIDHyperOptimizer
from hypertorch_sid.core.outer import _validation_batches, outer_gradients
from hypertorch_sid.core.second_order import check_second_derivatives, twice_differentiable
from hypertorch_sid.core.validation import (
    check_batch_dtype,
    check_contraction,
    check_dtypes,
    check_outer_optimizer,
    check_parameters,
    estimate_contraction,
)


def build(hyper, inner, outer_optimizer=None):
    def loss(_):
        return sum((w**2).sum() for w in inner) + sum(h.sum() for h in hyper)

    return SIDHyperOptimizer(
        hyper, inner, loss, loss, outer_optimizer, config=SIDConfig(inner_steps=5, adjoint_steps=5)
    )


def leaf(n=3, dtype=torch.float64):
    return torch.zeros(n, dtype=dtype, requires_grad=True)


# ====================================================================== 1. duplicated tensors


def test_same_inner_parameter_twice():
    w, lam = leaf(), leaf()
    with pytest.raises(
        ConfigurationError,
        match=r"inner_parameters\[0\] and inner_parameters\[2\] are the same "
        r"tensor.*pass each tensor once",
    ):
        check_parameters([w, leaf(), w], [lam])
    with pytest.raises(ConfigurationError, match=r"same tensor.*pass each tensor once"):
        build([lam], [w, w])


def test_same_hyperparameter_twice():
    w, lam = leaf(), leaf()
    with pytest.raises(
        ConfigurationError,
        match=r"hyperparameters\[0\] and hyperparameters\[1\] are the same "
        r"tensor.*pass each tensor once",
    ):
        check_parameters([w], [lam, lam])
    with pytest.raises(ConfigurationError, match=r"same tensor.*pass each tensor once"):
        build([lam, lam], [w])


def test_one_tensor_as_inner_parameter_and_hyperparameter():
    w = leaf()
    with pytest.raises(ConfigurationError, match=r"also inner parameters.*different tensors"):
        check_parameters([w], [w])


# ====================================================================== 2. shared storage


def shared_leaves():
    """w and λ: leaf views of one parameter's storage (the careless way to split a buffer)."""
    p = nn.Parameter(torch.zeros(10, dtype=torch.float64))
    w = p.data[:6].requires_grad_()
    lam = p.data[4:].requires_grad_()  # elements 4 and 5 are both w and λ
    return w, lam


def test_inner_parameter_and_hyperparameter_sharing_storage():
    w, lam = shared_leaves()
    assert w.is_leaf and lam.is_leaf
    with pytest.raises(
        ConfigurationError,
        match=r"inner_parameters\[0\] and hyperparameters\[0\] share memory.*clone\(\)",
    ):
        check_parameters([w], [lam])
    with pytest.raises(ConfigurationError, match=r"share memory.*clone\(\)"):
        build([lam], [w])


def test_whole_view_of_a_hyperparameter_as_inner_parameter():
    lam = leaf(4)
    w = lam.detach().view(2, 2).requires_grad_()  # same bytes, another shape
    with pytest.raises(ConfigurationError, match=r"share memory.*separate tensors"):
        check_parameters([w], [lam])


def test_views_of_one_buffer_that_do_not_overlap_are_accepted():
    buf = torch.zeros(10, dtype=torch.float64)
    w = buf[:5].requires_grad_()
    lam = buf[5:].requires_grad_()
    check_parameters([w], [lam])  # disjoint bytes of one storage: updates never interfere
    even = buf[0::2].requires_grad_()
    odd = buf[1::2].requires_grad_()  # interleaved: the byte ranges overlap, the elements do not
    check_parameters([even], [odd])


# ====================================================================== 3. dtypes


def test_mixed_dtypes_between_w_and_lambda():
    with pytest.raises(
        ConfigurationError,
        match=r"different dtypes \['torch.float32', 'torch.float64'\].*use one dtype.*"
        r"\.double\(\).*\.float\(\)",
    ):
        check_dtypes([leaf(dtype=torch.float32)], [leaf()])
    with pytest.raises(ConfigurationError, match=r"different dtypes.*\.double\(\)"):
        build([leaf()], [leaf(dtype=torch.float32)])


def test_mixed_dtypes_among_inner_parameters():
    with pytest.raises(ConfigurationError, match=r"different dtypes.*\.double\(\)"):
        check_dtypes([leaf(), leaf(dtype=torch.float32)], [leaf()])
    check_dtypes([leaf(), leaf()], [leaf()])  # one dtype: fine


def test_float32_batch_with_float64_parameters():
    X, y = torch.zeros(4, 3), torch.zeros(4)
    with pytest.raises(
        ConfigurationError,
        match=r"batch\[0\] has dtype torch.float32.*parameters are torch.float64.*"
        r"\.double\(\).*\.float\(\)",
    ):
        check_batch_dtype((X, y), [leaf()])
    with pytest.raises(ConfigurationError, match=r"batch\['x'\] has dtype torch.float32"):
        check_batch_dtype({"x": X, "idx": torch.arange(4)}, [leaf()])


def test_batch_with_the_parameters_dtype_and_integer_labels_is_accepted():
    X, labels = torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.long)
    check_batch_dtype((X, labels), [leaf()])
    check_batch_dtype([(X, labels), {"x": [X]}], [leaf()])
    check_batch_dtype("not a tensor", [leaf()])


# ====================================================================== 4. LBFGS


def test_lbfgs_outer_optimizer_is_refused():
    w, lam = leaf(), leaf()
    lbfgs = torch.optim.LBFGS([lam])
    with pytest.raises(ConfigurationError, match=r"LBFGS.*closure.*Adam.*SGD"):
        check_outer_optimizer(lbfgs, [w], [lam])
    with pytest.raises(ConfigurationError, match=r"LBFGS.*closure.*Adam.*SGD"):
        build([lam], [w], outer_optimizer=lbfgs)


# ====================================================================== 5. detached w in E


def detached_outer_loss(problem):
    def outer_loss(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w.detach() - y) ** 2).mean() + 0.01 * (problem.log_lam**2).sum()

    return outer_loss


def test_outer_loss_reading_w_only_through_detach_warns_once():
    problem = make_ridge()
    params = ([problem.w], [problem.log_lam])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            g_w, g_lam, _ = outer_gradients(detached_outer_loss(problem), problem.val(), *params)
    relevant = [w for w in caught if "implicit part" in str(w.message)]
    assert len(relevant) == 1
    assert issubclass(relevant[0].category, UserWarning)
    assert "does not depend on the inner parameters" in str(relevant[0].message)
    assert ".detach()" in str(relevant[0].message)
    assert torch.count_nonzero(g_w[0]) == 0 and torch.count_nonzero(g_lam[0]) > 0


def test_outer_loss_reading_w_only_through_detach_warns_through_the_optimizer():
    problem = make_ridge()
    hopt = full_batch_sid(problem, 20)
    hopt.outer_loss = detached_outer_loss(problem)
    with pytest.warns(UserWarning, match=r"implicit part of the hypergradient is zero.*detach"):
        hopt.hypergradient([problem.train()], problem.val())


def test_outer_loss_using_w_does_not_warn():
    problem = make_ridge()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outer_gradients(problem.outer_loss, problem.val(), [problem.w], [problem.log_lam])


def test_outer_loss_depending_on_neither_still_raises():
    problem = make_ridge()

    def outer_loss(batch):
        X, y = batch
        return 0.5 * ((X @ problem.w.detach() - y) ** 2).mean() + 0 * problem.log_lam.detach().sum()

    with pytest.raises(ConfigurationError, match=r"depends on neither"):
        outer_gradients(outer_loss, problem.val(), [problem.w], [problem.log_lam])


# ====================================================================== 6. lists of val batches


def split_val(problem, sizes=(100, 100)):
    Xs = problem.X_val.split(list(sizes))
    ys = problem.y_val.split(list(sizes))
    return list(zip(Xs, ys))


def test_two_tensors_are_one_batch():
    X, y = torch.zeros(4, 3), torch.zeros(4)
    for batch in ((X, y), [X, y], {"x": X, "y": y}, X):
        batches, several = _validation_batches(batch)
        assert batches == [batch] and not several


def test_list_of_batches_is_several_batches():
    X1, y1, X2, y2 = torch.zeros(4, 3), torch.zeros(4), torch.ones(2, 3), torch.ones(2)
    for val in ([(X1, y1), (X2, y2)], [[X1, y1], [X2, y2]], ((X1, y1),)):
        batches, several = _validation_batches(val)
        assert len(batches) == len(val) and several
    dicts = [{"x": X1, "y": y1}, {"x": X2, "y": y2}]
    assert _validation_batches(dicts) == (dicts, True)


def test_nested_single_batch_stays_one_batch():
    """((inputs...), (targets...)): the parts differ in shape, so it is one multi-input batch."""
    X1, X2, y1, y2 = torch.zeros(4, 3), torch.zeros(4, 5), torch.zeros(4), torch.zeros(4, 2)
    batch = ((X1, X2), (y1, y2))
    assert _validation_batches(batch) == ([batch], False)
    assert _validation_batches([batch]) == ([batch], True)  # explicit list of one batch


def test_empty_list_of_validation_batches():
    with pytest.raises(ConfigurationError, match=r"val_batch is an empty list.*pass a batch"):
        _validation_batches([])


def test_list_of_validation_batches_averages_like_a_dataloader():
    problem = make_ridge()
    params = ([problem.w], [problem.log_lam])
    with torch.no_grad():
        problem.w.fill_(0.3)
    listed = outer_gradients(problem.outer_loss, split_val(problem), *params)
    loader = DataLoader(TensorDataset(problem.X_val, problem.y_val), batch_size=100)
    loaded = outer_gradients(problem.outer_loss, loader, *params)
    whole = outer_gradients(problem.outer_loss, problem.val(), *params)
    for a, b in ((listed, loaded), (listed, whole)):
        assert torch.allclose(a[0][0], b[0][0]) and abs(a[2] - b[2]) < 1e-12


def test_list_of_validation_batches_through_the_optimizer():
    a, b = make_ridge(), make_ridge()
    g_list = full_batch_sid(a, 200).hypergradient([a.train()], split_val(a))
    g_one = full_batch_sid(b, 200).hypergradient([b.train()], b.val())
    assert relative_error(g_list[0], g_one[0]) < 1e-10


# ====================================================================== 7. contraction


def linear_map(norm, d=6, seed=0):
    """Φ(w) = A w + b with a symmetric A of spectral norm ``norm``; its VJP is v ↦ Aᵀ v."""
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    s = torch.linspace(0.1, norm, d, dtype=torch.float64)
    s[1] = -0.5 * norm
    A = Q @ torch.diag(s) @ Q.T
    b = torch.randn(d, generator=gen, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)

    def phi_vjp(batch, v):
        out = A @ w + b + 0 * batch
        return list(torch.autograd.grad(out, [w], grad_outputs=v))

    return phi_vjp, [w]


@pytest.mark.parametrize("norm", [0.5, 1.02])
def test_estimate_contraction_of_a_linear_map(norm):
    phi_vjp, like = linear_map(norm)
    q = estimate_contraction(phi_vjp, like, [torch.zeros(()), torch.ones(())], iters=50)
    assert abs(q - norm) < 1e-3 * norm


def test_estimate_contraction_averages_over_batches():
    d = 4
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)

    def phi_vjp(scale, v):  # ∂₁Φ̂_j = scale_j · I: the mean over j is what counts
        return list(torch.autograd.grad(scale * w, [w], grad_outputs=v))

    assert abs(estimate_contraction(phi_vjp, [w], [0.2, 1.0]) - 0.6) < 1e-12


def test_check_contraction():
    check_contraction(0.5, "fixed_point_map")
    with pytest.raises(
        ConfigurationError,
        match=r"fixed_point_map is not a contraction.*q ≈ 1.02.*smaller step.*damping",
    ):
        check_contraction(1.02, "fixed_point_map")
    with pytest.raises(ConfigurationError, match=r"not a contraction.*nan"):
        check_contraction(float("nan"), "fixed_point_map")


def test_expansive_linear_map_is_caught():
    phi_vjp, like = linear_map(1.02)
    with pytest.raises(ConfigurationError, match=r"not a contraction"):
        check_contraction(estimate_contraction(phi_vjp, like, [torch.zeros(())]), "Φ")


# ====================================================================== 8. torch.compile


def test_a_compiled_module_is_differentiated_twice_eagerly_in_the_hyper_steps():
    """Compiled graphs have no double backward (it was refused until session 42): inside
    ``twice_differentiable`` compiled code runs eagerly, outside it stays compiled."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    compiled = torch.compile(model, backend="aot_eager")
    x, params = torch.randn(5, 3), list(model.parameters())

    def hvp(net: nn.Module) -> list[torch.Tensor]:
        g = torch.autograd.grad(net(x).pow(2).sum(), params, create_graph=True)
        return list(torch.autograd.grad(sum((gi * gi).sum() for gi in g), params))

    with pytest.raises(RuntimeError, match="double backward|donated buffers"):
        hvp(compiled)  # torch's own limit, outside the hyper step's context
    with twice_differentiable(compiled):
        in_hyper_step = hvp(compiled)
    for a, b in zip(in_hyper_step, hvp(model)):
        torch.testing.assert_close(a, b)


# ====================================================================== 9. second derivatives


def test_layers_without_second_derivatives_are_refused_by_name():
    bag, ids = nn.EmbeddingBag(5, 2), nn.Embedding(5, 2, sparse=True)
    with pytest.raises(ConfigurationError, match=r"bag \(EmbeddingBag\): torch has no second"):
        check_second_derivatives(nn.ModuleDict({"bag": bag}), [bag.weight])
    with pytest.raises(ConfigurationError, match=r"ids \(Embedding\(sparse=True\)\).*sparse=False"):
        check_second_derivatives(nn.ModuleDict({"ids": ids}), [ids.weight])
    head = nn.Linear(2, 1)  # the bag's weight outside w (frozen, or not an inner parameter):
    check_second_derivatives(nn.Sequential(bag, head), list(head.parameters()))  # nothing to refuse
    dense = nn.Embedding(5, 2)
    check_second_derivatives(dense, [dense.weight])


def test_an_op_without_a_second_derivative_is_said_as_such():
    """Met in the first Hessian–vector product: a ConfigurationError naming torch's op, not a
    NotImplementedError from deep inside autograd."""
    ids = torch.randint(0, 6, (30, 3), generator=torch.Generator().manual_seed(0))
    y = torch.randn(30, generator=torch.Generator().manual_seed(1))
    w = torch.randn(6, 1, requires_grad=True)
    log_lam = torch.zeros(1, requires_grad=True)

    def inner_loss(batch):
        bag = nn.functional.embedding_bag(batch[0], w, mode="sum").squeeze(-1)
        return 0.5 * ((bag - batch[1]) ** 2).mean() + 0.5 * log_lam.exp() * (w**2).sum()

    sid = SIDHyperOptimizer(
        [log_lam],
        [w],
        inner_loss,
        lambda b: 0.5 * (w**2).sum(),
        config=SIDConfig(inner_steps=2, adjoint_steps=2),
    )
    with pytest.raises(
        ConfigurationError, match=r"not twice differentiable.*_embedding_bag_backward"
    ):
        sid.hypergradient([(ids, y)], (ids, y))

    def checkpointed(batch):  # a reentrant activation checkpoint cannot take .grad()
        fit = torch.utils.checkpoint.checkpoint(
            lambda v: (v * batch[1][:6]).sum(), w, use_reentrant=True
        )
        return fit**2 / 100 + 0.5 * log_lam.exp() * (w**2).sum()

    sid = SIDHyperOptimizer(
        [log_lam],
        [w],
        checkpointed,
        lambda b: 0.5 * (w**2).sum(),
        config=SIDConfig(inner_steps=2, adjoint_steps=2),
    )
    # said as the checkpoint's setting, not as an op to replace (session 61)
    with pytest.raises(ConfigurationError, match=r"use_reentrant=True.*Pass use_reentrant=False"):
        sid.hypergradient([(ids, y)], (ids, y))


def test_attention_takes_second_derivatives_in_the_hyper_step():
    """``F.scaled_dot_product_attention``'s fused kernels have no second derivative; the hyper step
    runs it on the math backend, so its hypergradient equals one through attention written out."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(40, 5, 4, generator=g, dtype=torch.float64), torch.randn(40, generator=g)
    y = y.double()

    def hypergradient(attend):
        w = torch.nn.Parameter(0.3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(1)))
        w.data = w.data.double()
        log_lam = torch.full((1,), -2.0, dtype=torch.float64, requires_grad=True)

        def fit(batch):
            h = batch[0] @ w
            return 0.5 * ((attend(h).mean((1, 2)) - batch[1]) ** 2).mean()

        def inner_loss(batch):
            return fit(batch) + 0.5 * log_lam.exp() * (w**2).sum()

        sid = SIDHyperOptimizer(
            [log_lam],
            [w],
            inner_loss,
            fit,
            config=SIDConfig(
                inner_steps=5,
                adjoint_steps=5,
                alpha=0.5,
                step_size="constant",
                curvature=KnownCurvature(1.0, 0.1),
            ),
        )
        batches = [(X[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]
        return sid.hypergradient(batches, (X, y))[0]

    def written_out(h):
        scores = h @ h.transpose(-1, -2) / h.shape[-1] ** 0.5
        return scores.softmax(-1) @ h

    fused = hypergradient(lambda h: nn.functional.scaled_dot_product_attention(h, h, h))
    torch.testing.assert_close(fused, hypergradient(written_out), rtol=1e-9, atol=1e-12)
    assert float(fused.abs()) > 0


class _WrittenOutHardsigmoid(nn.Module):
    def forward(self, x):
        return (x + 3).clamp(0, 6) / 6


def test_hardsigmoid_takes_second_derivatives_in_the_hyper_step():
    """torch's ``hardsigmoid_backward`` has no derivative (MobileNetV3's squeeze-excitation); in the
    hyper step of a module holding ``nn.Hardsigmoid`` it is computed as relu6(x + 3)/6, so the
    hypergradient equals the one through that written out."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(40, 3, generator=g, dtype=torch.float64), torch.randn(40, generator=g)
    batches = [(X[i : i + 10], y[i : i + 10].double()) for i in range(0, 40, 10)]

    def hypergradient(hardsigmoid):
        gen = torch.Generator().manual_seed(1)
        net = nn.Sequential(nn.Linear(3, 4), hardsigmoid(), nn.Linear(4, 1)).double()
        with torch.no_grad():  # weights large enough to reach every piece of hardsigmoid
            for p in net.parameters():
                p.copy_(2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        log_lam = torch.full((1,), -2.0, dtype=torch.float64, requires_grad=True)
        params = list(net.parameters())

        def fit(batch):
            return 0.5 * ((net(batch[0]).squeeze(-1) - batch[1]) ** 2).mean()

        def inner_loss(batch):
            return fit(batch) + 0.5 * log_lam.exp() * sum((p**2).sum() for p in params)

        sid = SIDHyperOptimizer(
            [log_lam],
            params,
            inner_loss,
            fit,
            module=net,
            config=SIDConfig(
                inner_steps=5,
                adjoint_steps=5,
                alpha=0.2,
                step_size="constant",
                curvature=KnownCurvature(1.0, 0.1),
            ),
        )
        return sid.hypergradient(batches, (X, y.double()))[0]

    got = hypergradient(nn.Hardsigmoid)
    torch.testing.assert_close(got, hypergradient(_WrittenOutHardsigmoid), rtol=1e-9, atol=1e-14)
    assert float(got.abs()) > 0
