"""ExpectedError(q=0.5) − mean loss, test accuracy points, paired by seed (mean ± s.e.): seeds
1-5 (../q05), 6-9 (../q05_seeds6to9), 10-14 (here); 20 Newsgroups seeds 0-5, 6-8, 9-11
(../news20*.json).

python benchmarks/results/noisy_labels/runs/outer_objective/q05_seeds10to14/table.py
"""

import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
OO = HERE.parent


def diffs(path: Path) -> dict[str, dict[int, float]]:
    if not path.exists():
        return {}
    res = json.loads(path.read_text())
    out = {}
    for name, s in res["settings"].items():
        r = s["runs"]
        pairs = zip(res["args"]["seeds"], r.get("drop_in_mean_loss", []), r.get("drop_in", []))
        out[name] = {k: 100 * (q["test_acc"] - m["test_acc"]) for k, m, q in pairs}
    return out


def news20(mean_files: list[str], q_files: list[str]) -> dict[int, float]:
    m, q = {}, {}
    for f in mean_files:
        if (OO / f).exists():
            runs = json.loads((OO / f).read_text())["runs"]
            m.update({int(k): v["mean_loss"]["acc"] for k, v in runs.items()})
    for f in q_files:
        if (OO / f).exists():
            runs = json.loads((OO / f).read_text())["runs"]
            q.update({int(k): v["expected_error_q0.5"]["acc"] for k, v in runs.items()})
    return {k: 100 * (q[k] - m[k]) for k in sorted(set(m) & set(q))}


def ms(xs: list[float]) -> str:
    if not xs:
        return "—"
    se = st.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    up = sum(x > 0 for x in xs)
    each = ", ".join(f"{x:+.1f}" for x in xs)
    return f"{st.mean(xs):+.2f} ± {se:.2f} ({each}; {up} of {len(xs)} up)"


rows = []
for ds, label in (("mnist", "MNIST"), ("fashion", "Fashion")):
    old = [diffs(OO / "q05" / f"{ds}.json"), diffs(OO / "q05_seeds6to9" / f"{ds}.json")]
    new = diffs(HERE / f"{ds}.json")
    for noise, nl in (("symmetric40", "symmetric"), ("pair40", "pair-flip")):
        name = f"{ds}_{noise}"
        parts = [list(o.get(name, {}).values()) for o in old] + [list(new.get(name, {}).values())]
        rows.append((f"{label} {nl}", *(ms(p) for p in parts), ms(sum(parts, []))))
n = [
    news20(["news20.json", "news20_seeds345.json"], ["news20_seeds012345_q0.5.json"]),
    news20(["news20_seeds678.json"], ["news20_seeds678_q0.5.json"]),
    news20(["news20_seeds91011.json"], ["news20_seeds91011_q0.5.json"]),
]
rows.append(
    (
        "20 Newsgroups (seeds 0-5 / 6-8 / 9-11)",
        *(ms(list(p.values())) for p in n),
        ms(sum((list(p.values()) for p in n), [])),
    )
)
print("| setting | seeds 1–5 | seeds 6–9 | seeds 10–14 (fresh) | all seeds |")
print("| --- | --- | --- | --- | --- |")
for r in rows:
    print("| " + " | ".join(r) + " |")
