"""Session 47: warm-started curvature refreshes (EstimatedCurvature(warm_start=True, tol=0.05))
against the default rerun in the same hour (ctl), paired by seed, with s45_fastfall/table.py's
table() and s46_pace/table.py's helpers (the learned runs of an arm, their budget rows).

Writes table_<arm>.{md,json} (issue28_beat_table.py's columns, − ctl) and result.{md,json} here:
the rule of rule.md (screen: warm − ctl ≤ 0 and ≤ 2 s.e. on digits_small and news_mlp; decision
on all four of digits_small, news_mlp, mnist_mlp, fashion_mlp: a. ≤ 0 on digits_small and
news_mlp, b. none above 2 s.e., c. every warm fit's final overhead ≤ 0.51), then per setting:
warm − ctl (n up), ctl / warm − grid pick, hyper steps and curvature products per fit; and
where ctlb (the default rerun again) is there, ctlb − ctl (record only).

The confirmation on fresh seeds 9-17 (rule.md, its last section): `python table.py confirm`
pairs fctl / fwarm by seed and writes confirm.{md,json}: per setting fwarm − fctl (n up), hyper
steps, curvature products, the budget's final overhead and the divergence recoveries (`retries`)
per fit, and the rule's verdict with each condition's numbers.

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
ARM, CONTROL = "warm", "ctl"
SCREEN = ["digits_small", "news_mlp"]
DECISION = [*SCREEN, "mnist_mlp", "fashion_mlp"]
RECORD = ["digits_mlp", "mnist_cnn", "fashion_cnn"]  # run after the screen, in no rule
MAX_FIT = 0.51


def have(arm: str, setting: str) -> bool:
    return len(list(here.glob(f"weight_decay_{arm}_{setting}_*_seed[0-9].json"))) == 9


def mechanism(arm: str, setting: str) -> dict:
    """Per fit: hyper steps run, curvature products, the budget's final overhead."""
    return mechanism_of(s46.runs(arm, setting, here))


def mechanism_of(rs: list[dict]) -> dict:
    return dict(hyper_steps=[r["hyper_steps"] for r in rs],
                curvature_products=[r["sid_cost"]["curvature_products"] for r in rs],
                overhead=[r["budget"]["overhead"] for r in rs])  # fmt: skip


def spread(xs: list) -> str:
    return f"{statistics.mean(xs):.1f} [{min(xs)}, {max(xs)}]"


def main_job_rows() -> dict:
    """Record only: main_job.py's runs (main_job_{ctl,warm}[_repeat].json), paired by the
    callback's seed and run: test loss of the final weights and hyper steps run."""
    rows, data = [], {}
    for tag in ("", "_repeat"):
        files = {a: here / f"main_job_{a}{tag}.json" for a in (CONTROL, ARM)}
        if not all(p.is_file() for p in files.values()):
            continue
        runs = {a: json.loads(p.read_text())["runs"] for a, p in files.items()}
        loss = {a: [r["test_loss"] for r in runs[a]] for a in runs}
        steps = {a: [len(r["hyper_steps"]) for r in runs[a]] for a in runs}
        d = s46.paired_difference(loss[ARM], loss[CONTROL])
        up = sum(w > c for w, c in zip(loss[ARM], loss[CONTROL]))
        data[tag or "first"] = dict(difference=d, test_loss=loss, hyper_steps=steps)
        rows.append(
            f"| {tag.strip('_') or 'first'} | {len(loss[ARM])} | {s45.f(d)} | {up} "
            f"| {statistics.median(loss[ARM]):.4f} / {statistics.median(loss[CONTROL]):.4f} "
            f"| {spread(steps[ARM])} / {spread(steps[CONTROL])} |"
        )
    if rows:
        rows = ["", "The main job (main_job.py, record only; final weights, paired by the "
                "callback's seed and run):", "",
                "| round | runs | warm − ctl | n up | median test loss warm / ctl "
                "| hyper steps warm / ctl |", "|---|---:|---|---:|---|---|", *rows]  # fmt: skip
    return dict(rows=rows, data=data)


