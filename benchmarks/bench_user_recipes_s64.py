"""Session 64: what ``LearnedDataWeights(no_signal=...)`` does to the deployed model.

Session 63 warned at a fit's end where the learned per-sample weights carried no more signal
than a random walk (eq. drift); on those recipes (a VAE's outlier images, the generalized cross
entropy, a weak char-CNN) the deployed model was worse than plain training's. Here the remedy
objects of :mod:`hypertorch_sid.lightning.no_signal` act during the fit instead, paired by seed
against today's default on session 63's recipes (``bench_user_recipes_s63.py``: ``vae_mnist``
with ``objective="mean_loss"``, ``gce_fmnist``, ``char_cnn``, ``sam_fmnist``, ``supcon``,
``rdrop``, ``stoch_depth``) and session 50's ``ckpt_cnn`` (``bench_user_recipes_s50.py``:
EarlyStopping + ModelCheckpoint, the best checkpoint deployed). Arms, all on the noisy data:

* ``plain``   the recipe, no drop-in;
* ``dw``      ``LearnedDataWeights()`` (today's default, ``no_signal=WarnAtEnd()``);
* ``reset``   ``LearnedDataWeights(no_signal=ResetWeights(after=--after))``;
* ``shrink``  ``LearnedDataWeights(no_signal=ShrinkWeights(keep=--keep, after=--after))``.

Each record adds ``settled`` (where the policy acted: the optimizer step and eq. drift's
reading, else None) and ``reading`` (``weight_signal()`` at the fit's end).

Usage (from the repository root)::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s64.py \\
        --data ../shared/data --recipes gce_fmnist --arms plain reset --seeds 0 1 2 3 4 5
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_user_recipes_s50 as s50  # noqa: E402
import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s63 as s63  # noqa: E402

from hypertorch_sid import LearnedDataWeights  # noqa: E402
from hypertorch_sid.lightning.no_signal import (  # noqa: E402
    NoSignalPolicy,
    ResetWeights,
    ShrinkWeights,
    WarnAtEnd,
)

RECIPES = (*s63.RECIPES, "ckpt_cnn")
ARMS = ("plain", "dw", "reset", "shrink")
POLICY: dict[str, NoSignalPolicy | None] = {"plain": None, "dw": WarnAtEnd()}
_made: list[LearnedDataWeights] = []  # the fit's drop-in, to read settled() after it


class _Kept(LearnedDataWeights):
    """``LearnedDataWeights``, kept in ``_made`` for its record (nothing else changes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _made.append(self)


class Recipe63(s63.Setup):
    """A session-63 recipe whose data-weights arm takes ``self.policy``."""

    policy: NoSignalPolicy | None = None

    def drop_ins(self, arm: str) -> list:
        if arm == "plain":
            return []
        objective = {"objective": "mean_loss"} if self.name == "vae_mnist" else {}
        return [_Kept(no_signal=self.policy, **objective)]


class Setup:
    """One recipe and seed, run in ``ARMS``."""

    def __init__(self, name: str, data: Path, seed: int) -> None:
        self.name, self.arms = name, ARMS
        self.inner = (
            s50.Setup(name, data, seed) if name == "ckpt_cnn" else Recipe63(name, data, seed)
        )

    def run(self, arm: str) -> dict[str, Any]:
        policy = POLICY[arm]
        _made.clear()
        if self.name == "ckpt_cnn":
            s50.DW_KWARGS.clear()
            s50.LearnedDataWeights = _Kept
            if policy is not None:
                s50.DW_KWARGS["no_signal"] = policy
            record = self.inner.run("plain" if policy is None else "dw")
        else:
            self.inner.policy = policy
            inner_arm = (
                "plain" if policy is None else "dw_mean" if self.name == "vae_mnist" else "dw"
            )
            record = self.inner.run(inner_arm)
        record["arm"], record["policy"] = arm, repr(policy)
        if _made:
            cb = _made[-1]
            reading = cb.weight_signal()
            record["settled"] = cb.settled()
            record["reading"] = None if reading is None else dataclasses.asdict(reading)
        return record


def table(records: list[dict[str, Any]]) -> str:
    """Paired by seed: each arm's test loss less ``dw``'s, and where the policy acted."""
    by = {(r["recipe"], r["seed"], r["arm"]): r for r in records}
    lines = ["| recipe | seed | plain | dw | reset − dw | shrink − dw | settled (reset) |"]
    lines.append("|---|---|---|---|---|---|---|")
    for recipe, seed in sorted({(r["recipe"], r["seed"]) for r in records}):
        cell = {a: by.get((recipe, seed, a), {}).get("test_loss") for a in ARMS}
        dw = cell["dw"]

        rel = {
            a: "" if cell[a] is None or dw is None else f"{cell[a] - dw:+.4f}"
            for a in ("reset", "shrink")
        }
        settled = by.get((recipe, seed, "reset"), {}).get("settled")
        at = "" if not settled else f"step {int(settled['step'])}"
        fmt = [f"{cell[a]:.4f}" if cell[a] is not None else "" for a in ("plain", "dw")]
        lines.append(
            f"| {recipe} | {seed} | {' | '.join(fmt)} | {rel['reset']} | {rel['shrink']} | {at} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--after", type=float, default=0.5)
    parser.add_argument("--keep", type=float, default=0.5)
    known, rest = parser.parse_known_args(argv)
    POLICY["reset"] = ResetWeights(after=known.after)
    POLICY["shrink"] = ShrinkWeights(keep=known.keep, after=known.after)
    s54.run_cli(rest, sys.modules[__name__], "s64", seeds=[0, 1, 2], shown=("settled", "test_acc"))


if __name__ == "__main__":
    main()
