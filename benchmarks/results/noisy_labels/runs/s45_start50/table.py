"""start_step=50 against LearnedDataWeights()'s default on fresh seeds (run.sh; the rule is in
docs/data_weights.md, "start_step=50 on fresh seeds (session 45)").

Confirmation (seeds 16-30, four settings): confirm/start50_{ds}_{noise}.json (plain and start50 in
one process) against ../s45_sym/confirm/default_{ds}_{noise}.json (the default and the oracle),
paired by seed. The plain runs are checked against ../s45_sym/confirm/q075_*.json's (the same
seeds). The gap recovered is a ratio of means, R = mean(m - p) / mean(o - p), ± its delta-method
s.e. Also: every seed run (the default's stored seeds 1-10 of ../refresh_s42/avx2 and 16-30;
start50's screen seeds 1-10 of ../s45_sym/screen, symmetric only, and 16-30), 20 Newsgroups
(news20/start50.json against ../s45_sym/news20/q075.json's default) and the imbalanced example
(imbalance/{default,start50}.json). Writes table.md. Usage (repository root):
    python benchmarks/results/noisy_labels/runs/s45_start50/table.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).parent
SYM = HERE.parent / "s45_sym"
_spec = importlib.util.spec_from_file_location("s45_sym_table", SYM / "table.py")
_sym = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sym)  # the same readers and statistics as sym45's table
STORED, SETTINGS = _sym.STORED, _sym.SETTINGS
load, stored, mean_se, ratio, acc, cpu = (
    _sym.load,
    _sym.stored,
    _sym.mean_se,
    _sym.ratio,
    _sym.acc,
    _sym.cpu,
)


def mech(runs: dict[int, dict], seeds: list[int]) -> str:
    """The drop-in's mean weight of the corrupted examples and flagged()'s precision / recall."""
    keys = ("weight_corrupted_mean", "flag_precision", "flag_recall")
    w, p, r = (sum(runs[s]["drop_in"][k] for s in seeds) / len(seeds) for k in keys)
    return f"{w:.3f}, {p:.2f} / {r:.2f}"


def paired(a: list[float], b: list[float]) -> tuple[str, bool]:
    """b - a by seed as text, and whether its mean is below 0 by more than its s.e."""
    diff = [y - x for x, y in zip(a, b)]
    m, se = mean_se(diff)
    text = f"{m:+.2f} ± {se:.2f} ({sum(x > 0 for x in diff)} of {len(diff)} up)"
    return text, m < -se


def gap(m: dict[int, float], p: dict[int, float], o: dict[int, float], seeds: list[int]) -> str:
    """The gap recovered over ``seeds`` (accuracies by seed)."""
    return pct(ratio([m[s] for s in seeds], [p[s] for s in seeds], [o[s] for s in seeds]))


def pct(r: tuple[float, float]) -> str:
    return f"{100 * r[0]:.1f} ± {100 * r[1]:.1f} %"


lines = ["## Confirmation: fresh seeds 16-30, all four settings", ""]
lines += [
    "| setting | seeds | plain | oracle | default | start50 | start50 − default (points) "
    "| gap recovered: default → start50 | CPU × plain: start50 (same process) / default "
    "(other process) | ω corrupted, flags P / R: default; start50 | plain = stored plain |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]
part1, part2, part3 = [], [], []
for ds, noise in SETTINGS:
    fc, fd = (
        HERE / "confirm" / f"start50_{ds}_{noise}.json",
        SYM / "confirm" / f"default_{ds}_{noise}.json",
    )
    if not fc.exists():
        continue
    cand, base = load(fc, ds, noise), load(fd, ds, noise)
    seeds = sorted(set(cand) & set(base))
    p, o = acc(cand, seeds, "plain"), acc(base, seeds, "oracle")
    d, c = acc(base, seeds, "drop_in"), acc(cand, seeds, "drop_in")
    old_plain = load(SYM / "confirm" / f"q075_{ds}_{noise}.json", ds, noise)
    same = all(cand[s]["plain"]["test_acc"] == old_plain[s]["plain"]["test_acc"] for s in seeds)
    cp = cpu(cand, seeds, "plain")
    text, below = paired(d, c)
    rd, rc = ratio(d, p, o), ratio(c, p, o)
    part1.append(not below)
    if noise == "symmetric":
        part2.append(rc[0] > rd[0])
    part3.append(cpu(cand, seeds, "drop_in") / cp <= 2)
    lines.append(
        f"| {ds} {noise} | {seeds[0]}–{seeds[-1]} ({len(seeds)}) | {mean_se(p)[0]:.2f} "
        f"| {mean_se(o)[0]:.2f} | {mean_se(d)[0]:.2f} | {mean_se(c)[0]:.2f} | {text} "
        f"| {pct(rd)} → {pct(rc)} "
        f"| {cpu(cand, seeds, 'drop_in') / cp:.2f} / {cpu(base, seeds, 'drop_in') / cp:.2f} "
        f"| {mech(base, seeds)}; {mech(cand, seeds)} | {'yes' if same else 'NO'} |"
    )

lines += ["", "## Every seed run: gap recovered (ratio of means)", ""]
lines += [
    "| setting | default: seeds, plain / default / oracle, gap recovered "
    "| start50: seeds, start50, gap recovered | start50 − default (paired seeds) |",
    "| --- | --- | --- | --- |",
]
for ds, noise in SETTINGS:
    fc = HERE / "confirm" / f"start50_{ds}_{noise}.json"
    if not fc.exists():
        continue
    cand, base, old = (
        load(fc, ds, noise),
        load(SYM / "confirm" / f"default_{ds}_{noise}.json", ds, noise),
        stored(ds, noise),
    )
    fresh = sorted(set(cand) & set(base))
    P = {s: acc(old, [s], "plain")[0] for s in old} | {s: acc(cand, [s], "plain")[0] for s in fresh}
    O = {s: acc(old, [s], "oracle")[0] for s in old} | {
        s: acc(base, [s], "oracle")[0] for s in fresh
    }
    D = {s: acc(old, [s], "drop_in")[0] for s in old} | {
        s: acc(base, [s], "drop_in")[0] for s in fresh
    }
    C = {s: acc(cand, [s], "drop_in")[0] for s in fresh}
    screen = SYM / "screen" / f"start50_{ds}_{noise}.json"
    if screen.exists():
        scr = load(screen, ds, noise)
        C |= {s: acc(scr, [s], "drop_in")[0] for s in scr}
    sd, sc = sorted(D), sorted(C)
    both = sorted(set(sd) & set(sc))

    lines.append(
        f"| {ds} {noise} | {len(sd)}: {mean_se([P[s] for s in sd])[0]:.2f} / "
        f"{mean_se([D[s] for s in sd])[0]:.2f} / {mean_se([O[s] for s in sd])[0]:.2f}, "
        f"{gap(D, P, O, sd)} | {len(sc)}: {mean_se([C[s] for s in sc])[0]:.2f}, {gap(C, P, O, sc)} "
        f"| {paired([D[s] for s in both], [C[s] for s in both])[0]} |"
    )

f = HERE / "news20" / "start50.json"
if f.exists():
    base = {
        int(k): v["default"]
        for k, v in json.loads((SYM / "news20" / "q075.json").read_text())["runs"].items()
    }
    runs = {int(k): v for k, v in json.loads(f.read_text())["runs"].items()}
    seeds = sorted(set(runs) & set(base))
    d = [100 * base[s]["acc"] for s in seeds]
    c = [100 * runs[s]["acc"] for s in seeds]
    text, below = paired(d, c)
    part1.append(not below)
    cd, cc = sum(base[s]["cpu"] for s in seeds), sum(runs[s]["cpu"] for s in seeds)
    prf = [
        sum(r[s][k] for s in seeds) / len(seeds)
        for r in (base, runs)
        for k in ("precision", "recall")
    ]
    lines += ["", f"## 20 Newsgroups: seeds {seeds[0]}–{seeds[-1]}", ""]
    lines += [
        "| default | start50 | start50 − default (points) | CPU: start50 / default "
        "| flags P / R: default; start50 |",
        "| --- | --- | --- | --- | --- |",
        f"| {mean_se(d)[0]:.2f} | {mean_se(c)[0]:.2f} | {text} | {cc / cd:.2f} "
        f"| {prf[0]:.2f} / {prf[1]:.2f}; {prf[2]:.2f} / {prf[3]:.2f} |",
    ]
    check = HERE / "news20" / "default.json"
    if check.exists():
        again = {int(k): v for k, v in json.loads(check.read_text())["runs"].items()}
        same = all(again[s]["acc"] == base[s]["acc"] for s in again)
        lines += [
            "",
            f"The default rerun today, seeds {sorted(again)}: same accuracy as stored: {same}.",
        ]

fd, fc = HERE / "imbalance" / "default.json", HERE / "imbalance" / "start50.json"
if fd.exists() and fc.exists():
    lines += ["", "## The imbalanced example (a report, not part of the rule), seeds 0-4", ""]
    lines += [
        "| method | default: test / classes 3 and 8 | start50: test / classes 3 and 8 "
        "| start50 − default: test | start50 − default: classes 3 and 8 | CPU: start50 / default |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    dd = json.loads(fd.read_text())
    cc_ = json.loads(fc.read_text())
    for method, name in (("per_class", "per class"), ("drop_in", "per sample")):
        a = dd["settings"]["mnist_imbalance"]["runs"][method]
        b = cc_["settings"]["mnist_imbalance"]["runs"][method]
        ta, tb = [100 * r["test_acc"] for r in a], [100 * r["test_acc"] for r in b]
        ma, mb = [100 * r["minority_acc"] for r in a], [100 * r["minority_acc"] for r in b]
        ca, cb = sum(r["cpu_s"] for r in a), sum(r["cpu_s"] for r in b)
        lines.append(
            f"| {name} | {mean_se(ta)[0]:.2f} / {mean_se(ma)[0]:.2f} "
            f"| {mean_se(tb)[0]:.2f} / {mean_se(mb)[0]:.2f} | {paired(ta, tb)[0]} "
            f"| {paired(ma, mb)[0]} | {cb / ca:.2f} |"
        )

if part3:
    lines += ["", "## The rule", ""]
    lines += [
        f"1. no paired mean below 0 by more than its s.e. (20 Newsgroups included): "
        f"{'holds' if all(part1) else 'FAILS'} ({len(part1)} comparisons)",
        "2. the gap recovered rises on both symmetric settings: "
        + ("holds" if all(part2) and len(part2) == 2 else "FAILS"),
        f"3. CPU ≤ 2× plain on every setting: {'holds' if all(part3) else 'FAILS'}",
    ]

text = "\n".join(lines) + "\n"
(HERE / "table.md").write_text(text)
print(text)
