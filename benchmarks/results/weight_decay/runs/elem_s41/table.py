"""Per element (``elements="layer_then_shrunk"``) under the per-layer default's budget
(OverheadBudget(0.5)) minus per layer (the default) rerun in the same process (run.sh), held-out
test loss paired by seed, after the per-element quantile bands were read from a fixed sample
(``metrics.spread``); hyper steps and the budget's mean cost of one hyper step per arm (its
``spent_hyper`` less the every-step work, over its hyper steps; CPU time); beside it session 40's
same arm (``../elem_s40``, exact bands) and per element's default, no budget
(``../elem_s39/S_seedK.json``; an unbudgeted fit is bit-for-bit repeatable, check_unbudgeted.sh).

``python benchmarks/results/weight_decay/runs/elem_s41/table.py``"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
S40, S39 = HERE.parent / "elem_s40", HERE.parent / "elem_s39"
SETTINGS = ("mnist_mlp", "news_mlp", "fashion_mlp", "digits_small")


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
    return sum(xs) / len(xs) if xs else math.nan


def hyper_ms(run: dict) -> float:
    """The budget's mean cost of one hyper step (ms), every-step work left out."""
    b = run["budget"]
    return 1e3 * (b["spent_hyper"] - b["spent_added"]) / max(b["hyper_steps"], 1)


rows = [
    "| setting | seeds | per layer, test loss | per element (0.5), test loss "
    "| per element − per layer | hyper steps element / layer | ms per hyper step element / layer "
    "| s40 (exact bands): element − layer; hyper steps element / layer "
    "| per element 0.5 − per element none (today's default) | per element none − per layer |",
    "|---|---:|---:|---:|---|---|---|---|---|---|",
]
out: dict = {}
for s in SETTINGS:
    got = {k: r for k in range(9) if len(r := _runs(HERE / f"{s}_budget_seed{k}.json", s)) == 2}
    if not got:
        continue
    ele = [r["learned_per_element"] for r in got.values()]
    lay = [r["learned_per_layer"] for r in got.values()]
    d = [e["test_loss"] - la["test_loss"] for e, la in zip(ele, lay)]
    old = [_runs(S40 / f"{s}_budget_seed{k}.json", s) for k in got]
    old = [o for o in old if len(o) == 2]
    old_d = [o["learned_per_element"]["test_loss"] - o["learned_per_layer"]["test_loss"]
             for o in old]  # fmt: skip
    old_he = [o["learned_per_element"]["hyper_steps"] for o in old]
    old_hl = [o["learned_per_layer"]["hyper_steps"] for o in old]
    none = {k: _runs(S39 / f"{s}_seed{k}.json", s).get("learned_per_element") for k in got}
    dn = [r["learned_per_element"]["test_loss"] - none[k]["test_loss"]
          for k, r in got.items() if none[k]]  # fmt: skip
    nl = [none[k]["test_loss"] - r["learned_per_layer"]["test_loss"]
          for k, r in got.items() if none[k]]  # fmt: skip
    rows.append(
        f"| {s} | {len(got)} | {mean([x['test_loss'] for x in lay]):.4f} "
        f"| {mean([x['test_loss'] for x in ele]):.4f} | {paired(d)} "
        f"| {mean([x['hyper_steps'] for x in ele]):.1f} / "
        f"{mean([x['hyper_steps'] for x in lay]):.1f} "
        f"| {mean([hyper_ms(x) for x in ele]):.1f} / {mean([hyper_ms(x) for x in lay]):.1f} "
        f"| {paired(old_d)}; {mean(old_he):.1f} / {mean(old_hl):.1f} | {paired(dn)} "
        f"| {paired(nl)} |"
    )
    out[s] = {
        "seeds": list(got),
        "per_layer_test_loss": [x["test_loss"] for x in lay],
        "per_element_test_loss": [x["test_loss"] for x in ele],
        "difference": d,
        "per_element_hyper_steps": [x["hyper_steps"] for x in ele],
        "per_layer_hyper_steps": [x["hyper_steps"] for x in lay],
        "per_element_ms_per_hyper_step": [hyper_ms(x) for x in ele],
        "per_layer_ms_per_hyper_step": [hyper_ms(x) for x in lay],
        "per_element_fixed_ms": [1e3 * x["budget"]["fixed_cost"] for x in ele],
        "per_layer_fixed_ms": [1e3 * x["budget"]["fixed_cost"] for x in lay],
        "per_element_cpu_s": [x["cpu_s"] for x in ele],
        "per_layer_cpu_s": [x["cpu_s"] for x in lay],
        "s40_difference": old_d,
        "s40_per_element_hyper_steps": old_he,
        "s40_per_layer_hyper_steps": old_hl,
        "minus_no_budget_per_element": dn,
        "no_budget_per_element_minus_per_layer": nl,
    }
text = "\n".join(rows)
print(text)
(HERE / "table.md").write_text(text + "\n")
(HERE / "table.json").write_text(json.dumps(out, indent=1))
