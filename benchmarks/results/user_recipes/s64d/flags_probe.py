"""flagged() on session 64's hinge and trusted recipes: the split's rows and its contradicted
rows (split_misfit) against the corrupted labels, and how many of the split's rows the trained
network predicts as another class than their (noisy) label, by arg-max (what "loss above
log 2" stands for under a cross entropy). Seeds 0-2, the dw arm as the benchmark fits it."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench_user_recipes_s64d as b  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    for name in ("hinge", "trusted"):
        for seed in (0, 1, 2):
            s = b.Setup(name, Path("../shared/data"), seed)
            train, bad = s.corrupted()
            cbs = s.drop_ins("dw")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = s.fit(cbs, train, bad, True, s.own, {"arm": "dw"})
                split, misfit = cbs[0].flagged("split"), cbs[0].flagged("split_misfit")
            x, y = (train.tensors if hasattr(train, "tensors") else
                    [torch.cat(t) for t in zip(*(d.tensors for d in train.datasets))])  # fmt: skip
            model.eval()
            with torch.no_grad():
                wrong = model(x).argmax(1) != y
            kept = torch.ones(len(y), dtype=torch.bool)
            kept[split] = False
            print(
                f"{name} seed {seed}: split {len(split)} P {float(bad[split].float().mean()):.2f} "
                f"R {float(bad[split].sum() / bad.sum()):.2f}; split_misfit {len(misfit)} P "
                f"{float(bad[misfit].float().mean()) if len(misfit) else float('nan'):.2f} R "
                f"{float(bad[misfit].sum() / bad.sum()):.2f}; arg-max ≠ label: split "
                f"{float(wrong[split].float().mean()):.2f}, "
                f"kept {float(wrong[kept].float().mean()):.2f}; "
                f"wrong labels fitted (arg-max = label) {float((~wrong[bad]).float().mean()):.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
