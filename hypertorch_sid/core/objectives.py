"""The outer objective E of data reweighting, on the validation losses: the mean loss, the
expected error and its margin variants, the class-relative error."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .errors import ConfigurationError
from .validation import as_strategy

Tensors = list[Tensor]


# ---------------------------------------------------------------------- the outer objective
class ValidationObjective(ABC):
    """E from the per-sample losses ℓⱼ of a validation batch (the outer objective the weights
    are tuned for)."""

    @abstractmethod
    def __call__(self, losses: Tensor) -> Tensor:
        """E (a scalar, differentiable in the losses)."""

    def read(self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]) -> Tensor:
        """What :meth:`__call__` reads from a validation ``batch``: by default the per-sample
        losses (``losses()``, the user's own on that batch); :class:`MarginError` reads the
        logits' margins instead."""
        return losses()


class MeanLoss(ValidationObjective):
    """E = mean ℓⱼ: the validation loss itself (with cross entropy, its calibration too)."""

    def __call__(self, losses: Tensor) -> Tensor:
        return losses.mean()

    def __repr__(self) -> str:
        return "MeanLoss()"


class ExpectedError(ValidationObjective):
    """E = mean (1 − e^{−q ℓⱼ}) / q: with the cross entropy ℓⱼ = −log p_{yⱼ}, GCE's
    (1 − p^q)/q of the validation predictions, and at q = 1 (default) their expected 0-1 error
    1 − p_{yⱼ}:

        E(w) = (1/|V|) Σⱼ (1 − exp(−q ℓⱼ(w))) / q,   ∇E = (1/|V|) Σⱼ e^{−q ℓⱼ} ∇ℓⱼ   (eq. softerr)

    (q → 0: the mean loss; a negative loss is refused). Each validation example's gradient is
    weighted by p_y^q, so the examples the network gets badly wrong (p_y → 0) no longer dominate
    E. Under the cross entropy they do, and a training label that only softens the network
    between two look-alike classes (a T-shirt labelled "shirt") lowers their loss: on the
    noisy-label CNNs such corrupted examples, 42–60 % of them from the ten most look-alike class
    pairs, were the ones the weights kept, and under this E their share of the weighted loss falls
    (Fashion symmetric seed 1: 13.6 → 7.4 %; docs/data_weights.md).
    """

    def __init__(self, q: float = 1.0) -> None:
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and q > 0):
            raise ConfigurationError(f"ExpectedError: q must be a number > 0, got {q!r}.")
        self.q = float(q)

    def __call__(self, losses: Tensor) -> Tensor:
        low = float(losses.detach().min()) if losses.numel() else 0.0  # both checks' one read
        self.refuse_negative(losses, low)
        self.refuse_saturated(losses, self.q, low)
        return (-torch.expm1(-self.q * losses)).mean() / self.q

    #: the largest e^{−qℓⱼ} below which E's gradient is refused as vanished (10⁻⁶ of the mean
    #: loss's); with a cross entropy: every validation example at p_y < (10⁻⁶)^{1/q}
    SATURATED = 1e-6

    @classmethod
    def refuse_saturated(cls, losses: Tensor, q: float, low: float | None = None) -> None:
        """A clear error where every validation example's e^{−qℓⱼ} is below
        :attr:`SATURATED`: E is then flat at 1/q and its gradient Σⱼ e^{−qℓⱼ}∇ℓⱼ vanishes (or
        underflows to exactly 0), so no weight would learn; a loss in other units than −log p
        (a squared error of targets in the tens) does this at the start of the fit. ``low``:
        the smallest loss, where the caller has read it."""
        if low is None:
            low = float(losses.detach().min()) if losses.numel() else 0.0
        if q * low > -math.log(cls.SATURATED):
            raise ConfigurationError(
                f"ExpectedError(q={q:g}) (LearnedDataWeights' default objective) reads each "
                f"validation loss as −log p of the right answer, but the smallest in this batch "
                f"is {low:.3g}: every e^(−qℓ) is below {cls.SATURATED:g}, so E is flat and its "
                "gradient vanishes (no weight would learn). A loss that is not a log-likelihood "
                "of labels, e.g. a squared or absolute error of a regression, or an "
                "autoencoder's reconstruction error or negative ELBO summed over its pixels, "
                "needs objective='mean_loss'."
            )

    @staticmethod
    def refuse_negative(losses: Tensor, low: float | None = None) -> None:
        """A clear error for a negative validation loss (e^(−ℓ) is then no probability).
        ``low``: the smallest loss, where the caller has read it (no second read)."""
        negative = low < 0 if low is not None else bool((losses.detach() < 0).any())
        if negative:
            raise ConfigurationError(
                f"ExpectedError (LearnedDataWeights' default objective) reads each validation "
                f"loss as −log p of the right answer (≥ 0), but got a negative one "
                f"({float(losses.detach().min()):.3g}): e^(−ℓ) is then no probability and its "
                "gradient grows without bound. Such a loss is no −log p: a Gaussian negative "
                "log-likelihood, or a loss with learned weights and offsets (uncertainty-"
                "weighted tasks, exp(−s)·ℓ + s), whose validation losses are training_step's "
                "on the validation batch. Pass objective='mean_loss' (their mean), or "
                "validation_loss=<a function (module, batch) → the per-sample −log p you "
                "validate, e.g. F.cross_entropy(module(x), y, reduction='none')> to keep the "
                "default objective on that."
            )

    def __repr__(self) -> str:
        return f"ExpectedError(q={self.q})"


