"""SID drop-in variants on benchopt's data cleaning outside benchopt, for a fixed CPU-time budget
(load-independent): the solver's ``DropIn`` class on ``bench_data_cleaning.load_problem``'s split,
x₀ = −2, z₀ = 0, seed 1; test error and f of its iterate and of its weights re-solved by L-BFGS,
and the flags.

    ../venv-benchopt/bin/python benchmarks/benchopt/probe_drop_in.py 0.5 35 '{}' '{"outer_lr": 0.1}'

Each further argument is a JSON dict of ``LearnedDataWeights`` arguments (``'{}'``: its defaults,
``'{"objective": "mean_loss"}'``: E = the benchmark's f, ``'{"objective": {"q": 0.25}}'``:
``ExpectedError(q=0.25)``); results in
``$BENCH_DC_OUT/probe_drop_in_p<p>.json`` (entries of earlier runs are kept).

``--trace S`` also records, every S s of CPU time (the measurements are not counted), the
iterate's test error, f (validation cross-entropy), E = ExpectedError(q=0.5) on validation, ‖z‖
and the mean weight on clean / corrupted examples: does a longer run still move, or has it
reached its fixed point? ``--srba S``: the same quantities at the point SRBA (the best peer; its
own JAX solver with its best parameters) reaches in S s of wall time in this process, for
comparison (``$BENCH_DC_OUT/probe_srba_p<p>.json``). ``--plot 0.5 0.9`` (with any p, budget): the
traces as ``$BENCH_DC_OUT/probe_long.png``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "solvers"), str(HERE.parents[1])]
import bench_data_cleaning as dc  # noqa: E402
import sid  # noqa: E402

from hypertorch_sid import ExpectedError  # noqa: E402


def expected_error(z: np.ndarray, X: np.ndarray, y: np.ndarray, q: float = 0.5) -> float:
    """E = mean (1 − p_y^q)/q on (X, y): the drop-in's default validation objective."""
    logits = X @ z
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float((1 - np.exp(q * log_p[np.arange(len(y)), y])).mean() / q)


def point(problem: dict, z: np.ndarray, w: np.ndarray) -> dict:
    """What a point (z features × classes, weights w) scores: test error, f, E, ‖z‖, mean ω."""
    c = problem["corrupted"]
    return dict(
        test_error=dc.error(z, problem["X_test"], problem["y_test"]),
        val_error=dc.error(z, problem["X_val"], problem["y_val"]),
        f=dc.val_loss(z, problem["X_val"], problem["y_val"]),
        expected_error=expected_error(z, problem["X_val"], problem["y_val"]),
        norm=float(np.linalg.norm(z)),
        mean_weight_clean=float(w[~c].mean()),
        mean_weight_corrupted=float(w[c].mean()),
    )


def final(problem: dict, z: np.ndarray, w: np.ndarray) -> dict:
    """The point, its weights re-solved exactly (and E there), and the flags."""
    r = point(problem, z, w)
    r.update(dc.resolve(problem, w))
    z_star = dc.fit_weighted(problem["X_train"].astype(np.float64), problem["y_train"], w)
    r["resolved_expected_error"] = expected_error(z_star, problem["X_val"], problem["y_val"])
    flags = dc.flagging(w, problem["corrupted"])
    r.update({k: flags[k] for k in ("flagged_precision", "flagged_recall", "average_precision")})
    return r


