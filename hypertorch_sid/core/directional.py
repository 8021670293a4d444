"""The training batches' cross term of eq. gradestim for data weights: directional
derivatives of the per-sample losses (forward mode, or a forward difference), and
:class:`TrainingCrossTerm`, which chooses between them."""

from __future__ import annotations

import contextlib
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .errors import ConfigurationError
from .weighted_loss import check_per_sample, class_centred, weighted_loss

if TYPE_CHECKING:
    from .sample_weights import SampleWeights

Tensors = list[Tensor]


# ---------------------------------------------------------------------- the training's cross term
def directional_losses(
    losses: Callable[..., Tensor], params: Sequence[Tensor], tangents: Sequence[Tensor]
) -> Tensor:
    """uᵢ = ⟨∇_w ℓᵢ(w), v⟩ for every sample at once: one forward-mode pass (dual numbers w + εv
    through the per-sample losses ``losses(*params) -> (b,)``), no per-sample gradients.
    ``losses`` must compute from the tensors it is given (not from captured parameters)."""
    import torch.autograd.forward_ad as fwAD

    with torch.no_grad(), fwAD.dual_level():
        duals = [fwAD.make_dual(p.detach(), t.detach()) for p, t in zip(params, tangents)]
        u = fwAD.unpack_dual(losses(*duals)).tangent
    if u is None:  # the losses do not read the parameters
        raise ConfigurationError(
            "directional_losses: the per-sample losses do not depend on the parameters given: "
            "compute them from the tensors passed to the function."
        )
    return u.detach()


class DirectionalDerivative(ABC):
    """How the training batch's cross term gets uᵢ = ⟨∇_w ℓᵢ(w), v⟩ for every sample (a
    strategy of :class:`TrainingCrossTerm`'s callers: :class:`ForwardMode` or
    :class:`ForwardDifference`).

    ``losses(*params) -> (b,)`` computes the per-sample losses from the tensors it is given;
    ``at`` (optional) is ℓ(w), the losses the training step already computed at ``params``
    (with the same randomness that ``losses`` replays)."""

    @abstractmethod
    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor: ...


class ForwardMode(DirectionalDerivative):
    """uᵢ = ⟨∇ℓᵢ(w), v⟩ exactly (to rounding), by one forward-mode (dual-number) pass:
    :func:`directional_losses`. Costs about 2 plain forwards (about a training step on a small
    CNN, 1.5 on an MLP); ``at`` is not used. Autocast is switched off for the pass (a
    dual-number matmul under autocast mixes a 16-bit primal with a 32-bit tangent)."""

    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor:
        with contextlib.ExitStack() as stack:
            for device in {p.device.type for p in params} | {"cpu"}:
                stack.enter_context(torch.autocast(device, enabled=False))
            try:
                return directional_losses(losses, params, tangents)
            except NotImplementedError as err:
                if "forward AD" not in str(err):
                    raise
                raise ConfigurationError(
                    f"ForwardMode: the training step's forward runs an operation torch has no "
                    f"forward-mode (dual-number) derivative for ({err}); the weight_norm and "
                    "spectral_norm parametrizations run such operations. Use "
                    "directional=ForwardDifference() (the drop-in's default; float32 "
                    "parameters, no autocast), or cross_term='hyper_step' (the cross term by "
                    "reverse mode, in the hyper steps only)."
                ) from err

    def __repr__(self) -> str:
        return "ForwardMode()"


#: parameter dtypes whose rounding makes a forward difference meaningless (half precision)
_LOW_PRECISION = (torch.float16, torch.bfloat16)


@torch.no_grad()
def _norm_tensor(tensors: Sequence[Tensor]) -> Tensor:
    """‖(t₁, …, tₖ)‖ over a non-empty set of tensors, each in its own dtype, as a float32
    tensor on their device, not read (one dispatch for all of them where they share a dtype
    and device: it runs at every training step)."""
    tensors = list(tensors)
    if len({(t.dtype, t.device) for t in tensors}) == 1 and not tensors[0].is_sparse:
        norms = torch._foreach_norm(tensors)
    else:
        norms = [torch.linalg.vector_norm(t) for t in tensors]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def _norm(tensors: Sequence[Tensor]) -> float:
    """:func:`_norm_tensor` read (0 for no tensor)."""
    return float(_norm_tensor(tensors)) if tensors else 0.0


