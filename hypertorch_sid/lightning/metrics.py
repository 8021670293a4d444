"""What the callback reports: the ``hyper/*`` metrics of a hyper step (logged, kept in its
history), its plan at the start of a fit, and the warning for a fit too short for λ to move.

The metrics: ``outer_loss`` (E on the validation data), ``hypergradient_norm``,
``adjoint_residual`` ‖Ψ̂(v) − v‖, ``adjoint_eta``, ``alpha``, ``damping``, ``L``, ``lambda_min``,
``v_norm``, ``outer_lr``, ``retries`` (the divergences this hyper step recovered from,
``config.on_divergence``), ``train_samples``/``val_samples`` (cumulative, all processes),
``step``, ``overhead`` (with a budget), and ``<name>_mean/_min/_max`` (and quantiles for many
values) for each entry of the λ summary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
from torch import Tensor

from ..core.optimizer import SIDHyperOptimizer
from .namespaces import classes


def hyper_metrics(
    sid: SIDHyperOptimizer,
    summary: dict[str, Tensor],
    world_size: int,
    val_samples: int,
    overhead: float = math.nan,
) -> dict[str, float]:
    """The core's report of the last hyper step, the outer learning rate, the samples read, the
    budget's spending before this step (``overhead``, where there is a budget), and
    ``<name>_mean/_min/_max`` (and quantiles for many values) of each entry of the λ summary."""
    last = sid.last
    assert sid.outer_optimizer is not None
    lr = sid.outer_optimizer.param_groups[0].get("lr", math.nan)
    metrics = {
        "hyper/outer_loss": last["outer_loss"],  # averaged over processes by the core
        "hyper/hypergradient_norm": last["hypergradient_norm"],
        "hyper/adjoint_residual": last["adjoint_residual"],
        "hyper/adjoint_eta": last["adjoint_eta"],
        "hyper/alpha": last["alpha"],
        "hyper/damping": last["damping"],
        "hyper/relative_adjoint_residual": last["relative_adjoint_residual"],
        "hyper/v_norm": last["v_norm"],
        "hyper/L": last["L"],
        "hyper/lambda_min": last["lambda_min"],
        "hyper/retries": float(last.get("retries", 0)),
        "hyper/outer_lr": float(lr),
        "hyper/train_samples": float(sid.cost.samples * world_size),
        "hyper/val_samples": float(val_samples),
        "hyper/step": float(sid.hyper_step),
    }
    if math.isfinite(overhead):  # with a budget: its spending before this step
        metrics["hyper/overhead"] = overhead
    for name, value in summary.items():
        metrics.update(spread(f"hyper/{name}", value.detach().double().flatten()))
    return metrics


#: the quantile bands logged for many values (per-element λ)
QUANTILES = (10, 25, 50, 75, 90)

#: the most values the bands are read from: above it, from a fixed sample of this many
BAND_SAMPLE = 2**14


@functools.lru_cache(maxsize=16)
def _sample(n: int) -> np.ndarray:
    """BAND_SAMPLE positions of n, drawn once per n without replacement (seeded, sorted): the
    same positions at every hyper step, so the bands move only when λ does."""
    rng = np.random.default_rng(0)
    return np.sort(rng.choice(n, BAND_SAMPLE, replace=False))


def spread(prefix: str, v: Tensor) -> dict[str, float]:
    """``<prefix>_mean/_min/_max`` of the values ``v`` and, for more than two, the quantile
    bands ``_q10 ... _q90`` (the k-th smallest value, k = round(q/100 · m) in [1, m], of the m
    values ranked): one NumPy partition on the host for all five bands, none where every value
    is the same (per element while every deviation is 0). Of more than :data:`BAND_SAMPLE`
    values the bands rank a fixed sample of that many (mean, min and max stay exact): a band's
    rank then has a standard error of √(q(1−q)/m) ≤ 0.4 % of the values. Exact bands of the
    MNIST MLP's per-element λ (2.7·10^5 values, and each layer's) took ~16 ms a hyper step, as
    much as 4 training steps, charged to a budget; sampled, ~2 ms (runs/elem_s41)."""
    lo, hi = float(v.min()), float(v.max())
    out = {f"{prefix}_mean": float(v.mean()), f"{prefix}_min": lo, f"{prefix}_max": hi}
    n = v.numel()
    if n > 2:
        ranked = None
        if lo != hi:
            values = v.cpu().numpy()
            ranked = values if n <= BAND_SAMPLE else values[_sample(n)]
        m = n if ranked is None else ranked.size
        ks = [min(m, max(1, round(q / 100 * m))) for q in QUANTILES]
        if ranked is not None:
            ranked = np.partition(ranked, [k - 1 for k in ks])
        for q, k in zip(QUANTILES, ks):
            out[f"{prefix}_q{q}"] = lo if ranked is None else float(ranked[k - 1])
    return out


def lambda_mean(summary: dict[str, Tensor]) -> float:
    """The mean of every logged λ value (the progress bar's ``lam``). A name with a ``/``
    is a part of a total logged under its prefix (``weight_decay/fc1``) and not counted."""
    totals = [v for name, v in summary.items() if "/" not in name]
    total = sum(float(v.detach().double().sum()) for v in totals)
    count = sum(v.numel() for v in totals)
    return total / count if count else math.nan


def readable_progress_bar(trainer: Any) -> None:
    """Three significant digits on Lightning's ``RichProgressBar`` (its default progress bar
    where ``rich`` is installed), whose default ``.3f`` shows the progress bar's ``lam`` at the
    default start λ = 1e-4, and at any λ below 5e-4, as 0.000. Only the untouched default
    theme changes (``.3g`` prints a loss of 0.151 as before, 2.3012 as 2.3); a theme the user
    passed is theirs. TQDM's bar already prints three significant digits."""
    bar = getattr(trainer, "progress_bar_callback", None)
    if not isinstance(bar, classes("callbacks.progress.rich_progress.RichProgressBar")):
        return
    default = type(bar.theme)()  # RichProgressBarTheme of the bar's own Lightning namespace
    if bar.theme == default:
        # a copy: RichProgressBar's default theme is one instance shared by every bar
        bar.theme = dataclasses.replace(bar.theme, metrics_format=".3g")