def run_variant(problem: dict, variant: str, budget: float, trace: float | None) -> dict:
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    X, Xv = t(problem["X_train"]), t(problem["X_val"])
    y, yv = torch.as_tensor(problem["y_train"]), torch.as_tensor(problem["y_val"])
    torch.manual_seed(1)
    x0 = torch.full((len(y),), -2.0)
    kwargs = json.loads(variant)
    if isinstance(kwargs.get("objective"), dict):  # JSON: ExpectedError's fields, e.g. {"q": 0.25}
        kwargs["objective"] = ExpectedError(**kwargs["objective"])
    m = sid.DropIn(X, y, Xv, yv, torch.zeros(784, 10), x0, dc.REG, 256, 1.0, 1, **kwargs)

    def snapshot():
        z = m.z.detach().t().double().numpy()
        w = torch.sigmoid(m.weights.logits.detach().double()).numpy()
        return z, w

    curve, work, next_trace = [], 0.0, trace
    while work < budget:
        start = time.process_time()
        for _ in range(m.every):
            m.step()
        work += time.process_time() - start
        if trace and work >= next_trace:
            curve.append(dict(cpu_s=work, samples=float(m.samples), **point(problem, *snapshot())))
            next_trace += trace
            print(variant, {k: round(v, 4) for k, v in curve[-1].items()}, flush=True)
    r = dict(cpu_s=work, samples=float(m.samples), steps=m.steps, **final(problem, *snapshot()))
    return dict(r, trace=curve) if trace else r


def srba_point(problem: dict, p: float, seconds: float) -> dict:
    entry = dc.best_params(p, ["SRBA"])[0]
    z, w = dc.peer_solution(entry, p, 1, seconds)
    return dict(entry=entry, wall_s=seconds, **final(problem, z, w))


def plot(ratios: list[float]) -> Path:
    """``probe_long.png``: test error and f against CPU time for every traced variant, with
    SRBA's point (``--srba``) and the perfect weights (``baselines.json``) as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = json.loads((dc.OUT.parent / "baselines.json").read_text())
    fig, axes = plt.subplots(2, len(ratios), figsize=(5 * len(ratios), 7), squeeze=False)
    for col, p in enumerate(ratios):
        runs = json.loads((dc.OUT / f"probe_drop_in_p{p}.json").read_text())
        srba_path = dc.OUT / f"probe_srba_p{p}.json"
        srba = list(json.loads(srba_path.read_text()).values())[-1] if srba_path.exists() else None
        for row, (key, name) in enumerate((("test_error", "test error"), ("f", "f (val. CE)"))):
            ax = axes[row][col]
            for label, r in runs.items():
                if "trace" in r:
                    t = r["trace"]
                    ax.plot([e["cpu_s"] for e in t], [e[key] for e in t], label=f"SID {label}")
            if srba:
                ax.axhline(srba[key], color="k", ls="--", label="SRBA's point")
            if key == "test_error":
                perfect = base[str(p)]["perfect weights"]["test_error"]
                ax.axhline(perfect, color="g", ls=":", label="perfect weights (L-BFGS)")
            ax.set(title=f"p = {p}", xlabel="CPU s (one thread)", ylabel=name)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = dc.OUT / "probe_long.png"
    fig.savefig(path, dpi=90)
    return path


def _merge(path: Path, new: dict) -> None:
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **new}, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("p", type=float)
    ap.add_argument("budget", type=float, help="CPU seconds per variant")
    ap.add_argument("variants", nargs="*", default=["{}"])
    ap.add_argument("--trace", type=float, default=None, help="record every S CPU seconds")
    ap.add_argument("--srba", type=float, default=None, help="SRBA's point after S s")
    ap.add_argument("--plot", type=float, nargs="+", help="only plot these ratios' traces")
    args = ap.parse_args(argv)
    if args.plot:
        print(plot(args.plot))
        return
    torch.set_num_threads(1)
    problem = dc.load_problem(dc.BENCH_DIR / "mnist.pkl", args.p)
    dc.OUT.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        r = run_variant(problem, variant, args.budget, args.trace)
        key = variant if args.trace is None else f"{variant}, trace {args.budget:g} s"
        print(args.p, key, {k: round(v, 4) for k, v in r.items() if k != "trace"}, flush=True)
        _merge(dc.OUT / f"probe_drop_in_p{args.p}.json", {key: r})
    if args.srba:
        r = srba_point(problem, args.p, args.srba)
        print(args.p, "SRBA", r, flush=True)
        _merge(dc.OUT / f"probe_srba_p{args.p}.json", {f"seed 1, {args.srba:g} s": r})


if __name__ == "__main__":
    main()
