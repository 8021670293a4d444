"""Session 52: ShrinkFallRprop (eq. shrinkfall) against the default rerun in the same hour (ctl),
paired by seed, with s45_fastfall/table.py's table() and s46_pace/table.py's helpers.

`python table.py` (the screen, seeds 0-8): writes table_<arm>.{md,json} (issue28_beat_table.py's
columns, − ctl) and screen.{md,json}: per setting fall − ctl (n up), ctl / fall − grid pick and
− Optuna pick (session 43's stored picks), hyper steps and the budget's final overhead per fit,
and rule.md's screen (a. news_mlp mean + s.e. < 0; b. mnist_mlp ≤ +1 s.e.; c. none above 2 s.e.).
`python table.py confirm` (fresh seeds 9-17): confirm.{md,json}, ffall − fctl per setting and the
decision's conditions a-e of rule.md.

`python table.py fair` (rule_fair.md, seeds 18-26): fair.{md,json}: a. per setting whether the
option acts without the clock (nctl / nfall, seeds 18-20: any final λ differs) and, where not,
whether λ and test loss are bit-identical; b. afall − actl (alternating, default budget) on the
acting settings; c. every afall fit's final overhead.

usage (from anywhere): python table.py [confirm | fair]
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


NO_CLOCK, ALTERNATE = (18, 19, 20), tuple(range(18, 27))


def fair_run(arm: str, setting: str, seed: int) -> dict | None:
    path = here / f"weight_decay_{arm}_{setting}_fair_seed{seed}.json"
    if not path.exists():
        return None
    run = json.loads(path.read_text())["settings"][setting]["runs"]["learned_per_layer"]
    return run if run.get("finished") else None


def fair() -> None:
    """rule_fair.md's a, b, c."""
    rows = ["a. Without the clock (`max_overhead=None`), seeds 18-20: does the option act?", "",
            "| setting | acts (seeds where a λ differs) | λ bit-identical "
            "| test loss bit-identical | nfall − nctl test loss (mean over seeds) |",
            "|---|---|---|---|---|"]  # fmt: skip
    acting, a_ok, a_done, noclock = [], True, True, {}
    for s in CONFIRM:
        pairs = [(fair_run("nctl", s, n), fair_run("nfall", s, n)) for n in NO_CLOCK]
        if any(c is None or f is None for c, f in pairs):
            a_done = False
            rows.append(f"| {s} | not run | | | |")
            continue
        lam = [c["lambda_by_slot"] == f["lambda_by_slot"] for c, f in pairs]
        loss = [c["test_loss"] == f["test_loss"] for c, f in pairs]
        acts = [n for n, same in zip(NO_CLOCK, lam) if not same]
        if acts:
            acting.append(s)
        elif not all(loss):
            a_ok = False
        d = statistics.mean(f["test_loss"] - c["test_loss"] for c, f in pairs)
        noclock[s] = dict(acts=acts, lambda_identical=lam, loss_identical=loss, mean_difference=d)
        rows.append(f"| {s} | {'yes (' + ', '.join(map(str, acts)) + ')' if acts else 'no'} "
                    f"| {sum(lam)} of 3 | {sum(loss)} of 3 | {d:+.4f} |")  # fmt: skip
    rows += ["", "b. Where it acts: afall − actl, default budget, alternating, seeds 18-26", "",
             "| setting | afall − actl | n | n up | per seed (sign) | hyper steps afall / actl "
             "| overhead max afall / actl | final mean λ afall / actl (geometric mean) |",
             "|---|---|---:|---:|---|---|---|---|"]  # fmt: skip
    diff, b_done, over = {}, True, 0.0
    for s in acting:
        pairs = [(fair_run("actl", s, n), fair_run("afall", s, n)) for n in ALTERNATE]
        pairs = [(c, f) for c, f in pairs if c is not None and f is not None]
        if len(pairs) < len(ALTERNATE):
            b_done = False
        if len(pairs) < 2:
            rows.append(f"| {s} | {len(pairs)} seeds in | | | | | | |")
            continue
        cl, fl = [c["test_loss"] for c, _ in pairs], [f["test_loss"] for _, f in pairs]
        diff[s] = s46.paired_difference(fl, cl)
        over = max([over] + [f["budget"]["overhead"] for _, f in pairs])
        signs = "".join("+" if x > y else ("−" if x < y else "=") for x, y in zip(fl, cl))
        hs = [spread([r["hyper_steps"] for r in rs]) for rs in zip(*pairs)][::-1]
        ov = [max(r["budget"]["overhead"] for r in rs) for rs in zip(*pairs)][::-1]
        geo = [statistics.geometric_mean([final_lambda(r) for r in rs]) for rs in zip(*pairs)]
        rows.append(f"| {s} | {s45.f(diff[s])} | {len(pairs)} | {signs.count('+')} | {signs} "
                    f"| {hs[0]} / {hs[1]} | {ov[0]:.3f} / {ov[1]:.3f} "
                    f"| {geo[1]:.2g} / {geo[0]:.2g} |")  # fmt: skip
    news = diff.get("news_mlp")
    above = [s for s in diff if diff[s]["mean"] > 2 * diff[s]["se"]]
    cond = {
        "a": (a_done and a_ok and "news_mlp" in acting,
              f"acting: {', '.join(acting) or 'none'}; not acting and bit-identical: "
              f"{'yes' if a_ok else 'no'}{'' if a_done else ' (not all run)'}"),
        "b": (b_done and news is not None and news["mean"] + news["se"] < 0 and not above,
              f"news_mlp {s45.f(news) if news else '—'} (mean + s.e. < 0); above 2 s.e.: "
              f"{', '.join(above) or 'none'}{'' if b_done else ' (not all seeds in)'}"),
        "c": (b_done and bool(diff) and over <= MAX_FIT,
              f"max afall overhead {over:.3f} (≤ {MAX_FIT})"),
    }  # fmt: skip
    rows += ["", "| condition | holds | numbers |", "|---|---|---|"]
    rows += [f"| {k} | {'yes' if ok else 'no'} | {txt} |" for k, (ok, txt) in cond.items()]
    held = all(ok for ok, _ in cond.values())
    rows += ["", f"Verdict (a' is checked in the docs): {'a-c hold' if held else 'not met'}."]
    out = dict(acting=acting, no_clock=noclock, differences=diff,
               conditions={k: v[0] for k, v in cond.items()}, held=held)  # fmt: skip
    (here / "fair.md").write_text("\n".join(rows) + "\n")
    (here / "fair.json").write_text(json.dumps(out, indent=1))
    print("\n".join(rows))


if __name__ == "__main__":
    {"confirm": confirm, "fair": fair}.get(sys.argv[1] if sys.argv[1:] else "", screen)()
