"""Weight decay as a hyperparameter container: λ by granularity and parameterisation.

The inner loss of weight-decay tuning is ℓ̂(w, λ; ζ) = g(w; ζ) + ½ Σ_p Σ_i c_{p,i}(λ) w_{p,i}², with
c = P ⊙ λ (P a fixed per-tensor scale, 1 for plain L2, an optimizer's preconditioner for decoupled
decay). :class:`WeightDecay` holds the learned tensors (the hyperparameters of
:class:`~hypertorch_sid.SIDHyperOptimizer`), maps each decayed tensor to its λ slot, and gives the
penalty, its coefficients c(λ) (the ``penalty=`` of the proximal map) and the projection onto Λ —
usable from a plain ``SIDHyperOptimizer`` as from :class:`~hypertorch_sid.LearnedWeightDecay`::

    decay = WeightDecay(model.named_parameters(), 1e-4, granularity="per_layer")
    hopt = SIDHyperOptimizer(
        decay.hyperparameters, model.parameters(),
        inner_loss=lambda b: F.cross_entropy(model(b[0]), b[1]) + decay.penalty(),
        outer_loss=..., outer_optimizer=torch.optim.Adam(decay.hyperparameters, lr=0.05),
        config=SIDConfig(feasible_set=FeasibleSet(project=lambda hs: decay.project())),
    )

Granularity (which tensors share a λ): ``"global"`` (one λ), ``"per_group"`` (one per group key
given with the tensor, e.g. an optimizer's parameter group), ``"per_layer"`` (one per owning
module: the name without its last component; a tensor no layer owns has one of its own),
``"per_tensor"``, ``"per_element"`` (λ shaped like each tensor). Parameterisation (how λ is
learned): :class:`LogDecay` (λ = exp ρ, λ > 0 always) or :class:`ProjectedDecay` (λ learned
directly and projected onto λ ≥ 0).

Per element, how the λ of one layer relate (``elements=``, an :class:`ElementModel`):
:class:`TiedToLayer` (the default) learns each layer's λ and a deviation s_e per element,

    λ_e = λ_layer(e) · exp(s_e),                                              (eq. tied)

with a Gaussian prior s_e ~ N(0, σ²) added to the outer objective as the MAP term of a validation
set of n samples (E is a mean over samples),

    E_prior(w, λ) = E(w) + Σ_e s_e² / (2 σ² n)                                (eq. prior)

(:meth:`WeightDecay.prior`; the drop-in adds it, a plain ``SIDHyperOptimizer`` adds it to its
``outer_loss``). The layer's λ gets exactly the per-layer hypergradient Σ_e ∂E/∂log λ_e, and a
deviation moves only as far as n validation samples support it against the prior: with 10⁵
deviations and 10³–10⁴ validation samples per-element decay stays close to per-layer decay
unless the validation data say otherwise. :class:`Untied` is one free λ per element (as in 0.1:
it fitted the validation set, and its gains mostly did not reach held-out data).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import ConfigurationError
from .outer_step import TrustRprop
from .validation import as_strategy

Tensors = list[Tensor]


class Parameterization(ABC):
    """λ = T(ρ): how the learned tensor ρ gives the decay λ."""

    @abstractmethod
    def initial(self, lam: float) -> float:
        """ρ₀ for the initial decay λ₀."""

    @abstractmethod
    def transform(self, rho: Tensor) -> Tensor:
        """λ = T(ρ)."""

    @abstractmethod
    def clamp(self, rho: Tensor, upper: float) -> None:
        """Keep T(ρ) in [0, upper], in place."""


class LogDecay(Parameterization):
    """λ = exp(ρ): positive by construction; the outer step moves log λ (scale-free)."""

    def initial(self, lam: float) -> float:
        if not lam > 0:
            raise ConfigurationError(f"the log parameterisation needs λ₀ > 0, got {lam!r}.")
        return math.log(lam)

    def transform(self, rho: Tensor) -> Tensor:
        return rho.exp()

    def clamp(self, rho: Tensor, upper: float) -> None:
        if math.isfinite(upper):
            rho.clamp_(max=math.log(upper))

    def __repr__(self) -> str:
        return "LogDecay()"


class ProjectedDecay(Parameterization):
    """λ = ρ, projected onto [0, upper] after each outer step."""

    def initial(self, lam: float) -> float:
        if not lam >= 0:
            raise ConfigurationError(f"the projected parameterisation needs λ₀ ≥ 0, got {lam!r}.")
        return lam

    def transform(self, rho: Tensor) -> Tensor:
        return rho

    def clamp(self, rho: Tensor, upper: float) -> None:
        rho.clamp_(min=0, max=upper if math.isfinite(upper) else None)

    def __repr__(self) -> str:
        return "ProjectedDecay()"


PARAMETERIZATIONS: dict[str, Callable[[], Parameterization]] = {
    "log": LogDecay,
    "projection": ProjectedDecay,
}


def layer_by_name(name: str) -> str:
    """The layer of the tensor ``name`` where nothing else says: the module that owns it, the
    name without its last component. A tensor of no module (a top-level name: ``self.w1 =
    nn.Parameter(...)`` on the model itself) is no layer's, so it is a layer of its own, named
    by itself (session 63: all such tensors shared one λ, ``"(root)"``, as ``"global"`` would:
    a cosine classifier's class vectors and its learned logit scale). A caller that knows the
    modules says which other owners are containers, no layer (``nn.ParameterList`` /
    ``ParameterDict``: :class:`WeightDecay`'s ``layer_of``). The tensors of a parametrization
    (``weight_norm``, ``spectral_norm``: ``<layer>.parametrizations.weight.original[k]``) are
    owned by the parametrization, so per layer they get a λ of their own beside the layer's bias
    (``"net.0.parametrizations.weight"``, ``"net.0"``): a spectral-norm weight's scale does not
    reach the loss (W/σ(W)), and on its own slot the scale-invariance probe holds its λ (session
    56); shared with the bias it would not be held (session 59)."""
    return name.rpartition(".")[0] or name


#: granularity → the slot key of a tensor (its name, group key, layer); None: one λ per element
GRANULARITIES: dict[str, Callable[[str, str, str], str] | None] = {
    "global": lambda name, group, layer: "all",
    "per_group": lambda name, group, layer: group,
    "per_layer": lambda name, group, layer: layer,
    "per_tensor": lambda name, group, layer: name,
    "per_element": None,
}


@dataclass
class Decayed:
    """One decayed tensor: its name, its group key and the λ slot it reads."""

    name: str
    param: Tensor
    group: str
    slot: int
    #: index of its layer (the per-layer slot), for per-element models that tie to it
    layer: int = 0


class ElementModel(ABC):
    """How per-element λ are learned (``granularity="per_element"``): the learned tensors, λ_e
    from them, the prior on them in the outer objective and their projection.

    ``outer_lr``, ``refresh_curvature`` and ``max_overhead`` are the drop-in's defaults for this
    model (Adam's learning rate on the learned tensors; whether the curvature estimate is
    refreshed; the compute budget — none: applying a per-element λ costs about a seventh of every
    training step and its hyper steps are dearer, so a budget of 0.5 left 12 of 39 hyper steps
    and a held-out test loss 0.035 above per layer's on MNIST MLP, against 0.006 without it;
    with λ applied once per hyper step (:meth:`applied`), :class:`LayerThenShrunk` under 0.5
    still took 18 hyper steps where per layer took 31 and ended +0.0099 ± 0.0051 (Fashion MLP)
    and +0.0069 ± 0.0006 (20 Newsgroups MLP) above per layer, 9 seeds,
    ``benchmarks/results/weight_decay/runs/elem_s39``)."""

    outer_lr: float = 1.0
    refresh_curvature: bool = False
    max_overhead: float | None = None

    @abstractmethod
    def create(self, decay: WeightDecay, fill: float) -> Tensors:
        """The learned tensors for ``decay.entries``, every λ_e at T(fill)."""

    def names(self, decay: WeightDecay) -> list[str]:
        """The names of the tensors :meth:`create` makes (one λ per decayed tensor)."""
        return [f"λ[{e.name}]" for e in decay.entries]

    @abstractmethod
    def lambda_of(self, decay: WeightDecay, entry: Decayed) -> Tensor:
        """λ of one decayed tensor, shaped like it; differentiable."""

    @abstractmethod
    def clamp(self, decay: WeightDecay, upper: Sequence[float]) -> None:
        """Keep λ_e of entry i in [0, upper[i]], in place."""

    @abstractmethod
    def carry(self, new: WeightDecay, old: WeightDecay) -> int:
        """Copy the learned values of the tensors both decay; the number of tensors carried."""

    def prior(self, decay: WeightDecay, samples: int | None) -> Tensor | None:
        """The prior's term in the outer objective, or None."""
        return None

    def floor(self, decay: WeightDecay, lower: float) -> None:
        """Keep every λ_e ≥ ``lower``, in place (default: one learned tensor per decayed tensor,
        λ_e = T(ρ_e), as :class:`Untied`)."""
        rho = decay.parameterization.initial(lower)
        for h in decay.hyperparameters:
            h.clamp_(min=rho)

    def mask(self, decay: WeightDecay, layers: Sequence[bool]) -> Tensors:
        """1 where a learned value belongs to a layer flagged in ``layers``, else 0; shaped like
        the learned tensors (default: one learned tensor per decayed tensor, as :class:`Untied`)."""
        return [_filled(e.param, float(layers[e.layer])).detach() for e in decay.entries]

    def applied(self, decay: WeightDecay, entry: Decayed) -> float | Tensor:
        """λ of one decayed tensor as the training step applies it, detached: a number where it
        is one value over the tensor (then applied as cheaply as a per-layer λ), else the
        tensor (default: the tensor)."""
        return self.lambda_of(decay, entry).detach()

    def outer_optimizer(self, lr: float) -> Callable[[Tensors], torch.optim.Optimizer] | None:
        """The model's own outer step (``params -> Optimizer``), or None: Adam at ``lr``."""
        return None

    def observe(self, share: float) -> None:
        """Told before each hyper step: the share b/n of the n validation samples that one
        hyper step's validation batch of b holds (1: the whole set, 0: unknown)."""
        return None


class Untied(ElementModel):
    """One free λ_e = T(ρ_e) per element, learned from the validation loss alone (no prior)."""

    def create(self, decay: WeightDecay, fill: float) -> Tensors:
        return [_filled(e.param, fill) for e in decay.entries]

    def lambda_of(self, decay: WeightDecay, entry: Decayed) -> Tensor:
        return decay.parameterization.transform(decay.hyperparameters[entry.slot])

    def clamp(self, decay: WeightDecay, upper: Sequence[float]) -> None:
        for e, u in zip(decay.entries, upper):
            decay.parameterization.clamp(decay.hyperparameters[e.slot], u)

    def carry(self, new: WeightDecay, old: WeightDecay) -> int:
        before = {id(e.param): e.slot for e in old.entries}
        carried = 0
        for e in new.entries:
            if id(e.param) in before:
                new.hyperparameters[e.slot].copy_(old.hyperparameters[before[id(e.param)]])
                carried += 1
        return carried

    def __repr__(self) -> str:
        return "Untied()"


class LayerDeviations(ElementModel):
    """λ_e = λ_layer · exp(s_e) (eq. tied): each layer's λ and a deviation s_e per element.

    Learned tensors: ``[ρ_layers, s_1, ..., s_m]`` (ρ one per layer, λ_layer = T(ρ); s_i shaped
    like decayed tensor i, starting at 0). The layer's ρ gets exactly the per-layer
    hypergradient Σ_e ∂E/∂log λ_e; subclasses say what keeps the deviations honest.
    """

    outer_lr = 0.3
    refresh_curvature = True

    def create(self, decay: WeightDecay, fill: float) -> Tensors:
        like = decay.entries[0].param
        layers = torch.full((len(decay.layer_names),), fill, dtype=like.dtype, device=like.device)
        deviations = [_filled(e.param, 0.0) for e in decay.entries]
        return [layers.requires_grad_(True), *deviations]

    def names(self, decay: WeightDecay) -> list[str]:
        return ["λ[layers]", *(f"deviation[{e.name}]" for e in decay.entries)]

    def lambda_of(self, decay: WeightDecay, entry: Decayed) -> Tensor:
        layer = decay.parameterization.transform(decay.hyperparameters[0][entry.layer])
        return layer * decay.hyperparameters[1 + entry.slot].exp()

    def clamp(self, decay: WeightDecay, upper: Sequence[float]) -> None:
        """λ_layer onto [0, min upper of its tensors], then each s_e ≤ log(upper / λ_layer)."""
        T, layers = decay.parameterization, decay.hyperparameters[0]
        bound = [math.inf] * len(layers)
        for e, u in zip(decay.entries, upper):
            bound[e.layer] = min(bound[e.layer], u)
        for i, u in enumerate(bound):
            T.clamp(layers[i], u)
        lam = T.transform(layers)
        for e, u in zip(decay.entries, upper):
            if math.isfinite(u) and float(lam[e.layer]) > 0:
                decay.hyperparameters[1 + e.slot].clamp_(max=math.log(u / float(lam[e.layer])))

    def carry(self, new: WeightDecay, old: WeightDecay) -> int:
        old_layers = {name: i for i, name in enumerate(old.layer_names)}
        for i, name in enumerate(new.layer_names):
            if name in old_layers:
                new.hyperparameters[0][i] = old.hyperparameters[0][old_layers[name]]
        before = {id(e.param): e.slot for e in old.entries}
        carried = 0
        for e in new.entries:
            if id(e.param) in before:
                new.hyperparameters[1 + e.slot].copy_(old.hyperparameters[1 + before[id(e.param)]])
                carried += 1
        return carried

    def applied(self, decay: WeightDecay, entry: Decayed) -> float | Tensor:
        """λ_layer as a number where every deviation s_e of the tensor is 0 (λ_e = λ_layer · 1
        exactly), else λ_e."""
        if bool((decay.hyperparameters[1 + entry.slot] == 0).all()):
            return decay.numbers(decay.hyperparameters[0])[entry.layer]
        return self.lambda_of(decay, entry).detach()

    def floor(self, decay: WeightDecay, lower: float) -> None:
        """Every layer's λ ≥ ``lower`` (the deviations s_e are left to the prior or shrinkage)."""
        decay.hyperparameters[0].clamp_(min=decay.parameterization.initial(lower))

    def mask(self, decay: WeightDecay, layers: Sequence[bool]) -> Tensors:
        like = decay.hyperparameters[0]
        flags = torch.tensor([float(f) for f in layers], dtype=like.dtype, device=like.device)
        return [flags, *ElementModel.mask(self, decay, layers)]


class TiedToLayer(LayerDeviations):
    """λ_e = λ_layer · exp(s_e) (eq. tied), with the prior s_e ~ N(0, σ²) (eq. prior).

    The layer's ρ and its deviations learn at the per-layer rate (``outer_lr`` 0.3) with the
    curvature refreshed, as per-layer decay does.

    Parameters
    ----------
    scale:
        σ, the prior's standard deviation of log(λ_e / λ_layer): 1 says "a weight's decay is
        typically within a factor e of its layer's". Large σ: the deviations are free (like
        :class:`Untied`); small σ: per-layer decay.
    samples:
        n, the number of validation samples E averages over (None: given to :meth:`prior` —
        the drop-in passes the size of the validation set).
    """

    def __init__(self, scale: float = 1.0, samples: int | None = None) -> None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ConfigurationError(f"TiedToLayer: scale must be a number > 0, got {scale!r}.")
        if scale == math.inf:
            raise ConfigurationError("TiedToLayer: scale=inf is no prior: use Untied().")
        if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)):
            raise ConfigurationError(f"TiedToLayer: samples must be an int, got {samples!r}.")
        self.scale = float(scale)
        self.samples = samples

    def prior(self, decay: WeightDecay, samples: int | None) -> Tensor:
        """Σ_e s_e² / (2σ²n) (eq. prior): the negative log prior per validation sample."""
        n = self.samples if self.samples is not None else samples
        if n is None or n <= 0:
            raise ConfigurationError(
                "TiedToLayer: the prior needs the number of validation samples n (E is their "
                "mean), and it is not known here (a streamed validation set?): pass "
                "TiedToLayer(samples=n)."
            )
        squares = torch.stack([s.pow(2).sum() for s in decay.hyperparameters[1:]]).sum()
        return squares / (2 * self.scale**2 * n)

    def __repr__(self) -> str:
        return f"TiedToLayer(scale={self.scale}, samples={self.samples})"


