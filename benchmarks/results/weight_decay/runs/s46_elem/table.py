"""Session 46, issue 28 item 3: per element (this folder's arm, run.sh) − the per-layer default,
held-out test loss paired by seed.

Per layer is s45_fastfall's ctl arm (the default rerun in session 45, the same seeds; its
budget reads the clock, so it is not bit-reproducible and is not rerun). Per element has no
budget, so this folder's elem arm must equal s45_fastfall's elem arm to the last digit (checked:
"= s45 elem"). Reads the runs with issue28_beat_table.variant (the arm's own trained method,
not the stored runs --reuse copied in) and s45_fastfall/table.py's settings.

usage (from anywhere): python table.py [ARM...]   (default: elem) → table_<ARM>.{md,json}; with
the layernone arm's runs also table_layernone.{md,json} (the budget's part and the deviations'),
with strict4's / the confirmation's runs table_screen / table_confirm.{md,json} (rule.md), and
with run.sh fresh's (seeds 9-17, both in one process) table_fresh.{md,json}
"""

import importlib.util
import json
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
S45 = here.parent / "s45_fastfall"
spec = importlib.util.spec_from_file_location("s45_table", S45 / "table.py")
s45 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s45)  # puts benchmarks/ on sys.path
from bench_weight_decay import paired_difference  # noqa: E402
from issue28_beat_table import text, variant  # noqa: E402


