"""Second derivatives: what SID's Hessian–vector products need from the model.

The adjoint solve (eq. linsystem) and the curvature estimate take Hessian–vector products
∇²₁₁ℓ̂ v, a backward pass through the gradient of ℓ̂, and the ∂₂Φ̂ term a mixed one. Every
operation between the inner parameters and ℓ̂ must therefore have a second derivative in torch.

* :func:`check_second_derivatives` refuses, by name and before any training step, layers whose
  trainable weights have none (``nn.EmbeddingBag``; sparse gradients of
  ``nn.Embedding(sparse=True)``);
* :func:`twice_differentiable` is the context of every hyper step: it routes ops that have a
  twice-differentiable equivalent to it — attention's fused kernels to the math backend, and
  ``F.hardsigmoid`` (MobileNetV3's squeeze-excitation) to relu6(x + 3)/6 — and leaves the
  training's own steps on the fast ones; an RNN on a CUDA device runs without cuDNN there
  (cuDNN's RNN kernels have no double backward), and ``torch.compile``d code runs eagerly there
  (compiled graphs have no double backward: the training keeps its compiled speed);
* :func:`not_twice_differentiable` says what any other such op, met in a product, means.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from .errors import ConfigurationError

#: what torch says when a Hessian–vector product meets an op without a second derivative
NO_SECOND_DERIVATIVE = ("derivative for", "differentiate twice", "incompatible with .grad()")


def check_second_derivatives(module: Any, inner_parameters: Sequence[Tensor]) -> None:
    """Refuse layers whose weights are inner parameters but cannot take part in second
    derivatives.

    The adjoint solve and the curvature estimate take Hessian–vector products through ℓ̂ (a
    backward pass through its gradient) with respect to the inner parameters w.
    ``nn.EmbeddingBag`` has no second derivative in torch, and ``nn.Embedding(sparse=True)``
    gives sparse gradients, which cannot hold a dense decay λ ⊙ w (torch's own ``weight_decay=``
    refuses them too) nor be differentiated again. A layer whose weight is not in w (frozen, or
    left out of the inner parameters) is differentiated through by nothing and passes.

    Only those layers' tensors are read, and as registered: ``getattr(m, "weight")`` on a
    parametrized layer runs its parametrization, and ``spectral_norm``'s, in training mode,
    one more power iteration on its ``_u``, ``_v``, so the fit's training left the user's own
    (weights 0.6 apart after 8 epochs of a digits MLP; session 56).
    """
    if not isinstance(module, torch.nn.Module):
        return
    inner = {id(p) for p in inner_parameters}
    for name, m in module.named_modules():
        if not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            continue
        if not any(id(p) in inner for p in m.parameters()):
            continue
        what = f"{name or 'the module'} ({type(m).__name__}"
        if isinstance(m, torch.nn.EmbeddingBag):
            raise ConfigurationError(
                f"{what}): torch has no second derivative for EmbeddingBag, which SID's "
                "Hessian–vector products need. Use nn.Embedding followed by .sum(1) or .mean(1) "
                "(the same bag, twice differentiable); for a 1-D input with offsets, sum each "
                "bag's rows with index_add: torch.zeros(len(offsets), dim).index_add(0, bag_of_"
                "each_token, emb(tokens)), bag_of_each_token = torch.repeat_interleave(torch."
                "arange(len(offsets)), torch.diff(offsets, append=torch.tensor([len(tokens)])))"
                " (divide by the sizes for mode='mean'); or freeze it (requires_grad=False)."
            )
        if isinstance(m, torch.nn.Embedding) and m.sparse:
            raise ConfigurationError(
                f"{what}(sparse=True)) gets sparse gradients, which cannot hold a dense decay "
                "λ ⊙ w (torch's own weight_decay= refuses them too) nor be differentiated again "
                "for SID's Hessian–vector products: create it with sparse=False, or freeze it "
                "(requires_grad=False)."
            )


#: torch's words for an activation checkpoint that ``torch.autograd.grad`` cannot run through
#: (``checkpoint(fn, x)`` without ``use_reentrant=``: torch's default is the reentrant one)
_REENTRANT_CHECKPOINT = "use_reentrant=True"

#: torch's name for the backward of ``F.ctc_loss`` / ``nn.CTCLoss``, which has no derivative
_CTC_BACKWARD = "_ctc_loss_backward"


def not_twice_differentiable(err: Exception) -> ConfigurationError:
    """torch's "the derivative for 'op' is not implemented" (or "trying to differentiate twice"
    a ``once_differentiable`` function, or a reentrant activation checkpoint met by
    ``torch.autograd.grad``), met in a Hessian–vector product, said as what it means for SID and
    what to change."""
    products = (
        "SID's adjoint solve and curvature estimate take Hessian–vector products (a backward "
        "pass through the gradient of ℓ̂, by torch.autograd.grad)"
    )
    if _REENTRANT_CHECKPOINT in str(err):  # session 61: ckpt_reentrant
        return ConfigurationError(
            "the inner loss ℓ̂ (the training loss) runs torch.utils.checkpoint.checkpoint with "
            "use_reentrant=True (torch's default where use_reentrant= is not passed), which "
            f"torch.autograd.grad cannot differentiate through, and {products}. Pass "
            "use_reentrant=False to every checkpoint(...) call (checkpoint_sequential(..., "
            "use_reentrant=False)): the same memory saving, and twice differentiable. "
            f"(torch: {err})"
        )
    if _CTC_BACKWARD in str(err):  # session 62: ctc_strip
        return ConfigurationError(
            "the inner loss ℓ̂ (the training loss) is torch's CTC loss (F.ctc_loss / "
            "nn.CTCLoss), whose gradient torch cannot differentiate again, and "
            f"{products}. Every trained weight's gradient passes through the loss, so freezing "
            "is no way out: compute the CTC loss by its forward recursion in torch ops "
            "(α over the blank-extended target, combined with torch.logsumexp at each time "
            "step; the same values and gradient, and twice differentiable: docs/failures.md, "
            f"'Unseen user recipes (session 62)'). (torch: {err})"
        )
    return ConfigurationError(
        f"the inner loss is not twice differentiable: {err} {products}, so "
        "every operation between the inner parameters and ℓ̂ needs a second derivative. "
        "Replace that operation, or freeze the parameters whose gradient passes through it."
    )


def _reduced(loss: Tensor, reduction: str) -> Tensor:
    """``loss`` per sample reduced as torch's losses' ``reduction=`` says."""
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def multi_margin_loss(
    input: Tensor,  # noqa: A002 (torch's name)
    target: Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: Tensor | None = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """``F.multi_margin_loss`` in twice-differentiable torch ops: per sample
    Σ_{j≠y} w_y · max(0, margin − x_y + x_j)^p / C (torch's ``multi_margin_loss_backward`` has
    no derivative; session 64, a hinge-loss classifier refused at its first hyper step)."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    x = input if input.dim() == 2 else input.reshape(1, -1)
    y = target.reshape(-1, 1)
    hinge = (margin - x.gather(1, y) + x).clamp_min(0)
    hinge = hinge if p == 1 else hinge.pow(p)
    if weight is not None:
        hinge = hinge * weight[y]
    loss = hinge.scatter(1, y, 0.0).sum(1) / x.shape[1]
    return _reduced(loss if input.dim() == 2 else loss.reshape(()), reduction)


