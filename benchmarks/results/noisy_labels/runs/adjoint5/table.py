"""Paired table: LearnedDataWeights(adjoint_steps=5) against the default (k = 3), accuracy points.

k = 5 comes from this folder's JSON; the default's runs of the same seeds (same data,
initialisation and order) are the stored ../outer_objective/q05 (seeds 1-5), q05_seeds6to9 and
q05_seeds10to14 (seed 10). Gap recovered = ratio of means (drop-in - plain) / (oracle - plain);
the oracle from ../clip1_v2 (seeds 1-5), ../outer_objective/seeds6to9 and oracle_seed10.json.
Run from the repository root: python benchmarks/results/noisy_labels/runs/adjoint5/table.py
"""

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
STORED = HERE.parent / "outer_objective"


def runs(path: Path, setting: str, method: str, seeds: list[int]) -> dict[int, dict]:
    data = json.loads(path.read_text())
    stored = data["args"]["seeds"]
    rows = data["settings"][setting]["runs"][method]
    return {s: r for s, r in zip(stored, rows) if s in seeds}


def default(ds: str, setting: str, method: str, seeds: list[int]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for folder in ("q05", "q05_seeds6to9", "q05_seeds10to14"):
        out.update(runs(STORED / folder / f"{ds}.json", setting, method, seeds))
    return out


ORACLE = [
    HERE.parent / "clip1_v2" / "{ds}_seeds123.json",
    HERE.parent / "clip1_v2" / "{ds}_seeds45.json",
    STORED / "seeds6to9" / "{ds}.json",
    HERE / "oracle_seed10.json",
]


def oracle(ds: str, setting: str, seeds: list[int]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for pattern in ORACLE:
        path = Path(str(pattern).format(ds=ds))
        if path.exists():
            out.update(runs(path, setting, "oracle", seeds))
    return out


def avg(rs: dict[int, dict], seeds: list[int], key: str = "test_acc") -> float:
    return sum(rs[s][key] for s in seeds) / len(seeds)


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else math.nan
    return m, math.sqrt(var / len(xs))


def main() -> None:
    print(
        "| setting | seeds | plain | default (k = 3) | k = 5 | k = 5 − default, paired | up | "
        "oracle | gap recovered, default → k = 5 | CPU × plain, k = 5 (same process) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for ds in ("mnist", "fashion"):
        for noise in ("symmetric40", "pair40"):
            setting = f"{ds}_{noise}"
            for tag, seeds in (("seeds1to5", [1, 2, 3, 4, 5]), ("seeds6to10", [6, 7, 8, 9, 10])):
                path = HERE / f"{ds}_{tag}.json"
                if not path.exists():
                    continue
                new = runs(path, setting, "drop_in", seeds)
                plain = runs(path, setting, "plain", seeds)
                old = default(ds, setting, "drop_in", seeds)
                both = sorted(set(new) & set(old))
                if not both:
                    continue
                d = [100 * (new[s]["test_acc"] - old[s]["test_acc"]) for s in both]
                m, se = mean_se(d)
                ratio = avg(new, both, "cpu_s") / avg(plain, both, "cpu_s")
                orc = oracle(ds, setting, both)
                gap = ""
                if set(orc) == set(both):
                    o, p = avg(orc, both), avg(plain, both)
                    before, after = (avg(old, both) - p) / (o - p), (avg(new, both) - p) / (o - p)
                    gap = f"{100 * o:.1f} | {before:.0%} → {after:.0%}"
                else:
                    gap = " | "
                print(
                    f"| {setting} | {both[0]}–{both[-1]} | {100 * avg(plain, both):.1f} | "
                    f"{100 * avg(old, both):.1f} | {100 * avg(new, both):.1f} | "
                    f"{m:+.2f} ± {se:.2f} | "
                    f"{sum(x > 0 for x in d)} of {len(d)} | {gap} | {ratio:.2f} |"
                )


def pooled() -> None:
    """The default's gap recovered over seeds 1-10 (ratio of means, delta-method s.e. from the
    per-seed (drop-in − plain, oracle − plain) pairs), plain and oracle as above."""
    print("\n| setting | default: gap recovered, seeds 1–10 (ratio of means ± s.e.) |")
    print("| --- | --- |")
    seeds = list(range(1, 11))
    for ds in ("mnist", "fashion"):
        for noise in ("symmetric40", "pair40"):
            setting = f"{ds}_{noise}"
            plain: dict[int, dict] = {}
            for tag in ("seeds1to5", "seeds6to10"):
                plain.update(runs(HERE / f"{ds}_{tag}.json", setting, "plain", seeds))
            old, orc = default(ds, setting, "drop_in", seeds), oracle(ds, setting, seeds)
            a = [old[s]["test_acc"] - plain[s]["test_acc"] for s in seeds]
            b = [orc[s]["test_acc"] - plain[s]["test_acc"] for s in seeds]
            n, ma, mb = len(seeds), sum(a) / len(a), sum(b) / len(b)
            r = ma / mb
            resid = [x - r * y for x, y in zip(a, b)]
            se = math.sqrt(sum(e * e for e in resid) / (n - 1) / n) / mb
            print(f"| {setting} | {r:.0%} ± {100 * se:.0f} |")


if __name__ == "__main__":
    main()
    pooled()
