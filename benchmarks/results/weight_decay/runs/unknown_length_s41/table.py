"""table.md / .json: held-out test loss of the unknown-length fit minus the known-length fit,
paired by seed, per run (read from each run's log: the probes print one JSON line per fit, so a
run cut short still counts the seeds it finished)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def rows(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines() if x.startswith('{"seed"')]


def main() -> None:
    lines = [
        "| run (log) | seeds | known: mean test loss | unknown: mean test loss | "
        "unknown − known: mean ± s.e. (per seed) |",
        "|---|---:|---:|---:|---|",
    ]
    out = {}
    names = sorted({log.stem.removeprefix("log_").split("_s5-9")[0] for log in HERE.glob("log_*")})
    for name in names:
        logs = [HERE / f"log_{name}.txt", HERE / f"log_{name}_s5-9.txt"]  # seeds 0-4, 5-9
        by = {(r["seed"], r["known"]): r["test_loss"] for g in logs if g.exists() for r in rows(g)}
        seeds = sorted({s for s, _ in by if (s, True) in by and (s, False) in by})
        if not seeds:
            continue
        k = np.array([by[s, True] for s in seeds])
        u = np.array([by[s, False] for s in seeds])
        d = u - k
        se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        each = ", ".join(f"{x:+.4f}" for x in d)
        lines.append(
            f"| {name} | {len(seeds)} | {k.mean():.4f} | {u.mean():.4f} | "
            f"{d.mean():+.4f} ± {se:.4f} ({each}) |"
        )
        out[name] = {"seeds": seeds, "known": k.tolist(), "unknown": u.tolist()}
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "table.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