def multilabel_margin_loss(
    input: Tensor,  # noqa: A002 (torch's name)
    target: Tensor,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """``F.multilabel_margin_loss`` in twice-differentiable torch ops: per sample
    Σ_{j ∈ targets} Σ_{k ∉ targets} max(0, 1 − (x_j − x_k)) / C, the targets the entries of
    ``target`` before its first −1 (torch's ``multilabel_margin_loss_backward`` has no
    derivative)."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    x = input if input.dim() == 2 else input.reshape(1, -1)
    t = target.reshape(x.shape)
    listed = (t >= 0).long().cumprod(1).bool()  # the entries before the first -1
    classes = torch.arange(x.shape[1], device=x.device)
    # [b, listed entry, class j]: the j each listed entry names (duplicates counted, as torch)
    pairs = (t.clamp_min(0)[:, :, None] == classes) & listed[:, :, None]
    is_target = pairs.any(1)
    hinge = (1 - x[:, :, None] + x[:, None, :]).clamp_min(0)  # [b, j, k]: 1 − (x_j − x_k)
    hinge = hinge * (~is_target)[:, None, :]
    loss = (pairs.to(x.dtype) @ hinge).sum((1, 2)) / x.shape[1]
    return _reduced(loss if input.dim() == 2 else loss.reshape(()), reduction)


#: torch functions whose backward has no derivative, each computed by a twice-differentiable
#: equivalent (the same values and first derivative) inside a hyper step
_REROUTED: dict[Any, Any] = {
    F.hardsigmoid: lambda x, inplace=False: (x + 3).clamp(0, 6) / 6,
    F.multi_margin_loss: multi_margin_loss,
    F.multilabel_margin_loss: multilabel_margin_loss,
}
#: the layers that call them (the mode is entered only where a module holds one, or after a
#: product met one: it adds a Python call to every op)
_REROUTED_LAYERS = (torch.nn.Hardsigmoid, torch.nn.MultiMarginLoss, torch.nn.MultiLabelMarginLoss)
#: torch's names for their backwards, in the error a product meets without the mode
_REROUTED_BACKWARDS = ("hardsigmoid_backward", "multi_margin_loss_backward",
                       "multilabel_margin_loss_backward")  # fmt: skip


class _TwiceDifferentiableOps(TorchFunctionMode):
    """``F.hardsigmoid(x)`` as relu6(x + 3)/6 (its second derivative 0 almost everywhere,
    which torch's fused ``hardsigmoid_backward`` lacks), ``F.multi_margin_loss`` and
    ``F.multilabel_margin_loss`` by :func:`multi_margin_loss` / :func:`multilabel_margin_loss`:
    the same values and first derivatives."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rerouted = _REROUTED.get(func)
        if rerouted is not None:
            return rerouted(*args, **kwargs)
        return func(*args, **kwargs)


def _on_cuda(module: torch.nn.Module) -> bool:
    return any(p.is_cuda for p in module.parameters())


@contextlib.contextmanager
def twice_differentiable(module: Any = None, reroute: bool = False) -> Iterator[None]:
    """The hyper step's context (see the module docstring). ``F.scaled_dot_product_attention``
    runs on its math backend (its fused kernels, on the CPU too, have no second derivative);
    whatever ``torch.compile`` compiled — ``torch.compile(model)``, ``model.compile()``, a
    compiled submodule or function — runs its original Python eagerly (AOTAutograd's graphs have
    no double backward: "donated buffers", "does not currently support double backward");
    where ``module`` holds an RNN (LSTM, GRU, RNN) on a CUDA device, cuDNN is off (its RNN
    kernels have no double backward; PyTorch's own have); where it holds an ``nn.Hardsigmoid``,
    an ``nn.MultiMarginLoss`` or an ``nn.MultiLabelMarginLoss``, or with ``reroute`` (a product
    met one of their functions, :func:`met_rerouted_op`), ``F.hardsigmoid`` and the two margin
    losses are computed twice differentiably (:class:`_TwiceDifferentiableOps`, a torch
    function mode, only then: it adds a Python call to every op). An op met in a product that
    has no second derivative is raised as :func:`not_twice_differentiable`'s error (the
    hypergradient's products and a budget's timing of one, session 61)."""
    modules = list(module.modules()) if isinstance(module, torch.nn.Module) else []
    reroute = reroute or any(isinstance(m, _REROUTED_LAYERS) for m in modules)
    cuda_rnn = any(isinstance(m, torch.nn.RNNBase) and _on_cuda(m) for m in modules)
    with contextlib.ExitStack() as stack:
        stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        if "torch._dynamo" in sys.modules:  # else nothing was compiled (and importing costs 1.5 s)
            stack.enter_context(torch.compiler.set_stance("force_eager"))
        if cuda_rnn:
            stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        if reroute:
            stack.enter_context(_TwiceDifferentiableOps())
        try:
            yield
        except (NotImplementedError, RuntimeError) as err:  # every product, said in one place
            if not any(s in str(err) for s in NO_SECOND_DERIVATIVE):
                raise
            raise not_twice_differentiable(err) from err


def met_rerouted_op(err: BaseException) -> bool:
    """Whether ``err`` (:func:`twice_differentiable`'s error) is a product meeting the backward
    of a function :class:`_TwiceDifferentiableOps` computes twice differentiably, called
    without a layer that tells (``F.multi_margin_loss`` in ``training_step``): the product
    can run again under ``reroute=True`` (session 64: a hinge-loss classifier was refused
    at its first hyper step, "derivative for aten::multi_margin_loss_backward is not
    implemented")."""
    said = f"{err} {err.__cause__}"
    return isinstance(err, ConfigurationError) and any(b in said for b in _REROUTED_BACKWARDS)