def rows(arm: str) -> tuple[list[str], dict]:
    lines = [
        f"| setting | seeds | per layer (s45 ctl) | per element ({arm}) | per element − per layer "
        "| seeds worse | hyper steps element / layer | = s45 elem |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    out = {}
    for s in s45.SETTINGS:
        seeds = [n for n in range(9) if variant(arm, s, n, here) is not None]
        if not seeds:
            continue
        mine = [variant(arm, s, n, here) for n in seeds]
        ctl = [variant("ctl", s, n, S45) for n in seeds]
        old = [variant("elem", s, n, S45) for n in seeds]
        a = [r["test_loss"] for r in mine]
        b = [r["test_loss"] for r in ctl]
        d = paired_difference(a, b)
        worse = sum(x > y for x, y in zip(a, b))
        steps = [sum(r["hyper_steps"] for r in rs) / len(rs) for rs in (mine, ctl)]
        same = max(abs(x - o["test_loss"]) for x, o in zip(a, old))
        out[s] = dict(seeds=seeds, element=a, layer=b, difference=d, worse=worse,
                      hyper_steps=steps, max_abs_vs_s45_elem=same)  # fmt: skip
        lines.append(
            f"| {s} | {len(seeds)} | {sum(b) / len(b):.4f} | {sum(a) / len(a):.4f} | {text(d)} "
            f"| {worse} | {steps[0]:.1f} / {steps[1]:.1f} | "
            f"{'yes' if same == 0 else f'no (max {same:.1e})'} |"
        )
    return lines, out


def budget_rows() -> tuple[list[str], dict]:
    """Where per element − per layer comes from: per layer without a budget (layernone, per
    element whose deviations never move) against ctl (the budget) and per element against it
    (the deviations; "equal" counts seeds where per element is layernone to the last digit)."""
    lines = [
        "| setting | seeds | per layer none − per layer (budget) | per element − per layer none "
        "(deviations) | seeds equal | hyper steps layer none |",
        "|---|---:|---|---|---:|---|",
    ]
    out = {}
    for s in s45.SETTINGS:
        seeds = [n for n in range(9) if variant("layernone", s, n, here) is not None]
        if not seeds:
            continue
        none = [variant("layernone", s, n, here)["test_loss"] for n in seeds]
        ctl = [variant("ctl", s, n, S45)["test_loss"] for n in seeds]
        elem = [variant("elem", s, n, here)["test_loss"] for n in seeds]
        steps = [variant("layernone", s, n, here)["hyper_steps"] for n in seeds]
        budget, dev = paired_difference(none, ctl), paired_difference(elem, none)
        equal = sum(a == b for a, b in zip(elem, none))
        out[s] = dict(seeds=seeds, layer_none=none, budget=budget, deviations=dev, equal=equal)
        lines.append(f"| {s} | {len(seeds)} | {text(budget)} | {text(dev)} | {equal} "
                     f"| {sum(steps) / len(steps):.1f} |")  # fmt: skip
    return lines, out


def diff_rows(pairs: dict[str, tuple], seeds: range) -> tuple[list[str], dict]:
    """Per setting, paired differences of the named pairs ((arm, folder, method) − (arm,
    folder, method)), each over the seeds where both runs are there ("—": none); a setting
    appears where the first pair has runs."""
    heads = " | ".join(pairs)
    lines = [f"| setting | seeds | {heads} |", "|---|---:|" + "---|" * len(pairs)]
    out = {}
    for s in s45.SETTINGS:
        cells, rec = [], {}
        for name, (a, b) in pairs.items():
            n_ok = [
                n for n in seeds if all(variant(*x[:1], s, n, *x[1:]) is not None for x in (a, b))
            ]
            if not n_ok:
                cells.append("—")
                continue
            x = [variant(a[0], s, n, a[1], a[2])["test_loss"] for n in n_ok]
            y = [variant(b[0], s, n, b[1], b[2])["test_loss"] for n in n_ok]
            d = paired_difference(x, y)
            up = sum(i > j for i, j in zip(x, y))
            rec[name] = dict(seeds=n_ok, a=x, b=y, difference=d, above=up)
            cells.append(f"{text(d)}, above 0 in {up}")
        first = rec.get(next(iter(pairs)))
        if first is not None:
            out[s] = rec
            lines.append(f"| {s} | {len(first['seeds'])} | " + " | ".join(cells) + " |")
    return lines, out


SCREEN = {  # rule.md: strict4 against per element's default and per layer, seeds 0-8
    "strict4 − elem": (("strict4", here, None), ("elem", here, None)),
    "strict4 − per layer (s45 ctl)": (("strict4", here, None), ("ctl", S45, None)),
    "elem − per layer (s45 ctl)": (("elem", here, None), ("ctl", S45, None)),
}
CONFIRM = {  # rule.md: fresh seeds 9-17, per layer and per element's default in one process
    "strict4 − elem": (("strict4c", here, None), ("confirm", here, "learned_per_element")),
    "strict4 − per layer": (("strict4c", here, None), ("confirm", here, "learned_per_layer")),
    "elem − per layer": (
        ("confirm", here, "learned_per_element"),
        ("confirm", here, "learned_per_layer"),
    ),
}


FRESH = {  # run.sh fresh: item 3 on fresh seeds 9-17, per layer in the same process
    "per element − per layer (same process)": (
        ("fresh", here, "learned_per_element"),
        ("fresh", here, "learned_per_layer"),
    ),
    "per layer without budget − per layer": (
        ("freshnone", here, None),
        ("fresh", here, "learned_per_layer"),
    ),
    "per element − per layer without budget (deviations)": (
        ("fresh", here, "learned_per_element"),
        ("freshnone", here, None),
    ),
}


def main() -> None:
    for name, pairs, seeds in (
        ("screen", SCREEN, range(9)),
        ("confirm", CONFIRM, range(9, 18)),
        ("fresh", FRESH, range(9, 18)),
    ):
        lines, data = diff_rows(pairs, seeds)
        if data:
            md = "\n".join(lines)
            (here / f"table_{name}.md").write_text(md + "\n")
            (here / f"table_{name}.json").write_text(json.dumps(data, indent=1))
            print(f"\n{name}\n{md}")
    lines, data = budget_rows()
    if data:
        md = "\n".join(lines)
        (here / "table_layernone.md").write_text(md + "\n")
        (here / "table_layernone.json").write_text(json.dumps(data, indent=1))
        print(f"\nlayernone\n{md}")
    for arm in sys.argv[1:] or ["elem"]:
        lines, data = rows(arm)
        md = "\n".join(lines)
        (here / f"table_{arm}.md").write_text(md + "\n")
        (here / f"table_{arm}.json").write_text(json.dumps(data, indent=1))
        print(f"\n{arm}\n{md}")


if __name__ == "__main__":
    main()