class ShrunkToLayer(LayerDeviations):
    """λ_e = λ_layer · exp(s_e) (eq. tied), the deviations moved only as far as the validation
    data tell them apart from noise: James–Stein shrinkage toward the layer's λ.

    No prior: the outer step is its own (:class:`ShrinkageStep`). The layer's ρ takes Adam
    steps on the per-layer hypergradient. For each decayed tensor, the hypergradient of its
    deviations less its mean over the tensor, g_e (the common part is the layer's), is
    averaged over hyper steps (an exponential average m_e with bias
    correction, weights w_t summing to 1), and its variance across the hyper steps'
    validation batches σ_e² estimated alongside. The variance of m_e about the mean over
    *all* validation data is σ_e² Σ_t w_t², and that mean's own about the population's is
    σ_e² b/n (batches of b from a validation set of n: re-reading the same samples does not
    lower it; the drop-in tells b/n through :meth:`observe`). With d_e = m_e − mean(m), the
    positive-part James–Stein factor of the tensor

        c = max(0, 1 − Σ_e σ_e² (Σ_t w_t² + b/n) / Σ_e d_e²)                   (eq. shrink)

    is ≈ 0 where the spread of the averaged hypergradients is what their noise alone would
    give, and → 1 where it is far larger (the noise is counted two standard deviations of a
    χ² spread high, so that chance alone rarely passes); each step moves the deviations by
    −lr · c · m_e / √(mean g_e²) (as Adam scales its step: at most lr · c, less where an
    element's hypergradient is mostly noise). Where every c stays 0, λ_e = λ_layer and the
    fit is per-layer decay.

    Parameters
    ----------
    beta:
        Decay of the hypergradient averages (0.9: about the last 10–20 hyper steps).
    """

    outer_lr = 0.3
    refresh_curvature = True

    def __init__(self, beta: float = 0.9) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1:
            raise ConfigurationError(f"ShrunkToLayer: beta must be in (0, 1), got {beta!r}.")
        self.beta = float(beta)
        self.share = 0.0

    def observe(self, share: float) -> None:
        self.share = float(share)

    def outer_optimizer(self, lr: float) -> Callable[[Tensors], torch.optim.Optimizer]:
        return lambda params: ShrinkageStep(params, lr, self.beta, lambda: self.share)

    def __repr__(self) -> str:
        return f"ShrunkToLayer(beta={self.beta})"