#: a fit planned with fewer hyper steps than this gets a warning (λ cannot settle)
FEW_HYPER_STEPS = 10


def budget_cut(
    ran: int, due: int, needed: int, max_overhead: float | None, named: str = "λ"
) -> str | None:
    """The warning for a fit whose compute budget ran ``ran`` (> 0) of its ``due`` hyper steps:
    fewer than half of them and fewer than the ``needed`` (:data:`FEW_HYPER_STEPS`) for
    ``named`` to be learned (None: enough ran, or the budget cut few: 9 of 12 or 5 of 7 due is
    the budget's ordinary spacing, and a fit too short in itself was told so at its start,
    :func:`few_hyper_steps`). Counted, not timed. A 6-epoch 20 Newsgroups fit ran 3–4 of its 11
    due hyper steps at ``max_overhead=0.5`` and said nothing (session 53), while the user read
    the λ it printed as tuned."""
    if ran >= needed or 2 * ran >= due:
        return None
    limit = f"max_overhead={max_overhead:g}" if max_overhead is not None else "its budget"
    return (
        f"the compute budget ({limit}) ran only {ran} of the {due} hyper steps due in this "
        f"fit, fewer than the {needed} that {named} needs to move from its start and correct "
        f"itself, so {named} is barely learned: read it as close to where it started, not as "
        "tuned. Train longer (the budget grows with the training), raise max_overhead, or pass "
        "max_overhead=None (every due hyper step runs)."
    )


