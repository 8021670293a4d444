"""Paired table of run.sh: the new default (invariant="held") minus the old (invariant="implicit"),
held-out test loss per seed, mean ± s.e.; writes table.md and table.json next to this file."""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(setting: str, arm: str, seed: int) -> dict | None:
    path = HERE / f"{setting}_{arm}_seed{seed}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]


def main() -> None:
    rows, out = [], {}
    for setting in ("fashion_cnn", "mnist_cnn"):
        pairs = [(s, run(setting, "held", s), run(setting, "implicit", s)) for s in range(9)]
        pairs = [p for p in pairs if p[1] and p[2]]
        if not pairs:
            continue
        d = [h["test_loss"] - i["test_loss"] for _, h, i in pairs]
        n = len(d)
        mean = sum(d) / n
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
        held = sum(h["test_loss"] for _, h, _ in pairs) / n
        impl = sum(i["test_loss"] for _, _, i in pairs) / n
        ratio = sum(h["wall_s"] for _, h, _ in pairs) / sum(i["wall_s"] for _, _, i in pairs)
        out[setting] = dict(
            seeds=[s for s, _, _ in pairs],
            diff=d,
            mean=mean,
            se=se,
            held=held,
            implicit=impl,
            wall_ratio=ratio,
        )
        per = ", ".join(f"{x:+.4f}" for x in d)
        rows.append(
            f"| {setting} | {n} | {impl:.4f} | {held:.4f} | {mean:+.4f} ± {se:.4f} "
            f"| {sum(x < 0 for x in d)} of {n} | {ratio:.2f} | {per} |"
        )
    head = (
        "| setting | seeds | implicit (old default) | held (new default) | held − implicit "
        "| held lower | wall held / implicit | per seed |\n|---|---:|---:|---:|---|---|---:|---|"
    )
    (HERE / "table.md").write_text(head + "\n" + "\n".join(rows) + "\n")
    (HERE / "table.json").write_text(json.dumps(out, indent=1))
    print(head + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