class LayerThenShrunk(ShrunkToLayer):
    """Per-layer decay first, per-element deviations only where the validation data show them
    apart from noise: λ_e = λ_layer · exp(s_e) (eq. tied) with

    - the layer part stepped exactly as the per-layer default: ρ_layer = log λ_layer gets the
      per-layer hypergradient Σ_e ∂E/∂log λ_e (eq. tied at s = 0 is per-layer decay) and
      :class:`~hypertorch_sid.core.outer_step.TrustRprop` steps on it (eqs. signsize,
      signstep, decaytrust; Δ₀ = ``outer_lr`` 0.3, Δ_min/Δ_max = 0.01/2 as per layer);
    - the deviations s_e moved by :class:`ShrunkToLayer`'s James–Stein step (eq. shrink), c = 0
      while the spread of a tensor's averaged hypergradients is what their noise alone gives.

    Where every c stays 0 the s_e stay exactly 0, λ_e = λ_layer bit for bit, and the fit IS
    the per-layer default's (the same λ_layer path and weights, seed for seed, without a
    clock-read budget: ``tests/test_decay_layer_first.py``). The outer step is
    :class:`TrustShrinkageStep`.

    Parameters
    ----------
    beta:
        Decay of the deviations' hypergradient averages (as :class:`ShrunkToLayer`).
    """

    def outer_optimizer(self, lr: float) -> Callable[[Tensors], torch.optim.Optimizer]:
        sizes = (min(1e-2, lr), max(2.0, lr))  # as the per-layer default's TrustRprop
        return lambda params: TrustShrinkageStep(
            params, lr, self.beta, lambda: self.share, step_sizes=sizes
        )

    def __repr__(self) -> str:
        return f"LayerThenShrunk(beta={self.beta})"


