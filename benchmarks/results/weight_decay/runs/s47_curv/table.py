"""Session 47: warm-started curvature refreshes (EstimatedCurvature(warm_start=True, tol=0.05))
against the default rerun in the same hour (ctl), paired by seed, with s45_fastfall/table.py's
table() and s46_pace/table.py's helpers (the learned runs of an arm, their budget rows).

Writes table_<arm>.{md,json} (issue28_beat_table.py's columns, − ctl) and result.{md,json} here:
the rule of rule.md (screen: warm − ctl ≤ 0 and ≤ 2 s.e. on digits_small and news_mlp; decision
on all four of digits_small, news_mlp, mnist_mlp, fashion_mlp: a. ≤ 0 on digits_small and
news_mlp, b. none above 2 s.e., c. every warm fit's final overhead ≤ 0.51), then per setting:
warm − ctl (n up), ctl / warm − grid pick, hyper steps and curvature products per fit; and
where ctlb (the default rerun again) is there, ctlb − ctl (record only).

usage (from anywhere): python table.py
"""

import importlib.util
import json
import statistics
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
    rs = s46.runs(arm, setting, here)
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


if __name__ == "__main__":
    main()
