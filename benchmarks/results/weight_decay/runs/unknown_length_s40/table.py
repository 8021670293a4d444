"""table.md / table.json from the probe's JSON files: held-out test loss of the unknown-length
fit and of the known-length fit, per seed, and their paired difference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def rows(name: str) -> dict[bool, dict[int, dict]]:
    runs = json.loads((HERE / f"{name}.json").read_text())
    return {k: {r["seed"]: r for r in runs if r["known"] == k} for k in (True, False)}


def main() -> None:
    lines = [
        "| code, budget | known length: mean test loss | unknown length: mean test loss | "
        "unknown − known: mean ± s.e. | seeds with test loss > 1 (unknown) | λ of the last "
        "layer, unknown (per seed) |",
        "|---|---:|---:|---|---:|---|",
    ]
    out = {}
    for name in ("before_none", "after_none", "after_default"):
        if not (HERE / f"{name}.json").exists():
            continue
        r = rows(name)
        seeds = sorted(set(r[True]) & set(r[False]))
        k = np.array([r[True][s]["test_loss"] for s in seeds])
        u = np.array([r[False][s]["test_loss"] for s in seeds])
        d = u - k
        se = d.std(ddof=1) / np.sqrt(len(d))
        lam = ", ".join(f"{r[False][s]['lambda'][-1]:.2g}" for s in seeds)
        lines.append(
            f"| {name} | {k.mean():.4f} | {u.mean():.4f} | {d.mean():+.4f} ± {se:.4f} | "
            f"{int((u > 1).sum())} of {len(seeds)} | {lam} |"
        )
        out[name] = {"seeds": seeds, "known": k.tolist(), "unknown": u.tolist()}
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "table.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
