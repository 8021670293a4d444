"""The diagnosis table (benchmarks/results/noisy_labels/diagnosis.md) from the runs here.

python benchmarks/results/noisy_labels/runs/diagnosis/table.py
"""

import gzip
import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE.parents[1] / "diagnosis.md"


def gap(m: float, p: float, o: float) -> str:
    return f"{100 * m:.1f} ({100 * (m - p) / (o - p):.0f} %)"


head = (
    "| setting, seed | plain | oracle | drop-in | hindsight: final ω from step 0 | from step 100 "
    "| ω of step 160 / 192 / 224 from step 0 | final ω, kept corrupted (ω ≥ 0.25) → 0 "
    "| final ω, low corrupted (ω < 0.25) → 0 | final ω, lost clean (ω < 0.25) → clean mean |"
)
rows = [head, "| " + " | ".join(["---"] * 10) + " |"]
means: dict[str, list[float]] = {}
for ds in ("mnist", "fashion"):
    with gzip.open(HERE / f"{ds}.json.gz", "rt") as f:
        diag = json.load(f)
    rew = json.loads((HERE / f"rewind_screen_{ds}.json").read_text())
    var = json.loads((HERE / f"hindsight_variants_{ds}.json").read_text())
    for name, seeds in diag["settings"].items():
        for seed, r in seeds.items():
            p, o = r["plain"], r["oracle"]
            rw = rew["settings"][name][seed]
            v = var["settings"][name][seed]
            cells = {
                "drop_in": r["drop_in"], "hindsight": r["hindsight"],
                "hindsight100": r["hindsight100"], "up0": v["up0"], "down0": v["down0"],
                "clean_back": v["clean_back"],
            }  # fmt: skip
            for k, x in cells.items():
                means.setdefault(k, []).append((x - p) / (o - p))
            steps = " / ".join(f"{100 * (rw[s]['acc'] - p) / (o - p):.0f} %" for s in sorted(rw))
            rows.append(
                f"| {name} {seed} | {100 * p:.1f} | {100 * o:.1f} | {gap(r['drop_in'], p, o)} "
                f"| {gap(r['hindsight'], p, o)} | {gap(r['hindsight100'], p, o)} | {steps} "
                f"| {gap(v['up0'], p, o)} | {gap(v['down0'], p, o)} "
                f"| {gap(v['clean_back'], p, o)} |"
            )
mean = {k: f"{100 * st.mean(x):.0f} %" for k, x in means.items()}
rows.append(
    f"| mean gap recovered | | | {mean['drop_in']} | {mean['hindsight']} | {mean['hindsight100']} "
    f"| | {mean['up0']} | {mean['down0']} | {mean['clean_back']} |"
)
text = (
    "# What the symmetric-noise gap is made of (issue 27 diagnosis)\n\n"
    "Test accuracy % (gap recovered), seeds 1–2, clipped recipe, 12 epochs; every column is one "
    "training of the same seed (data order, initialisation). Commands: `runs/diagnosis/run.sh`; "
    "this table: `runs/diagnosis/table.py`; per-group evidence and steps: "
    "`runs/diagnosis/analysis.txt`, class pairs: `runs/diagnosis/pairs.txt`.\n\n"
    + "\n".join(rows)
    + "\n"
)
OUT.write_text(text)
print(text)
