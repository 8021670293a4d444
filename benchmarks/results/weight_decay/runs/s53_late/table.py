"""Session 53: LateBudget (eq. budgetlate) with every_n_steps=10 against the default, paired by
seed; rule.md's screen and confirmation.

`python table.py` (the screen, seeds 0-8): screen.{md,json}: per setting late − ctl (the stored
session-52 runs of the default: arm ctl, news_mlp's fall), late / ctl − grid pick, − Optuna pick
and − no decay (session 43's stored deployments), hyper steps, the budget's final overhead, the
fit's CPU seconds and the final λ; then S1-S3.
`python table.py confirm` (fresh seeds 27-35, actl / alate run alternately): confirm.{md,json},
alate − actl per setting, then C1-C4.

`python table.py ctl53` (record only, rule.md's addendum): ctl53.{md,json}, late − ctl53 and
ctl53 − ctl (the same code, another time) on the settings ctl53 ran.

usage (from anywhere): python table.py [confirm | ctl53]
"""

import importlib.util
import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
S45 = here.parent / "s45_fastfall" / "table.py"
spec = importlib.util.spec_from_file_location("s45_table", S45)
s45 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s45)  # puts benchmarks/ on sys.path
from bench_weight_decay import paired_difference  # noqa: E402
from issue28_beat_table import variant  # noqa: E402

S52 = here.parent / "s52_shrinkfall"
ORDER = ["digits_small", "mnist_cnn", "fashion_cnn", "mnist_mlp", "fashion_mlp", "news_mlp"]
MISSES = ["digits_small", "mnist_cnn", "fashion_cnn"]
PICKS = ("grid pick", "Optuna pick", "no WD")
MAX_FIT = 0.51
SCREEN_SEEDS, FRESH_SEEDS = range(9), range(27, 36)


def f(d: dict) -> str:
    return f"{d['mean']:+.4f} ± {d['se']:.4f}"


def control(setting: str, seed: int) -> dict | None:
    """Today's default on a screen seed: session 52's stored run (ShrinkFallRprop where it acts,
    news_mlp; elsewhere TrustRprop, which it equals bit for bit without the clock)."""
    return variant("fall" if setting == "news_mlp" else "ctl", setting, seed, S52)


def fresh(arm: str, setting: str, seed: int) -> dict | None:
    path = here / f"weight_decay_{arm}_{setting}_fresh_seed{seed}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]


def deployments() -> dict:
    dep: dict = {}
    for path in s45.DEPLOYMENTS:
        dep.update(json.loads(path.read_text())["deployment"]["settings"])
    return dep


def final_lambda(r: dict) -> float:
    return max(r["lambda_summary"]["mean"], 1e-300)


def mechanism(rs: list[dict]) -> dict:
    return dict(
        hyper_steps=[r["hyper_steps"] for r in rs],
        overhead=[r["budget"]["overhead"] for r in rs],
        cpu_s=[r["cpu_s"] for r in rs],
        final_lambda=[final_lambda(r) for r in rs],
    )


def spread(xs: list) -> str:
    return f"{statistics.mean(xs):.1f} [{min(xs)}, {max(xs)}]"


def compare(arm: dict, ctl: dict, settings: list[str]) -> tuple[dict, list[str]]:
    """Per setting: arm − ctl (mean ± s.e., seeds up) and the mechanism's columns."""
    out, rows = {}, []
    for s in settings:
        a = [r["test_loss"] for r in arm[s]]
        c = [r["test_loss"] for r in ctl[s]]
        d = paired_difference(a, c)
        ma, mc = mechanism(arm[s]), mechanism(ctl[s])
        up = sum(x > y for x, y in zip(a, c))
        geo = [statistics.geometric_mean(m["final_lambda"]) for m in (ma, mc)]
        out[s] = dict(arm=a, ctl=c, difference=d, up=up, arm_mechanism=ma, ctl_mechanism=mc)
        rows.append(
            f"| {s} | {statistics.mean(a):.4f} | {statistics.mean(c):.4f} | {f(d)} "
            f"| {up} of {len(a)} "
            f"| {spread(ma['hyper_steps'])} / {spread(mc['hyper_steps'])} "
            f"| {max(ma['overhead']):.3f} / {max(mc['overhead']):.3f} "
            f"| {statistics.mean(ma['cpu_s']):.1f} / {statistics.mean(mc['cpu_s']):.1f} "
            f"| {geo[0]:.2g} / {geo[1]:.2g} |"
        )
    return out, rows


HEAD = (
    "| setting | {a}: test loss | {c}: test loss | {a} − {c} | n up | hyper steps {a} / {c} "
    "| overhead max {a} / {c} | CPU s per fit {a} / {c} | final mean λ {a} / {c} (geometric) |\n"
    "|---|---:|---:|---|---:|---|---|---|---|"
)