def main() -> None:
    ran = [s for s in DECISION + RECORD if have(ARM, s) and have(CONTROL, s)]
    settings = [s for s in ran if s in DECISION]
    data = {}
    for a, ctl in ((CONTROL, None), (ARM, CONTROL)):
        md, data[a] = s45.table(a, ran, None, here, s45.DEPLOYMENTS, ctl)
        (here / f"table_{a}.md").write_text(md + "\n")
        (here / f"table_{a}.json").write_text(json.dumps(data[a], indent=1))
    d, c = data[ARM], data[CONTROL]
    diff = {s: d[s]["control"]["difference"] for s in ran}
    mech = {a: {s: mechanism(a, s) for s in ran} for a in (CONTROL, ARM)}
    above_2se = [s for s in settings if diff[s]["mean"] > 2 * diff[s]["se"]]
    screened = [s for s in SCREEN if s in settings]
    screen = (
        len(screened) == 2
        and all(diff[s]["mean"] <= 0 for s in SCREEN)
        and not [s for s in SCREEN if s in above_2se]
    )
    over_ok = all(max(mech[ARM][s]["overhead"]) <= MAX_FIT for s in settings)
    full = settings == DECISION
    held = full and all(diff[s]["mean"] <= 0 for s in SCREEN) and not above_2se and over_ok
    decided = full or (len(screened) == 2 and not screen)
    word = "holds" if held else "not met" if decided else "screen only"
    rows = [
        f"| settings run | screen (digits_small, news_mlp) | above 2 s.e. | overhead ≤ {MAX_FIT} "
        "(every warm fit) | rule |",
        "|---|---|---|---|---|",
        f"| {', '.join(settings)} | {'passed' if screen else 'failed'} "
        f"| {', '.join(above_2se) or 'none'} | {'yes' if over_ok else 'no'} | {word} |",
        "",
        "Per setting, seeds 0-8 paired by seed (mean ± s.e.; n up: seeds where warm's test loss "
        "is above ctl's); hyper steps, curvature products and the budget's final overhead per "
        "fit: mean [min, max] over the 9 fits, warm / ctl:",
        "",
        "| setting | warm − ctl | n up | ctl − grid pick | warm − grid pick | hyper steps "
        "warm / ctl | curvature products warm / ctl | overhead warm / ctl |",
        "|---|---|---:|---|---|---|---|---|",
    ]
    for s in ran:
        up = sum(a > b for a, b in zip(d[s]["test_loss"], d[s]["control"]["test_loss"]))
        m = {a: mech[a][s] for a in (ARM, CONTROL)}
        name = f"{s} (record only)" if s in RECORD else s
        rows.append(
            f"| {name} | {s45.f(diff[s])} | {up} of 9 | {s45.f(c[s]['differences']['grid pick'])} "
            f"| {s45.f(d[s]['differences']['grid pick'])} "
            f"| {spread(m[ARM]['hyper_steps'])} / {spread(m[CONTROL]['hyper_steps'])} "
            f"| {spread(m[ARM]['curvature_products'])} / "
            f"{spread(m[CONTROL]['curvature_products'])} "
            f"| {max(m[ARM]['overhead']):.3f} / {max(m[CONTROL]['overhead']):.3f} (max) |"
        )
    reruns = {}  # record only (rule.md, "After the screen"): how far ctl's rerun moves
    for s in settings:
        if have("ctlb", s):
            arms = ("ctlb", CONTROL, ARM)
            loss = {a: [r["test_loss"] for r in s46.runs(a, s, here)] for a in arms}
            pd = s46.paired_difference
            reruns[s] = dict(
                ctlb_minus_ctl=pd(loss["ctlb"], loss[CONTROL]),
                warm_minus_ctlb=pd(loss[ARM], loss["ctlb"]),
            )
    if reruns:
        head = "| setting | ctlb − ctl | warm − ctl | warm − ctlb |"
        rows += ["", "The default rerun (ctlb, the same code again), paired by seed:", "",
                 head, "|---|---|---|---|"]  # fmt: skip
        rows += [f"| {s} | {s45.f(x['ctlb_minus_ctl'])} | {s45.f(diff[s])} "
                 f"| {s45.f(x['warm_minus_ctlb'])} |" for s, x in reruns.items()]  # fmt: skip
    main_job = main_job_rows()
    rows += main_job["rows"]
    record = [s for s in ran if s in RECORD]
    rule = dict(settings=settings, record_only=record, screen_passed=screen, above_2se=above_2se,
                overhead_ok=over_ok, held=held, differences=diff, mechanism=mech,
                reruns=reruns, main_job=main_job["data"])  # fmt: skip
    (here / "result.md").write_text("\n".join(rows) + "\n")
    (here / "result.json").write_text(json.dumps(rule, indent=1))
    print("\n".join(rows))


FRESH = range(9, 18)  # the confirmation's seeds (rule.md, "Confirmation on fresh seeds 9-17")
CONFIRM = ["news_mlp", "digits_small", "mnist_cnn", "fashion_cnn", "mnist_mlp", "fashion_mlp",
           "digits_mlp"]  # fmt: skip
FCTL, FWARM = "fctl", "fwarm"


