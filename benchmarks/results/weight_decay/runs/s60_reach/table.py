# ruff: noqa: E501
"""Session 60: reach − ctl per condition of ../../rules_s60/reach60-rule.txt (held-out test loss,
paired by seed, mean ± s.e., seeds worse); writes table.md here.
usage (from anywhere): python table.py"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
CONDITIONS = [  # (label, setting or "mainjob", seeds, the rule's test)
    ("(a) digits_small, best-validation epoch", "digits_small", range(63, 72), "mean < 0"),
    ("(b) main job, last weights", "mainjob", range(30, 42), "mean < 2 s.e."),
    ("(c) MNIST CNN+BN", "mnist_cnn", range(63, 72), "mean < 2 s.e."),
    ("(c) Fashion CNN+BN", "fashion_cnn", range(63, 72), "mean < 2 s.e."),
    ("(d) MNIST MLP", "mnist_mlp", range(63, 69), "mean < 2 s.e."),
    ("(d) Fashion MLP", "fashion_mlp", range(63, 69), "mean < 2 s.e."),
]


def record(arm: str, setting: str, seed: int) -> dict | None:
    if setting == "mainjob":
        path = here / f"mainjob_{arm}_seed{seed}.json"
        if not path.is_file():
            return None
        r = json.loads(path.read_text())["runs"][0]
        return {
            "test_loss": r["test_loss"],
            "lam": r["path"][-1]["lam_mean"] if r["path"] else None,
        }
    path = here / f"weight_decay_{arm}_{setting}_seed{seed}.json"
    if not path.is_file():
        return None
    r = json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]
    return {"test_loss": r["test_loss"], "lam": None}


def main() -> None:
    rows = [
        "| condition | pairs | test ctl | test reach | reach − ctl (mean ± s.e.) | reach worse "
        "| rule | holds | per pair |",
        "|---|---:|---:|---:|---|---:|---|---|---|",
    ]
    for label, setting, seeds, test in CONDITIONS:
        pairs = [(record("ctl", setting, s), record("reach", setting, s)) for s in seeds]
        pairs = [(c, r) for c, r in pairs if c and r]
        if not pairs:
            continue
        d = [r["test_loss"] - c["test_loss"] for c, r in pairs]
        n, mean = len(d), statistics.fmean(d)
        se = statistics.stdev(d) / math.sqrt(n) if n > 1 else math.nan
        holds = mean < 0 if test == "mean < 0" else mean < 2 * se
        tc = statistics.fmean(c["test_loss"] for c, _ in pairs)
        tr = statistics.fmean(r["test_loss"] for _, r in pairs)
        per = ", ".join(f"{x:+.4f}" for x in d)
        rows.append(
            f"| {label} | {n} | {tc:.4f} | {tr:.4f} | **{mean:+.4f} ± {se:.4f}** | "
            f"{sum(x > 0 for x in d)}/{n} | {test} | {'yes' if holds else 'NO'} | {per} |"
        )
    text = "\n".join(rows) + "\n"
    (here / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
