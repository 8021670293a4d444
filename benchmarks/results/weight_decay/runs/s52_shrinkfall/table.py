"""Session 52: ShrinkFallRprop (eq. shrinkfall) against the default rerun in the same hour (ctl),
paired by seed, with s45_fastfall/table.py's table() and s46_pace/table.py's helpers.

`python table.py` (the screen, seeds 0-8): writes table_<arm>.{md,json} (issue28_beat_table.py's
columns, − ctl) and screen.{md,json}: per setting fall − ctl (n up), ctl / fall − grid pick and
− Optuna pick (session 43's stored picks), hyper steps and the budget's final overhead per fit,
and rule.md's screen (a. news_mlp mean + s.e. < 0; b. mnist_mlp ≤ +1 s.e.; c. none above 2 s.e.).
`python table.py confirm` (fresh seeds 9-17): confirm.{md,json}, ffall − fctl per setting and the
decision's conditions a-e of rule.md.

usage (from anywhere): python table.py [confirm]
"""

import importlib.util
import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


s45 = _load("s45_table", here.parent / "s45_fastfall" / "table.py")  # puts benchmarks/ on path
s46 = _load("s46_table", here.parent / "s46_pace" / "table.py")
ARM, CONTROL = "fall", "ctl"
ORDER = ["news_mlp", "mnist_mlp", "digits_small", "fashion_mlp", "mnist_cnn", "fashion_cnn",
         "digits_mlp"]  # fmt: skip
CONFIRM = ["news_mlp", "digits_small", "mnist_cnn", "fashion_cnn", "mnist_mlp", "fashion_mlp",
           "digits_mlp"]  # fmt: skip
MAX_FIT = 0.51


def have(arm: str, setting: str) -> bool:
    return len(list(here.glob(f"weight_decay_{arm}_{setting}_*_seed[0-9].json"))) == 9


def spread(xs: list) -> str:
    return f"{statistics.mean(xs):.1f} [{min(xs)}, {max(xs)}]"


def final_lambda(r: dict) -> float:
    return max(r["lambda_summary"]["mean"], 1e-300)  # λ may underflow to 0 (digits MLP)


def screen() -> None:
    ran = [s for s in ORDER if have(ARM, s) and have(CONTROL, s)]
    data = {}
    for a, ctl in ((CONTROL, None), (ARM, CONTROL)):
        md, data[a] = s45.table(a, ran, None, here, s45.DEPLOYMENTS, ctl)
        (here / f"table_{a}.md").write_text(md + "\n")
        (here / f"table_{a}.json").write_text(json.dumps(data[a], indent=1))
    d, c = data[ARM], data[CONTROL]
    diff = {s: d[s]["control"]["difference"] for s in ran}
    above_2se = [s for s in ran if diff[s]["mean"] > 2 * diff[s]["se"]]
    a = "news_mlp" in diff and diff["news_mlp"]["mean"] + diff["news_mlp"]["se"] < 0
    b = "mnist_mlp" in diff and diff["mnist_mlp"]["mean"] <= diff["mnist_mlp"]["se"]
    passed = a and b and not above_2se
    rows = [
        f"Screen (rule.md): a. news_mlp mean + s.e. < 0: {'yes' if a else 'no'}; b. mnist_mlp "
        f"≤ +1 s.e.: {'yes' if b else 'no'}; c. above 2 s.e.: {', '.join(above_2se) or 'none'}"
        f" → {'passed' if passed else 'failed'} (settings run: {', '.join(ran)})",
        "",
        "| setting | fall − ctl | n up | ctl − grid pick | fall − grid pick | ctl − Optuna pick "
        "| fall − Optuna pick | hyper steps fall / ctl | overhead max fall / ctl "
        "| final mean λ fall / ctl (geometric mean over seeds) |",
        "|---|---|---:|---|---|---|---|---|---|---|",
    ]
    mech = {}
    for s in ran:
        rs = {x: s46.runs(x, s, here) for x in (ARM, CONTROL)}
        up = sum(x > y for x, y in zip(d[s]["test_loss"], d[s]["control"]["test_loss"]))
        geo = {x: statistics.geometric_mean([final_lambda(r) for r in rs[x]]) for x in rs}
        mech[s] = {x: dict(hyper_steps=[r["hyper_steps"] for r in rs[x]],
                           overhead=[r["budget"]["overhead"] for r in rs[x]],
                           final_lambda=[final_lambda(r) for r in rs[x]]) for x in rs}  # fmt: skip
        m = mech[s]
        rows.append(
            f"| {s} | {s45.f(diff[s])} | {up} of 9 | {s45.f(c[s]['differences']['grid pick'])} "
            f"| {s45.f(d[s]['differences']['grid pick'])} "
            f"| {s45.f(c[s]['differences']['Optuna pick'])} "
            f"| {s45.f(d[s]['differences']['Optuna pick'])} "
            f"| {spread(m[ARM]['hyper_steps'])} / {spread(m[CONTROL]['hyper_steps'])} "
            f"| {max(m[ARM]['overhead']):.3f} / {max(m[CONTROL]['overhead']):.3f} "
            f"| {geo[ARM]:.2g} / {geo[CONTROL]:.2g} |"
        )
    out = dict(settings=ran, passed=passed, a=a, b=b, above_2se=above_2se, differences=diff,
               mechanism=mech)  # fmt: skip
    (here / "screen.md").write_text("\n".join(rows) + "\n")
    (here / "screen.json").write_text(json.dumps(out, indent=1))
    print("\n".join(rows))


