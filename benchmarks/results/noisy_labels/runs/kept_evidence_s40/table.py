"""KeptEvidenceError on the CNNs against the stored default (ExpectedError(q=0.5)) and mean-loss
runs, paired by seed: 70 % symmetric (seeds 1-4) against runs/high_noise_s39, 40 % symmetric and
pair-flip (seeds 1-5) against runs/outer_objective/q05; and the q* every validation batch chose.
Writes table.md and table.json next to this file."""

import json
import statistics
from pathlib import Path

here = Path(__file__).parent
stored = {
    "r07": here.parent / "high_noise_s39" / "{}_r07.json",
    "r04": here.parent / "outer_objective" / "q05" / "{}.json",
}


def accuracies(path: Path) -> dict[str, dict[str, list[float]]]:
    settings = json.loads(path.read_text())["settings"]
    return {
        name: {m: [100 * r["test_acc"] for r in runs] for m, runs in s["runs"].items()}
        for name, s in settings.items()
    }


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    d = [x - y for x, y in zip(a, b)]
    return statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5


rows, out = [], {}
for tag, ds in [(t, d) for t in ("r07", "r04") for d in ("mnist", "fashion")]:
    new = accuracies(here / f"{ds}_{tag}.json")
    old = accuracies(Path(str(stored[tag]).format(ds)))
    trace = json.loads((here / f"q_{ds}_{tag}.json").read_text())
    for name, acc in new.items():
        kept = acc["drop_in"]
        default, mean_loss = old[name]["drop_in"], old[name]["drop_in_mean_loss"]
        n = len(kept)
        vs_default, vs_mean = paired(kept, default[:n]), paired(kept, mean_loss[:n])
        qs = [q for q, _, _ in trace]
        ess = [e for _, e, _ in trace]
        out[name] = {
            "kept_evidence": kept, "default": default[:n], "mean_loss": mean_loss[:n],
            "kept_minus_default": vs_default, "kept_minus_mean_loss": vs_mean,
            "q_star_min_max": [min(qs), max(qs)],
            "ess_share_at_q_max_min_max": [min(ess), max(ess)],
            "validation_batches": len(trace),
        }  # fmt: skip
        rows.append(
            f"| {name} | {statistics.mean(kept):.1f} | {statistics.mean(default[:n]):.1f} | "
            f"{statistics.mean(mean_loss[:n]):.1f} | {vs_default[0]:+.2f} ± {vs_default[1]:.2f} | "
            f"{vs_mean[0]:+.2f} ± {vs_mean[1]:.2f} | {min(qs):.3g}–{max(qs):.3g} | "
            f"{min(ess):.2f}–{max(ess):.2f} |"
        )
head = (
    "| setting (70 %: seeds 1–4, 40 %: 1–5) | kept evidence | default q = 0.5 | mean loss | "
    "kept − default | "
    "kept − mean loss | q* chosen | ESS(0.5)/|V| |\n|---|---|---|---|---|---|---|---|\n"
)
(here / "table.md").write_text(head + "\n".join(rows) + "\n")
(here / "table.json").write_text(json.dumps(out, indent=1))
print(head + "\n".join(rows))