#: a norm kept for the tensors it was read of, at their versions (an in-place change, such as
#: the optimizer's step on w, makes it stale)
_Kept = tuple[list[tuple[Tensor, int]], float]


def _kept(kept: _Kept | None, tensors: Sequence[Tensor]) -> float | None:
    """The norm ``kept``, where it was read of ``tensors`` as they are now (else None)."""
    if kept is None or len(kept[0]) != len(tensors):
        return None
    if all(a is b and u == b._version for (a, u), b in zip(kept[0], tensors)):
        return kept[1]
    return None


def _keep(tensors: Sequence[Tensor], norm: float) -> _Kept:
    return [(t, t._version) for t in tensors], norm


@torch.no_grad()
def _moved(params: Sequence[Tensor], tangents: Sequence[Tensor], h: float) -> list[Tensor]:
    """w + h·v, one fused add per tensor (a temporary h·v doubles the time on an MLP), in one
    dispatch for all of them where they share a dtype and a device (a launch-bound GPU pays for
    each)."""
    params, tangents = list(params), list(tangents)
    kinds = {(t.dtype, t.device, t.layout) for t in (*params, *tangents)}
    if len(kinds) == 1 and next(iter(kinds))[2] == torch.strided:
        return list(torch._foreach_add(params, tangents, alpha=h))
    return [torch.add(p, t.to(p.dtype), alpha=h) for p, t in zip(params, tangents)]


