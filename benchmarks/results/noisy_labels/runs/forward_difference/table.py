"""The forward-difference table from the runs here (mnist.json, fashion.json, news20.json).

python benchmarks/results/noisy_labels/runs/forward_difference/table.py
(writes benchmarks/results/noisy_labels/forward_difference.md)
"""

import json
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from bench_noisy_labels import mean_se  # noqa: E402

HERE = Path(__file__).parent
OUT = HERE.parents[1] / "forward_difference.md"


def ratio(num: list[float], den: list[float]) -> str:
    r = [a / b for a, b in zip(num, den)]
    return f"{sum(num) / sum(den):.2f} ({min(r):.2f}–{max(r):.2f})"


rows = [
    "| setting | plain | drop-in (ForwardMode) | forward difference | FD − FM, points (paired) "
    "| CPU × plain: FM | CPU × plain: FD | cross-term CPU s: FM → FD |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]
for ds in ("mnist", "fashion"):
    path = HERE / f"{ds}.json"
    if not path.exists():
        continue
    for name, s in json.loads(path.read_text())["settings"].items():
        r = s["runs"]
        if "drop_in_fd" not in r:
            continue
        acc = {m: [100 * x["test_acc"] for x in r[m]] for m in ("plain", "drop_in", "drop_in_fd")}
        cpu = {m: [x["cpu_s"] for x in r[m]] for m in acc}
        cross = {m: sum(x["phase_s"]["cross_term_cpu"] for x in r[m]) / len(r[m]) for m in
                 ("drop_in", "drop_in_fd")}  # fmt: skip
        diff = [b - a for a, b in zip(acc["drop_in"], acc["drop_in_fd"])]
        rows.append(
            f"| {name} | {st.mean(acc['plain']):.1f} | {st.mean(acc['drop_in']):.1f} "
            f"| {st.mean(acc['drop_in_fd']):.1f} | {mean_se(diff)} "
            f"| {ratio(cpu['drop_in'], cpu['plain'])} | {ratio(cpu['drop_in_fd'], cpu['plain'])} "
            f"| {cross['drop_in']:.2f} → {cross['drop_in_fd']:.2f} |"
        )
news = HERE / "news20.json"
if news.exists():
    runs = list(json.loads(news.read_text())["runs"].values())
    acc = {m: [100 * x[m]["acc"] for x in runs] for m in ("plain", "drop_in", "drop_in_fd")}
    cpu = {m: [x[m]["cpu"] for x in runs] for m in acc}
    diff = [b - a for a, b in zip(acc["drop_in"], acc["drop_in_fd"])]
    rows.append(
        f"| 20news symmetric 40 % ({len(runs)} seeds) | {st.mean(acc['plain']):.1f} "
        f"| {st.mean(acc['drop_in']):.1f} | {st.mean(acc['drop_in_fd']):.1f} | {mean_se(diff)} "
        f"| {ratio(cpu['drop_in'], cpu['plain'])} | {ratio(cpu['drop_in_fd'], cpu['plain'])} | – |"
    )
text = (
    '# The training cross term by a forward difference (`directional="forward_difference"`)\n\n'
    "Test accuracy (%, mean over seeds; MNIST/Fashion: held-out seeds 1–5, clipped recipe, 12 "
    "epochs), paired difference FD − FM (mean ± s.e.), CPU time over plain's (ratio of sums, "
    "per-seed range), all three methods back to back in one process per data set, 1 thread, "
    "shared 2-core CPU. Commands: `runs/forward_difference/run.sh`, `news20.py`; this table: "
    "`runs/forward_difference/table.py`.\n\n" + "\n".join(rows) + "\n"
)
OUT.write_text(text)
print(text)
