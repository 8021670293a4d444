"""traj64's table: eq. drift by the share of the planned hyper-step intervals read.

    cd benchmarks/results/user_recipes/s64 && python traj64_table.py traj64.txt

Per fit (recipe, seed) and interval k: R and the median zᵢ² of the first k intervals (k = 1
reads 1 / 1 by construction: S² = Q for one step). Then, per k, the largest reading of the
no-signal recipes against the smallest of the separating ones, and which fits a judgement at k
(session 63's thresholds, R > 1.25 or median > 1.3: separates) would get wrong.
"""

from __future__ import annotations

import json
import re
import sys

NO_SIGNAL = ("vae_mnist", "gce_fmnist", "char_cnn")
DRIFT, MEDIAN = 1.25, 1.3


def fits(path: str) -> list[tuple[str, int, dict, dict]]:
    """(recipe, seed, TRAJ line, the run's record) of each fit in a traj64 output."""
    traj, rows = None, []
    for line in open(path).read().splitlines():
        if line.startswith("TRAJ "):
            traj = json.loads(line[5:])
            continue
        m = re.match(r"^([a-z_]+) (dw\w*) (\d+) (\{.*)", line)
        if m and traj is not None:
            rows.append((m.group(1), int(m.group(3)), traj, eval(m.group(4))))  # noqa: S307
            traj = None
        elif line.startswith('{"recipe"') and traj is not None:
            rec = json.loads(line)
            rows.append((rec["recipe"], rec["seed"], traj, rec))
            traj = None
    return rows


def compact(rows: list[tuple[str, int, dict, dict]]) -> None:
    """One row per fit: R / median after k = 2, 3, 4, 5 intervals and at the fit's end, with
    k / K (the share of the fit's intervals read) and the optimizer step."""
    print("| fit | K | k=2 | k=3 | k=4 | k=5 | end (k=K) | dw test loss |")
    print("|---|---|---|---|---|---|---|---|")
    for recipe, seed, t, rec in rows:
        K, cells = len(t["traj"]), []
        for k in (2, 3, 4, 5):
            at = [r for r in t["traj"] if r[0] == k and k < K]
            cells.append(
                f"{at[0][2]:.2f} / {at[0][3]:.2f} ({k / K:.2f}, {at[0][1]})" if at else "—"
            )
        last = t["traj"][-1]
        cells.append(f"{last[2]:.2f} / {last[3]:.2f}")
        print(f"| {recipe} {seed} | {K} | {' | '.join(cells)} | {rec['test_loss']:.4f} |")


def main(path: str) -> None:
    rows = fits(path)
    if "--compact" in sys.argv:
        compact(rows)
        return
    print("| fit | K | k (step) | k/K | step/T | R | median |")
    print("|---|---|---|---|---|---|---|")
    for recipe, seed, t, _ in rows:
        K = len(t["traj"])
        for k, step, drift, median, _ in t["traj"]:
            share = f"{k / K:.2f}"
            print(
                f"| {recipe} {seed} | {K} | {k} ({step}) | {share} | {step / t['planned']:.2f} "
                f"| {drift:.2f} | {median:.2f} |"
            )
    print(
        "\n| k | no-signal fits: max R / max median | separating: min R / min median "
        "| no-signal read 'separates' | separating read 'no signal' |"
    )
    print("|---|---|---|---|---|")
    for k in range(2, 11):
        quiet, loud, missed, false = [], [], [], []
        for recipe, seed, t, _ in rows:
            at = [r for r in t["traj"] if r[0] == k]
            if not at:
                continue
            _, _, drift, median, _ = at[0]
            separates = drift > DRIFT or median > MEDIAN
            if recipe in NO_SIGNAL:
                quiet.append((drift, median))
                if separates:
                    missed.append(f"{recipe} {seed}")
            else:
                loud.append((drift, median))
                if not separates:
                    false.append(f"{recipe} {seed}")
        if not quiet and not loud:
            continue
        q = f"{max(d for d, _ in quiet):.2f} / {max(m for _, m in quiet):.2f} ({len(quiet)})"
        lo = (
            f"{min(d for d, _ in loud):.2f} / {min(m for _, m in loud):.2f} ({len(loud)})"
            if loud
            else "—"
        )
        print(
            f"| {k} | {q} | {lo} | {', '.join(missed) or 'none'} | {', '.join(false) or 'none'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
