"""Per element (``elements="layer_then_shrunk"``) minus per layer (the default: TrustRprop,
OverheadBudget(0.5)), held-out test loss paired by seed (run.sh), two arms of per element:

- ``budget``: per layer's budget, OverheadBudget(0.5) (files ``S_budget_seedK.json``);
- ``none``: no budget (per element's old default; files ``S_seedK.json``, MLPs only).

Per layer comes from the same process where it ran there, else from this folder's other arm's
file of the seed, else from ../final_s38_overhead (the stored default runs: the CNNs). Also
per element − the old per-element default (``"tied"``, no budget, stored in
../per_element_budget, MLPs), and CPU seconds per element / per layer.

``python benchmarks/results/weight_decay/runs/elem_s39/table.py``"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = ("digits_small", "mnist_mlp", "fashion_mlp", "news_mlp", "mnist_cnn", "fashion_cnn")
ARMS = {"budget": "_budget", "none": ""}  # (S_tied_*: the old default "tied", no budget)


def _runs(path: Path, setting: str) -> dict:
    return json.loads(path.read_text())["settings"][setting]["runs"] if path.exists() else {}


def pair(setting: str, k: int, tag: str) -> tuple[dict, dict, str] | None:
    """(per element, per layer, where per layer came from) of one seed, or None."""
    ele = _runs(HERE / f"{setting}{tag}_seed{k}.json", setting).get("learned_per_element")
    if ele is None:
        return None
    sources = [(f"{setting}{t}_seed{k}.json", "same run" if t == tag else "other arm")
               for t in (tag, *ARMS.values())]  # fmt: skip
    sources.append((f"../final_s38_overhead/{setting}_seed{k}.json", "stored"))
    for name, where in sources:
        lay = _runs(HERE / name, setting).get("learned_per_layer")
        if lay is not None:
            return ele, lay, where
    return None


def tied(setting: str, k: int) -> float | None:
    path = HERE.parent / "per_element_budget" / f"{setting}_tied_none_seed{k}.json"
    if not path.exists():  # run here: news_mlp, digits_small (commands in S_tied_seedK.json)
        path = HERE / f"{setting}_tied_seed{k}.json"
    r = _runs(path, setting).get("learned_per_element")
    return r["test_loss"] if r else None


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
    "| setting | per element budget | seeds | per layer, test loss | per element, test loss "
    "| per element − per layer | hyper steps element / layer "
    "| CPU s element / layer (per layer from) "
    "| per element − tied (stored) |",
    "|---|---|---:|---:|---:|---|---|---|---|",
]
out: dict = {}
for s in SETTINGS:
    for arm, tag in ARMS.items():
        got = [(k, p) for k in range(9) if (p := pair(s, k, tag)) is not None]
        if not got:
            continue
        ele = [p[0] for _, p in got]
        lay = [p[1] for _, p in got]
        where = sorted({p[2] for _, p in got})
        d = [e["test_loss"] - la["test_loss"] for e, la in zip(ele, lay)]
        old = [tied(s, k) for k, _ in got]
        dt = [e["test_loss"] - t for e, t in zip(ele, old) if t is not None]
        rows.append(
            f"| {s} | {'0.5 (per layer’s)' if arm == 'budget' else 'none'} | {len(got)} "
            f"| {mean([x['test_loss'] for x in lay]):.4f} "
            f"| {mean([x['test_loss'] for x in ele]):.4f} "
            f"| {paired(d)} | {mean([x['hyper_steps'] for x in ele]):.1f} / "
            f"{mean([x['hyper_steps'] for x in lay]):.1f} "
            f"| {mean([x['cpu_s'] for x in ele]) / mean([x['cpu_s'] for x in lay]):.2f} "
            f"({', '.join(where)}) | {paired(dt) if dt else 'not run'} |"
        )
        out.setdefault(s, {})[arm] = {
            "seeds": [k for k, _ in got],
            "per_layer_from": [p[2] for _, p in got],
            "per_layer_test_loss": [x["test_loss"] for x in lay],
            "per_element_test_loss": [x["test_loss"] for x in ele],
            "difference": d,
            "per_layer_cpu_s": [x["cpu_s"] for x in lay],
            "per_element_cpu_s": [x["cpu_s"] for x in ele],
            "per_element_hyper_steps": [x["hyper_steps"] for x in ele],
            "per_layer_hyper_steps": [x["hyper_steps"] for x in lay],
            "tied_test_loss": old,
        }
# per layer without a budget (files S_layernone_seedK.json): how much of per element's
# no-budget difference is the budget's, not the deviations'
rows += [
    "",
    "| setting | per layer none − per layer 0.5 | per element none − per layer none "
    "| hyper steps per layer none |",
    "|---|---|---|---|",
]
for s in SETTINGS:
    seeds = [k for k in range(9) if (HERE / f"{s}_layernone_seed{k}.json").exists()]
    if not seeds:
        continue
    none = [_runs(HERE / f"{s}_layernone_seed{k}.json", s)["learned_per_layer"] for k in seeds]
    both = [_runs(HERE / f"{s}_seed{k}.json", s) for k in seeds]
    d1 = [n["test_loss"] - b["learned_per_layer"]["test_loss"] for n, b in zip(none, both)]
    d2 = [b["learned_per_element"]["test_loss"] - n["test_loss"] for n, b in zip(none, both)]
    hs = mean([n["hyper_steps"] for n in none])
    rows.append(f"| {s} | {paired(d1)} | {paired(d2)} | {hs:.1f} |")
    out.setdefault(s, {})["per_layer_none_test_loss"] = [n["test_loss"] for n in none]
text = "\n".join(rows)
print(text)
(HERE / "table.md").write_text(text + "\n")
(HERE / "table.json").write_text(json.dumps(out, indent=1))