class ShrinkageStep(torch.optim.Optimizer):
    """The outer step of :class:`ShrunkToLayer` on ``[ρ_layers, s_1, ..., s_m]``: Adam on ρ,
    the shrunk averaged step (eq. shrink) on each s_i. The state (averages, step counts, the
    last factor c as ``state[s]["shrinkage"]``) is an optimizer's: checkpointed with it.

    ``share``: ``() -> b/n`` (the floor of the averages' noise; 0: none).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        beta: float = 0.9,
        share: Callable[[], float] = lambda: 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        params = list(params)
        groups = [
            {"params": params[:1], "shrink": False},
            {"params": params[1:], "shrink": True},
        ]
        super().__init__(groups, {"lr": lr, "beta": beta, "betas": betas, "eps": eps})
        self.share = share

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    (self._shrunk if group["shrink"] else self._adam)(p, p.grad, group)
        return loss

    def _adam(self, p: Tensor, g: Tensor, group: dict) -> None:
        st = self.state[p]
        if not st:
            st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        (b1, b2), st["step"] = group["betas"], st["step"] + 1
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (st["exp_avg_sq"] / (1 - b2 ** st["step"])).sqrt_().add_(group["eps"])
        p.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / (1 - b1 ** st["step"]))

    def _shrunk(self, p: Tensor, g: Tensor, group: dict) -> None:
        _shrunk_step(self.state[p], p, g, group, self.share())


def _shrunk_step(st: dict, p: Tensor, g: Tensor, group: dict, share: float) -> None:
    """One shrunk averaged step (eq. shrink) on the deviations ``p`` of one tensor; ``st`` its
    optimizer state (averages, step count, the factor c as ``st["shrinkage"]``)."""
    if not st:
        st.update(step=0, mean=torch.zeros_like(p), square=torch.zeros_like(p), shrinkage=0.0)
        st["lagged"] = 0.0
    beta, st["step"] = group["beta"], st["step"] + 1
    g = g - g.mean()  # the common part is the layer's ρ
    if "last" in st:  # successive hypergradients share w and the warm-started adjoint
        st["lagged"] = beta * st["lagged"] + (1 - beta) * float((g * st["last"]).sum())
    st["last"] = g.clone()
    st["mean"].mul_(beta).add_(g, alpha=1 - beta)
    st["square"].mul_(beta).addcmul_(g, g, value=1 - beta)
    c = shrinkage(st["mean"], st["square"], beta, st["step"], share, st.get("lagged", 0.0))
    st["shrinkage"] = c
    if c > 0:  # Adam-like per element: |m_e| ≤ √(mean g_e²), so at most lr · c
        c1 = 1 - beta ** st["step"]
        denom = (st["square"] / c1).sqrt_().add_(group["eps"])
        p.addcdiv_(st["mean"] / c1, denom, value=-group["lr"] * c)


class TrustShrinkageStep(TrustRprop):
    """The outer step of :class:`LayerThenShrunk` on ``[ρ_layers, s_1, ..., s_m]``: on ρ_layers
    exactly the per-layer default's step, :class:`~hypertorch_sid.core.outer_step.TrustRprop`
    (eqs. signsize, signstep, decaytrust: Rprop on log λ_layer, rises held to δ/(ηR)), on
    each s_i the shrunk averaged step of eq. shrink (as :class:`ShrinkageStep`). Told R and η
    by the callback (``observe``) like per-layer TrustRprop. Its state (Rprop's step sizes and
    last signs on ρ; the averages, step counts and factor c per s_i) is an optimizer's,
    checkpointed with it.

    ``share``: ``() -> b/n`` (the floor of the averages' noise; 0: none). ``lr``: Δ₀ of ρ and
    the deviations' step scale (as ``ShrinkageStep``'s lr); ``beta``: the averages' decay.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.3,
        beta: float = 0.9,
        share: Callable[[], float] = lambda: 0.0,
        step_sizes: tuple[float, float] = (1e-2, 2.0),
        trust: float = 0.1,
        eps: float = 1e-8,
    ) -> None:
        params = list(params)
        super().__init__(params[:1], lr=lr, step_sizes=step_sizes, trust=trust)
        self.add_param_group({"params": params[1:], "beta": beta, "eps": eps})
        self.share = share

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        (layers, deviations), self.bound = self.param_groups, False
        moved = []
        for p in layers["params"]:  # TrustRprop.step on ρ_layers alone
            if p.grad is not None:
                st, old = self._state_of(p, layers["lr"]), p.clone()
                moved.append(bool(self._signed_step(p, p.grad, layers, st).any()))
                self._trusted(p, old, st, layers)
        self.held_back = bool(moved) and not any(moved)
        self.max_rise = math.inf  # one observation, one step
        share = self.share()
        for p in deviations["params"]:
            if p.grad is not None:
                _shrunk_step(self.state[p], p, p.grad, deviations, share)
        return loss

    def __repr__(self) -> str:
        return f"TrustShrinkageStep({super().__repr__()})"


