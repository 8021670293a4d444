"""SID against the stochastic bilevel solvers on their own benchmark: benchopt's data cleaning.

The peers' code is ``benchopt/benchmark_bilevel`` (pinned, obtained and prepared by
``benchmarks/benchopt/get_benchmark.sh``; never copied here). Its MNIST data-cleaning problem:
20,000 training images, a fraction p of them given uniformly random labels, 5,000 clean validation
images, the 10,000 test images, standardised pixels, multinomial logistic regression
z ∈ R^{784×10} with the L2 term reg‖z‖² (reg = 0.2) and one weight σ(xᵢ) per training example:

    g(z, x) = (1/n) Σᵢ σ(xᵢ) CE(Xᵢ z, ỹᵢ) + reg ‖z‖²,   f(z) = (1/m) Σⱼ CE(X'ⱼ z, y'ⱼ).

Subcommands (run in the environment of ``benchmarks/benchopt/setup_env.sh``):

``config``     the benchopt YAML: the chosen peers with the benchmark's best parameters for each p
               (``config/datacleaning0_{5,7,9}_best_params.yml``), our SID solver, the seeds.
``run``        ``benchopt run`` of that YAML (one run: every method, same machine, same budget),
               single-threaded JAX and torch, then the L-BFGS baselines.
``baselines``  unweighted and perfect weights (1 clean, 0 corrupted), L-BFGS on g, test error.
``resolve``    each peer's (z, weights) and SID's weights re-solved to optimality (L-BFGS on g):
               test error and f of the exact inner solution against the method's own iterate.
``descend``    exact full-batch hypergradient descent from a peer's and SID's weights: f and test
               error on the way to a bilevel stationary point.
``decompose``  a peer's weights re-solved in parts (clean / corrupted rows, per class, rescaled).
``scaled``     the perfect weights times c, re-solved: test error and f against the weights' scale.
``summarise``  JSON + figure (test error against wall time and against samples read, median and
               range over seeds) + a markdown table under ``benchmarks/results/data_cleaning/``.

Timing: the benchmark's clock (benchopt's callback timer) with the patch of ``get_benchmark.sh``
that blocks on each JAX epoch's results before the clock stops (JAX dispatches asynchronously);
SID's torch work is synchronous on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("BENCH_DC_OUT", ROOT / "benchmarks" / "results" / "data_cleaning"))
#: the peers' benchmark, fetched beside the repository by benchopt/get_benchmark.sh
BENCH_DIR = Path(os.environ.get("BENCH_BILEVEL_DIR", ROOT.parent / "benchmark_bilevel"))
RATIOS = (0.5, 0.7, 0.9)
PEERS = ("SOBA", "SABA", "SRBA", "StocBiO", "AmIGO", "MRBO", "F2SA")
DEFAULT_PEERS = ("SOBA", "SABA", "SRBA", "StocBiO", "AmIGO")
#: minibatches (of ``batch_size``) each peer draws per outer iteration, counted in its solver file
#: at the pinned commit: inner + outer gradient (SOBA, SABA, SRBA), + n_inner_steps inner SGD and
#: n_shia_steps / linear-system steps (StocBiO, AmIGO: 10 + 10), n_shia_steps (MRBO: 10).
BATCHES_PER_ITER = {
    "SOBA": 2,
    "SABA": 2,
    "SRBA": 2,
    "StocBiO": 22,
    "AmIGO": 22,
    "MRBO": 12,
    "F2SA": 33,
}
#: parameters renamed in the solvers since the best-parameter files were written (same values)
RENAMED = {"init_memory": "mode_init_memory"}
#: F2SA's only tuned parameters on this problem (p = 0.5): used at every p
F2SA_PARAMS = "datacleaning0_5_021424_best_params.yml"
N_TRAIN, N_VAL, REG, DATA_SEED = 20_000, 5_000, 0.2, 32
#: every method's start, x₀ = −2 (the benchmark's ``outer_var0``): ω₀ = σ(−2)
X0_WEIGHT = 1 / (1 + np.exp(2.0))


# ------------------------------------------------------------------ the problem as they build it
def load_problem(mnist_pkl: Path | dict, ratio: float, random_state: int = DATA_SEED) -> dict:
    """The split, corruption and scaling of benchmark_bilevel's ``datasets/mnist.py`` (same calls
    in the same order on the same ``RandomState``), plus the clean labels it throws away."""
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    if isinstance(mnist_pkl, dict):
        mnist = mnist_pkl
    else:
        with open(mnist_pkl, "rb") as f:
            mnist = pickle.load(f)
    rng = np.random.RandomState(random_state)
    n_train = min(N_TRAIN, len(mnist["training_labels"]) // 2)
    n_val = min(N_VAL, len(mnist["training_labels"]) - n_train)
    X_train, X_val, y_train, y_val = train_test_split(
        mnist["training_images"],
        mnist["training_labels"],
        test_size=n_val,
        train_size=n_train,
        random_state=rng,
    )
    y_clean = np.array(y_train, copy=True)
    y_noisy = np.array(y_train, copy=True)
    resampled = rng.rand(n_train) < ratio
    y_noisy[resampled] = rng.randint(0, 10, np.sum(resampled))
    scaler = StandardScaler()
    X_train = scaler.fit_transform(X_train)
    return dict(
        X_train=X_train,
        y_train=y_noisy,
        y_clean=y_clean,
        resampled=resampled,
        corrupted=y_noisy != y_clean,
        X_val=scaler.transform(X_val),
        y_val=np.asarray(y_val),
        X_test=scaler.transform(mnist["test_images"]),
        y_test=np.asarray(mnist["test_labels"]),
    )


def _weighted_objective(z_flat, X, y, w, reg, n_classes=10):
    """g(z) = (1/n) Σ wᵢ CE(Xᵢ z, yᵢ) + reg‖z‖² and its gradient (float64)."""
    z = z_flat.reshape(X.shape[1], n_classes)
    logits = X @ z
    logits -= logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    n = len(y)
    value = -(w * log_p[np.arange(n), y]).sum() / n + reg * (z**2).sum()
    p = np.exp(log_p)
    p[np.arange(n), y] -= 1.0
    grad = X.T @ (w[:, None] * p) / n + 2 * reg * z
    return value, grad.reshape(-1)


def fit_weighted(X, y, w, reg: float = REG, n_classes: int = 10, z0=None) -> np.ndarray:
    """argmin_z g(z) for fixed weights, by L-BFGS (the baselines), from ``z0`` (default 0)."""
    from scipy.optimize import minimize

    z0 = np.zeros(X.shape[1] * n_classes) if z0 is None else np.asarray(z0).reshape(-1)
    res = minimize(
        _weighted_objective,
        z0,
        args=(X, y, w, reg, n_classes),
        jac=True,
        method="L-BFGS-B",
        options=dict(maxiter=1000, gtol=1e-8),
    )
    return res.x.reshape(X.shape[1], n_classes)


def error(z, X, y) -> float:
    return float(np.mean((X @ z).argmax(1) != y))


def baselines(problem: dict) -> dict:
    """Test error of the unweighted fit (all wᵢ = 1), of perfect weights (1 clean, 0 wrong) and
    of perfect weights self-normalised (the data term Σ ωᵢℓᵢ / Σ ωᵢ: not the benchmark's g)."""
    X = problem["X_train"].astype(np.float64)
    out = {}
    perfect = (~problem["corrupted"]).astype(np.float64)
    for name, w in (
        ("unweighted", np.ones(len(X))),
        ("perfect weights", perfect),
        # Σ ωᵢℓᵢ / Σ ωᵢ (the drop-in's normalize=True) with the perfect ω: n/n_clean on the clean
        ("perfect weights, self-normalised", perfect / perfect.mean()),
    ):
        t0 = time.perf_counter()
        z = fit_weighted(X, problem["y_train"], w)
        out[name] = dict(
            test_error=error(z, problem["X_test"], problem["y_test"]),
            val_error=error(z, problem["X_val"], problem["y_val"]),
            seconds=time.perf_counter() - t0,
        )
    return out


# ---------------------------------------------------------------------- flagging corrupted examples
def flagging(weights: np.ndarray, corrupted: np.ndarray, initial: float = X0_WEIGHT) -> dict:
    """How well low weights flag the corrupted examples: precision/recall of what the library
    flags (``SampleWeights.flagged()``: the two-component split of the logits, ω₀ = ``initial``,
    the benchmark's σ(−2)) and of 'ω < mean ω', the precision at k = #corrupted lowest weights
    (= recall there), and average precision."""
    weights, corrupted = np.asarray(weights, float), np.asarray(corrupted, bool)
    flagged = weights < weights.mean()
    tp = int((flagged & corrupted).sum())
    k = int(corrupted.sum())
    lowest = np.argsort(weights, kind="stable")[:k]
    order = np.argsort(weights, kind="stable")
    hits = corrupted[order]
    precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    ap = float((precision_at * hits).sum() / max(k, 1))
    split = library_flags(weights, initial)
    tp_split = int((split & corrupted).sum())
    return dict(
        flagged_precision=tp_split / max(int(split.sum()), 1),
        flagged_recall=tp_split / max(k, 1),
        precision=tp / max(int(flagged.sum()), 1),
        recall=tp / max(k, 1),
        precision_at_k=float(corrupted[lowest].mean()) if k else float("nan"),
        average_precision=ap,
        mean_weight_clean=float(weights[~corrupted].mean()),
        mean_weight_corrupted=float(weights[corrupted].mean()) if k else float("nan"),
    )


def library_flags(weights: np.ndarray, initial: float = X0_WEIGHT) -> np.ndarray:
    """The mask of ``SampleWeights(initial=...).flagged()`` for sigmoid weights ``weights``."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import torch

    from hypertorch_sid.core.sample_weights import SampleWeights

    w = np.clip(np.asarray(weights, np.float64), 1e-15, 1 - 1e-15)
    family = SampleWeights(len(w), initial=initial, dtype=torch.float64)
    with torch.no_grad():
        family.logits.copy_(torch.as_tensor(np.log(w / (1 - w))))
    mask = np.zeros(len(w), bool)
    mask[family.flagged().numpy()] = True
    return mask


# ---------------------------------------------------------------------- the benchopt configuration
def best_params(ratio: float, peers: Sequence[str], bench_dir: Path = BENCH_DIR) -> list[str]:
    """The peers' entries of ``config/datacleaning0_X_best_params.yml``, as written there, minus
    ``framework=none`` (not a parameter of these solvers at the pinned commit) and the seeds, with
    SABA's ``init_memory`` under its current name ``mode_init_memory``."""
    text = bench_dir / "config" / f"datacleaning{str(ratio).replace('.', '_')}_best_params.yml"
    entries = {}
    lines = text.read_text().splitlines()
    if "F2SA" in peers:  # tuned only at p = 0.5, in the February 2024 file: used at every p
        f2sa = (bench_dir / "config" / F2SA_PARAMS).read_text().splitlines()
        lines += [line for line in f2sa if line.strip().startswith("- F2SA[")]
    for line in lines:
        line = re.sub(r",?random_state=\[[^\]]*\]?", "", line)  # some lack their "]"
        m = re.match(r"\s*-\s*(\w+)\[(.*?)\]?\s*$", line)
        if m and m.group(1) in peers:
            params = [
                RENAMED.get(p.split("=")[0], p.split("=")[0]) + p[len(p.split("=")[0]) :]
                for p in re.split(r",(?![^\[]*\])", m.group(2))
                if p and not p.startswith(("framework", "random_state"))
            ]
            entries.setdefault(m.group(1), f"{m.group(1)}[{','.join(params)}]")
    missing = [p for p in peers if p not in entries]
    if missing:
        raise SystemExit(f"no best parameters for {missing} at p={ratio} in {text}")
    return [entries[p] for p in peers]


def write_config(
    path: Path,
    ratios: Sequence[float],
    peers: Sequence[str],
    sid: Sequence[str],
    seeds: Sequence[int],
    timeout: float,
    bench_dir: Path = BENCH_DIR,
) -> Path:
    """One YAML per p is what benchopt's best-parameter files are; we write one per p too."""
    seeds_txt = "[" + ", ".join(str(s) for s in seeds) + "]"
    lines = [
        "objective:",
        "  - Bilevel Optimization",
        "dataset:",
        f"  - mnist[ratio={ratios[0]}]",
        "solver:",
    ]
    for entry in best_params(ratios[0], peers, bench_dir):
        lines.append(f"  - {entry[:-1]},random_state={seeds_txt}]")
    for variant in sid:
        lines.append(f"  - SID[{variant},random_state={seeds_txt}]")
    lines += [
        "n-repetitions: 1",
        "max-runs: 1000000",
        f"timeout: {int(timeout)}",
        f"output: {path.stem}",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------- summarising the runs
#: the SID solver's defaults (benchmarks/benchopt/solvers/sid.py ``parameters``)
SID_DEFAULTS = {
    "regime": "drop_in",
    "inner_lr": "1.0",
    "outer_beta1": "default",
    "outer_objective": "f",
    "normalize": "false",
}
#: the outer objective E in a SID row's label: 'f' (the benchmark's own, the solver's default
#: since session 47) is left unwritten; 'drop_in' is LearnedDataWeights()'s default objective,
#: which sessions 41-46 wrote 'default' (the solver refuses that value now; old rows keep it)
E_LABEL = {"drop_in": "drop-in's default", "default": "drop-in's default"}


def _sid_params(solver_name: str) -> tuple[str, str, str, str, bool]:
    """(regime, inner_lr, outer_beta1, objective, normalize) of a SID entry, the solver's
    defaults where not written."""
    get = lambda key: (re.search(rf"{key}=([\w.]+)", solver_name) or [0, SID_DEFAULTS[key]])[1]  # noqa: E731
    return (
        get("regime"),
        str(float(get("inner_lr"))),
        sid_beta1(get("outer_beta1")),
        get("outer_objective"),
        get("normalize").lower() in ("true", "1"),
    )


def sid_beta1(value: str) -> str:
    """The solver's ``outer_beta1`` as written in its file names: 'default' or a float."""
    return value if value == "default" else str(float(value))


def sid_label(
    regime: str,
    inner_lr: str,
    beta1: str = "default",
    objective: str = "default",
    normalize: bool = False,
) -> str:
    """'SID (defaults)': the drop-in's regime and defaults (``LearnedDataWeights``);
    'SID (Algorithm 1, SIDConfig())': one ``SIDHyperOptimizer.step`` per hyper step; the
    training's initial SGD step (a user's choice, one value for every p; 1.0 by default) is
    written where not 1.0, the outer ``LazyAdam``'s β₁ where not the drop-in's, and the outer
    objective E where not the benchmark's f (``drop_in``, and the old rows' ``default``:
    ``LearnedDataWeights()``'s default objective; ``mean_loss``: f by another name)."""
    name = "defaults" if regime == "drop_in" else "Algorithm 1, SIDConfig()"
    lr = f", SGD lr={float(inner_lr):g}" if float(inner_lr) != 1.0 else ""
    b1 = f", outer β₁={float(beta1):g}" if beta1 != "default" else ""
    obj = f", E={E_LABEL.get(objective, objective)}" if objective != "f" else ""
    norm = ", self-normalised Σωℓ/Σω: not the benchmark's g" if normalize else ""
    return f"SID ({name}{lr}{b1}{obj}{norm})"


def sid_file(
    regime: str, inner_lr: str, beta1: str, objective: str, normalize: bool, p, seed: int
) -> str:
    """The name of the solver's ``SID_BENCH_OUT`` file (its ``tag``): E always written since
    session 47 (``_Ef``, ``_Edrop_in``); the old rows' ``outer_objective=default`` had none."""
    b1 = "" if beta1 == "default" else f"_b1{beta1}"
    obj = "" if objective == "default" else f"_E{objective}"
    norm = "_norm" if normalize else ""
    return f"sid_{regime}_lr{inner_lr}{b1}{obj}{norm}_p{p}_seed{seed}.npz"


def method_of(solver_name: str) -> str:
    """'SOBA[batch_size=64,...]' -> 'SOBA'; SID entries -> :func:`sid_label`."""
    base = solver_name.split("[")[0]
    return sid_label(*_sid_params(solver_name)) if base == "SID" else base


def seed_of(solver_name: str) -> int:
    m = re.search(r"random_state=(\d+)", solver_name)
    return int(m.group(1)) if m else 0


def curves(records: Iterable[dict]) -> dict:
    """{(p, method): {seed: (time, samples, test_error) arrays}} from benchopt result rows
    (``solver_name``, ``p_dataset_ratio``, ``stop_val``, ``time``, ``objective_test_accuracy``
    — the benchmark's 'accuracy' metric is the error rate — and optional ``samples``)."""
    out: dict = {}
    for r in records:
        key = (float(r["p_dataset_ratio"]), method_of(r["solver_name"]))
        out.setdefault(key, {}).setdefault(seed_of(r["solver_name"]), []).append(r)
    for seeds in out.values():
        for seed, rows in seeds.items():
            rows.sort(key=lambda r: r["stop_val"])
            seeds[seed] = dict(
                time=np.array([r["time"] for r in rows], float),
                samples=np.array([r.get("samples", np.nan) for r in rows], float),
                test_error=np.array([r["objective_test_accuracy"] for r in rows], float),
                val_error=np.array([r["objective_value"] for r in rows], float),
            )
    return out


def at_budget(curve: dict, budget: float) -> float:
    """Test error of the last evaluation within the budget (wall time of the work)."""
    inside = curve["time"] <= budget
    return float(curve["test_error"][inside][-1]) if inside.any() else float("nan")


def time_to_reach(
    curve: dict, target: float, axis: str = "time", budget: float | None = None
) -> float:
    """First time (or ``axis="samples"``: samples read) the test error is ≤ target (inf if
    never, or, with ``budget``, not at an evaluation within that much wall time)."""
    reached = curve["test_error"] <= target + 1e-12
    if budget is not None:
        reached &= curve["time"] <= budget
    hit = np.nonzero(reached)[0]
    return float(curve[axis][hit[0]]) if len(hit) else float("inf")


#: "near the perfect weights": the goal's first half, within 0.5 point of their test error
NEAR_PERFECT_POINTS = 0.5


def time_to_target_median(seeds: dict, target: float, budget: float, axis: str = "time") -> float:
    """Median over seeds of :func:`time_to_reach` within the budget (inf: not reached by at
    least half of the seeds)."""
    return float(np.median([time_to_reach(c, target, axis, budget) for c in seeds.values()]))


def error_at_samples(curve: dict, samples: float) -> float:
    """Test error at the last evaluation after the start that had read at most ``samples``
    examples (nan: none had, or the samples are not counted)."""
    inside = (curve["samples"] <= samples) & (curve["samples"] > 0)
    return float(curve["test_error"][inside][-1]) if inside.any() else float("nan")


def samples_at_budget(curve: dict, budget: float) -> float:
    """Samples read by the last evaluation within the budget (nan where not counted)."""
    inside = curve["time"] <= budget
    return float(curve["samples"][inside][-1]) if inside.any() else float("nan")


def summarise(
    runs: dict, budget: float, baselines_: dict | None = None, flags: dict | None = None
) -> dict:
    """Per p: final test error at the common budget (median, min, max over seeds) for every
    method, the best peer, each method's time to reach the best peer's final error, the gap to
    perfect weights and the flagging quality."""
    table: dict = {}
    for (p, method), seeds in sorted(runs.items()):
        finals = [at_budget(c, budget) for c in seeds.values()]
        table.setdefault(p, {})[method] = dict(
            seeds=sorted(seeds),
            final_median=float(np.median(finals)),
            final_min=float(np.min(finals)),
            final_max=float(np.max(finals)),
            samples_at_budget_median=float(
                np.median([samples_at_budget(c, budget) for c in seeds.values()])
            ),
        )
        own = table[p][method]
        own["time_to_own_final_median"] = time_to_target_median(seeds, own["final_median"], budget)
        own["samples_to_own_final_median"] = time_to_target_median(
            seeds, own["final_median"], budget, "samples"
        )
    for p, methods in table.items():
        peers = {m: v for m, v in methods.items() if not m.startswith("SID")}
        if peers:
            best = min(peers, key=lambda m: peers[m]["final_median"])
            target = peers[best]["final_median"]
            methods_meta = dict(best_peer=best, target=target)
            for m, v in methods.items():
                seeds = runs[(p, m)]
                v["time_to_best_peer_median"] = time_to_target_median(seeds, target, budget)
                v["samples_to_best_peer_median"] = time_to_target_median(
                    seeds, target, budget, "samples"
                )
            table[p] = dict(methods=methods, **methods_meta)
        else:
            table[p] = dict(methods=methods)
        key = str(p)
        sid = methods.get("SID (defaults)")
        if sid is not None and np.isfinite(sid["samples_at_budget_median"]):
            n = sid["samples_at_budget_median"]  # everyone at the samples SID read: load-free
            table[p]["equal_samples"] = n
            for m, v in methods.items():
                errs = [error_at_samples(c, n) for c in runs[(p, m)].values()]
                v["error_at_equal_samples_median"] = float(np.median(errs))
        if baselines_ and key in baselines_:
            table[p]["baselines"] = baselines_[key]
            perfect = baselines_[key]["perfect weights"]["test_error"]
            near = perfect + NEAR_PERFECT_POINTS / 100
            table[p]["near_perfect_target"] = near
            for m, v in methods.items():
                v["gap_to_perfect_points"] = 100 * (v["final_median"] - perfect)
                seeds = runs[(float(p), m)]
                v["time_to_near_perfect_median"] = time_to_target_median(seeds, near, budget)
                v["samples_to_near_perfect_median"] = time_to_target_median(
                    seeds, near, budget, "samples"
                )
        if flags and key in flags:
            table[p]["flagging"] = flags[key]
    return {str(p): v for p, v in table.items()}


def _count(x: float) -> str:
    """1.2e6-style sample counts; ∞ and unknown spelled out."""
    if np.isnan(x):
        return "–"
    return "∞" if np.isinf(x) else f"{x:.2g}"


def markdown(summary: dict, budget: float) -> str:
    lines = [
        f"Test error at a common budget of {budget:g} s (median [min, max] over seeds); "
        "time to reach the best peer's final error (median over seeds; ∞: never).",
        "",
    ]
    for p, s in summary.items():
        lines += [
            f"### p = {p}",
            "",
            "| method | test error | gap to perfect (points) | time to best peer's error (s) "
            "| samples read in the budget | samples to best peer's error |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for m, v in sorted(s["methods"].items(), key=lambda kv: kv[1]["final_median"]):
            gap = v.get("gap_to_perfect_points")
            ttr = v.get("time_to_best_peer_median", float("nan"))
            reads = v.get("samples_at_budget_median", float("nan"))
            str_ = v.get("samples_to_best_peer_median", float("nan"))
            lines.append(
                f"| {m} | {v['final_median']:.4f} [{v['final_min']:.4f}, {v['final_max']:.4f}] | "
                f"{'' if gap is None else f'{gap:+.2f}'} | {ttr:.1f} | {_count(reads)} | "
                f"{_count(str_)} |"
            )
        for name, b in s.get("baselines", {}).items():
            lines.append(f"| *{name}* (L-BFGS) | {b['test_error']:.4f} | | | | |")
        if "near_perfect_target" in s:
            lines += [
                "",
                f"Time and samples to within {NEAR_PERFECT_POINTS:g} point of the perfect "
                f"weights (test error ≤ {s['near_perfect_target']:.4f}) and to the method's own "
                "final median error, within the budget (median over seeds; ∞: not reached by "
                "half of the seeds):",
                "",
                "| method | time to ≤ perfect + 0.5 pt (s) | samples to it | time to its own "
                "final error (s) | samples to it |",
                "|---|---:|---:|---:|---:|",
            ]
            for m, v in sorted(s["methods"].items(), key=lambda kv: kv[1]["final_median"]):
                lines.append(
                    f"| {m} | {v['time_to_near_perfect_median']:.1f} | "
                    f"{_count(v['samples_to_near_perfect_median'])} | "
                    f"{v['time_to_own_final_median']:.1f} | "
                    f"{_count(v['samples_to_own_final_median'])} |"
                )
        if "best_peer" in s:
            lines += ["", f"Best peer: {s['best_peer']} ({s['target']:.4f}).", ""]
        if "equal_samples" in s:
            at = sorted(
                (v["error_at_equal_samples_median"], m)
                for m, v in s["methods"].items()
                if np.isfinite(v.get("error_at_equal_samples_median", np.nan))
            )
            lines += [
                f"Test error after {_count(s['equal_samples'])} samples read (what SID (defaults) "
                "read in the budget; median over seeds; a method is left out where its first "
                "evaluation came later): " + ", ".join(f"{m} {e:.4f}" for e, m in at) + ".",
                "",
            ]
        for m, f in s.get("flagging", {}).items():
            split = (
                f"`flagged()` (two-component split) precision {f['flagged_precision']:.3f}, "
                f"recall {f['flagged_recall']:.3f}; "
                if "flagged_precision" in f
                else ""
            )
            lines.append(
                f"- Flagging by {m}: {split}precision {f['precision']:.3f}, recall "
                f"{f['recall']:.3f} "
                f"(ω < mean ω), precision@#corrupted {f['precision_at_k']:.3f}, average "
                f"precision {f['average_precision']:.3f}; mean ω clean "
                f"{f['mean_weight_clean']:.3f}, corrupted {f['mean_weight_corrupted']:.3f}."
            )
        lines.append("")
    return "\n".join(lines)


def plot(runs: dict, summary: dict, path: Path, budget: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted({p for p, _ in runs})
    fig, axes = plt.subplots(2, len(ratios), figsize=(5 * len(ratios), 8), squeeze=False)
    methods = sorted({m for _, m in runs})
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    for j, p in enumerate(ratios):
        for row, xkey in enumerate(("time", "samples")):
            ax = axes[row, j]
            for m in methods:
                seeds = runs.get((p, m))
                if not seeds:
                    continue
                for k, c in enumerate(seeds.values()):
                    x = c[xkey]
                    keep = np.isfinite(x) & (c["time"] <= budget)
                    if xkey == "samples":
                        keep &= x > 0
                    ax.plot(
                        x[keep],
                        c["test_error"][keep],
                        color=colors[m],
                        lw=1.2,
                        alpha=0.85,
                        label=m if k == 0 else None,
                    )
            base = summary.get(str(p), {}).get("baselines", {})
            for name, ls in (("unweighted", ":"), ("perfect weights", "--")):
                if name in base:
                    ax.axhline(base[name]["test_error"], color="k", ls=ls, lw=1, label=name)
            ax.set_xscale("log")
            if xkey == "time":
                ax.set_xlim(left=0.05)
            ax.set_ylim(bottom=min(0.12, ax.get_ylim()[0]), top=0.4)
            ax.set_xlabel("wall time of the work (s)" if xkey == "time" else "samples read")
            ax.set_ylabel("test error")
            ax.set_title(f"p = {p}")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------------- reading the run's files
def read_results(parquets: Sequence[Path], sid_dir: Path) -> list[dict]:
    """benchopt's parquet rows, with ``samples`` (examples read) added: for a peer
    iterations × batches per iteration × batch size (the benchmark's ``eval_freq`` iterations per
    evaluation), for SID what its solver counted (saved in ``sid_dir``)."""
    import pandas as pd

    rows = pd.concat([pd.read_parquet(p) for p in parquets]).to_dict("records")
    for r in rows:
        method = method_of(r["solver_name"])
        if method in BATCHES_PER_ITER:
            m = re.search(r"eval_freq=(\d+)", r["solver_name"])
            b = re.search(r"batch_size=(\d+)", r["solver_name"])
            r["samples"] = (
                r["stop_val"] * int(m.group(1)) * BATCHES_PER_ITER[method] * int(b.group(1))
            )
        elif method.startswith("SID"):
            seed = seed_of(r["solver_name"])
            f = sid_dir / sid_file(*_sid_params(r["solver_name"]), r["p_dataset_ratio"], seed)
            if f.exists():
                samples = np.load(f)["samples"]
                r["samples"] = float(samples[min(int(r["stop_val"]), len(samples) - 1)])
    return rows


def sid_flagging(sid_dir: Path, problems: dict) -> dict:
    out: dict = {}
    for f in sorted(sid_dir.glob("sid_*_p*_seed*.npz")):
        m = re.match(
            r"sid_([a-z0-9]+(?:_[a-z0-9]+)?)_lr([\d.]+)(?:_b1([\d.]+))?(?:_E([a-z]+(?:_[a-z]+)*?))?"
            r"(_norm)?_p([\d.]+)_seed(\d+)$",
            f.stem,
        )
        if not m or m.group(6) not in problems:
            continue
        label = sid_label(
            m.group(1),
            m.group(2),
            m.group(3) or "default",
            m.group(4) or "default",
            bool(m.group(5)),
        )
        weights = 1 / (1 + np.exp(-np.load(f)["logits"]))
        out.setdefault(m.group(6), {})[f"{label}, seed {m.group(7)}"] = flagging(
            weights, problems[m.group(6)]["corrupted"]
        )
    return out


def _load_class(path: Path, attr: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_bb_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attr)


def peer_solution(
    entry: str, ratio: float, seed: int, budget: float
) -> tuple[np.ndarray, np.ndarray]:
    """(z, σ(x)) of one peer (their solver class, their objective and dataset, in this process)
    after ``budget`` seconds of its work, z as features × classes: for the flagging columns and
    the re-solve (the benchopt run does not keep x)."""
    sys.path.insert(0, str(BENCH_DIR))
    cwd = os.getcwd()
    os.chdir(BENCH_DIR)  # datasets/mnist.py reads ./mnist.pkl
    try:
        dataset = _load_class(BENCH_DIR / "datasets" / "mnist.py", "Dataset").get_instance(
            ratio=ratio, random_state=DATA_SEED, reg=REG
        )
        objective = _load_class(BENCH_DIR / "objective.py", "Objective").get_instance()
        objective.set_data(**dataset.get_data())
        name, params = re.match(r"(\w+)\[(.*)\]", entry).groups()
        kwargs = {}
        for item in params.split(","):
            key, value = item.split("=")
            kwargs[key] = value if value.isalpha() else float(value)
            if isinstance(kwargs[key], float) and kwargs[key].is_integer() and key != "step_size":
                kwargs[key] = int(kwargs[key])
        solver_file = {s.lower(): s for s in PEERS}[name.lower()].lower()
        cls = _load_class(BENCH_DIR / "solvers" / f"{solver_file}.py", "Solver")
        solver = cls.get_instance(**kwargs, random_state=seed)
        solver.set_objective(**objective.get_objective())
        start = time.perf_counter()
        solver.run(lambda: time.perf_counter() - start < budget)
        result = solver.get_result()
        outer = np.asarray(result["outer_var"], np.float64)
        z = np.asarray(result["inner_var"], np.float64).reshape(dataset.n_features, -1)
    finally:
        os.chdir(cwd)
        sys.path.remove(str(BENCH_DIR))
    return z, 1 / (1 + np.exp(-outer))


def peer_weights(entry: str, ratio: float, seed: int, budget: float) -> np.ndarray:
    """σ(x) of :func:`peer_solution`."""
    return peer_solution(entry, ratio, seed, budget)[1]


def val_loss(z, X, y) -> float:
    """f(z): the mean cross-entropy on (validation) data, the outer objective."""
    logits = X @ z
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def resolve(problem: dict, weights: np.ndarray, z: np.ndarray | None = None) -> dict:
    """Where a method's test error comes from: its weights re-solved to optimality (L-BFGS on
    g, as the baselines) against its own inner iterate ``z``; f and the test error of each, and
    how its weights treat the clean examples by hardness (the loss of their label under the
    perfect-weights fit, passed as ``problem["hardness"]``)."""
    X = problem["X_train"].astype(np.float64)
    z_star = fit_weighted(X, problem["y_train"], np.asarray(weights, np.float64))
    out = dict(
        resolved_test_error=error(z_star, problem["X_test"], problem["y_test"]),
        resolved_val_loss=val_loss(z_star, problem["X_val"], problem["y_val"]),
        resolved_norm=float(np.linalg.norm(z_star)),
    )
    if z is not None:
        out.update(
            iterate_test_error=error(z, problem["X_test"], problem["y_test"]),
            iterate_val_loss=val_loss(z, problem["X_val"], problem["y_val"]),
            iterate_norm=float(np.linalg.norm(z)),
        )
    clean, corrupted = ~problem["corrupted"], problem["corrupted"]
    w = np.asarray(weights, np.float64)
    out.update(
        weight_sum=float(w.sum()),
        mean_weight_clean=float(w[clean].mean()),
        mean_weight_corrupted=float(w[corrupted].mean()),
    )
    if "hardness" in problem:
        h = problem["hardness"][clean]
        hard = h >= np.quantile(h, 0.9)
        out.update(
            mean_weight_hardest_clean_10pct=float(w[clean][hard].mean()),
            mean_weight_other_clean=float(w[clean][~hard].mean()),
        )
    return out


def _analysis(name: str) -> tuple[Path, dict]:
    """``OUT/name`` and what an earlier analysis run left in it (its entries are kept)."""
    path = OUT / name
    return path, json.loads(path.read_text()) if path.exists() else {}


def _problem(p: float) -> tuple[dict, np.ndarray]:
    """The problem at ratio p and its training matrix in float64."""
    problem = load_problem(BENCH_DIR / "mnist.pkl", p)
    return problem, problem["X_train"].astype(np.float64)


def cmd_resolve(args: argparse.Namespace) -> None:
    """Why a peer ends below the perfect weights' error: each peer's (z, weights) after
    ``--timeout`` s and SID's saved weights (``--sid-dir``), re-solved to optimality."""
    path, out = _analysis("resolve.json")
    for p in args.ratios:
        problem, X = _problem(p)
        perfect = (~problem["corrupted"]).astype(np.float64)
        z_p = fit_weighted(X, problem["y_train"], perfect)
        logits = X @ z_p
        logits -= logits.max(1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        problem["hardness"] = -log_p[np.arange(len(X)), problem["y_clean"]]
        entry = out.setdefault(str(p), {})
        entry["perfect weights"] = resolve(problem, perfect, z_p)
        for seed in args.seeds:
            for peer in best_params(p, args.peers):
                z, w = peer_solution(peer, p, seed, args.timeout)
                entry[f"{peer.split('[')[0]}, seed {seed}"] = resolve(problem, w, z)
                print(p, peer.split("[")[0], seed, entry[f"{peer.split('[')[0]}, seed {seed}"])
                path.write_text(json.dumps(out, indent=1))
            for f in sorted(Path(args.sid_dir).glob(f"sid_*_p{p}_seed{seed}.npz")):
                w = 1 / (1 + np.exp(-np.load(f)["logits"].astype(np.float64)))
                entry[f"{f.stem.rsplit('_p', 1)[0]}, seed {seed}"] = resolve(problem, w)
                print(p, f.stem, entry[f"{f.stem.rsplit('_p', 1)[0]}, seed {seed}"], flush=True)
        path.write_text(json.dumps(out, indent=1))


def cmd_peer_weights(args: argparse.Namespace) -> None:
    """Flagging quality of each peer's weights (one seed, ``--timeout`` seconds each)."""
    path = OUT / "peer_flagging.json"
    OUT.mkdir(parents=True, exist_ok=True)
    out = json.loads(path.read_text()) if path.exists() else {}
    for p in args.ratios:
        problem = load_problem(BENCH_DIR / "mnist.pkl", p)
        for entry in best_params(p, args.peers):
            weights = peer_weights(entry, p, args.seeds[0], args.timeout)
            out.setdefault(str(p), {})[f"{entry.split('[')[0]}, seed {args.seeds[0]}"] = flagging(
                weights, problem["corrupted"]
            )
            print(p, entry, out[str(p)], flush=True)
            path.write_text(json.dumps(out, indent=1))


def cmd_decompose(args: argparse.Namespace) -> None:
    """Which part of a peer's weights sets its test error: its weights after ``--timeout`` s
    (seed ``--seeds[0]``) re-solved, then with the corrupted rows zeroed, with the clean rows
    set to 1, with each clean row set to its class's mean, and with the clean rows divided by
    their mean (mean 1: some weights above 1, outside σ's range) or that clipped at 1."""
    path, out = _analysis("decompose.json")
    for p in args.ratios:
        problem, X = _problem(p)
        y = problem["y_train"]
        clean, yc = ~problem["corrupted"], problem["y_clean"]
        for peer in best_params(p, args.peers):
            z_it, w = peer_solution(peer, p, args.seeds[0], args.timeout)
            per_class = np.array([w[clean & (yc == c)].mean() for c in range(10)])
            scaled = w / w[clean].mean()
            entry = dict(
                iterate_test_error=error(z_it, problem["X_test"], problem["y_test"]),
                clean_weight_quantiles_1_10_50_90_99=np.quantile(
                    w[clean], [0.01, 0.1, 0.5, 0.9, 0.99]
                ).tolist(),
                clean_weight_per_class=per_class.tolist(),
            )
            for name, weights in (
                ("as learned", w),
                ("clean as learned, corrupted 0", np.where(clean, w, 0.0)),
                ("clean 1, corrupted as learned", np.where(clean, 1.0, w)),
                ("clean at their class mean, corrupted 0", np.where(clean, per_class[yc], 0)),
                ("clean / their mean, corrupted 0", np.where(clean, scaled, 0.0)),
                ("min(clean / their mean, 1), corrupted 0", np.where(clean, np.fmin(scaled, 1), 0)),
            ):  # fmt: skip
                z = fit_weighted(X, y, weights)
                entry[name] = dict(
                    test_error=error(z, problem["X_test"], problem["y_test"]),
                    val_loss=val_loss(z, problem["X_val"], problem["y_val"]),
                    mean_weight=float(weights.mean()),
                )
                print(p, peer.split("[")[0], name, entry[name], flush=True)
            out.setdefault(str(p), {})[f"{peer.split('[')[0]}, seed {args.seeds[0]}"] = entry
            path.write_text(json.dumps(out, indent=1))


def cmd_scaled(args: argparse.Namespace) -> None:
    """The perfect weights times c (c = 1: the baseline), re-solved by L-BFGS: the weights' scale
    is an inverse L2 strength (g = (c/n) Σ_clean CE + reg‖z‖²), so this shows how test error
    and f (validation CE, the outer objective) move with it."""
    path, out = _analysis("scaled_perfect.json")
    for p in args.ratios:
        problem, X = _problem(p)
        perfect = (~problem["corrupted"]).astype(np.float64)
        for c in args.scales:
            z = fit_weighted(X, problem["y_train"], c * perfect)
            out.setdefault(str(p), {})[f"{c:g}"] = dict(
                test_error=error(z, problem["X_test"], problem["y_test"]),
                val_loss=val_loss(z, problem["X_val"], problem["y_val"]),
                val_error=error(z, problem["X_val"], problem["y_val"]),
                norm=float(np.linalg.norm(z)),
            )
            print(p, c, out[str(p)][f"{c:g}"], flush=True)
            path.write_text(json.dumps(out, indent=1))


def exact_hypergradient(problem: dict, x: np.ndarray, z: np.ndarray, reg: float = REG):
    """∇ₓ f(z*(x)) at the exact inner solution z = z*(x) (float64, full batch):
    v = H⁻¹∇f by conjugate gradients on g's Hessian-vector products, then
    hᵢ = −σ'(xᵢ)/n ⟨Xᵢᵀ(Pᵢ − Yᵢ), v⟩ (eq. gradestim without the noise)."""
    from scipy.sparse.linalg import LinearOperator, cg

    X, y = problem["X_train"].astype(np.float64), problem["y_train"]
    Xv, yv = problem["X_val"].astype(np.float64), problem["y_val"]
    n, d = X.shape
    k = z.shape[1]
    w = 1 / (1 + np.exp(-x))

    def softmax(S):
        S = S - S.max(1, keepdims=True)
        E = np.exp(S)
        return E / E.sum(1, keepdims=True)

    P, Pv = softmax(X @ z), softmax(Xv @ z)
    Pv[np.arange(len(yv)), yv] -= 1.0
    grad_f = (Xv.T @ Pv / len(yv)).reshape(-1)

    def hvp(flat):
        V = flat.reshape(d, k)
        A = X @ V
        PA = P * A
        JA = PA - P * PA.sum(1, keepdims=True)
        return (X.T @ (w[:, None] * JA) / n + 2 * reg * V).reshape(-1)

    v, _ = cg(LinearOperator((d * k, d * k), matvec=hvp), grad_f, rtol=1e-8, maxiter=500)
    R = P.copy()
    R[np.arange(n), y] -= 1.0
    return -(w * (1 - w) / n) * ((X @ v.reshape(d, k)) * R).sum(1)


def cmd_descend(args: argparse.Namespace) -> None:
    """Exact full-batch hypergradient descent (Adam on x, L-BFGS inner solves warm-started,
    CG adjoint) from SRBA's weights after ``--timeout`` s and from SID's saved weights: does
    the outer objective f fall, and where does the test error go, as the weights approach a
    bilevel stationary point?"""
    path, out = _analysis("descend.json")
    for p in args.ratios:
        problem, X = _problem(p)
        starts = {}
        for peer in best_params(p, args.peers):
            _, w = peer_solution(peer, p, args.seeds[0], args.timeout)
            starts[peer.split("[")[0]] = np.log(np.clip(w, 1e-12, 1) / np.clip(1 - w, 1e-12, 1))
        for f in sorted(Path(args.sid_dir).glob(f"sid_*_p{p}_seed{args.seeds[0]}.npz")):
            starts[f.stem.rsplit("_p", 1)[0]] = np.load(f)["logits"].astype(np.float64)
        for name, x in starts.items():
            x, m, s2, trace, z = x.copy(), np.zeros_like(x), np.zeros_like(x), [], None
            for t in range(args.outer_steps + 1):
                z = fit_weighted(X, problem["y_train"], 1 / (1 + np.exp(-x)), z0=z)
                trace.append(
                    dict(
                        step=t,
                        val_loss=val_loss(z, problem["X_val"], problem["y_val"]),
                        test_error=error(z, problem["X_test"], problem["y_test"]),
                        mean_weight=float((1 / (1 + np.exp(-x))).mean()),
                    )
                )
                print(p, name, trace[-1], flush=True)
                if t == args.outer_steps:
                    break
                h = exact_hypergradient(problem, x, z)
                m = 0.9 * m + 0.1 * h
                s2 = 0.999 * s2 + 0.001 * h * h
                x -= (
                    args.outer_lr
                    * (m / (1 - 0.9 ** (t + 1)))
                    / (np.sqrt(s2 / (1 - 0.999 ** (t + 1))) + 1e-12)
                )
            out.setdefault(str(p), {})[name] = trace
            path.write_text(json.dumps(out, indent=1))


# ---------------------------------------------------------------------- commands
def _env() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
        JAX_PLATFORMS="cpu",
        SID_BENCH_OUT=str(OUT / "sid"),
        # the SID solver imports this checkout's hypertorch_sid (not another installed copy)
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


def cmd_run(args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for p in args.ratios:
        cfg = write_config(
            OUT / f"config_p{p}.yml", [p], args.peers, args.sid, args.seeds, args.timeout
        )
        cmd = [
            sys.executable,
            "-m",
            "benchopt",
            "run",
            str(BENCH_DIR),
            "--config",
            str(cfg),
            "--no-plot",
            "--no-html",
            *(["--no-cache"] if args.no_cache else []),
            "--output",
            str((OUT / f"runs_p{str(p).replace('.', '_')}").resolve()),
        ]
        print("$", " ".join(cmd), flush=True)
        t0 = time.time()
        subprocess.run(cmd, cwd=BENCH_DIR, env=_env(), check=True)
        print(f"p={p}: {time.time() - t0:.0f} s", flush=True)
    cmd_baselines(args)


def cmd_baselines(args: argparse.Namespace) -> None:
    out = {}
    for p in args.ratios:
        out[str(p)] = baselines(load_problem(BENCH_DIR / "mnist.pkl", p))
        print(p, json.dumps(out[str(p)]), flush=True)
    path = OUT / "baselines.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(out)
    path.write_text(json.dumps(old, indent=1))


def cmd_summarise(args: argparse.Namespace) -> None:
    raw = OUT / "runs" if (OUT / "runs").is_dir() else OUT  # raw files moved under runs/
    parquets = sorted(raw.glob("runs_p*.parquet"))
    runs = curves(read_results(parquets, raw / "sid"))
    base_path = OUT / "baselines.json"
    base = json.loads(base_path.read_text()) if base_path.exists() else None
    problems = {str(p): load_problem(BENCH_DIR / "mnist.pkl", p) for p in args.ratios}
    flags = sid_flagging(raw / "sid", problems)
    peer_path = OUT / "peer_flagging.json"
    for p, entries in (json.loads(peer_path.read_text()) if peer_path.exists() else {}).items():
        flags.setdefault(p, {}).update(entries)
    summary = summarise(runs, args.timeout, base, flags)
    summary_all = dict(
        budget_s=args.timeout,
        peers=list(args.peers),
        sid=list(args.sid),
        seeds=list(args.seeds),
        per_ratio=summary,
        curves={
            f"{p}|{m}|{s}": {k: v.tolist() for k, v in c.items()}
            for (p, m), seeds in runs.items()
            for s, c in seeds.items()
        },
    )
    (OUT / "summary.json").write_text(json.dumps(summary_all, indent=1))
    (OUT / "summary.md").write_text(markdown(summary, args.timeout))
    plot(runs, summary, OUT / "test_error_vs_time.png", args.timeout)
    print(markdown(summary, args.timeout))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=(
            "run",
            "baselines",
            "summarise",
            "config",
            "peer_weights",
            "resolve",
            "scaled",
            "descend",
        ),  # fmt: skip
    )
    parser.add_argument("--outer-steps", type=int, default=30, help="descend: Adam steps on x")
    parser.add_argument("--outer-lr", type=float, default=0.1, help="descend: Adam's lr on x")
    parser.add_argument(
        "--scales",
        type=float,
        nargs="+",
        default=[1.0, 0.75, 0.5, 0.35, 0.25],
        help="scaled: multiples of the perfect weights",
    )
    parser.add_argument(
        "--sid-dir",
        type=Path,
        default=OUT / "runs" / "sid",
        help="resolve: the SID solver's saved logits (SID_BENCH_OUT of a run)",
    )
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--peers", nargs="*", default=list(DEFAULT_PEERS))
    parser.add_argument(
        "--sid",
        nargs="+",
        default=["regime=drop_in"],
        help="SID entries (benchopt parameters of benchmarks/benchopt/solvers/sid.py; "
        "regime=drop_in,inner_lr=1.0 are its defaults)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="run: rerun every method (benchopt otherwise reuses a peer's cached result of an "
        "earlier run with the same parameters)",
    )
    parser.add_argument(
        "--timeout", type=float, default=35.0, help="wall-clock budget per method and seed (s)"
    )
    args = parser.parse_args(argv)
    if args.command == "config":
        for p in args.ratios:
            print(
                write_config(
                    OUT / f"config_p{p}.yml", [p], args.peers, args.sid, args.seeds, args.timeout
                ).read_text()
            )
    else:
        commands = dict(
            run=cmd_run,
            baselines=cmd_baselines,
            summarise=cmd_summarise,
            peer_weights=cmd_peer_weights,
            resolve=cmd_resolve,
            scaled=cmd_scaled,
            descend=cmd_descend,
            decompose=cmd_decompose,
        )
        commands[args.command](args)


if __name__ == "__main__":
    main()
