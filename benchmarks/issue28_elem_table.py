"""Issue 28, part 3: per-element weight decay tied to its layer against per-layer decay, paired by
seed on the held-out test loss (5 settings of ``bench_weight_decay.py``).

Reads ``benchmarks/results/weight_decay/runs/issue28_elem/``:

* ``old*_seed<s>.json`` — ``learned_per_layer`` and ``learned_per_element`` with
  ``elements="untied"`` (the free per-element λ; made from the commit before the tied model,
  where per element was untied);
* ``<variant>_seed<s>.json`` — ``learned_per_element`` tied to its layer: ``tied`` (the default,
  ``TiedToLayer(scale=1.0)``), ``tied_s0.1`` (σ = 0.1), ``tied_s100`` (σ = 100).

Each file holds the command that made it. Prints one Markdown table: per variant the paired
difference of its test loss to per-layer's (mean ± s.e. [95 % interval], n seeds), and how
many seeds it was above per layer.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_weight_decay import paired_difference  # noqa: E402

RUNS = Path(__file__).resolve().parent / "results" / "weight_decay" / "runs" / "issue28_elem"
SETTINGS = ("mnist_mlp", "mnist_cnn", "digits_mlp", "fashion_mlp", "fashion_cnn")
VARIANTS = ("tied", "tied_s0.1", "tied_s100")


def load(pattern: str) -> dict[int, dict]:
    """seed → settings of the files ``pattern``[one letter or digit]_seed<s>.json (one run of
    several seeds per file name; runs on other seeds in parallel add a letter or digit)."""
    out: dict[int, dict] = {}
    for path in sorted(RUNS.glob(f"{pattern}*_seed*.json")):  # old, old2; tied_s0.1, tied_s0.1b
        match = re.fullmatch(rf"{re.escape(pattern)}[a-z0-9]?_seed(\d+)\.json", path.name)
        if match:
            out[int(match.group(1))] = json.loads(path.read_text())["settings"]
    return out


def test_loss(per_seed: dict[int, dict], seed: int, setting: str, method: str) -> float | None:
    run = per_seed.get(seed, {}).get(setting, {}).get("runs", {}).get(method)
    return run["test_loss"] if run and run.get("finished") else None


def cell(a: dict[int, dict], a_method: str, base: dict[int, dict], setting: str) -> str:
    pairs = [
        (x, y)
        for s in sorted(base)
        if (x := test_loss(a, s, setting, a_method)) is not None
        and (y := test_loss(base, s, setting, "learned_per_layer")) is not None
    ]
    return paired_cell(pairs)


def paired_cell(pairs: list[tuple[float, float]]) -> str:
    """x − y over (x, y) pairs: mean ± s.e. [95 %], n, how many x were above their y."""
    if not pairs:
        return "—"
    d = paired_difference([x for x, _ in pairs], [y for _, y in pairs])
    above = sum(x > y for x, y in pairs)
    return (
        f"{d['mean']:+.4f} ± {d['se']:.4f} [{d['low']:+.4f}, {d['high']:+.4f}] "
        f"(n={d['n']}, above in {above})"
    )


def main() -> None:
    old = load("old")
    variants = {v: load(v) for v in VARIANTS}
    variants = {v: runs for v, runs in variants.items() if runs}
    head = [f"{v} − per layer" for v in variants] + ["untied − per layer", "per layer (mean)"]
    print("| setting | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(head))
    for setting in SETTINGS:
        cells = [cell(runs, "learned_per_element", old, setting) for runs in variants.values()]
        cells.append(cell(old, "learned_per_element", old, setting))
        base = [x for s in old if (x := test_loss(old, s, setting, "learned_per_layer"))]
        cells.append(f"{sum(base) / len(base):.4f}" if base else "—")
        print(f"| {setting} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
