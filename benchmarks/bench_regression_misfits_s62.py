"""Session 62: a regression's default flags filtered by the validation scale, before and after
(docs/data_weights.md, "Regression flags filtered by the validation scale (session 62)").

Reads the records ``benchmarks/bench_regression_flags_s62.py`` kept (each fit's split rows, the
rows' last-visit training losses, the validation losses the last hyper steps read, the truth;
no refit) and puts the library's own readings on them: before, the split's rows (the default
then); after, :meth:`RowEvidence.misfits` of them (eq. scalemisfit, the default now), each with
its precision, recall, F1 and whether ``flagged()`` warns (before: eq. scalecontrast on the
split's rows; after: eq. scaleprecision on the rows returned). From the repository root::

    .venv/bin/python benchmarks/bench_regression_misfits_s62.py \\
        benchmarks/results/regression_flags_s62 benchmarks/results/regression_flags_s62/heldout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_regression_flags_s62 import Record  # noqa: E402

OUT = Path("benchmarks/results/regression_misfits_s62")


def scores(flags: torch.Tensor, bad: torch.Tensor) -> dict:
    """The number flagged, precision, recall and F1 against the corrupted rows ``bad``."""
    hit = int(bad[flags].sum()) if len(flags) else 0
    p, r = hit / max(len(flags), 1), hit / max(int(bad.sum()), 1)
    return {"n": len(flags), "precision": p, "recall": r, "f1": 2 * p * r / (p + r or 1)}


def row(rec: dict) -> dict:
    """One fit: the default's rows before and after, and each one's warning."""
    record, split, bad = Record(rec), rec["flags"], rec["bad"]
    after = record.misfits(split)
    return {
        "setup": rec["setup"], "seed": rec["seed"], "corrupted": int(bad.sum()),
        "before": scores(split, bad), "after": scores(after, bad),
        "warned_before": record.flag_contrast(split) is not None,
        "warned_after": record.flag_contrast(split, misfits=True) is not None,
    }  # fmt: skip


def span(rs: list[dict], when: str, key: str, f: str = ".2f") -> str:
    lo, hi = min(r[when][key] for r in rs), max(r[when][key] for r in rs)
    return f"{lo:{f}}" if f"{lo:{f}}" == f"{hi:{f}}" else f"{lo:{f}}–{hi:{f}}"


def table(rows: list[dict]) -> str:
    """By set-up: flagged, precision, recall, F1 before → after; warnings before / after."""
    lines = [
        "| set-up (seeds) | flagged before → after | precision before → after | recall "
        "before → after | F1 before → after | ΔF1 | warned before / after |",
        "|---|---|---|---|---|---|---|",
    ]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(f"{r['setup']} ({'held out' if r['seed'] > 2 else '0–2'})", []).append(r)
    for name, rs in by.items():
        cells = [
            f"{span(rs, 'before', k, f)} → {span(rs, 'after', k, f)}"
            for k, f in (("n", "d"), ("precision", ".2f"), ("recall", ".2f"), ("f1", ".2f"))
        ]
        df = [r["after"]["f1"] - r["before"]["f1"] for r in rs]
        warned = (
            f"{sum(r['warned_before'] for r in rs)}/{len(rs)} / "
            f"{sum(r['warned_after'] for r in rs)}/{len(rs)}"
        )
        lines.append(
            f"| `{name}` | {' | '.join(cells)} | {min(df):+.2f} to {max(df):+.2f} | {warned} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="folders of the kept records")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    files = [f for folder in args.records for f in sorted(folder.glob("*.pt"))]
    rows = [row(torch.load(f, weights_only=False)) for f in files]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