class ForwardDifference(DirectionalDerivative):
    """uᵢ ≈ (ℓᵢ(w + hv) − ℓᵢ(w)) / h (eq. fdcross), reusing ℓ(w) that the training step already
    computed: ONE no-grad forward at w + hv per training batch instead of a dual-number pass.

    The step h is relative to the scales of w and v over the whole parameter set,

        h·‖v‖ = c·max(‖w‖, 1)   (c = ``relative_step``),

    so it works at any scale of v and of a network's weights (the floor at 1: the losses do
    not vanish with w, so a step shrunk with a near-zero w would drown in their rounding).
    The default c = √ε of the parameters' dtype (3.5e-4 in float32, 1.5e-8 in float64)
    balances the O(h·vᵀ∇²ℓᵢv) truncation against the O(ε·|ℓᵢ|/h) rounding of the difference.

    Where a difference of losses cannot be accurate it falls back to :class:`ForwardMode` and
    says so once (a ``UserWarning``): half/bfloat16 parameters, or an autocast
    (mixed-precision) region around the call, whose 16-bit matmuls round ℓ to ~1e-3.

    The caller must evaluate ``losses`` with the same randomness (dropout masks) as ``at``,
    and leave normalisation statistics untouched (the Lightning drop-in replays the training
    step's RNG state in a forked stream and swaps BatchNorm's buffers for copies). That
    assumption is watched while it runs: at the first call and every ``check_every`` calls after
    it, ``losses`` is evaluated once more at w itself, and where it does not give back ``at``
    (to ``REPRODUCIBLE_RTOL`` of the losses' scale: randomness outside torch's generator, e.g. a
    mixup drawn with numpy, or a forward that changes state) the difference would be that
    randomness divided by h, not ⟨∇ℓᵢ, v⟩: it says so once and uses :class:`ForwardMode` from
    then on (one more forward every ``check_every`` batches, 2 % at the default)."""

    #: recomputed losses at w must match the step's own to this fraction of their scale
    REPRODUCIBLE_RTOL = 1e-3

    def __init__(self, relative_step: float | None = None, check_every: int = 50) -> None:
        if relative_step is not None and not (0.0 < float(relative_step) < 1.0):
            raise ConfigurationError(
                f"ForwardDifference: relative_step must be in (0, 1) (the step h·‖v‖ relative "
                f"to ‖w‖), got {relative_step!r}; None picks √ε of the parameters' dtype."
            )
        if int(check_every) < 1:
            raise ConfigurationError(
                f"ForwardDifference: check_every must be a positive number of calls between "
                f"reproducibility checks, got {check_every!r}."
            )
        self.relative_step = None if relative_step is None else float(relative_step)
        self.check_every = int(check_every)
        self.fallback = ForwardMode()
        self._warned = False
        self._calls = 0
        self._unreproducible: str | None = None
        self._v_norm: _Kept | None = None  # ‖v‖: v changes at the hyper steps
        self._w_norm: _Kept | None = None  # ‖w‖: read ahead by :meth:`prefetch`

    def inaccurate(self, params: Sequence[Tensor]) -> str | None:
        """Why a forward difference would be inaccurate here (None: it is not)."""
        if self._unreproducible is not None:
            return self._unreproducible
        low = sorted({str(p.dtype) for p in params if p.dtype in _LOW_PRECISION})
        if low:
            return f"the parameters are {', '.join(low)}"
        devices = {p.device.type for p in params} | {"cpu"}
        if any(torch.is_autocast_enabled(d) for d in devices):
            return "it runs under autocast (mixed precision)"
        return None

    def step(self, params: Sequence[Tensor], tangents: Sequence[Tensor]) -> float:
        """h with h·‖v‖ = c·max(‖w‖, 1) (0 where v = 0). ‖v‖ is read once per v (v changes
        at the hyper steps, the call comes at every training step); both norms are taken as
        :meth:`prefetch` read them, where it did for these tensors as they are."""
        v_norm = self._tangent_norm(tangents)
        if v_norm == 0.0 or not math.isfinite(v_norm):
            return 0.0
        w_norm = _kept(self._w_norm, params)  # read ahead for this call only
        self._w_norm = None
        if w_norm is None:
            w_norm = _norm(params)
        dtype = params[0].dtype if params else torch.get_default_dtype()
        c = self.relative_step or math.sqrt(torch.finfo(dtype).eps)
        return c * max(w_norm, 1.0) / v_norm

    def _tangent_norm(self, tangents: Sequence[Tensor]) -> float:
        """‖v‖, kept while v is the same tensors at the same versions."""
        norm = _kept(self._v_norm, tangents)
        if norm is None:
            norm = _norm(tangents)
            self._v_norm = _keep(tangents, norm)
        return norm

    def prefetch(
        self, params: Sequence[Tensor], tangents: Sequence[Tensor]
    ) -> tuple[Tensor, Callable[[Sequence[float]], None]] | None:
        """The norms the next call will read of the device and does not hold, ‖w‖ (and ‖v‖
        after a new v), as one float64 tensor on the device, not read, and the function to
        hand their values to once the caller has read them, with values of its own (one wait
        for the device per training step, not two or three). None: nothing to read (a
        difference that falls back to :class:`ForwardMode`)."""
        if not params or not tangents or self.inaccurate(params) is not None:
            return None
        # ‖w‖ for this step's call only (w moves at every step, also where its version does
        # not show it: a p.data edit), ‖v‖ where not held for v as it is
        v = _kept(self._v_norm, tangents) is None
        parts = [params, tangents] if v else [params]
        norms = torch.stack([_norm_tensor(ts).double() for ts in parts])

        def read(values: Sequence[float]) -> None:
            self._w_norm = _keep(params, float(values[0]))
            if v:
                self._v_norm = _keep(tangents, float(values[1]))

        return norms, read

    def __call__(
        self,
        losses: Callable[..., Tensor],
        params: Sequence[Tensor],
        tangents: Sequence[Tensor],
        at: Tensor | None = None,
    ) -> Tensor:
        why = self.inaccurate(params)
        if why is None and at is not None and self._calls % self.check_every == 0:
            why = self._unreproduced(losses, params, at)
        if why is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "ForwardDifference (the cross term's default directional= of "
                    f"LearnedDataWeights): {why}, so a difference of losses cannot be accurate; "
                    "the cross term uses ForwardMode (dual numbers, exact) instead. Pass "
                    'LearnedDataWeights(directional="forward_mode") to silence this.',
                    UserWarning,
                    stacklevel=2,
                )
            return self.fallback(losses, params, tangents, at)
        self._calls += 1
        h = self.step(params, tangents)
        with torch.no_grad():  # nothing here is differentiated: no detach needed
            if at is None:
                at = losses(*params)
            if h == 0.0:
                return torch.zeros_like(at)
            return (losses(*_moved(params, tangents, h)) - at) / h

    def _unreproduced(
        self, losses: Callable[..., Tensor], params: Sequence[Tensor], at: Tensor
    ) -> str | None:
        """Why ``losses`` at w does not give back the step's own ``at`` (the difference's
        premise; None: it does). Once it has not, every later call takes the fallback."""
        with torch.no_grad():
            again = losses(*params)
            at = at.to(again.dtype)
            if again.shape == at.shape:  # both read in one wait for the device
                mean, worst = torch.stack([at.abs().mean(), (again - at).abs().max()]).tolist()
        if again.shape == at.shape:
            scale = mean + torch.finfo(again.dtype).eps
            gap = worst / scale
            if gap <= self.REPRODUCIBLE_RTOL:
                return None
            what = f"differ from the step's own by {gap:.3g} of their mean"
        else:
            what = f"have shape {tuple(again.shape)}, the step's {tuple(at.shape)}"
        self._unreproducible = (
            "the per-sample losses recomputed at the same weights, with the training step's "
            f"torch RNG state, {what} (randomness outside torch's generator, e.g. a mixup or "
            "noise drawn with numpy or random, or a forward that changes state)"
        )
        return self._unreproducible

    def __repr__(self) -> str:
        return (
            f"ForwardDifference(relative_step={self.relative_step}, check_every={self.check_every})"
        )


