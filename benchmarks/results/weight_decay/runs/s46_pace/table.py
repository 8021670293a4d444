"""Session 46: PacedBudget (eq. budgetpace) against the default rerun in the same hour (ctl),
paired by seed, with s45_fastfall/table.py's helpers (its table(), per-setting rows, settings
and stored deployments).

Writes table_<arm>.{md,json} (issue28_beat_table.py's columns, − ctl), and rule_<arm>.{md,json}
here: the rule of rule.md (mean over settings of arm − grid pick against ctl's; no setting with
arm − ctl above 2 s.e.; the budget's own final overhead, per-setting mean ≤ 0.5 and no fit above
0.51), then per setting: arm − ctl, − s45's ctl, − grid / Optuna pick, hyper steps, overhead.

usage (from anywhere): python table.py [ARM[:CONTROL]]   (default: pace; CONTROL: ctl; e.g.
paceminb:ctlb, the reruns after the rule, on the settings both have)
"""

import importlib.util
import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location(
    "s45_table", here.parent / "s45_fastfall" / "table.py"
)
s45 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s45)  # puts benchmarks/ on sys.path
from bench_weight_decay import paired_difference  # noqa: E402
from issue28_beat_table import variant  # noqa: E402

S45 = here.parent / "s45_fastfall"
MAX_MEAN, MAX_FIT = 0.5, 0.51


def have(arm: str, setting: str) -> bool:
    return len(list(here.glob(f"weight_decay_{arm}_{setting}_*_seed[0-9].json"))) == 9


def runs(arm: str, setting: str, folder: Path = here) -> list[dict]:
    return [variant(arm, setting, n, folder) for n in range(9)]


def budget_rows(arm: str, settings: list[str]) -> dict:
    """Per setting: hyper steps and the budget's final overhead (mean, max over the seeds)."""
    out = {}
    for s in settings:
        rs = runs(arm, s)
        over = [r["budget"]["overhead"] for r in rs]
        out[s] = dict(hyper_steps=[r["hyper_steps"] for r in rs], overhead=over,
                      overhead_mean=statistics.mean(over), overhead_max=max(over))  # fmt: skip
    return out


def main() -> None:
    arm, _, control = (sys.argv[1] if len(sys.argv) > 1 else "pace").partition(":")
    control = control or "ctl"
    settings = [s for s in s45.SETTINGS if have(arm, s) and have(control, s)]
    data = {}
    for a, ctl in ((control, None), (arm, control)):
        md, data[a] = s45.table(a, settings, None, here, s45.DEPLOYMENTS, ctl)
        (here / f"table_{a}.md").write_text(md + "\n")
        (here / f"table_{a}.json").write_text(json.dumps(data[a], indent=1))
        print(f"\n{a}\n{md}")
    d, c = data[arm], data[control]
    budgets = {a: budget_rows(a, settings) for a in (control, arm)}
    worse = [s for s in d if (x := d[s]["control"]["difference"])["mean"] > 2 * x["se"]]
    mine = statistics.mean(d[s]["differences"]["grid pick"]["mean"] for s in d)
    ref = statistics.mean(c[s]["differences"]["grid pick"]["mean"] for s in d)
    b = budgets[arm]
    over_ok = all(b[s]["overhead_mean"] <= MAX_MEAN and b[s]["overhead_max"] <= MAX_FIT for s in b)
    full = len(settings) == len(s45.SETTINGS)
    held = full and not worse and mine < ref and over_ok
    word = "holds" if held else "not met" if full else "screen only"
    rows = [
        f"| arm | settings | worse than {control} by > 2 s.e. | mean (arm − grid) "
        f"| mean ({control} − grid) "
        "| overhead ≤ 0.5 (mean), ≤ 0.51 (each fit) | rule |",
        "|---|---:|---|---:|---:|---|---|",
        f"| {arm} | {len(d)} | {', '.join(worse) or 'none'} | {mine:+.4f} | {ref:+.4f} "
        f"| {'yes' if over_ok else 'no'} | {word} |",
        "",
        f"{arm}, per setting (mean ± s.e. over seeds 0-8, paired by seed; hyper steps and the "
        "budget's final overhead: mean [min, max] / mean, max over the 9 fits):",
        "",
        f"| setting | {arm} − {control} | {arm} − ctl (s45) | {arm} − grid pick "
        f"| {control} − grid pick | {arm} − Optuna pick | {control} − Optuna pick "
        f"| hyper steps {arm} / {control} | overhead {arm} / {control} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    s45_ctl = {}
    for s in d:
        old = [r["test_loss"] for r in runs("ctl", s, S45)]
        s45_ctl[s] = paired_difference(d[s]["test_loss"], old)
        hs = {a: budgets[a][s]["hyper_steps"] for a in budgets}
        hs_text = " / ".join(
            f"{statistics.mean(h):.1f} [{min(h)}, {max(h)}]" for h in (hs[arm], hs[control])
        )
        ov = " / ".join(
            f"{budgets[a][s]['overhead_mean']:.3f}, {budgets[a][s]['overhead_max']:.3f}"
            for a in (arm, control)
        )
        rows.append(
            f"| {s} | {s45.f(d[s]['control']['difference'])} | {s45.f(s45_ctl[s])} "
            f"| {s45.f(d[s]['differences']['grid pick'])} "
            f"| {s45.f(c[s]['differences']['grid pick'])} "
            f"| {s45.f(d[s]['differences']['Optuna pick'])} "
            f"| {s45.f(c[s]['differences']['Optuna pick'])} | {hs_text} | {ov} |"
        )
    dep: dict = {}
    for path in s45.DEPLOYMENTS:
        dep.update(json.loads(path.read_text())["deployment"]["settings"])
    rows += s45.per_setting(arm, d, dep, control)
    rule = dict(settings=list(d), worse_than_ctl_2se=worse, mean_minus_grid=mine,
                ctl_minus_grid=ref, overhead_ok=over_ok, held=held, budgets=budgets,
                minus_s45_ctl=s45_ctl)  # fmt: skip
    (here / f"rule_{arm}.md").write_text("\n".join(rows) + "\n")
    (here / f"rule_{arm}.json").write_text(json.dumps(rule, indent=1))
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
