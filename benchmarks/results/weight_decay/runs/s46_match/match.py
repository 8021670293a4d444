"""Issue 28 item 4: how many Optuna trials it takes to match one default training.

Per setting and seed, the number of Optuna TPE trials (in trial order) until the model Optuna
would deploy — its pick so far, chosen on the validation loss — has a held-out test loss at or
below the learned default's (``bench_weight_decay.optuna_trials_to_match``). The default's runs
are an arm of a run folder (``issue28_beat_run_arm.sh``; session 45's same-hour rerun ``ctl`` by
default), Optuna's 10 trials per seed the stored ones of session 43's deployment summaries.
Writes match_<arm>.{md,json} here.

usage (from anywhere): python match.py [--runs FOLDER] [--arm ARM]
"""

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location(
    "s45_table", here.parent / "s45_fastfall" / "table.py"
)
s45 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s45)  # puts benchmarks/ on sys.path; its settings and stored picks
from bench_weight_decay import optuna_trials_to_match  # noqa: E402
from issue28_beat_table import variant  # noqa: E402

DEPLOYMENTS, SETTINGS = s45.DEPLOYMENTS, s45.SETTINGS


def optuna_trials() -> dict[str, dict[int, list[dict]]]:
    """Per setting and seed, Optuna's stored trials (best_val_loss, test_loss, test_acc)."""
    out: dict[str, dict[int, list[dict]]] = {}
    for path in DEPLOYMENTS:
        for setting, rows in json.loads(path.read_text())["deployment"]["settings"].items():
            seeds = rows["Optuna pick"]["seeds"]
            out[setting] = {int(s): rec["trials"] for s, rec in seeds.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=here.parent / "s45_fastfall")
    p.add_argument("--arm", default="ctl")
    args = p.parse_args()
    trials = optuna_trials()
    record, rows = {}, []
    for setting in SETTINGS:
        per_seed = {}
        for seed, tr in sorted(trials[setting].items()):
            run = variant(args.arm, setting, seed, args.runs)
            if run is None or not run.get("finished", True):
                continue
            per_seed[seed] = optuna_trials_to_match(tr, float(run["test_loss"]))
        if not per_seed:
            continue
        found = [n for n in per_seed.values() if n is not None]
        med = statistics.median([n if n is not None else 11 for n in per_seed.values()])
        record[setting] = dict(per_seed=per_seed, matched=len(found), seeds=len(per_seed),
                               median=med)  # fmt: skip
        cells = " ".join("–" if n is None else str(n) for n in per_seed.values())
        med_text = "> 10" if med > 10 else f"{med:g}"
        rows.append(f"| {setting} | {cells} | {len(found)} of {len(per_seed)} | {med_text} |")
    head = [
        f"Optuna trials to match `{args.arm}` ({args.runs.name}), per seed 0–8 (– : not within "
        "the 10 trials run):",
        "",
        "| setting | trials per seed | seeds matched in 10 | median (not matched = 11) |",
        "|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    print(text)
    (here / f"match_{args.arm}.md").write_text(text)
    (here / f"match_{args.arm}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
