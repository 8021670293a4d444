"""The no-signal warning's reading (eq. drift, lightning/weight_signal.py) on fits where it was
said although the weights separated (hinge, trusted seed 2) and on fits where it was not
(bootstrap, ordinal): per row zᵢ² = Sᵢ²/Qᵢ at the fit's end, its median for the corrupted and
the clean rows, and the share of rows above 3.84 (a χ²₁ variable's 95 % point: 5 % for rows
that random-walk)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import bench_user_recipes_s64d as b  # noqa: E402

FITS = (("hinge", 0), ("hinge", 1), ("trusted", 2), ("bootstrap", 0), ("ordinal", 0))


def main() -> None:
    torch.set_num_threads(1)
    for name, seed in FITS:
        s = b.Setup(name, Path("../shared/data"), seed)
        train, bad = s.corrupted()
        cbs = s.drop_ins("dw")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.fit(cbs, train, bad, True, s.own, {"arm": "dw"})
        sig = cbs[0]._signal
        z2 = (sig._sum.square() / sig._squares.clamp_min(1e-30)).float().cpu()
        r = cbs[0].weight_signal()
        print(
            f"{name} seed {seed}: R {r.drift:.2f}, median {r.median:.2f} (said: "
            f"{not r.separates}); z² median corrupted {float(z2[bad].median()):.2f}, clean "
            f"{float(z2[~bad].median()):.2f}; share above 3.84: all "
            f"{float((z2 > 3.84).float().mean()):.2f}, corrupted "
            f"{float((z2[bad] > 3.84).float().mean()):.2f}, clean "
            f"{float((z2[~bad] > 3.84).float().mean()):.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