def conditions(data: dict, settings: list[str], arm_runs: dict, tag: str) -> dict:
    diff = {s: data[s]["difference"] for s in settings}
    misses = [s for s in MISSES if s in diff]
    mean = statistics.mean(diff[s]["mean"] for s in misses) if misses else float("nan")
    one = [s for s in misses if diff[s]["mean"] + diff[s]["se"] < 0]
    above = [s for s in settings if diff[s]["mean"] > 2 * diff[s]["se"]]
    over = max((r["budget"]["overhead"] for s in settings for r in arm_runs[s]), default=0.0)
    return {
        f"{tag}1": (len(misses) == 3 and mean < 0 and bool(one),
                    f"mean over the misses ({', '.join(misses)}) {mean:+.4f} (< 0); "
                    f"mean + s.e. < 0: {', '.join(one) or 'none'}"),
        f"{tag}2": (not above, f"above +2 s.e.: {', '.join(above) or 'none'}"),
        f"{tag}3": (over <= MAX_FIT, f"max overhead {over:.3f} (≤ {MAX_FIT})"),
    }  # fmt: skip


def table_of_conditions(cond: dict) -> list[str]:
    rows = ["| condition | holds | numbers |", "|---|---|---|"]
    rows += [f"| {k} | {'yes' if ok else 'no'} | {txt} |" for k, (ok, txt) in cond.items()]
    return rows


def screen() -> None:
    late = {s: [variant("late", s, n, here) for n in SCREEN_SEEDS] for s in ORDER}
    ctl = {s: [control(s, n) for n in SCREEN_SEEDS] for s in ORDER}
    ran = [s for s in ORDER if all(late[s]) and all(ctl[s])]
    data, rows = compare(late, ctl, ran)
    dep = deployments()
    pick_rows = [
        "",
        "Against what the searches deploy (session 43's stored picks, seeds 0-8):",
        "",
        "| setting | " + " | ".join(f"late − {p} | ctl − {p}" for p in PICKS) + " |",
        "|---|" + "---|" * (2 * len(PICKS)),
    ]
    for s in ran:
        cells = []
        for p in PICKS:
            ref = [dep[s][p]["seeds"][str(n)]["test_loss"] for n in SCREEN_SEEDS]
            da = paired_difference(data[s]["arm"], ref)
            dc = paired_difference(data[s]["ctl"], ref)
            data[s][p] = dict(late=da, ctl=dc)
            cells += [f(da), f(dc)]
        pick_rows.append(f"| {s} | " + " | ".join(cells) + " |")
    cond = conditions(data, ran, late, "S")
    passed = ran == ORDER and all(ok for ok, _ in cond.values())
    word = "passed" if passed else ("failed" if ran == ORDER else "incomplete")
    md = [
        f"Screen (rule.md), seeds 0-8, settings run: {', '.join(ran)} → **{word}**",
        "",
        HEAD.format(a="late", c="ctl"),
        *rows,
        *pick_rows,
        "",
        *table_of_conditions(cond),
    ]
    (here / "screen.md").write_text("\n".join(md) + "\n")
    out = dict(settings=ran, passed=passed, conditions={k: v[0] for k, v in cond.items()},
               data=data)  # fmt: skip
    (here / "screen.json").write_text(json.dumps(out, indent=1))
    print("\n".join(md))


def confirm() -> None:
    runs = {a: {s: [fresh(a, s, n) for n in FRESH_SEEDS] for s in ORDER} for a in ("alate", "actl")}
    ran = [s for s in ORDER if all(runs["alate"][s]) and all(runs["actl"][s])]
    data, rows = compare(runs["alate"], runs["actl"], ran)
    cond = conditions(data, ran, runs["alate"], "C")
    cond["C4"] = (ran == ORDER, f"settings run on seeds 27-35: {', '.join(ran) or 'none'}")
    held = all(ok for ok, _ in cond.values())
    md = [
        f"Confirmation (rule.md), fresh seeds 27-35 → **{'holds' if held else 'not met'}**",
        "",
        HEAD.format(a="alate", c="actl"),
        *rows,
        "",
        *table_of_conditions(cond),
    ]
    (here / "confirm.md").write_text("\n".join(md) + "\n")
    out = dict(settings=ran, held=held, conditions={k: v[0] for k, v in cond.items()}, data=data)
    (here / "confirm.json").write_text(json.dumps(out, indent=1))
    print("\n".join(md))


def rerun() -> None:
    """late − ctl53 (today's default rerun in this session) and ctl53 − ctl (session 52's)."""
    late = {s: [variant("late", s, n, here) for n in SCREEN_SEEDS] for s in ORDER}
    again = {s: [variant("ctl53", s, n, here) for n in SCREEN_SEEDS] for s in ORDER}
    ctl = {s: [control(s, n) for n in SCREEN_SEEDS] for s in ORDER}
    ran = [s for s in ORDER if all(again[s])]
    data, rows = compare(late, again, ran)
    drift, drift_rows = compare(again, ctl, ran)
    md = [
        "Record only (rule.md's addendum): late against today's default rerun in this session "
        "(ctl53), seeds 0-8",
        "",
        HEAD.format(a="late", c="ctl53"),
        *rows,
        "",
        "The same code at two times: ctl53 (this session) against ctl (session 52's stored runs)",
        "",
        HEAD.format(a="ctl53", c="ctl"),
        *drift_rows,
    ]
    (here / "ctl53.md").write_text("\n".join(md) + "\n")
    (here / "ctl53.json").write_text(json.dumps(dict(late=data, drift=drift), indent=1))
    print("\n".join(md))


if __name__ == "__main__":
    {"confirm": confirm, "ctl53": rerun}.get(sys.argv[1] if sys.argv[1:] else "", screen)()
