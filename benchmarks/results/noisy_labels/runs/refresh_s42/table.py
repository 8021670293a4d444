"""Session 42: the README's 10-seed noisy-label numbers rerun on today's code, against the stored
runs, and the GPU run (H100) against the CPU runs of the same seeds.

Stored (the README's "77 / 87 / 76 / 86 %", ../adjoint5/table.py): drop-in ../outer_objective/q05
(seeds 1-5), q05_seeds6to9, q05_seeds10to14 (seed 10); plain ../adjoint5/{ds}_seeds{1to5,6to10};
oracle ../clip1_v2/{ds}_seeds{123,45}, ../outer_objective/seeds6to9, ../adjoint5/oracle_seed10.
Today: this folder ({ds}_seeds12345.json, {ds}_seeds678910.json: plain and drop-in back to back;
oracle_{ds}.json), one process at a time, with this machine's AVX-512 kernels; avx2/: the same
with torch's AVX2 kernels, as the stored runs had. Gap recovered: the benchmark's ratio of means
(bench_noisy_labels.recovered_ratio), ± its delta-method s.e.
Run from the repository root: python benchmarks/results/noisy_labels/runs/refresh_s42/table.py
"""

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
RUNS = HERE.parent
sys.path.insert(0, str(RUNS.parents[3] / "benchmarks"))
from bench_noisy_labels import recovered_ratio  # noqa: E402

SEEDS = list(range(1, 11))
SETTINGS = [f"{ds}_{n}40" for ds in ("mnist", "fashion") for n in ("symmetric", "pair")]


def read(path: Path, setting: str, method: str) -> dict[int, dict]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if setting not in data["settings"]:
        return {}
    runs = data["settings"][setting]["runs"]
    if method not in runs:
        return {}
    return dict(zip(data["args"]["seeds"], runs[method]))


def gather(paths: list[str], setting: str, method: str) -> dict[int, dict]:
    ds = setting.split("_")[0]
    out: dict[int, dict] = {}
    for p in paths:
        out.update(read(RUNS / p.format(ds=ds), setting, method))
    return {s: r for s, r in out.items() if s in SEEDS}


STORED = {
    "plain": ["adjoint5/{ds}_seeds1to5.json", "adjoint5/{ds}_seeds6to10.json"],
    "drop_in": [
        "outer_objective/q05_seeds10to14/{ds}.json",
        "outer_objective/q05_seeds6to9/{ds}.json",
        "outer_objective/q05/{ds}.json",
    ],
    "oracle": [
        "clip1_v2/{ds}_seeds123.json",
        "clip1_v2/{ds}_seeds45.json",
        "outer_objective/seeds6to9/{ds}.json",
        "adjoint5/oracle_seed10.json",
    ],
}
TODAY = {
    "plain": ["refresh_s42/{ds}_seeds12345.json", "refresh_s42/{ds}_seeds678910.json"],
    "drop_in": ["refresh_s42/{ds}_seeds12345.json", "refresh_s42/{ds}_seeds678910.json"],
    "oracle": ["refresh_s42/oracle_{ds}.json"],
}
#: today's code with torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
AVX2 = {
    m: ["refresh_s42/avx2/{ds}_seeds12345.json", "refresh_s42/avx2/{ds}_seeds678910.json"]
    for m in ("plain", "drop_in", "oracle")
}
GPU = RUNS / "gpu_h100_s42" / "noisy_labels_gpu.json"


def mean_se(xs: list[float]) -> str:
    se = float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else 0.0
    return f"{float(np.mean(xs)):+.2f} ± {se:.2f}"


def gap(runs: dict[str, dict[int, dict]], seeds: list[int]) -> str:
    acc = {m: np.array([runs[m][s]["test_acc"] for s in seeds]) for m in runs}
    r, se = recovered_ratio(acc["drop_in"] - acc["plain"], acc["oracle"] - acc["plain"])
    return f"{100 * r:.0f} ± {100 * se:.0f} %"


def load(which: dict[str, list[str]], setting: str) -> dict[str, dict[int, dict]]:
    out = {}
    for m, paths in which.items():
        out[m] = gather(paths, setting, m)
    return out


def identical(old: dict[int, dict], new: dict[int, dict], keys: tuple[str, ...]) -> str:
    """In how many seeds the two runs agree on every key (where both hold them: the bench
    stores the weights of a run's first seed only)."""
    have = [s for s in old if s in new and all(k in old[s] and k in new[s] for k in keys)]
    if not have:
        return "–"
    same = sum(all(old[s][k] == new[s][k] for k in keys) for s in have)
    return f"{same} of {len(have)}"