def fresh_runs(arm: str, setting: str) -> list[dict] | None:
    """The arm's learned runs of seeds 9-17 (None unless all nine are there)."""
    rs = [s46.variant(arm, setting, n, here) for n in FRESH]
    return None if any(r is None for r in rs) else rs


def confirm() -> None:
    """The confirmation rule (rule.md): a. mean over the 7 settings of fwarm − fctl < 0; b. none
    above 2 s.e.; c. news_mlp ≤ +1 s.e.; d. every fwarm fit's final overhead ≤ 0.51; e. fwarm's
    recoveries summed ≤ fctl's + 5; all 7 settings run, else no decision."""
    runs = {a: {s: fresh_runs(a, s) for s in CONFIRM} for a in (FCTL, FWARM)}
    ran = [s for s in CONFIRM if runs[FCTL][s] and runs[FWARM][s]]
    loss = {a: {s: [r["test_loss"] for r in runs[a][s]] for s in ran} for a in runs}
    diff = {s: s46.paired_difference(loss[FWARM][s], loss[FCTL][s]) for s in ran}
    mech = {
        a: {s: dict(mechanism_of(runs[a][s]), retries=[r["retries"] for r in runs[a][s]])
            for s in ran}
        for a in runs
    }  # fmt: skip
    full = ran == CONFIRM
    mean = statistics.mean(diff[s]["mean"] for s in ran) if ran else float("nan")
    above_2se = [s for s in ran if diff[s]["mean"] > 2 * diff[s]["se"]]
    news = diff.get("news_mlp")
    over = max((max(mech[FWARM][s]["overhead"]) for s in ran), default=float("nan"))
    rec = {a: sum(sum(mech[a][s]["retries"]) for s in ran) for a in runs}
    conditions = {
        "a": (mean < 0, f"mean over {len(ran)} settings of fwarm − fctl = {mean:+.4f} (< 0)"),
        "b": (not above_2se, f"above 2 s.e.: {', '.join(above_2se) or 'none'}"),
        "c": (news is not None and news["mean"] <= news["se"],
              f"news_mlp fwarm − fctl = {s45.f(news)} (≤ +1 s.e.)" if news else "news_mlp not run"),
        "d": (over <= MAX_FIT, f"max fwarm overhead = {over:.3f} (≤ {MAX_FIT})"),
        "e": (rec[FWARM] <= rec[FCTL] + 5,
              f"recoveries fwarm {rec[FWARM]} vs fctl {rec[FCTL]} (≤ fctl + 5)"),
    }  # fmt: skip
    held = full and all(ok for ok, _ in conditions.values())
    word = "holds" if held else "not met" if full else "no decision (not all 7 settings run)"
    rows = [
        f"Settings run: {', '.join(ran) or 'none'}; rule: **{word}**.", "",
        "| condition | holds | numbers |", "|---|---|---|",
        *[f"| {k} | {'yes' if ok else 'no'} | {text} |" for k, (ok, text) in conditions.items()],
        "",
        "Per setting, seeds 9-17 paired by seed (mean ± s.e.; n up: seeds where fwarm's test loss "
        "is above fctl's); per fit: hyper steps and curvature products mean [min, max], the "
        "budget's final overhead (max) and divergence recoveries (sum over the 9 fits), "
        "fwarm / fctl:", "",
        "| setting | fwarm − fctl | n up | hyper steps | curvature products | overhead (max) "
        "| recoveries |",
        "|---|---|---:|---|---|---|---|",
    ]  # fmt: skip
    for s in ran:
        m = {a: mech[a][s] for a in runs}
        up = sum(w > c for w, c in zip(loss[FWARM][s], loss[FCTL][s]))
        rows.append(
            f"| {s} | {s45.f(diff[s])} | {up} of 9 "
            f"| {spread(m[FWARM]['hyper_steps'])} / {spread(m[FCTL]['hyper_steps'])} "
            f"| {spread(m[FWARM]['curvature_products'])} / "
            f"{spread(m[FCTL]['curvature_products'])} "
            f"| {max(m[FWARM]['overhead']):.3f} / {max(m[FCTL]['overhead']):.3f} "
            f"| {sum(m[FWARM]['retries'])} / {sum(m[FCTL]['retries'])} |"
        )
    result = dict(settings=ran, held=held, decided=full, mean_difference=mean,
                  conditions={k: ok for k, (ok, _) in conditions.items()}, differences=diff,
                  test_loss=loss, mechanism=mech, recoveries=rec)  # fmt: skip
    (here / "confirm.md").write_text("\n".join(rows) + "\n")
    (here / "confirm.json").write_text(json.dumps(result, indent=1))
    print("\n".join(rows))


if __name__ == "__main__":
    confirm() if sys.argv[1:] == ["confirm"] else main()
