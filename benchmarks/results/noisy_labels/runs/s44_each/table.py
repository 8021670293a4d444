"""Session 44: minibatches="each" against "mean" for LearnedDataWeights' curvature estimate, paired by seed.
Reads this folder's {mean,each}_{ds}_{noise}_{tag}.json and the oracle of ../refresh_s42/avx2 (the same recipe and
AVX2 kernels; the oracle does not read the drop-in's settings). Writes table.md next to this file.
Usage (repository root): python benchmarks/results/noisy_labels/runs/s44_each/table.py"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

HERE = Path(__file__).parent
STORED = HERE.parent / "refresh_s42" / "avx2"


def runs(arm: str, ds: str, noise: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for f in sorted(glob.glob(str(HERE / f"{arm}_{ds}_{noise}_*.json"))):
        d = json.load(open(f))
        for s in d["settings"].values():
            seeds = d["args"]["seeds"]
            for seed, plain, drop in zip(seeds, s["runs"]["plain"], s["runs"]["drop_in"]):
                out[seed] = {"plain": plain, "drop_in": drop}
    return out


def oracle(ds: str, noise: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for f in sorted(glob.glob(str(STORED / f"{ds}_seeds*.json"))):
        d = json.load(open(f))
        s = d["settings"].get(f"{ds}_{noise}40")
        if s and "oracle" in s["runs"]:
            for seed, r in zip(d["args"]["seeds"], s["runs"]["oracle"]):
                out[seed] = r["test_acc"]
    return out


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


lines = [
    "| setting | seeds | plain | oracle | mean: acc | each: acc | each − mean (points, per seed) | "
    "gap recovered: mean / each | P / R: mean | P / R: each | each − mean: P / R (per seed) | "
    "CPU s: mean / each |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]
for noise in ("symmetric", "pair"):
    for ds in ("mnist", "fashion"):
        m, e, o = runs("mean", ds, noise), runs("each", ds, noise), oracle(ds, noise)
        seeds = sorted(set(m) & set(e))  # paired by seed; the gap on the seeds with a stored oracle
        if not seeds:
            continue
        for s in seeds:  # the plain runs of the two processes are the same runs
            assert m[s]["plain"]["test_acc"] == e[s]["plain"]["test_acc"], (ds, noise, s)
        acc = lambda r, k="test_acc": [100 * r[s]["drop_in"][k] for s in seeds]  # noqa: E731
        plain = [100 * m[s]["plain"]["test_acc"] for s in seeds]
        with_oracle = [s for s in seeds if s in o]
        orc = [100 * o[s] for s in with_oracle]
        plain_o = [100 * m[s]["plain"]["test_acc"] for s in with_oracle]
        am, ae = acc(m), acc(e)
        diff = [b - a for a, b in zip(am, ae)]
        gap = sum(orc) - sum(plain_o)
        rec = lambda a: 100 * (  # noqa: E731
            sum(x for x, s in zip(a, seeds) if s in o) - sum(plain_o)
        ) / gap
        pr = lambda r: (  # noqa: E731
            [r[s]["drop_in"]["flag_precision"] for s in seeds],
            [r[s]["drop_in"]["flag_recall"] for s in seeds],
        )
        (pm, rm), (pe, re_) = pr(m), pr(e)
        dp = [b - a for a, b in zip(pm, pe)]
        dr = [b - a for a, b in zip(rm, re_)]
        cpu = lambda r: sum(r[s]["drop_in"]["cpu_s"] for s in seeds) / len(seeds)  # noqa: E731
        f = lambda xs: "%.1f ± %.1f" % mean_se(xs)  # noqa: E731
        d, dse = mean_se(diff)
        lines.append(
            f"| {ds}_{noise}40 | {seeds[0]}–{seeds[-1]} | {f(plain)} | {f(orc)} ({with_oracle[0]}–{with_oracle[-1]}) | {f(am)} | {f(ae)} | "
            f"{d:+.2f} ± {dse:.2f} ({', '.join('%+.2f' % x for x in diff)}; {sum(x < 0 for x in diff)} worse) | "
            f"{rec(am):.0f} % / {rec(ae):.0f} % (seeds {with_oracle[0]}–{with_oracle[-1]}) | {sum(pm) / len(pm):.3f} / {sum(rm) / len(rm):.3f} | "
            f"{sum(pe) / len(pe):.3f} / {sum(re_) / len(re_):.3f} | "
            f"{mean_se(dp)[0]:+.3f} ± {mean_se(dp)[1]:.3f} / {mean_se(dr)[0]:+.3f} ± {mean_se(dr)[1]:.3f} | "
            f"{cpu(m):.1f} / {cpu(e):.1f} |"
        )
text = "\n".join(lines) + "\n"
(HERE / "table.md").write_text(text)
print(text)
