"""run.sh's probe JSONs and q* traces as table.md / table.json next to this file."""

import json
from pathlib import Path

here = Path(__file__).parent
names = {
    '{"objective": "kept_evidence"}': "kept",
    "{}": "default",
    '{"objective": "mean_loss"}': "mean",
}
rows, out = [], {}
for path in sorted(here.glob("probe_drop_in_p*.json")):
    p = path.stem.removeprefix("probe_drop_in_p")
    err = {names[k]: v["test_error"] for k, v in json.loads(path.read_text()).items() if k in names}
    trace = here / f"q_p{p}.json"
    q = ess = "—"
    if trace.exists():
        rec = json.loads(trace.read_text())
        q = f"{min(r[0] for r in rec):.3g}–{max(r[0] for r in rec):.3g}"
        ess = f"{min(r[1] for r in rec):.2f}–{max(r[1] for r in rec):.2f}"
    out[p] = {**err, "q_star": q, "ess_share_at_0.5": ess}
    if len(err) == 3:
        rows.append(
            f"| {p} | {err['kept']:.4f} | {err['default']:.4f} | {err['mean']:.4f} | "
            f"{100 * (err['default'] - err['kept']):+.2f} | "
            f"{100 * (err['mean'] - err['kept']):+.2f} | {q} | {ess} |"
        )
head = (
    "| p | kept evidence | default q = 0.5 | mean loss | kept vs default (points) | "
    "kept vs mean loss (points) | q* chosen | ESS(0.5)/|V| |\n|---|---|---|---|---|---|---|---|\n"
)
(here / "table.md").write_text(
    "Test error, seed 1, 35 s of CPU (points: positive = kept evidence better)\n\n"
    + head
    + "\n".join(rows)
    + "\n"
)
(here / "table.json").write_text(json.dumps(out, indent=1))
print(head + "\n".join(rows))
