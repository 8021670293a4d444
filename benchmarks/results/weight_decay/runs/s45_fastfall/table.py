"""Session 45: the screen and the confirmation of a faster fall of λ (run.sh), paired by seed.

Per setting and arm (issue28_beat_table.py against session 43's stored picks and default, and
against ctl, the default rerun in the same hour): writes table_<arm>.{md,json}; then the rule
(docs/weight_decay_budget.md, "Session 45"): per setting arm − ctl, and the mean over settings
of (arm − grid pick) for the arm, ctl and the stored default; and per arm and setting the paired
differences with the number of seeds above 0: rule.{md,json}.

usage (from anywhere): python table.py [ARM[:CONTROL]...]   (default: fall20 eta20 eta15
ff10:ctl2; CONTROL, the same-hour rerun of the default to pair with, defaults to ctl)
"""

import json
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3]))
from issue28_beat_table import table  # noqa: E402

RESULTS = here.parents[1]
DEPLOYMENTS = (
    RESULTS / "weight_decay_deployment_9seeds_final_s43.json",
    RESULTS / "weight_decay_deployment_9seeds_news_final_s43.json",
)
SETTINGS = [
    "news_mlp", "mnist_mlp", "fashion_mlp", "mnist_cnn", "fashion_cnn", "digits_mlp",
    "digits_small",
]  # fmt: skip
REFS = (("ctl", None), ("default (s43)", "learned per_layer"), ("grid pick", "grid pick"),
        ("Optuna pick", "Optuna pick"))  # fmt: skip


def have(arm: str, setting: str) -> bool:
    return len(list(here.glob(f"weight_decay_{arm}_{setting}_*_seed[0-9].json"))) == 9


def f(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f}"


def verdict(arm: str, d: dict, ctl: dict) -> tuple[dict, str]:
    """The rule: no setting worse than ctl by more than its s.e., and a lower mean over the
    seven settings of (arm − grid pick) than ctl's."""
    worse = [
        s for s in d if d[s]["control"]["difference"]["mean"] > d[s]["control"]["difference"]["se"]
    ]
    mine = sum(d[s]["differences"]["grid pick"]["mean"] for s in d) / len(d)
    ref = sum(ctl[s]["differences"]["grid pick"]["mean"] for s in d) / len(d)
    stored = sum(
        d[s]["differences"]["grid pick"]["mean"] - d[s]["differences"]["learned per_layer"]["mean"]
        for s in d
    ) / len(d)
    full = len(d) == len(SETTINGS)
    held = full and not worse and mine < ref
    rec = dict(settings=list(d), worse_than_ctl=worse, mean_minus_grid=mine, ctl_minus_grid=ref,
               stored_default_minus_grid=stored, held=held)  # fmt: skip
    word = "holds" if held else "not met" if full else "screen only"
    row = (f"| {arm} | {len(d)} | {', '.join(worse) or 'none'} | {mine:+.4f} | {ref:+.4f} "
           f"| {stored:+.4f} | {word} |")  # fmt: skip
    return rec, row


def per_setting(arm: str, d: dict, dep: dict, ctl: str) -> list[str]:
    heads = " | ".join(f"{arm} − {ctl if k is None else r}" for r, k in REFS)
    rows = ["", f"{arm}, per setting (mean ± s.e., seeds above 0 of 9):", "",
            f"| setting | {heads} |", "|---|" + "---|" * len(REFS)]  # fmt: skip
    for s, rec in d.items():
        cells = []
        for _, key in REFS:
            if key is None:
                other, diff = rec["control"]["test_loss"], rec["control"]["difference"]
            else:
                other = [dep[s][key]["seeds"][str(n)]["test_loss"] for n in rec["seeds"]]
                diff = rec["differences"][key]
            up = sum(a > b for a, b in zip(rec["test_loss"], other))
            cells.append(f"{f(diff)} ({up} of {len(other)} up)")
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    specs = sys.argv[1:] or ["fall20", "eta20", "eta15", "ff10:ctl2"]
    control = {a: c or "ctl" for a, _, c in (x.partition(":") for x in specs)}
    arms, data = list(control), {}
    for arm in [*dict.fromkeys(control.values()), *arms]:
        ctl = control.get(arm)
        settings = [s for s in SETTINGS if have(arm, s) and have(ctl or arm, s)]
        md, data[arm] = table(arm, settings, None, here, DEPLOYMENTS, ctl)
        (here / f"table_{arm}.md").write_text(md + "\n")
        (here / f"table_{arm}.json").write_text(json.dumps(data[arm], indent=1))
        print(f"\n{arm}\n{md}")
    dep: dict = {}
    for path in DEPLOYMENTS:
        dep.update(json.loads(path.read_text())["deployment"]["settings"])
    rows = [
        "| arm | settings | worse than its ctl by > s.e. | mean (arm − grid) | mean (ctl − grid) "
        "| mean (stored default − grid) | rule |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    rule = {}
    for arm in arms:
        rule[arm], row = verdict(arm, data[arm], data[control[arm]])
        rows.append(row)
    for arm in arms:
        rows += per_setting(arm, data[arm], dep, control[arm])
    (here / "rule.md").write_text("\n".join(rows) + "\n")
    (here / "rule.json").write_text(json.dumps(rule, indent=1))
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
