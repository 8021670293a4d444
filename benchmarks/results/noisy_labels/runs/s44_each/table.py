"""Session 44: minibatches="each" against "mean" for LearnedDataWeights' curvature estimate,
paired by seed. Reads this folder's {mean,each}_{ds}_{noise}_{tag}.json and the oracle of
../refresh_s42/avx2 (the same recipe and AVX2 kernels; the oracle does not read the drop-in's
settings): the gap recovered is over the seeds with a stored oracle. Writes table.md.
Usage (repository root): python benchmarks/results/noisy_labels/runs/s44_each/table.py
"""

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
            for seed, plain, drop in zip(
                d["args"]["seeds"], s["runs"]["plain"], s["runs"]["drop_in"]
            ):
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


def f(xs: list[float]) -> str:
    m, se = mean_se(xs)
    return f"{m:.1f} ± {se:.1f}"


def paired(a: list[float], b: list[float], digits: int) -> str:
    m, se = mean_se([y - x for x, y in zip(a, b)])
    return f"{m:+.{digits}f} ± {se:.{digits}f}"


def row(ds: str, noise: str) -> str | None:
    m, e, o = runs("mean", ds, noise), runs("each", ds, noise), oracle(ds, noise)
    seeds = sorted(set(m) & set(e))  # paired by seed
    if not seeds:
        return None
    for s in seeds:  # the plain runs of the two processes are the same runs
        assert m[s]["plain"]["test_acc"] == e[s]["plain"]["test_acc"], (ds, noise, s)

    def col(r: dict, method: str, key: str, among: list[int] = seeds) -> list[float]:
        return [r[s][method][key] for s in among]

    plain = [100 * x for x in col(m, "plain", "test_acc")]
    am = [100 * x for x in col(m, "drop_in", "test_acc")]
    ae = [100 * x for x in col(e, "drop_in", "test_acc")]
    diff = [y - x for x, y in zip(am, ae)]
    known = [s for s in seeds if s in o]  # the gap on the seeds with a stored oracle
    orc = [100 * o[s] for s in known]
    plain_o = [100 * x for x in col(m, "plain", "test_acc", known)]
    gap = sum(orc) - sum(plain_o)
    rec_m = 100 * (100 * sum(col(m, "drop_in", "test_acc", known)) - sum(plain_o)) / gap
    rec_e = 100 * (100 * sum(col(e, "drop_in", "test_acc", known)) - sum(plain_o)) / gap
    pm, rm = col(m, "drop_in", "flag_precision"), col(m, "drop_in", "flag_recall")
    pe, re_ = col(e, "drop_in", "flag_precision"), col(e, "drop_in", "flag_recall")
    cpu_m, cpu_e = (sum(col(r, "drop_in", "cpu_s")) / len(seeds) for r in (m, e))
    per_seed = ", ".join(f"{x:+.2f}" for x in diff)
    return (
        f"| {ds}_{noise}40 | {seeds[0]}–{seeds[-1]} | {f(plain)} | {f(orc)} "
        f"({known[0]}–{known[-1]}) | {f(am)} | {f(ae)} | {paired(am, ae, 2)} ({per_seed}; "
        f"{sum(x < 0 for x in diff)} worse) | {rec_m:.0f} % / {rec_e:.0f} % "
        f"(seeds {known[0]}–{known[-1]}) | {sum(pm) / len(pm):.3f} / {sum(rm) / len(rm):.3f} | "
        f"{sum(pe) / len(pe):.3f} / {sum(re_) / len(re_):.3f} | "
        f"{paired(pm, pe, 3)} / {paired(rm, re_, 3)} | {cpu_m:.1f} / {cpu_e:.1f} |"
    )


lines = [
    "| setting | seeds | plain | oracle | mean: acc | each: acc | each − mean (points, per seed) "
    "| gap recovered: mean / each | P / R: mean | P / R: each | each − mean: P / R | "
    "CPU s: mean / each |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]
for noise in ("symmetric", "pair"):
    for ds in ("mnist", "fashion"):
        line = row(ds, noise)
        if line:
            lines.append(line)
text = "\n".join(lines) + "\n"
(HERE / "table.md").write_text(text)
print(text)