class KeptEvidenceError(ValidationObjective):
    """ExpectedError whose q each validation batch chooses: the largest q ≤ ``q_max`` whose
    weights p_y^q = e^{−qℓⱼ} keep at least a share κ of the batch's evidence, measured by their
    effective sample size,

        ESS(q) = (Σⱼ e^{−qℓⱼ})² / Σⱼ e^{−2qℓⱼ},   q* = max {q ∈ [0, q_max] : ESS(q) ≥ κ|V|},
        E(w) = (1/|V|) Σⱼ (1 − exp(−q* ℓⱼ(w))) / q*   (q* held fixed; q* = 0: the mean loss)
                                                                            (eq. keptevidence)

    ESS(0) = |V| and ESS falls as q grows (d log ESS/dq = 2(E_{2q}[ℓ] − E_q[ℓ]) ≤ 0, the
    tilted mean of ℓ falling in the tilt), so q* is well defined. A well-fit validation batch
    (every p_y high, the weights nearly equal) keeps q* = q_max: :class:`ExpectedError`
    ``(q_max)``. A poorly fit one, whose p_y^q_max would hand most of the gradient to the few
    examples already right, slides toward q = 0, the mean loss (:class:`MeanLoss`), which keeps
    every example's evidence. q* is searched on ``grid`` + 1 equally spaced values of [0, q_max]
    in one tensor operation (no host synchronisation) and is not differentiated. ``q``: the q*
    of the last batch (q_max before the first); ``qs``: every batch's q* so far (a list of
    0-d tensors, read after the fit).
    """

    def __init__(self, q_max: float = 0.5, kappa: float = 0.5, grid: int = 64) -> None:
        if not (isinstance(q_max, (int, float)) and not isinstance(q_max, bool) and q_max > 0):
            raise ConfigurationError(
                f"KeptEvidenceError: q_max must be a number > 0, got {q_max!r}."
            )
        if not (isinstance(kappa, (int, float)) and not isinstance(kappa, bool) and 0 < kappa <= 1):
            raise ConfigurationError(
                f"KeptEvidenceError: kappa (the share of the validation batch's effective sample "
                f"size to keep) must lie in (0, 1], got {kappa!r}."
            )
        if not (isinstance(grid, int) and not isinstance(grid, bool) and grid >= 1):
            raise ConfigurationError(f"KeptEvidenceError: grid must be an int ≥ 1, got {grid!r}.")
        self.q_max, self.kappa, self.grid = float(q_max), float(kappa), grid
        self.qs: list[Tensor] = []

    @property
    def q(self) -> float:
        """q* of the last validation batch (q_max before the first)."""
        return float(self.qs[-1]) if self.qs else self.q_max

    def choose_q(self, losses: Tensor) -> Tensor:
        """q* of eq. keptevidence for these losses (0-d, detached)."""
        ell = losses.detach().reshape(-1).to(torch.float64)
        candidates = torch.linspace(
            0.0, self.q_max, self.grid + 1, dtype=ell.dtype, device=ell.device
        )
        log_w = -candidates[:, None] * (ell - ell.min())[None, :]  # shift: ESS is scale-free
        log_ess = 2 * torch.logsumexp(log_w, 1) - torch.logsumexp(2 * log_w, 1)
        keep = log_ess >= math.log(self.kappa * ell.numel()) - 1e-12
        keep[0] = True  # ESS(0) = |V|
        return candidates[keep.cumprod(0).sum() - 1].to(losses.dtype)

    def __call__(self, losses: Tensor) -> Tensor:
        ExpectedError.refuse_negative(losses)
        q = self.choose_q(losses)
        self.qs.append(q)
        safe = torch.where(q > 0, q, torch.ones_like(q))
        soft = -torch.expm1(-safe * losses) / safe
        return torch.where(q > 0, soft, losses).mean()

    def __repr__(self) -> str:
        return f"KeptEvidenceError(q_max={self.q_max}, kappa={self.kappa})"


