"""after − before, held-out test loss per seed (paired), mean ± standard error; also against the
stored session-43 default (final_s43). Where an arm was run more than once (``after/`` and
``rep<R>_after/``), each seed's runs are averaged first.  usage: python compare.py [SETTING...]"""

import json
import statistics
import sys
from pathlib import Path

here = Path(__file__).resolve().parent


def loss(folders: list[Path], setting: str, seed: int) -> tuple[float, int] | None:
    """The mean test loss over the folders holding this seed, and how many did."""
    found = [
        json.loads(f.read_text())["settings"][setting]["runs"]["learned_per_layer"]["test_loss"]
        for folder in folders
        if (f := folder / f"{setting}_seed{seed}.json").is_file()
    ]
    return (statistics.fmean(found), len(found)) if found else None


def arm(name: str) -> list[Path]:
    return sorted([here / name, *here.glob(f"rep*_{name}")])


for setting in sys.argv[1:] or ["news_mlp", "mnist_mlp"]:
    after = arm("after")
    for base_name, base in (("before", arm("before")), ("final_s43", [here.parent / "final_s43"])):
        pairs = [
            (a, b)
            for s in range(9)
            if (a := loss(after, setting, s)) is not None and (b := loss(base, setting, s))
        ]
        if not pairs:
            continue
        d = [a[0] - b[0] for a, b in pairs]
        se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
        reps = f"{max(a[1] for a, _ in pairs)}×{max(b[1] for _, b in pairs)} runs per seed"
        print(
            f"{setting}: after − {base_name} {statistics.fmean(d):+.4f} ± {se:.4f} over {len(d)} "
            f"seeds ({sum(x > 0 for x in d)} worse; {reps}); after "
            f"{statistics.fmean(a[0] for a, _ in pairs):.4f}, {base_name} "
            f"{statistics.fmean(b[0] for _, b in pairs):.4f}; per seed "
            + " ".join(f"{x:+.4f}" for x in d)
        )
