"""The network matrix with the default outer step (TrustRprop) against the stored matrix of the
previous default (Adam lr 0.3 on log λ, ../../network_cost.json): CPU-time ratio to a plain
training, median [min, max] per network, hyper steps, the budget's share and the final λ (mean
per decay entry: the smallest and largest of all repeats; finite?). The benchmark trains on
synthetic data and records no held-out loss. Writes table.md and table.json in the folder given
(default: this file's).

    python benchmarks/results/network_cost/runs/trust_rprop/table.py [FOLDER]
"""

import json
import math
import sys
from pathlib import Path

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent
OLD = Path(__file__).resolve().parents[2] / "network_cost.json"


def rows(path: Path) -> dict:
    d = json.loads(path.read_text())
    out = {}
    for net, e in d["summary"].items():
        recs = [r for r in d["records"] if r["network"] == net and r["config"] == "default"]
        lam = [x for r in recs for x in r["lam"]]
        out[net] = {
            "ratio_median": e["default"]["ratio_median"],
            "ratio_min": e["default"]["ratio_min"],
            "ratio_max": e["default"]["ratio_max"],
            "repeats": len(recs),
            "hyper_steps": [r["budget"]["hyper_steps"] for r in recs],
            "due": recs[0]["hyper_steps_due"],
            "share": e["default"]["overhead_median"],
            "lambda_min": min(lam),
            "lambda_max": max(lam),
            "lambda_finite": all(math.isfinite(x) and x >= 0 for x in lam),
            "load": e.get("load"),
            "file": path.name,
        }
    return out


def cell(r: dict) -> str:
    return f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] ({r['repeats']})"


files = sorted(HERE.glob("network_cost*.json"))
new = {f.name: rows(f) for f in files}
old = rows(OLD)
lines = [
    "| network | new default: × plain, median [min, max] (repeats) | hyper steps run of due "
    "| share | final λ, min–max (finite) | previous default (stored run): × plain | its λ |",
    "|---|---|---|---|---|---|---|",
]
for name, table in new.items():
    for net, r in table.items():
        o = old[net]
        lines.append(
            f"| {net} ({name}) | {cell(r)} | {','.join(map(str, r['hyper_steps']))} of {r['due']} "
            f"| {r['share']:.2f} | {r['lambda_min']:.1e}–{r['lambda_max']:.1e} "
            f"({r['lambda_finite']}) | {cell(o)} | {o['lambda_min']:.1e}–{o['lambda_max']:.1e} |"
        )
(HERE / "table.md").write_text("\n".join(lines) + "\n")
(HERE / "table.json").write_text(json.dumps({"new": new, "previous": old}, indent=2) + "\n")
print("\n".join(lines))