def few_hyper_steps(
    total: float,
    every: int,
    start_step: int,
    global_step: int,
    minimum: int = FEW_HYPER_STEPS,
    named: str = "λ",
) -> str | None:
    """The warning for a fit of ``total`` optimizer steps with fewer than ``minimum``
    (:data:`FEW_HYPER_STEPS`) hyper steps (None: enough, or the length is unknown).

    The outer optimizer moves λ a bounded amount per hyper step (Adam: about ``outer_lr``
    in log λ), so a fit of 32 optimizer steps with one hyper step every 20 learns nothing,
    silently; TrustRprop's steps grow while the sign holds, so a few can move λ far (of a
    digits CNN's 9 planned, the 6 its budget ran moved λ 20×) with none left to correct it.
    Hyper steps run at the multiples of ``every_n_steps`` from ``start_step`` on. ``named``
    names the hyperparameters the warning speaks of (``"the data weights"``: session 58, the
    data weights' warning spoke of λ).
    """
    if not math.isfinite(total) or total < 0:  # unknown (e.g. a stream, no max_steps): -1
        return None
    total, n = int(total), every
    first = max(start_step, global_step + 1, 1)
    planned = max(0, total // n - (first - 1) // n)
    if planned >= minimum:
        return None
    remaining = total - first + 1
    suggest = max(1, remaining // (2 * minimum))
    advice = "Train longer (more optimizer steps)"
    if remaining <= 0:  # the first hyper step is due after the fit's last step
        advice += (
            f", or lower start_step (the optimizer steps before it train plainly; the fit "
            f"ends at step {total})"
        )
    elif suggest < n:
        advice += (
            f", or pass every_n_steps={suggest} for {remaining // suggest} hyper steps (each "
            "costs its k adjoint products and a validation gradient)"
        )
    runs = (
        f"{total - global_step} more optimizer steps (from step {global_step} to {total})"
        if global_step > 0
        else f"{total} optimizer steps"
    )
    return (
        f"this fit runs {runs}, so only {planned} "
        f"hyper step{'s' if planned != 1 else ''} (one every every_n_steps={n} optimizer "
        f"steps{f', from start_step={start_step}' if start_step else ''}): {named} will "
        "barely move from where they start, or move with too few hyper steps left to correct "
        f"themselves. {advice}."
    )


def late_first_hyper_step(
    total: float, every: int, start_step: int, global_step: int, epoch_steps: float
) -> str | None:
    """The warning for a fit whose first hyper step comes in its second half and leaves fewer
    than two epochs (``epoch_steps`` optimizer steps each) after it (None: otherwise, none at
    all (:func:`few_hyper_steps` says so), or a length unknown). The thresholds are a judgement
    from the one recipe below, not a tuned rule.

    Data weights move per visit of their rows, but only once a hyper step has given v: the
    optimizer steps before the first train plainly, and the model trains with the weights only
    after it (session 51: MNIST with ``accumulate_grad_batches=4``, 96 optimizer steps, a
    MultiStepLR at steps 48 and 72, the first hyper step at step 80; test loss 0.7141 against
    plain's 0.7148 although the weights separated the noisy rows at AUC 0.95; with
    ``start_step=18, every_n_steps=18`` 0.50).
    """
    if not (math.isfinite(total) and math.isfinite(epoch_steps)) or total < 0:
        return None
    total, n = int(total), every
    first = -(-max(start_step, global_step + 1, 1) // n) * n
    after = total - first
    if first > total or 2 * first <= total or after >= 2 * epoch_steps:
        return None
    epochs = (
        "less than one epoch, so some rows' weights never move"
        if after < epoch_steps
        else f"{after / epoch_steps:.1f} epochs"
    )
    early = max(1, total // 5)
    return (
        f"the data weights move only from the first hyper step on (at optimizer step {first}: "
        f"start_step={start_step}, every_n_steps={n}), and this fit runs {total} optimizer "
        f"steps: the model trains with the weights only for its last {after} ({epochs}), "
        "and may end close to a plain fit. Train longer, or start earlier, e.g. "
        f"start_step={early}, every_n_steps={early} (gradient accumulation divides the "
        "optimizer steps these count)."
    )


def describe(callback: Any, sid: SIDHyperOptimizer, batch_size: int, world_size: int) -> str:
    """The callback's plan, logged when a fit starts."""
    n_hyper = sum(h.numel() for h in sid.hyperparameters)
    alpha = (
        f"alpha = {sid.alpha:.4g}"
        if sid.alpha is not None
        else "alpha = 2/(L+mu) estimated at the first hyper step"
    )
    return (
        f"{type(callback).__name__}: {n_hyper} hyperparameter values in "
        f"{len(sid.hyperparameters)} tensors; a hyper step every {callback.every_n_steps} "
        f"optimizer steps: k = {sid.adjoint_steps} adjoint steps "
        f"({sid.adjoint_batches}), J = {sid.config.batches.d2}, val = {callback.val!r}, "
        f"sampler batch {batch_size} per process × {world_size}; {alpha}."
    )
