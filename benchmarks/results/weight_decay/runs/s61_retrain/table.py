# ruff: noqa: E501
"""Session 61: learn once, retrain at the effective λ (rule ../../rules_s61/retrain61-rule.txt):
per setting, paired by seed, the retrain (a plain training at the learned fit's overall effective
λ, eq. effectivedecay) against the learned fit itself, session 43's stored picks and the one
constant best on test in hindsight; held-out test loss at the deployed (best-validation) epoch.
usage (from anywhere): python table.py   → table.md, table.json here"""

import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
root = here.parents[1]
PICKS = json.loads((root / "weight_decay_deployment_9seeds_final_s43.json").read_text())[
    "deployment"
]["settings"]
SETTINGS = ["digits_small", "mnist_mlp", "fashion_mlp", "fashion_cnn"]
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def load(kind: str, setting: str, seed: int) -> dict | None:
    path = here / f"{kind}_{setting}_seed{seed}.json"
    if not path.is_file():
        return None
    runs = json.loads(path.read_text())["settings"][setting]["runs"]
    return runs["learned_per_layer"] if kind == "learned" else runs["grid"][0]


def paired(xs: list[float]) -> str:
    n = len(xs)
    if n < 2:
        return "–"
    mean, se = statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(n)
    text = f"{mean:+.4f} ± {se:.4f} ({sum(x > 0 for x in xs)}/{n})"
    return f"**{text}**" if abs(mean) > T95.get(n - 1, 2.262) * se else text


rows, learned_rows, out = [], [], {}
for s in SETTINGS:
    picks = PICKS[s]
    pairs = []
    for seed in range(9):
        learned, retrain = load("learned", s, seed), load("retrain", s, seed)
        if learned is None or retrain is None:
            continue
        k = str(seed)
        pairs.append(
            dict(
                seed=seed,
                learned=learned["test_loss"],
                retrain=retrain["test_loss"],
                lam=learned["effective_all"],
                grid=picks["grid pick"]["seeds"][k]["test_loss"],
                optuna=picks["Optuna pick"]["seeds"][k]["test_loss"],
                oracle=picks["one λ, best on test (oracle)"]["seeds"][k]["test_loss"],
                oracle_lam=picks["one λ, best on test (oracle)"]["seeds"][k]["weight_decay"],
            )
        )
    if not pairs:
        continue
    out[s] = pairs
    mean = lambda key, pairs=pairs: statistics.fmean(p[key] for p in pairs)  # noqa: E731
    diff = lambda key, pairs=pairs: paired([p["retrain"] - p[key] for p in pairs])  # noqa: E731
    lams = [p["lam"] for p in pairs]
    rows.append(
        f"| {s} | {len(pairs)} | {mean('learned'):.4f} | {mean('retrain'):.4f} | {mean('grid'):.4f} | "
        f"{mean('optuna'):.4f} | {mean('oracle'):.4f} | {min(lams):.1e}–{max(lams):.1e} "
        f"(oracle {pairs[0]['oracle_lam']:.1e}) | {diff('learned')} | {diff('grid')} | "
        f"{diff('optuna')} | {diff('oracle')} |"
    )

    again = lambda key, pairs=pairs: paired([p["learned"] - p[key] for p in pairs])  # noqa: E731
    learned_rows.append(
        f"| {s} | {len(pairs)} | {mean('learned'):.4f} | {again('grid')} | {again('optuna')} |"
    )

head = (
    "| setting | seeds | learned | retrain at λ̄ | grid's pick | Optuna's pick | oracle constant | λ̄ "
    "| retrain − learned | retrain − grid's pick | retrain − Optuna's pick | retrain − oracle |\n"
    "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|"
)
learned_head = (
    "\n\nThis run's learned fits (another draw of the session-60 default) against the picks:\n\n"
    "| setting | seeds | learned | learned − grid's pick | learned − Optuna's pick |\n"
    "|---|---:|---:|---|---|"
)
(here / "table.md").write_text(
    head + "\n" + "\n".join(rows) + learned_head + "\n" + "\n".join(learned_rows) + "\n"
)
(here / "table.json").write_text(json.dumps(out, indent=1))
print((here / "table.md").read_text())