def shrinkage(
    mean: Tensor, square: Tensor, beta: float, t: int, share: float, lagged: float = 0.0
) -> float:
    """c of eq. shrink from the uncorrected exponential averages of g and g² after t steps
    (``lagged``: that of Σ_e g_e,t g_e,t−1, for the correlation r of successive steps)."""
    if mean.numel() < 3 or t * (1 - beta) < 1:  # the averages' noise is not known yet
        return 0.0
    c1 = 1 - beta**t
    w2 = (1 - beta) / (1 + beta) * (1 - beta ** (2 * t)) / c1**2  # Σ_t w_t² of the weights
    m = mean / c1
    var = (square / c1 - m.pow(2)).clamp_min(0) / (1 - w2)  # σ_e², unbiased
    total = float(var.sum())
    if not total > 0:
        return 0.0
    r = min(max((lagged / (1 - beta ** (t - 1)) - float(m.pow(2).sum())) / total, 0.0), 0.9)
    dims = m.numel() - 1  # centred
    noise = total * (w2 * (1 + r) / (1 - r) + share) * dims / m.numel()
    noise *= 1 + 2 * math.sqrt(2 / dims)  # two s.d. of a χ² spread of pure noise above it
    spread = float((m - m.mean()).pow(2).sum())
    if not spread > 0:
        return 0.0
    return max(0.0, 1.0 - noise / spread)