class MarginError(ValidationObjective):
    """E = the validation predictions' 0-1 error smoothed in the logit margin:

        mⱼ = z_{yⱼ} − max_{k≠yⱼ} z_k,   E(w) = (1/|V|) Σⱼ σ(−mⱼ/τ),
        ∇E = −(1/|V|) Σⱼ σ'(mⱼ/τ)/τ · (∇z_{yⱼ} − ∇z_{kⱼ*})                    (eq. marginerr)

    (τ → 0: the error count; kⱼ* the top rival). Unlike the cross entropy and
    :class:`ExpectedError`, each validation example's gradient reads only its label against its
    top rival, weighted by a kernel symmetric about the decision boundary (m = 0): a training
    label that moves probability from class a to b gains on the validation examples of b just
    wrong and loses on those of a just right by the same weight, so softening the network
    between two look-alike classes is not rewarded for its own sake (under the cross entropy the
    wrong side weighs 1 − p_y, the right side almost 0). It reads the logits, not the losses:
    ``logits(module, batch) -> (z, y)`` (default ``module(batch[0]), batch[1]``; z of shape
    (B, C), C ≥ 2, y integer labels); a ``validation_loss=`` given to the drop-in must then
    return the per-sample margins itself.
    """

    def __init__(
        self,
        tau: float = 1.0,
        logits: Callable[[Any, Any], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau > 0):
            raise ConfigurationError(
                f"{type(self).__name__}: tau (the margin's temperature, in logit units) must be "
                f"a number > 0, got {tau!r}."
            )
        if logits is not None and not callable(logits):
            raise ConfigurationError(
                f"{type(self).__name__}: logits must be a callable (module, batch) -> (logits, "
                f"labels), got {type(logits).__name__}."
            )
        self.tau, self.logits = float(tau), logits

    def read(self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]) -> Tensor:
        if self.logits is not None:
            z, y = self.logits(module, batch)
        else:
            if not (isinstance(batch, (tuple, list)) and len(batch) >= 2):
                raise ConfigurationError(
                    f"{type(self).__name__} reads (inputs, labels) from the validation batch, "
                    f"got a {type(batch).__name__}: give logits=lambda module, batch: "
                    "(logits, labels)."
                )
            z, y = module(batch[0]), batch[1]
        return self.margins(z, y)

    def margins(self, z: Tensor, y: Tensor) -> Tensor:
        """mⱼ = z_{yⱼ} − max_{k≠yⱼ} z_k of logits z (B, C) and integer labels y (B,)."""
        if not isinstance(z, Tensor) or z.dim() != 2 or z.shape[1] < 2:
            shape = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ConfigurationError(
                f"{type(self).__name__}: the validation logits must have shape (batch, classes) "
                f"with ≥ 2 classes, got {shape}: give logits=lambda module, batch: (logits, "
                "labels)."
            )
        _check_class_labels(
            type(self).__name__,
            y,
            z.shape[:1],
            "give logits=lambda m, b: (m(b[0]), b[1].argmax(1))",
        )
        z_y = z.gather(1, y[:, None]).squeeze(1)
        rival = z.scatter(1, y[:, None], float("-inf")).amax(1)
        return z_y - rival

    def temperature(self, margins: Tensor) -> Tensor | float:
        """τ of eq. marginerr for this batch (fixed here)."""
        return self.tau

    def __call__(self, margins: Tensor) -> Tensor:
        return torch.sigmoid(-margins / self.temperature(margins)).mean()

    def __repr__(self) -> str:
        return f"MarginError(tau={self.tau})"


