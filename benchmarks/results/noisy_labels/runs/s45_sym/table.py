"""Session 45: the candidates of run.sh against LearnedDataWeights()'s default, paired by seed.

Screen (seeds 1-10, symmetric noise): screen/{arm}_{ds}_symmetric.json against the stored default,
plain and oracle of ../refresh_s42/avx2 (the same recipe and AVX2 kernels; bit-for-bit today).
Confirmation (fresh seeds 16-30, all four settings): confirm/default_{ds}_{noise}.json (default
drop-in, oracle) and confirm/{arm}_{ds}_{noise}.json (plain, candidate in one process).
20 Newsgroups: news20/{arm}.json (default and candidate per seed).
The gap recovered is a ratio of means, R = mean(m - p) / mean(o - p), ± its delta-method s.e.
Writes table.md. Usage (repository root):
    python benchmarks/results/noisy_labels/runs/s45_sym/table.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
STORED = HERE.parent / "refresh_s42" / "avx2"
ARMS = ("q075", "d2x4", "val512", "classrel", "start50")
SETTINGS = [(ds, noise) for noise in ("symmetric", "pair") for ds in ("mnist", "fashion")]


def load(path: Path, ds: str, noise: str) -> dict[int, dict[str, dict]]:
    """{seed: {method: run}} of one bench_noisy_labels output."""
    d = json.loads(path.read_text())
    s = d["settings"][f"{ds}_{noise}40"]["runs"]
    return {
        seed: {m: runs[i] for m, runs in s.items()} for i, seed in enumerate(d["args"]["seeds"])
    }


def stored(ds: str, noise: str) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for tag in ("seeds12345", "seeds678910"):
        out.update(load(STORED / f"{ds}_{tag}.json", ds, noise))
    return out


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def ratio(m: list[float], p: list[float], o: list[float]) -> tuple[float, float]:
    """R = mean(m - p) / mean(o - p) and its delta-method s.e. (paired by seed)."""
    d = [a - b for a, b in zip(m, p)]
    g = [a - b for a, b in zip(o, p)]
    n, md, mg = len(d), sum(d) / len(d), sum(g) / len(g)
    r = md / mg
    if n < 2:
        return r, math.nan
    res = [x - r * y for x, y in zip(d, g)]
    mr = sum(res) / n
    return r, math.sqrt(sum((x - mr) ** 2 for x in res) / (n - 1) / n) / abs(mg)


def acc(runs: dict[int, dict], seeds: list[int], method: str, key: str = "test_acc") -> list[float]:
    return [100 * runs[s][method][key] for s in seeds]


def cpu(runs: dict[int, dict], seeds: list[int], method: str) -> float:
    return sum(runs[s][method]["cpu_s"] for s in seeds)


def mech(runs: dict[int, dict], seeds: list[int]) -> str:
    """The drop-in's mean weight of the corrupted examples and flagged()'s precision / recall."""
    keys = ("weight_corrupted_mean", "flag_precision", "flag_recall")
    w, p, r = (sum(runs[s]["drop_in"][k] for s in seeds) / len(seeds) for k in keys)
    return f"{w:.3f}, {p:.2f} / {r:.2f}"


def rec(m: dict[int, float], p: dict[int, float], o: dict[int, float], seeds: list[int]) -> str:
    """The gap recovered over ``seeds`` (accuracies by seed)."""
    return pct(ratio([m[s] for s in seeds], [p[s] for s in seeds], [o[s] for s in seeds]))


def paired(a: list[float], b: list[float]) -> str:
    diff = [y - x for x, y in zip(a, b)]
    m, se = mean_se(diff)
    return f"{m:+.2f} ± {se:.2f} ({sum(x > 0 for x in diff)} of {len(diff)} up)"


def pct(r: tuple[float, float]) -> str:
    return f"{100 * r[0]:.0f} ± {100 * r[1]:.0f} %"


lines = ["## Screen: seeds 1-10, symmetric 40 % (default, plain, oracle: ../refresh_s42/avx2)", ""]
lines += [
    "| candidate | setting | default | candidate | candidate − default (points) "
    "| gap recovered: default → candidate | CPU s per run: default (stored) / candidate "
    "| ω corrupted, flags P / R: default; candidate |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]
for arm in ARMS:
    for ds in ("mnist", "fashion"):
        f = HERE / "screen" / f"{arm}_{ds}_symmetric.json"
        if not f.exists():
            continue
        cand, base = load(f, ds, "symmetric"), stored(ds, "symmetric")
        seeds = sorted(set(cand) & set(base))
        p, o = acc(base, seeds, "plain"), acc(base, seeds, "oracle")
        d, c = acc(base, seeds, "drop_in"), acc(cand, seeds, "drop_in")
        lines.append(
            f"| {arm} | {ds} symmetric, seeds {seeds[0]}–{seeds[-1]} | {mean_se(d)[0]:.2f} "
            f"| {mean_se(c)[0]:.2f} | {paired(d, c)} | {pct(ratio(d, p, o))} → "
            f"{pct(ratio(c, p, o))} | {cpu(base, seeds, 'drop_in') / len(seeds):.1f} / "
            f"{cpu(cand, seeds, 'drop_in') / len(seeds):.1f} | {mech(base, seeds)}; "
            f"{mech(cand, seeds)} |"
        )

for arm in ARMS:
    files = [HERE / "confirm" / f"{arm}_{ds}_{noise}.json" for ds, noise in SETTINGS]
    if not any(f.exists() for f in files):
        continue
    lines += ["", f"## Confirmation of {arm}: fresh seeds 16-30, all four settings", ""]
    lines += [
        "| setting | seeds | plain | oracle | default | candidate | candidate − default (points) "
        "| gap recovered: default → candidate | CPU × plain: candidate (same process) / "
        "default (plain of the next process) | ω corrupted, flags P / R: default; candidate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ds, noise in SETTINGS:
        fc = HERE / "confirm" / f"{arm}_{ds}_{noise}.json"
        fd = HERE / "confirm" / f"default_{ds}_{noise}.json"
        if not (fc.exists() and fd.exists()):
            continue
        cand, base = load(fc, ds, noise), load(fd, ds, noise)
        seeds = sorted(set(cand) & set(base))
        p, o = acc(cand, seeds, "plain"), acc(base, seeds, "oracle")
        d, c = acc(base, seeds, "drop_in"), acc(cand, seeds, "drop_in")
        cp = cpu(cand, seeds, "plain")
        lines.append(
            f"| {ds} {noise} | {seeds[0]}–{seeds[-1]} | {mean_se(p)[0]:.2f} | {mean_se(o)[0]:.2f} "
            f"| {mean_se(d)[0]:.2f} | {mean_se(c)[0]:.2f} | {paired(d, c)} "
            f"| {pct(ratio(d, p, o))} → {pct(ratio(c, p, o))} "
            f"| {cpu(cand, seeds, 'drop_in') / cp:.2f} / {cpu(base, seeds, 'drop_in') / cp:.2f} "
            f"| {mech(base, seeds)}; {mech(cand, seeds)} |"
        )

for arm in ARMS:  # every seed run: stored 1-10 and fresh 16-30 (the candidate's screen: 1-10)
    if not (HERE / "confirm" / f"{arm}_mnist_symmetric.json").exists():
        continue
    lines += ["", f"## Every seed run, default and {arm}: gap recovered (ratio of means)", ""]
    lines += [
        "| setting | default: seeds, gap recovered | candidate: seeds, gap recovered "
        "| candidate − default (points, paired) |",
        "| --- | --- | --- | --- |",
    ]
    for ds, noise in SETTINGS:
        fc = HERE / "confirm" / f"{arm}_{ds}_{noise}.json"
        fd = HERE / "confirm" / f"default_{ds}_{noise}.json"
        if not (fc.exists() and fd.exists()):
            continue
        cand, base, old = load(fc, ds, noise), load(fd, ds, noise), stored(ds, noise)
        fresh = sorted(set(cand) & set(base))
        acc_p = {s: acc(old, [s], "plain")[0] for s in old}
        acc_p |= {s: acc(cand, [s], "plain")[0] for s in fresh}
        acc_o = {s: acc(old, [s], "oracle")[0] for s in old}
        acc_o |= {s: acc(base, [s], "oracle")[0] for s in fresh}
        acc_d = {s: acc(old, [s], "drop_in")[0] for s in old}
        acc_d |= {s: acc(base, [s], "drop_in")[0] for s in fresh}
        acc_c = {s: acc(cand, [s], "drop_in")[0] for s in fresh}
        screen = HERE / "screen" / f"{arm}_{ds}_{noise}.json"
        if screen.exists():
            scr = load(screen, ds, noise)
            acc_c |= {s: acc(scr, [s], "drop_in")[0] for s in scr}
        sd, sc = sorted(acc_d), sorted(acc_c)

        both = sorted(set(sd) & set(sc))
        diff = paired([acc_d[s] for s in both], [acc_c[s] for s in both])
        lines.append(
            f"| {ds} {noise} | {len(sd)} seeds, {rec(acc_d, acc_p, acc_o, sd)} | {len(sc)} seeds, "
            f"{rec(acc_c, acc_p, acc_o, sc)} | {diff} |"
        )

for arm in ARMS:
    f = HERE / "news20" / f"{arm}.json"
    if not f.exists():
        continue
    runs = {int(k): v for k, v in json.loads(f.read_text())["runs"].items()}
    seeds = sorted(runs)
    d = [100 * runs[s]["default"]["acc"] for s in seeds]
    c = [100 * runs[s][arm]["acc"] for s in seeds]
    cd = sum(runs[s]["default"]["cpu"] for s in seeds)
    cc = sum(runs[s][arm]["cpu"] for s in seeds)
    lines += ["", f"## 20 Newsgroups, {arm}: seeds {seeds[0]}–{seeds[-1]}", ""]
    lines += [
        "| default | candidate | candidate − default (points) | CPU: candidate / default |",
        "| --- | --- | --- | --- |",
        f"| {mean_se(d)[0]:.2f} | {mean_se(c)[0]:.2f} | {paired(d, c)} | {cc / cd:.2f} |",
    ]

text = "\n".join(lines) + "\n"
(HERE / "table.md").write_text(text)
print(text)