#: names of the per-element models (``elements=`` takes a name or an :class:`ElementModel`)
ELEMENT_MODELS: dict[str, Callable[[], ElementModel]] = {
    "tied": TiedToLayer,
    "untied": Untied,
    "shrunk": ShrunkToLayer,
    "layer_then_shrunk": LayerThenShrunk,
}


def as_element_model(value: str | ElementModel) -> ElementModel:
    """An :class:`ElementModel` from its name (``"tied"``, ``"untied"``, ``"shrunk"``,
    ``"layer_then_shrunk"``) or itself."""
    return as_strategy(
        "elements", value, ElementModel, ELEMENT_MODELS, example="TiedToLayer(scale=2.0)"
    )


def _filled(param: Tensor, value: float) -> Tensor:
    return (
        torch.full_like(param, value, memory_format=torch.contiguous_format)
        .detach()
        .requires_grad_(True)
    )


class WeightDecay:
    """λ over named tensors by granularity and parameterisation (see the module docstring).

    Parameters
    ----------
    named_parameters:
        ``(name, tensor)`` or ``(name, tensor, group_key)`` triples (``model.named_parameters()``);
        the group key is what ``"per_group"`` shares a λ by (default: ``"all"``).
    weight_decay:
        The initial λ₀ of every slot.
    granularity:
        One of :data:`GRANULARITIES`.
    parameterization:
        ``"log"``, ``"projection"`` or a :class:`Parameterization`.
    elements:
        Per element only: ``"tied"`` (:class:`TiedToLayer`, the default: layer λ and deviations
        under a prior), ``"untied"`` (:class:`Untied`), ``"shrunk"`` (:class:`ShrunkToLayer`),
        ``"layer_then_shrunk"`` (:class:`LayerThenShrunk`) or an :class:`ElementModel`.
    layer_of:
        The layer of a tensor by its name (what ``"per_layer"`` shares a λ by, and per element
        the layer λ ties to); default :func:`layer_by_name`.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, Tensor] | tuple[str, Tensor, str]],
        weight_decay: float,
        granularity: str = "global",
        parameterization: str | Parameterization = "log",
        elements: str | ElementModel = "tied",
        layer_of: Callable[[str], str] = layer_by_name,
    ) -> None:
        if granularity not in GRANULARITIES:
            raise ConfigurationError(
                f"granularity must be one of {list(GRANULARITIES)}, got {granularity!r}."
            )
        self.parameterization = as_parameterization(parameterization)
        self.elements = as_element_model(elements)
        if (
            isinstance(weight_decay, bool)
            or not isinstance(weight_decay, (int, float))
            or not math.isfinite(weight_decay)
        ):
            raise ConfigurationError(f"weight_decay must be a finite number, got {weight_decay!r}.")
        fill = self.parameterization.initial(float(weight_decay))
        #: λ₀ as given and ρ₀ = T⁻¹(λ₀) as computed: a slot whose ρ still holds ρ₀ (stored in
        #: its dtype) applies λ₀ itself, as ``SGD(weight_decay=λ₀)`` would; exp(log λ₀) in
        #: float32 is not λ₀ (5e-4 → 4.9999997e-4: the weights drifted by an ulp per step from
        #: the optimizer's own decay, held or not, session 57)
        self.start = (float(weight_decay), fill)
        self.granularity = granularity
        #: the layer of a tensor by its name (also of tensors not decayed: the invariance
        #: probe scales a slot's layers whole)
        self.layer_of = layer_of
        key = GRANULARITIES[granularity]
        slots: dict[str, int] = {}
        layers: dict[str, int] = {}
        self.entries: list[Decayed] = []
        for item in named_parameters:
            name, param = item[0], item[1]
            group = item[2] if len(item) > 2 else "all"  # type: ignore[misc]
            owner = layer_of(name)
            slot = (
                len(self.entries)
                if key is None
                else slots.setdefault(key(name, group, owner), len(slots))
            )
            layer = layers.setdefault(owner, len(layers))
            self.entries.append(Decayed(name, param, group, slot, layer))
        if not self.entries:
            raise ConfigurationError("WeightDecay needs at least one tensor to decay.")
        #: names of the λ slots (all but per-element granularity)
        self.slot_names = list(slots)
        #: names of the layers (modules owning decayed tensors; a tensor no layer owns: its
        #: own name), in ``Decayed.layer`` order
        self.layer_names = list(layers)
        like = self.entries[0].param
        if key is None:
            self.hyperparameters: Tensors = self.elements.create(self, fill)
        else:
            self.hyperparameters = [
                torch.full(
                    (len(slots),), fill, dtype=like.dtype, device=like.device
                ).requires_grad_(True)
            ]

    @torch.no_grad()
    def carry_from(self, old: WeightDecay) -> int:
        """Take the learned values from ``old`` for the tensors both decay (the same tensor
        objects, the same granularity, parameterisation and element model): a new fit that
        decays more tensors keeps what the last one learned for the others. Returns the number
        of values (tensors per element) carried."""
        if (
            old.granularity != self.granularity
            or type(old.parameterization) is not type(self.parameterization)
            or (self.per_element and type(old.elements) is not type(self.elements))
        ):
            return 0
        if self.per_element:
            return self.elements.carry(self, old)
        before = {id(e.param): e.slot for e in old.entries}
        carried: set[int] = set()
        for e in self.entries:
            slot = before.get(id(e.param))
            if slot is None or e.slot in carried:
                continue
            self.hyperparameters[0][e.slot] = old.hyperparameters[0][slot]
            carried.add(e.slot)
        return len(carried)

    @property
    def per_element(self) -> bool:
        return GRANULARITIES[self.granularity] is None

    def lambda_of(self, entry: Decayed) -> Tensor:
        """λ of one decayed tensor (a scalar, or shaped like it per element); differentiable."""
        if self.per_element:
            return self.elements.lambda_of(self, entry)
        return self.parameterization.transform(self.hyperparameters[0])[entry.slot]

    @torch.no_grad()
    def applied_lambdas(self) -> list[float | Tensor]:
        """λ of every decayed tensor as the training step applies it (detached): a number where
        it is one value over the tensor (every slot but per element's; per element where the
        element model says so, :meth:`ElementModel.applied`), else a tensor shaped like it."""
        if self.per_element:
            return [self.elements.applied(self, e) for e in self.entries]
        lam = self.numbers(self.hyperparameters[0])
        return [lam[e.slot] for e in self.entries]

    @torch.no_grad()
    def numbers(self, rho: Tensor) -> list[float]:
        """λ = T(ρ) of a vector of slots (or layers) as numbers, λ₀ exactly where ρ is still
        ρ₀ in ρ's dtype (:attr:`start`)."""
        lam0, fill = self.start
        rho0 = torch.tensor(fill, dtype=rho.dtype).item()
        lam = self.parameterization.transform(rho).tolist()
        return [lam0 if r == rho0 else x for r, x in zip(rho.tolist(), lam)]

    def prior(self, samples: int | None = None) -> Tensor | None:
        """The per-element model's prior term of the outer objective (eq. prior: add it to E),
        for a validation set of ``samples`` samples; None where there is none."""
        return self.elements.prior(self, samples) if self.per_element else None

    def values(self) -> dict[str, Tensor]:
        """The current λ of every decayed tensor, by name (detached)."""
        with torch.no_grad():
            return {e.name: self.lambda_of(e).detach().clone() for e in self.entries}

    def by_group(self) -> dict[str, Tensor]:
        """λ by slot, flattened (detached): one value per layer / group / tensor, or every value
        of a tensor per element; empty for a single global λ (``summary()`` holds it)."""
        with torch.no_grad():
            if self.per_element:
                return {e.name: self.lambda_of(e).flatten() for e in self.entries}
            if len(self.slot_names) < 2:
                return {}
            lam = self.parameterization.transform(self.hyperparameters[0])
            return {name: lam[i : i + 1] for i, name in enumerate(self.slot_names)}

    def summary(self) -> Tensor:
        """Every λ, flattened (detached)."""
        with torch.no_grad():
            if self.per_element:
                return torch.cat([self.lambda_of(e).flatten() for e in self.entries])
            return self.parameterization.transform(self.hyperparameters[0]).flatten()

    def coefficients_by_entry(self, scales: Sequence[Tensor | float] | None = None) -> Tensors:
        """c = P ⊙ λ of each decayed tensor (P = ``scales``, default 1)."""
        scales = scales if scales is not None else [1.0] * len(self.entries)
        return [s * self.lambda_of(e) for e, s in zip(self.entries, scales)]

    def penalty(self, scales: Sequence[Tensor | float] | None = None) -> Tensor:
        """½ Σ_p ⟨c_p, w_p²⟩ with c = P ⊙ λ: differentiable in w and λ."""
        terms = [
            0.5 * (c * e.param.pow(2)).sum()
            for e, c in zip(self.entries, self.coefficients_by_entry(scales))
        ]
        return torch.stack(terms).sum()

    def coefficients(
        self, inner_parameters: Sequence[Tensor], scales: Sequence[Tensor | float] | None = None
    ) -> Tensors:
        """c(λ) for every inner parameter (0 for undecayed ones): the proximal map's penalty."""
        by_param = {
            id(e.param): c for e, c in zip(self.entries, self.coefficients_by_entry(scales))
        }
        return [
            by_param.get(id(p), torch.zeros((), dtype=p.dtype, device=p.device))
            for p in inner_parameters
        ]

    def hyperparameter_names(self) -> list[str]:
        """The names of :attr:`hyperparameters`, by which a saved state is matched to them (the
        slots' order is the slots' own matter: :attr:`slot_names`)."""
        return self.elements.names(self) if self.per_element else ["λ[slots]"]

    def group_names(self) -> list[str]:
        """The groups :meth:`mask` flags: the λ slots, or per element the layers."""
        return self.layer_names if self.per_element else self.slot_names

    def group_of(self, entry: Decayed) -> int:
        """The index of ``entry``'s group in :meth:`group_names`."""
        return entry.layer if self.per_element else entry.slot

    def mask(self, flags: Sequence[bool]) -> Tensors:
        """1 on every learned value of a group flagged in ``flags`` (indexed like
        :meth:`group_names`), 0 elsewhere; shaped like :attr:`hyperparameters`."""
        if len(flags) != len(self.group_names()):
            raise ConfigurationError(
                f"mask: {len(flags)} flags for {len(self.group_names())} groups."
            )
        if self.per_element:
            return self.elements.mask(self, flags)
        like = self.hyperparameters[0]
        return [torch.tensor([float(f) for f in flags], dtype=like.dtype, device=like.device)]

    @torch.no_grad()
    def floor(self, lower: float) -> None:
        """Every λ ≥ ``lower`` (per element tied to its layer: every layer's λ), in place."""
        if not lower > 0:
            return
        if self.per_element:
            self.elements.floor(self, lower)
            return
        self.hyperparameters[0].clamp_(min=self.parameterization.initial(lower))

    @torch.no_grad()
    def project(self, upper: Sequence[float] | None = None) -> None:
        """λ onto [0, upper_e] for each decayed tensor e (default: no upper bound): P_Λ."""
        bounds = list(upper) if upper is not None else [math.inf] * len(self.entries)
        if self.per_element:
            self.elements.clamp(self, bounds)
            return
        by_slot: dict[int, float] = {}
        for e, u in zip(self.entries, bounds):
            by_slot[e.slot] = min(by_slot.get(e.slot, math.inf), u)
        for slot, bound in by_slot.items():
            self.parameterization.clamp(self.hyperparameters[0][slot], bound)


def as_parameterization(value: str | Parameterization) -> Parameterization:
    """A :class:`Parameterization` from its name (``"log"``, ``"projection"``) or itself."""
    return as_strategy("parameterization", value, Parameterization, PARAMETERIZATIONS)
