"""Classes pushed away from the validation's by the data weights (session 50): the watch
(``DataWeightsProblem.class_shift``, eq. classshift) and ``gauge="class"`` on two benchmarks.

``recipes``: ``bench_user_recipes_s50.py``'s recipes (e.g. ``news_bag``), per seed the arms

* ``plain`` plain training on the noisy labels (the recipe's own);
* ``dw``    ``LearnedDataWeights()`` as that script builds it (every default; under the news
            recipe's ``collate_fn`` no label is read, so neither the label checks nor the watch);
* ``dw_t``  the same with ``target=lambda batch: batch[-1]`` (the labels read: the watch on);
* ``dw_class`` ``dw_t`` with ``gauge="class"``.

``noisy``: ``bench_noisy_labels.py`` run as given after ``--``, every ``LearnedDataWeights`` it
builds watched.

Each data-weight fit prints one ``CLASSWATCH {...}`` line at its end: the per-class weighted,
unweighted and validation shares and whether the watch said anything::

    python benchmarks/bench_class_gauge_s50.py recipes --recipes news_bag --seeds 0 1
    python benchmarks/bench_class_gauge_s50.py noisy -- --datasets mnist --noise symmetric \\
        --methods plain drop_in --seeds 1 --epochs 12 --out <file>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from hypertorch_sid import LearnedDataWeights  # noqa: E402


class Watched(LearnedDataWeights):
    """The drop-in, printing its class shares and the watch's verdict at the fit's end."""

    extra: dict[str, Any] = {}
    last: dict[str, Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, **Watched.extra})

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_end(trainer, pl_module)
        shares = self.problem.class_shares()
        said = self.problem.class_shift()
        rec: dict[str, Any] = {"warned": said is not None, "gauge": self.problem.gauge}
        if shares is not None:
            rec.update({k: [round(float(v), 4) for v in t] for k, t in shares.items()})
            ratio = shares["weighted"] / shares["validation"].clamp_min(1e-12)
            rec["min_ratio"] = round(float(ratio.min()), 4)
        if said is not None:
            rec["message"] = said[:240]
        Watched.last = rec
        print("CLASSWATCH " + json.dumps(rec), flush=True)


def recipes(argv: list[str]) -> None:
    import bench_user_recipes_s50 as bench

    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--recipes", nargs="+", default=["news_bag"])
    p.add_argument("--arms", nargs="+", default=["plain", "dw", "dw_t", "dw_class"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    bench.LearnedDataWeights = Watched
    out: list[dict[str, Any]] = []
    for name in args.recipes:
        for seed in args.seeds:
            setup = bench.Setup(name, args.data, seed)
            for arm in args.arms:
                Watched.extra = {
                    "dw": {},
                    "dw_t": {"target": lambda b: b[-1]},
                    "dw_class": {"target": lambda b: b[-1], "gauge": "class"},
                }.get(arm, {})
                Watched.last = None
                rec = setup.run("plain" if arm == "plain" else "dw")
                rec.update(arm=arm, watch=Watched.last)
                rec.pop("warnings", None)
                print(json.dumps(rec), flush=True)
                out.append(rec)
                if args.out is not None:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(
                        json.dumps({"command": " ".join(["python", *sys.argv]), "records": out})
                    )


def noisy(argv: list[str]) -> None:
    import bench_noisy_labels as bench

    bench.LearnedDataWeights = Watched
    bench.main(argv)


if __name__ == "__main__":
    mode, rest = sys.argv[1], [a for a in sys.argv[2:] if a != "--"]
    {"recipes": recipes, "noisy": noisy}[mode](rest)
