"""Session 55: ForwardSensitivity (arm fwd) against today's default (arm ctl), both without a
budget, run alternately seed by seed (run.sh); rule.md's screen.

Per setting: held-out test loss at the deployed checkpoint (best validation epoch), fwd − ctl
paired by seed (mean ± s.e., seeds worse), each arm − the grid's pick (stored, the same seed),
λ reached (the mean over the layers' λ, geometric mean over seeds) and the fit's wall seconds.
Writes screen.{md,json} here.
usage (from anywhere): python table.py
"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
ORDER = ["digits_small", "mnist_cnn", "fashion_cnn", "mnist_mlp", "fashion_mlp", "news_mlp"]


def load(arm: str, setting: str, seed: int) -> dict | None:
    path = here / f"{arm}_{setting}_s{seed}_seed{seed}.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())["settings"][setting]
    return {**s["runs"]["learned_per_layer"], "grid_test": s["derived"]["grid"]["test_loss"],
            "grid_lambda": s["derived"]["grid"]["best_weight_decay"]}  # fmt: skip


def stats(xs: list[float]) -> dict:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    return {"mean": statistics.fmean(xs), "se": se, "n": len(xs), "worse": sum(x > 0 for x in xs)}


def f(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f}"


def geo(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def main() -> None:
    table, rows = {}, []
    for setting in ORDER:
        pairs = [(load("ctl", setting, n), load("fwd", setting, n)) for n in range(18)]
        pairs = [(c, w) for c, w in pairs if c is not None and w is not None]
        if not pairs:
            continue
        d = [w["test_loss"] - c["test_loss"] for c, w in pairs]
        entry = {
            "seeds": len(pairs),
            "fwd_minus_ctl": stats(d),
            "ctl_minus_grid": stats([c["test_loss"] - c["grid_test"] for c, _ in pairs]),
            "fwd_minus_grid": stats([w["test_loss"] - w["grid_test"] for _, w in pairs]),
            "lambda_ctl": geo([c["lambda_summary"]["mean"] for c, _ in pairs]),
            "lambda_fwd": geo([w["lambda_summary"]["mean"] for _, w in pairs]),
            "lambda_grid": geo([c["grid_lambda"] for c, _ in pairs]),
            "wall_ctl": statistics.fmean(c["wall_s"] for c, _ in pairs),
            "wall_fwd": statistics.fmean(w["wall_s"] for _, w in pairs),
            "test_ctl": statistics.fmean(c["test_loss"] for c, _ in pairs),
            "test_fwd": statistics.fmean(w["test_loss"] for _, w in pairs),
            "by_seed": [round(x, 4) for x in d],
        }
        table[setting] = entry
        e = entry
        rows.append(
            f"| {setting} | {e['seeds']} | {e['test_ctl']:.4f} | {e['test_fwd']:.4f} | "
            f"{f(e['fwd_minus_ctl'])} | {e['fwd_minus_ctl']['worse']}/{e['seeds']} | "
            f"{f(e['ctl_minus_grid'])} | {f(e['fwd_minus_grid'])} | {e['lambda_ctl']:.2e} | "
            f"{e['lambda_fwd']:.2e} | {e['lambda_grid']:.2e} | {e['wall_ctl']:.1f} | "
            f"{e['wall_fwd']:.1f} |"
        )
    head = (
        "| setting | seeds | test ctl | test fwd | fwd − ctl | fwd worse | ctl − grid | "
        "fwd − grid | λ ctl | λ fwd | λ grid | wall ctl s | wall fwd s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    seeds = [f"- {k}: fwd − ctl by seed {v['by_seed']}" for k, v in table.items()]
    text = (
        "# Session 55 screen: fwd − ctl, held-out test loss\n\n"
        + head + "\n" + "\n".join(rows) + "\n\n" + "\n".join(seeds)
    )  # fmt: skip
    (here / "screen.md").write_text(text + "\n")
    (here / "screen.json").write_text(json.dumps(table, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
