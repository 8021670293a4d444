"""Table of the symmetric-noise screen: each arm's test accuracy and share of the plain-oracle gap.

Plain and oracle come from ``base.json`` (the same seeds); every other JSON holds one drop-in arm.
From the repository root: ``python benchmarks/results/noisy_labels/runs/sym_screen/table.py``.
"""

import json
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def load(name: str) -> dict:
    return json.loads((HERE / f"{name}.json").read_text())["settings"]


def main() -> None:
    base = load("base")
    stems = [p.stem for p in HERE.glob("*.json")]
    arms = ["base"] + sorted(s for s in stems if s != "base" and not s.startswith("news20"))
    settings = list(base)
    head = "| arm | " + " | ".join(f"{s}: acc (gap), cpu ×plain" for s in settings) + " |"
    print(head)
    print("|" + " --- |" * (len(settings) + 1))
    for arm in arms:
        cells = []
        for s in settings:
            try:
                runs = load(arm)[s]["runs"]
            except (KeyError, FileNotFoundError):
                cells.append("")
                continue
            b = base[s]["runs"]
            n = min(len(runs["drop_in"]), len(b["plain"]))

            def mean(rs: list[dict], k: str = "test_acc", n: int = n) -> float:
                return sum(r[k] for r in rs[:n]) / n

            plain, oracle, drop = mean(b["plain"]), mean(b["oracle"]), mean(runs["drop_in"])
            ratio = mean(runs["drop_in"], "cpu_s") / mean(b["plain"], "cpu_s")
            cells.append(
                f"{100 * drop:.1f} ({100 * (drop - plain) / (oracle - plain):.0f} %), {ratio:.2f}"
            )
        print(f"| {arm} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
