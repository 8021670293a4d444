"""Seed 1 of the screen: which (true → noisy) class pairs the kept corrupted examples (ω ≥ 0.25)
come from, and which true classes the lost clean examples (ω < 0.25) belong to, per E.
The labels are rebuilt with the benchmark's own split and corruption (seed 1). Writes pairs.txt.
Run from the repository root: python benchmarks/results/noisy_labels/runs/s43_margin/pairs.py
"""

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_noisy_labels as bench  # noqa: E402

ARMS = ("default", "margin_error", "class_relative_error")


def main() -> None:
    args = bench.parse(["--epochs", "12"])
    out = []
    for ds in ("mnist", "fashion"):
        d = bench.noisy_setting(bench.load(ds, args.data), "symmetric", args, 1)
        y, noisy = d["y"].tolist(), d["y_noisy"].tolist()
        for arm in ARMS:
            data = json.loads((HERE / f"screen_{arm}_{ds}.json").read_text())
            block = data["settings"][f"{ds}_symmetric40"]
            assert block["clean"] == d["clean"].tolist()
            w = block["runs"]["drop_in"][0]["weights"]
            kept = Counter((t, n) for t, n, v in zip(y, noisy, w) if t != n and v >= 0.25)
            lost = Counter(t for t, n, v in zip(y, noisy, w) if t == n and v < 0.25)
            top = ", ".join(f"{t}→{n} {c}" for (t, n), c in kept.most_common(8))
            share = sum(c for _, c in kept.most_common(10)) / max(sum(kept.values()), 1)
            out.append(
                f"{ds} seed 1 {arm}: kept {sum(kept.values())} (top 10 pairs {100 * share:.0f} %): "
                f"{top}\n    lost clean {sum(lost.values())} by class: "
                + ", ".join(f"{c}: {k}" for c, k in sorted(lost.items()))
            )
    text = "\n".join(out) + "\n"
    (HERE / "pairs.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