class AdaptiveMarginError(MarginError):
    """:class:`MarginError` whose τ each validation batch takes from its own margins: ∇E of
    eq. marginerr is a kernel estimate (logistic kernel, standard deviation πτ/√3) of the margins'
    density at the decision boundary, times their direction, so τ is set by Silverman's rule for
    that kernel's bandwidth,

        h = 0.9 · min(sd(m), IQR(m)/1.34) · |V|^{−1/5},   τ = √3 h / π   (held fixed; eq. marginbw)

    floored at ``min_tau``: the same smoothing relative to the margins' spread early in the fit
    (small logits) and late (large ones), where a fixed τ first counts every example and then
    only the few at the boundary. ``last_tau``: τ of the last batch (0-d; ``None`` before the
    first). Measured worse than the default on the noisy-label screen (−7.6 / −4.1 points on
    MNIST / Fashion-MNIST symmetric 40 %, seeds 1–2; docs/data_weights.md, session 43): kept for
    the record, not for use.
    """

    def __init__(
        self,
        min_tau: float = 0.05,
        logits: Callable[[Any, Any], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        super().__init__(min_tau, logits)
        self.min_tau = float(min_tau)
        self.last_tau: Tensor | None = None

    def temperature(self, margins: Tensor) -> Tensor:
        m = margins.detach().reshape(-1).to(torch.float64)
        n = m.numel()
        sd = m.std() if n > 1 else m.new_zeros(())
        iqr = (torch.quantile(m, 0.75) - torch.quantile(m, 0.25)) / 1.34
        spread = torch.where(iqr > 0, torch.minimum(sd, iqr), sd)
        tau = (math.sqrt(3) / math.pi) * 0.9 * spread * n ** (-0.2)
        self.last_tau = tau.clamp_min(self.min_tau).to(margins.dtype)
        return self.last_tau

    def __repr__(self) -> str:
        return f"AdaptiveMarginError(min_tau={self.min_tau})"


def _check_class_labels(who: str, y: Any, shape: torch.Size, one_hot_fix: str) -> None:
    """Validation labels as integer class indices of ``shape`` (one per validation example)."""
    if not isinstance(y, Tensor) or y.dtype.is_floating_point or y.shape != shape:
        got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise ConfigurationError(
            f"{who}: the validation labels must be integer class indices of shape "
            f"{tuple(shape)}, one per validation example, got {got}"
            + (f" of {y.dtype}" if isinstance(y, Tensor) else "")
            + f" (one-hot labels: {one_hot_fix})."
        )


class LabelledLosses(NamedTuple):
    """Per-sample validation losses with the batch's integer labels (what
    :class:`ClassRelativeError` reads)."""

    losses: Tensor
    labels: Tensor


class ClassRelativeError(ValidationObjective):
    """E = the mean over the batch's classes of the log of each class's expected error, each
    shrunk toward the batch's error by one pseudo-example:

        eⱼ = (1 − e^{−qℓⱼ})/q,   Ē_c = (Σ_{j: yⱼ=c} eⱼ + ē) / (n_c + 1),   ē = mean eⱼ (held fixed),
        E(w) = (1/|C|) Σ_{c ∈ C} log Ē_c,   ∇E = (1/|C|) Σ_c Σ_{j: yⱼ=c} ∇eⱼ / ((n_c + 1) Ē_c)
                                                                              (eq. classrel)

    (C: the classes present in the batch; q = 0.5 by default: the per-example error of
    :class:`ExpectedError` ``(0.5)``). Each class counts by its *relative* change in error, so a
    training label that moves a look-alike pair's boundary toward the harder class a (large
    Ē_a) at the cost of the easier b gains δ/Ē_a and loses δ/Ē_b: softening between two classes
    pays only where it lowers the pair's errors in proportion, not because the hard class's
    examples dominate the mean (under :class:`ExpectedError` and the cross entropy the gain and
    the loss count in absolute terms, and the hard classes' examples carry most of ∇E). The
    pseudo-example keeps a class whose few validation examples of the batch are all right from
    dividing by ≈ 0. Reads the labels as ``batch[1]`` (or ``labels(batch)``); the per-sample losses
    are the user's own (a negative one is refused, as by :class:`ExpectedError`).
    """

    def __init__(self, q: float = 0.5, labels: Callable[[Any], Tensor] | None = None) -> None:
        if not (isinstance(q, (int, float)) and not isinstance(q, bool) and q > 0):
            raise ConfigurationError(f"ClassRelativeError: q must be a number > 0, got {q!r}.")
        if labels is not None and not callable(labels):
            raise ConfigurationError(
                f"ClassRelativeError: labels must be a callable batch -> integer labels, got "
                f"{type(labels).__name__}."
            )
        self.q, self.labels = float(q), labels

    def read(
        self, module: Callable[..., Any], batch: Any, losses: Callable[[], Tensor]
    ) -> LabelledLosses:
        if self.labels is not None:
            y = self.labels(batch)
        elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
            y = batch[1]
        else:
            raise ConfigurationError(
                f"ClassRelativeError reads the labels as batch[1], got a {type(batch).__name__}: "
                "give labels=lambda batch: ..."
            )
        return LabelledLosses(losses(), y)

    def __call__(self, read: LabelledLosses) -> Tensor:  # type: ignore[override]
        if not isinstance(read, LabelledLosses):
            raise ConfigurationError(
                "ClassRelativeError needs the validation labels with the losses (read() gives "
                f"both), got a {type(read).__name__}: a validation_loss= returning per-sample "
                "losses cannot be used with it; drop validation_loss= (it then reads "
                "training_step's losses and the labels batch[1], or labels=)."
            )
        losses, y = read
        losses = losses.reshape(losses.shape[0], -1).mean(1) if losses.dim() > 1 else losses
        _check_class_labels(
            "ClassRelativeError", y, losses.shape, "labels=lambda batch: batch[1].argmax(1)"
        )
        ExpectedError.refuse_negative(losses)
        e = -torch.expm1(-self.q * losses) / self.q
        classes, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
        sums = e.new_zeros(classes.shape[0]).index_add(0, inverse, e)
        per_class = (sums + e.detach().mean()) / (counts.to(e.dtype) + 1)
        return per_class.log().mean()

    def __repr__(self) -> str:
        return f"ClassRelativeError(q={self.q})"


#: objectives by name (``LearnedDataWeights(objective=...)``)
OBJECTIVES: dict[str, Callable[[], ValidationObjective]] = {
    "mean_loss": MeanLoss,
    "expected_error": ExpectedError,
    "kept_evidence": KeptEvidenceError,
    "margin_error": MarginError,
    "adaptive_margin_error": AdaptiveMarginError,
    "class_relative_error": ClassRelativeError,
}


def as_validation_objective(value: str | ValidationObjective) -> ValidationObjective:
    """A :class:`ValidationObjective` from its name (``"mean_loss"``, ``"expected_error"``,
    ``"kept_evidence"``, ``"margin_error"``, ``"adaptive_margin_error"``,
    ``"class_relative_error"``)."""
    return as_strategy(
        "the validation objective", value, ValidationObjective, OBJECTIVES, "ExpectedError(q=0.7)"
    )
