"""One table (and figure) of ``bench_noisy_labels.py`` runs split by data set and seed group,
with drop-in variants ("arms", the drop-in rerun with other ``--drop-in-kwargs``) beside the
default.

Gap recovered is a ratio of means over the seeds, R = mean(m − p) / mean(o − p) (m the method,
p plain, o the oracle, paired by seed), with its standard error by the delta method,
s.e.(R) = sd(aᵢ − R·bᵢ) / (|mean b|·√n), aᵢ = mᵢ − pᵢ, bᵢ = oᵢ − pᵢ; the per-seed ratios aᵢ/bᵢ
are listed too. Costs: CPU time of each training ÷ the plain training of the same seed and
setting (one thread; back to back in one process for the main methods, in the next process for
an arm). Arms are compared with the default paired by seed (mean ± s.e., and how many seeds
were worse).

Usage (from the repository root)::

    python benchmarks/noisy_labels_arms.py \\
        --main runs/clip1_v2/mnist_seeds123.json runs/clip1_v2/mnist_seeds45.json ... \\
        --arm vb256=runs/clip1_v2/mnist_vb256_seeds123.json,... --out runs/clip1_v2/table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_noisy_labels import plot  # noqa: E402

BASE = ["plain", "oracle", "drop_in", "gce", "ren"]


def merge(paths: list[Path], rename: str | None = None) -> dict[str, dict[str, list]]:
    """setting → method → runs ordered by seed (runs of the files concatenated by seed)."""
    out: dict[str, dict[str, dict[int, Any]]] = {}
    clean: dict[str, Any] = {}
    for path in paths:
        part = json.loads(path.read_text())
        seeds = part["args"]["seeds"]
        for name, setting in part["settings"].items():
            if setting.get("clean") is not None and name not in clean:
                clean[name] = setting["clean"]
            for method, recs in setting["runs"].items():
                key = rename if (rename and method == "drop_in") else method
                for seed, rec in zip(seeds, recs):
                    rec = {**rec, "seed": seed}
                    out.setdefault(name, {}).setdefault(key, {})[seed] = rec
    merged = {
        name: {m: [by_seed[s] for s in sorted(by_seed)] for m, by_seed in methods.items()}
        for name, methods in out.items()
    }
    return {"runs": merged, "clean": clean}  # type: ignore[return-value]


def ratio_of_means(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """R = mean a / mean b and its delta-method standard error (paired samples)."""
    r = a.mean() / b.mean()
    se = np.std(a - r * b, ddof=1) / (abs(b.mean()) * math.sqrt(len(a))) if len(a) > 1 else math.nan
    return float(r), float(se)


def summary(runs: dict[str, list[dict[str, Any]]], arms: list[str]) -> dict[str, Any]:
    acc = {m: 100 * np.array([r["test_acc"] for r in recs]) for m, recs in runs.items()}
    seeds = [r["seed"] for r in runs["plain"]]
    for m, recs in runs.items():
        assert [r["seed"] for r in recs] == seeds, (m, seeds)
    p, o = acc["plain"], acc["oracle"]
    out: dict[str, Any] = {"seeds": seeds, "methods": {}}
    for m in [x for x in ["drop_in", *arms, "gce", "ren"] if x in acc]:
        r, se = ratio_of_means(acc[m] - p, o - p)
        cpu = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[m], runs["plain"])]
        wall = [a["wall_s"] / b["wall_s"] for a, b in zip(runs[m], runs["plain"])]
        entry = {
            "gap_recovered": r, "gap_recovered_se": se,
            "gap_recovered_per_seed": [float(x) for x in (acc[m] - p) / (o - p)],
            "cpu_ratio_mean": float(np.mean(cpu)), "cpu_ratio_max": float(np.max(cpu)),
            "wall_ratio_mean": float(np.mean(wall)),
        }  # fmt: skip
        if m in arms:
            d = acc[m] - acc["drop_in"]
            entry["minus_default"] = float(d.mean())
            entry["minus_default_se"] = float(np.std(d, ddof=1) / math.sqrt(len(d)))
            entry["minus_default_per_seed"] = [float(x) for x in d]
        if "flag_precision" in runs[m][0]:
            entry["precision"] = float(np.mean([x["flag_precision"] for x in runs[m]]))
            entry["recall"] = float(np.mean([x["flag_recall"] for x in runs[m]]))
        out["methods"][m] = entry
    out["acc"] = {m: [float(x) for x in a] for m, a in acc.items()}
    return out


def table(settings: dict[str, Any], arms: list[str]) -> str:
    def acc(s: dict[str, Any], m: str) -> str:
        a = np.array(s["acc"][m])
        return f"{a.mean():.1f} ± {a.std(ddof=1):.1f}"

    def gap(e: dict[str, Any]) -> str:
        per = ", ".join(f"{100 * x:.0f}" for x in e["gap_recovered_per_seed"])
        return f"{100 * e['gap_recovered']:.0f} ± {100 * e['gap_recovered_se']:.0f} % ({per})"

    cols = ["drop_in", *arms, "gce", "ren"]
    head = ["setting", "plain", "oracle", *cols, *(f"gap recovered: {m}" for m in cols),
            *(f"CPU × plain: {m}" for m in ["drop_in", *arms, "ren"]),
            *(f"{m} − drop_in (points)" for m in arms),
            *(f"precision / recall: {m}" for m in ["drop_in", *arms])]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, s in settings.items():
        e = s["methods"]
        cells = [name, acc(s, "plain"), acc(s, "oracle"), *(acc(s, m) for m in cols)]
        cells += [gap(e[m]) for m in cols]
        cells += [f"{e[m]['cpu_ratio_mean']:.2f} (max {e[m]['cpu_ratio_max']:.2f})"
                  for m in ["drop_in", *arms, "ren"]]  # fmt: skip
        for m in arms:
            worse = sum(x < 0 for x in e[m]["minus_default_per_seed"])
            per = ", ".join(f"{x:+.1f}" for x in e[m]["minus_default_per_seed"])
            cells.append(
                f"{e[m]['minus_default']:+.1f} ± {e[m]['minus_default_se']:.1f} ({per}; "
                f"{worse} worse)"
            )
        cells += [f"{e[m]['precision']:.2f} / {e[m]['recall']:.2f}" for m in ["drop_in", *arms]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_recipes(paths: list[Path], out: Path) -> None:
    """``--recipes``: the oracle's test accuracy per epoch, every seed, one panel per run file
    and data set (``--trace`` runs of ``--methods oracle``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for path in paths:
        part = json.loads(path.read_text())
        a = part["args"]
        recipe = f"lr {a['lr']}" + (f", clip {a['clip']}" if a.get("clip") else ", no clip")
        for name, setting in part["settings"].items():
            title = f"{name.split('_')[0]} oracle, {recipe}"
            if title not in [t for t, _ in panels]:  # the same oracle on every noise
                panels.append((title, setting["runs"]["oracle"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    for ax, (title, recs) in zip(axes[0], panels):
        for rec in recs:
            t = rec["trace"]
            ax.plot([r["epoch"] for r in t], [100 * r["test_acc"] for r in t], "o-", ms=3)
        ax.set(title=title, xlabel="epoch", ylabel="test accuracy (%)", ylim=(40, 100))
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recipes", type=Path, nargs="+", help="plot these oracle traces to --out")
    p.add_argument("--main", type=Path, nargs="+")
    p.add_argument("--arm", action="append", default=[], help="NAME=FILE[,FILE...]")
    p.add_argument(
        "--default-arm", default=None,
        help="NAME: this arm is the drop-in's default (shown as drop_in); the --main files' "
        "drop_in becomes the arm drop_in_earlier",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="prefix: writes .json .md .png")
    args = p.parse_args(argv)
    if args.recipes:
        plot_recipes(args.recipes, args.out.with_suffix(".png"))
        return
    base = merge(args.main, rename="drop_in_earlier" if args.default_arm else None)
    runs, arms = base["runs"], ["drop_in_earlier"] if args.default_arm else []
    for spec in args.arm:
        name, files = spec.split("=", 1)
        key = "drop_in" if name == args.default_arm else f"drop_in_{name}"
        arm = merge([Path(f) for f in files.split(",")], rename=key)
        if key != "drop_in":
            arms.append(key)
        for setting, methods in arm["runs"].items():
            runs.setdefault(setting, {}).update(methods)
    settings = {name: summary(r, arms) for name, r in runs.items()}
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    full = {
        "command": "python benchmarks/noisy_labels_arms.py " + " ".join(argv or sys.argv[1:]),
        "settings": {
            n: {"runs": runs[n], "summary": settings[n], "clean": base["clean"].get(n)}
            for n in runs
        },
    }
    out.with_suffix(".json").write_text(json.dumps(full))
    out.with_suffix(".md").write_text(table(settings, arms))
    plot(
        {"settings": {n: {"runs": {m: runs[n][m] for m in BASE if m in runs[n]},
                          "clean": base["clean"].get(n)} for n in runs}},
        out.with_suffix(".png"),
    )  # fmt: skip
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
