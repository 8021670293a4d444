"""Per element (``elements="layer_then_shrunk"``) under the per-layer default's budget
(OverheadBudget(0.5)) minus per layer (the default) rerun in the same process (run.sh), held-out
test loss paired by seed, after the per-element hyper step's logging was made cheap
(``metrics.spread``); beside it session 39's same arm (``../elem_s39/S_budget_seedK.json``, the
old logging) and its no-budget per element (per element's default, ``../elem_s39/S_seedK.json``).

``python benchmarks/results/weight_decay/runs/elem_s40/table.py``"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
OLD = HERE.parent / "elem_s39"
SETTINGS = ("mnist_mlp", "fashion_mlp", "news_mlp", "digits_small", "mnist_cnn", "fashion_cnn")


def _runs(path: Path, setting: str) -> dict:
    return json.loads(path.read_text())["settings"][setting]["runs"] if path.exists() else {}


def paired(d: list[float]) -> str:
    n = len(d)
    if n < 2:
        return "n/a"
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n)
    return f"{m:+.4f} ± {se:.4f} (n={n}, above 0 in {sum(x > 0 for x in d)})"


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


rows = [
    "| setting | seeds | per layer, test loss | per element (0.5), test loss "
    "| per element − per layer | hyper steps element / layer | CPU s element / layer "
    "| s39 same arm: element − layer, hyper steps element | now − s39 no-budget per element |",
    "|---|---:|---:|---:|---|---|---|---|---|",
]
out: dict = {}
for s in SETTINGS:
    got = {k: r for k in range(9) if len(r := _runs(HERE / f"{s}_budget_seed{k}.json", s)) == 2}
    if not got:
        continue
    ele = [r["learned_per_element"] for r in got.values()]
    lay = [r["learned_per_layer"] for r in got.values()]
    d = [e["test_loss"] - la["test_loss"] for e, la in zip(ele, lay)]
    old = [_runs(OLD / f"{s}_budget_seed{k}.json", s) for k in got]
    old_d = [o["learned_per_element"]["test_loss"] - o["learned_per_layer"]["test_loss"]
             for o in old if len(o) == 2]  # fmt: skip
    old_h = [o["learned_per_element"]["hyper_steps"] for o in old if o]
    none = [_runs(OLD / f"{s}_seed{k}.json", s).get("learned_per_element") for k in got]
    dn = [e["test_loss"] - n["test_loss"] for e, n in zip(ele, none) if n]
    rows.append(
        f"| {s} | {len(got)} | {mean([x['test_loss'] for x in lay]):.4f} "
        f"| {mean([x['test_loss'] for x in ele]):.4f} | {paired(d)} "
        f"| {mean([x['hyper_steps'] for x in ele]):.1f} / "
        f"{mean([x['hyper_steps'] for x in lay]):.1f} "
        f"| {mean([x['cpu_s'] for x in ele]) / mean([x['cpu_s'] for x in lay]):.2f} "
        f"| {paired(old_d)}, {mean(old_h) if old_h else math.nan:.1f} | {paired(dn)} |"
    )
    out[s] = {
        "seeds": list(got),
        "per_layer_test_loss": [x["test_loss"] for x in lay],
        "per_element_test_loss": [x["test_loss"] for x in ele],
        "difference": d,
        "per_element_hyper_steps": [x["hyper_steps"] for x in ele],
        "per_layer_hyper_steps": [x["hyper_steps"] for x in lay],
        "per_element_cpu_s": [x["cpu_s"] for x in ele],
        "per_layer_cpu_s": [x["cpu_s"] for x in lay],
        "s39_budget_difference": old_d,
        "s39_budget_per_element_hyper_steps": old_h,
        "minus_s39_no_budget_per_element": dn,
    }
text = "\n".join(rows)
print(text)
(HERE / "table.md").write_text(text + "\n")
(HERE / "table.json").write_text(json.dumps(out, indent=1))