class TrainingCrossTerm:
    """Eq. gradestim's cross term on a *training* minibatch ζ, from the last adjoint v:

        ĝᵢ = −α ∂ₓᵢ ⟨∇₁ℓ̂(w, x; ζ), v⟩ = −α ∂ₓᵢ ℓ̂ᵤ(x),   ℓ̂ᵤ = weighted_loss(u, ω(x_ζ)),
        uⱼ = ⟨∇ℓⱼ(w), v⟩,

    for the rows i ∈ ζ only (zero elsewhere), then the outer optimizer's step on those rows.
    With ``weights.gauge == "mean_logit"`` the normaliser of ℓ̂ᵤ is held: ĝᵢ = −α ω′ᵢuᵢ / Σ ω,
    without the minibatch's centre û (the mean logit is held instead, after the step). Under a
    class gauge (``"class"``, ``"class_centred"``: :data:`~.normalisers.CLASS_GAUGES`) u is
    centred on each row's class first (:func:`class_centred`, eq. classcentre). Where the
    loss is known to mask rows (``weights.masks``, :class:`ZeroLossMasks`), a row whose loss
    and uᵢ are exactly 0 is masked at this visit: left out, not moved (:meth:`_masked`).

    Where the training's own SGD steps are the warm-started inner solve (inner_steps = 0, the
    Lightning drop-in, or a loop of the user's), every training batch thus moves the weights of
    the examples it reads, at the cost of one forward-mode pass (u) per batch, and every example
    is visited once per epoch instead of only in the hyper steps' own J minibatches; the hyper
    steps (a few warm-started adjoint steps) only refresh v. Its cost is O(batch): the gradient
    is a sparse COO tensor of the batch's rows, which :class:`LazyAdam` (or SGD without
    momentum) applies to those rows only.

    ``weights``: the family; ``optimizer``: the outer optimizer over ``weights.logits`` (that of
    the :class:`~hypertorch_sid.SIDHyperOptimizer`); ``normalize``: as in
    :func:`weighted_loss` (the training's loss).
    """

    def __init__(
        self, weights: SampleWeights, optimizer: torch.optim.Optimizer, normalize: bool = False
    ) -> None:
        self.weights, self.optimizer, self.normalize = weights, optimizer, bool(normalize)

    def gradient(self, index: Tensor, u: Tensor, alpha: float) -> Tensor:
        """ĝ on the rows ``index`` as a sparse COO tensor of shape ``(n,)`` (duplicates summed)."""
        return self.gradients(index, u, alpha)[0]

    def gradients(
        self, index: Tensor, u: Tensor, alpha: float, losses: Tensor | None = None
    ) -> Tensors:
        """ĝ for every tensor of ``weights.hyperparameters``: the rows ``index`` of the logits
        (sparse COO, shape ``(n,)``), then the parameterisation's own tensors (dense: θ of
        :class:`SharedLossWeights` from every row, with the rows' current ``losses``)."""
        w = self.weights
        index = w.check_index(index)
        shared = w.parameterization.hyperparameters
        u = check_per_sample(u, index)
        masked = self._masked(u, losses)
        with torch.no_grad():
            x = w.logits_of(index)
        with torch.enable_grad():
            x.requires_grad_(True)
            omega = w.parameterization.rows(x, w, index, losses)
            held = w.gauge == "mean_logit"
            u = class_centred(u, omega.detach(), w.labels_of(index))  # None: no class gauge
            inner = weighted_loss(u, omega, self.normalize, held, masked)
            g, *gs = torch.autograd.grad(inner, [x, *shared], allow_unused=True)
        g = -float(alpha) * g.to(w.logits.dtype)
        if masked is not None and bool(masked.any()):  # a row masked at this visit: not moved
            taught = ~masked.to(index.device)
            index, g = index[taught], g[taught]
        rows = torch.sparse_coo_tensor(index[None], g, (w.n,), check_invariants=False)
        own = [
            torch.zeros_like(t) if gt is None else -float(alpha) * gt.detach()
            for t, gt in zip(shared, gs)
        ]
        return [rows, *own]

    def _masked(self, u: Tensor, losses: Tensor | None) -> Tensor | None:
        """The batch's rows masked at this visit (``weights.masks``, :class:`RowMasks`: None
        unless the loss is known to mask rows) whose uᵢ = ⟨∇ℓᵢ, v⟩ is exactly 0 too (taken
        before any centring): left out of the sparse gradient, so this visit does not move
        them (an outer optimizer with momentum would move a row given a 0), and held by value
        in Σ ω. A row of loss 0 whose u is not 0 (its loss depends on the network's weights:
        a row fitted in float32) stays in."""
        if losses is None:
            return None
        masked = self.weights.masks.masked(losses)
        return None if masked is None else masked.to(u.device) & u.detach().eq(0)

    @torch.no_grad()
    def apply(self, gradient: Tensor | Sequence[Tensor]) -> None:
        """The outer step on the rows of ``gradient`` (sparse; or the list of
        :meth:`gradients`): each hyperparameter's grad ← its ĝ, step, projection."""
        grads = [gradient] if isinstance(gradient, Tensor) else list(gradient)
        for h, g in zip(self.weights.hyperparameters, grads):
            h.grad = g
        self.optimizer.step()
        for group in self.optimizer.param_groups:  # zero_grad(set_to_none=True), unprofiled
            for h in group["params"]:
                h.grad = None
        self.weights.projection()

    def step(
        self, index: Tensor, u: Tensor, alpha: float | None, losses: Tensor | None = None
    ) -> bool:
        """:meth:`gradients` then :meth:`apply`; nothing (False) before the first adjoint solve
        gave α."""
        if alpha is None:
            return False
        self.apply(self.gradients(index, u, alpha, losses))
        return True