def fresh_runs(arm: str, setting: str) -> list[dict] | None:
    rs = [s46.variant(arm, setting, n, here) for n in range(9, 18)]
    return None if any(r is None for r in rs) else rs


def confirm() -> None:
    runs = {x: {s: fresh_runs(x, s) for s in CONFIRM} for x in ("fctl", "ffall")}
    ran = [s for s in CONFIRM if runs["fctl"][s] and runs["ffall"][s]]
    loss = {x: {s: [r["test_loss"] for r in runs[x][s]] for s in ran} for x in runs}
    diff = {s: s46.paired_difference(loss["ffall"][s], loss["fctl"][s]) for s in ran}
    above_2se = [s for s in ran if diff[s]["mean"] > 2 * diff[s]["se"]]
    mean = statistics.mean(diff[s]["mean"] for s in ran) if ran else float("nan")
    over = max((r["budget"]["overhead"] for s in ran for r in runs["ffall"][s]), default=0.0)
    news, mnist = diff.get("news_mlp"), diff.get("mnist_mlp")
    cond = {
        "a": (news is not None and news["mean"] + news["se"] < 0,
              f"news_mlp ffall − fctl {s45.f(news) if news else '—'} (mean + s.e. < 0)"),
        "b": (not above_2se, f"above 2 s.e.: {', '.join(above_2se) or 'none'}"),
        "c": (mnist is not None and mnist["mean"] <= mnist["se"],
              f"mnist_mlp ffall − fctl {s45.f(mnist) if mnist else '—'} (≤ +1 s.e.)"),
        "d": (mean < 0, f"mean over {len(ran)} settings of ffall − fctl = {mean:+.4f} (< 0)"),
        "e": (over <= MAX_FIT, f"max ffall overhead {over:.3f} (≤ {MAX_FIT})"),
    }  # fmt: skip
    full = ran == CONFIRM
    held = full and all(ok for ok, _ in cond.values())
    word = "holds" if held else ("not met" if full else "no decision (not all 7 settings run)")
    rows = [
        "| setting | ffall − fctl | n up | hyper steps ffall / fctl | overhead max ffall / fctl "
        "| final mean λ ffall / fctl (geometric mean) |",
        "|---|---|---:|---|---|---|",
    ]
    for s in ran:
        up = sum(x > y for x, y in zip(loss["ffall"][s], loss["fctl"][s]))
        hs = {x: [r["hyper_steps"] for r in runs[x][s]] for x in runs}
        ov = {x: max(r["budget"]["overhead"] for r in runs[x][s]) for x in runs}
        geo = {x: statistics.geometric_mean([final_lambda(r) for r in runs[x][s]]) for x in runs}
        rows.append(f"| {s} | {s45.f(diff[s])} | {up} of 9 | {spread(hs['ffall'])} / "
                    f"{spread(hs['fctl'])} | {ov['ffall']:.3f} / {ov['fctl']:.3f} "
                    f"| {geo['ffall']:.2g} / {geo['fctl']:.2g} |")  # fmt: skip
    rows += ["", "| condition | holds | numbers |", "|---|---|---|"]
    rows += [f"| {k} | {'yes' if ok else 'no'} | {txt} |" for k, (ok, txt) in cond.items()]
    rows += ["", f"Verdict: {word}."]
    out = dict(settings=ran, differences=diff, conditions={k: v[0] for k, v in cond.items()},
               held=held, loss=loss)  # fmt: skip
    (here / "confirm.md").write_text("\n".join(rows) + "\n")
    (here / "confirm.json").write_text(json.dumps(out, indent=1))
    print("\n".join(rows))


if __name__ == "__main__":
    confirm() if sys.argv[1:] == ["confirm"] else screen()
