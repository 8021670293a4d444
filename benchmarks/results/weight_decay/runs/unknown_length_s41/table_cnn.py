"""table_cnn.md / .json: per setting, held-out test loss of the unknown-length fit minus the
known-length fit (paired by seed), with the optimizer steps and CPU seconds of both: the CNNs
stopped by a callback (settings_*.json, run_cnn.sh) and two settings trained from a stream
(streams_*.json, run_streams.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    lines = [
        "| setting | how the length is unknown | seeds | known: test loss | unknown: test loss "
        "| unknown − known (per seed) "
        "| steps known / unknown | CPU s known / unknown | warnings (unknown) |",
        "|---|---|---:|---:|---:|---|---|---|---|",
    ]
    out = {}
    cases = [
        ("settings", s, "max_epochs=-1, stopped by a callback")
        for s in ("mnist_cnn", "fashion_cnn")
    ]
    cases += [("streams", s, "a stream without __len__") for s in ("mnist_mlp", "fashion_cnn")]
    for kind, setting, how in cases:
        path = HERE / f"{kind}_{setting}.json"
        if not path.exists():
            continue
        runs = {(r["seed"], r["known"]): r for r in json.loads(path.read_text())}
        seeds = sorted({s for s, _ in runs if (s, True) in runs and (s, False) in runs})
        k = np.array([runs[s, True]["test_loss"] for s in seeds])
        u = np.array([runs[s, False]["test_loss"] for s in seeds])
        d = u - k
        se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        steps = [np.mean([runs[s, kn]["optimizer_steps"] for s in seeds]) for kn in (True, False)]
        cpu = [np.mean([runs[s, kn]["cpu_s"] for s in seeds]) for kn in (True, False)]
        warns = sorted({str(w)[:60] for s in seeds for w in (runs[s, False].get("warnings") or [])})
        each = ", ".join(f"{x:+.4f}" for x in d)
        lines.append(
            f"| {setting} | {how} | {len(seeds)} | {k.mean():.4f} | {u.mean():.4f} | "
            f"{d.mean():+.4f} ± {se:.4f} ({each}) | {steps[0]:.0f} / {steps[1]:.0f} | "
            f"{cpu[0]:.1f} / {cpu[1]:.1f} | {'; '.join(warns) or '—'} |"
        )
        out[f"{kind}/{setting}"] = {"seeds": seeds, "known": k.tolist(), "unknown": u.tolist()}
    (HERE / "table_cnn.md").write_text("\n".join(lines) + "\n")
    (HERE / "table_cnn.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
