"""Issue 28, part 3: per-element decay with James–Stein shrinkage toward the layer
(``elements="shrunk"``, :class:`~hypertorch_sid.ShrunkToLayer`) against per-layer decay, paired
by seed on the held-out test loss (5 settings of ``bench_weight_decay.py``).

Reads ``benchmarks/results/weight_decay/runs/issue28_shrunk/<setting><x>_seed<s>.json`` (one
per setting and seed; ``<x>`` names the process that ran it): each holds
``learned_per_element`` (``elements="shrunk"``, no budget: ``max_overhead=None``) and the other
methods, ``learned_per_layer`` among them, either trained in the same run from the same code or
taken from ``runs/final_recover`` (``--reuse``): per layer trained here equals the stored runs
to the last digit on every seed it was trained (33 of them), so the benchmark is deterministic
and either pairs. Each file holds its ``command`` (all in ``commands.txt`` beside them). For
reference, the untied per-element runs stored in ``runs/final_recover`` are paired with the
same per-layer runs.

Prints one Markdown table::

    python benchmarks/issue28_shrunk_table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from issue28_elem_table import paired_cell as cell  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "weight_decay" / "runs"
SETTINGS = ("mnist_mlp", "mnist_cnn", "digits_mlp", "fashion_mlp", "fashion_cnn")


def load(folder: Path, setting: str) -> dict[int, dict]:
    """seed → the runs of ``setting`` in ``folder``'s per-seed result files."""
    out: dict[int, dict] = {}
    for path in sorted(folder.glob("*_seed*.json")):
        result = json.loads(path.read_text())
        runs = result["settings"].get(setting, {}).get("runs", {})
        if runs:
            out.setdefault(int(result["seed"]), {}).update(runs)
    return out


def _test(runs: dict, method: str) -> float | None:
    run = runs.get(method)
    return run["test_loss"] if run and run.get("finished") else None


def main() -> None:
    print(
        "| setting | seeds | per layer, test loss | shrunk, test loss | shrunk − per layer "
        "| untied (stored) − per layer |\n|---|---:|---:|---:|---|---|"
    )
    for setting in SETTINGS:
        here = load(RESULTS / "issue28_shrunk", setting)
        stored = load(RESULTS / "final_recover", setting)
        pairs = [
            (x, y)
            for runs in here.values()
            if (x := _test(runs, "learned_per_element")) is not None
            and (y := _test(runs, "learned_per_layer")) is not None
        ]
        untied = [
            (x, y)
            for seed, runs in here.items()
            if (x := _test(stored.get(seed, {}), "learned_per_element")) is not None
            and (y := _test(runs, "learned_per_layer")) is not None
        ]
        if not pairs:
            continue
        print(
            f"| {setting} | {len(pairs)} | {mean(y for _, y in pairs):.4f} | "
            f"{mean(x for x, _ in pairs):.4f} | {cell(pairs)} | {cell(untied)} |"
        )


if __name__ == "__main__":
    main()