def control(today: dict[str, dict[str, dict[int, dict]]]) -> None:
    """5fe5811 (the stored runs' code) on this machine against today's code, seeds 1-2."""
    print("\n## Control: 5fe5811 (the stored runs' code) on this machine, seeds 1–2\n")
    print(
        "| setting | method | test acc identical | weights identical (first seed) | "
        "mean corrupted weight identical | flags P / R identical |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for setting in SETTINGS:
        for m in ("plain", "drop_in", "oracle"):
            old = gather(["refresh_s42/control_5fe5811_{ds}.json"], setting, m)
            if not old:
                continue
            new = today[setting][m]
            cells = [
                identical(old, new, keys)
                for keys in (
                    ("test_acc",),
                    ("weights",),
                    ("weight_corrupted_mean",),
                    ("flag_precision", "flag_recall"),
                )
            ]
            print(f"| {setting} | {m} | " + " | ".join(cells) + " |")


def avx2(stored: dict[str, dict[str, dict[int, dict]]]) -> None:
    """Today's code with torch's AVX2 kernels against the stored runs, seed by seed."""
    print("\n## Today's code with AVX2 kernels against the stored runs, seeds 1–10\n")
    print(
        "| setting | method | test acc identical | weights identical (first seed) | "
        "flags P / R identical | gap recovered (AVX2) | CPU × plain, per-seed mean (range) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for setting in SETTINGS:
        runs = load(AVX2, setting)
        for m in ("plain", "drop_in", "oracle"):
            if not runs[m]:
                continue
            cells = [
                identical(stored[setting][m], runs[m], keys)
                for keys in (("test_acc",), ("weights",), ("flag_precision", "flag_recall"))
            ]
            seeds = [s for s in SEEDS if all(s in runs[k] for k in ("plain", "drop_in", "oracle"))]
            g = cpu = ""
            if m == "drop_in" and seeds:
                g = gap(runs, seeds)
                r = [runs["drop_in"][s]["cpu_s"] / runs["plain"][s]["cpu_s"] for s in seeds]
                cpu = f"{np.mean(r):.2f} ({min(r):.2f}–{max(r):.2f})"
            print(f"| {setting} | {m} | " + " | ".join(cells) + f" | {g} | {cpu} |")


def main() -> None:
    stored = {s: load(STORED, s) for s in SETTINGS}
    today = {s: load(TODAY, s) for s in SETTINGS}

    print("## Today − stored, paired by seed (test accuracy points, seeds 1–10)\n")
    print("| setting | method | identical | today − stored | up | max abs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for setting in SETTINGS:
        for m in ("plain", "drop_in", "oracle"):
            a, b = today[setting][m], stored[setting][m]
            both = sorted(set(a) & set(b))
            if not both:
                continue
            d = [100 * (a[s]["test_acc"] - b[s]["test_acc"]) for s in both]
            same = sum(a[s]["test_acc"] == b[s]["test_acc"] for s in both)
            print(
                f"| {setting} | {m} | {same} of {len(both)} | {mean_se(d)} | "
                f"{sum(x > 0 for x in d)} of {len(d)} | {max(abs(x) for x in d):.2f} |"
            )

    for method, title in (("drop_in", "Drop-in"), ("plain", "Plain")):
        print(f"\n## {title} per seed, stored → today (test accuracy %)\n")
        print("| seed | " + " | ".join(SETTINGS) + " |")
        print("| --- |" + " --- |" * len(SETTINGS))
        for s in SEEDS:
            cells = []
            for setting in SETTINGS:
                a, b = today[setting][method].get(s), stored[setting][method].get(s)
                cells.append(
                    f"{100 * b['test_acc']:.2f} → {100 * a['test_acc']:.2f}" if a and b else "–"
                )
            print(f"| {s} | " + " | ".join(cells) + " |")

    print("\n## Seeds 1–10: stored and today\n")
    print(
        "| setting | plain | drop-in | oracle | gap recovered | CPU × plain (mean, range) | "
        "flags P / R (range) | flagged() empty |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for setting in SETTINGS:
        for tag, runs in (("stored", stored[setting]), ("today", today[setting])):
            seeds = [s for s in SEEDS if all(s in runs[m] for m in ("plain", "drop_in", "oracle"))]
            if not seeds:
                continue
            acc = {m: 100 * np.mean([runs[m][s]["test_acc"] for s in seeds]) for m in runs}
            drop = [runs["drop_in"][s] for s in seeds]
            ratio = [runs["drop_in"][s]["cpu_s"] / runs["plain"][s]["cpu_s"] for s in seeds]
            p = [r["flag_precision"] for r in drop]
            r_ = [r["flag_recall"] for r in drop]
            empty = sum(r["flag_precision"] == 0 and r["flag_recall"] == 0 for r in drop)
            nonempty = [(x, y) for x, y in zip(p, r_) if x > 0 or y > 0]
            pr = (
                f"{min(x for x, _ in nonempty):.2f}–{max(x for x, _ in nonempty):.2f} / "
                f"{min(y for _, y in nonempty):.2f}–{max(y for _, y in nonempty):.2f}"
                if nonempty
                else "–"
            )
            print(
                f"| {setting} ({tag}, {len(seeds)} seeds) | {acc['plain']:.1f} | "
                f"{acc['drop_in']:.1f} | {acc['oracle']:.1f} | {gap(runs, seeds)} | "
                f"{np.mean(ratio):.2f} ({min(ratio):.2f}–{max(ratio):.2f}) | {pr} | "
                f"{empty} of {len(drop)} |"
            )

    control(today)
    avx2(stored)

    pairs = sorted(HERE.glob("timing_ab/head_*.json"))
    if pairs:
        print("\n## Timing control: drop-in / plain CPU time, today's code and 5fe5811's\n")
        print("| pair | today's code | 5fe5811 | today − 5fe5811 |")
        print("| --- | --- | --- | --- |")
        diffs = []
        for head in pairs:
            old_path = head.with_name(head.name.replace("head_", "old_"))
            if not old_path.exists():
                continue
            ratio = []
            for path in (head, old_path):
                runs = json.loads(path.read_text())["settings"]["mnist_symmetric40"]["runs"]
                ratio.append(runs["drop_in"][0]["cpu_s"] / runs["plain"][0]["cpu_s"])
            diffs.append(ratio[0] - ratio[1])
            print(f"| {head.stem[5:]} | {ratio[0]:.2f} | {ratio[1]:.2f} | {diffs[-1]:+.2f} |")
        if diffs:
            print(f"\nmean today − 5fe5811: {mean_se(diffs)}")

    if not GPU.exists():
        return
    gpu = json.loads(GPU.read_text())
    print("\n## GPU (H100) − CPU, paired by seed (seeds 1–3, test accuracy points)\n")
    print(
        "| setting | method | GPU (%) | CPU today (%) | GPU − CPU today | GPU − CPU stored | "
        "gap recovered GPU / CPU today / CPU stored (seeds 1–3) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for setting, res in gpu["settings"].items():
        g = {m: dict(zip(gpu["args"]["seeds"], rs)) for m, rs in res["runs"].items()}
        seeds = gpu["args"]["seeds"]
        gaps = " / ".join(gap(x, seeds) for x in (g, today[setting], stored[setting]))
        for m in ("plain", "drop_in", "oracle"):
            t, s_ = today[setting][m], stored[setting][m]
            d_t = [100 * (g[m][s]["test_acc"] - t[s]["test_acc"]) for s in seeds]
            d_s = [100 * (g[m][s]["test_acc"] - s_[s]["test_acc"]) for s in seeds]
            fmt = "/".join(f"{100 * g[m][s]['test_acc']:.1f}" for s in seeds)
            fmt_t = "/".join(f"{100 * t[s]['test_acc']:.1f}" for s in seeds)
            print(
                f"| {setting} | {m} | {fmt} | {fmt_t} | {mean_se(d_t)} | {mean_se(d_s)} | "
                f"{gaps if m == 'drop_in' else ''} |"
            )
        wall = [g["drop_in"][s]["wall_s"] / g["plain"][s]["wall_s"] for s in seeds]
        wall_m = np.mean([g["drop_in"][s]["wall_s"] for s in seeds]) / np.mean(
            [g["plain"][s]["wall_s"] for s in seeds]
        )
        pr = [(g["drop_in"][s]["flag_precision"], g["drop_in"][s]["flag_recall"]) for s in seeds]
        fits = ", ".join(f"{g['plain'][s]['wall_s']:.2f}" for s in seeds)
        print(
            f"\n{setting} on the GPU: drop-in / plain wall time {wall_m:.2f} (ratio of means; "
            f"per seed {', '.join(f'{w:.2f}' for w in wall)}); plain fit "
            f"{fits} s; flags P / R "
            f"{', '.join(f'{p:.2f}/{r:.2f}' for p, r in pr)}\n"
        )


if __name__ == "__main__":
    main()
