"""``tf_news`` (session 64's Transformer recipe) with ``apply_to="decayed_groups"``.

The decay arm of ``bench_user_recipes_s64w.py`` as the user would now write it: the recipe's
optimizer unchanged (AdamW, decay group at its own 0.01, embeddings / biases / norms in the
``weight_decay=0`` group) and ``LearnedWeightDecay(0.01, decoupled=True,
apply_to="decayed_groups")``; the round's own ``decay`` arm removed the decay from every group and
passed ``apply_to="weights"``, which decayed ``tok`` and ``pos`` (λ on ``pos`` to 296). Run from
the repository root::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/check_decayed_groups_s64.py \
        --data ../shared/data --threads 1 --recipes tf_news --arms decay --seeds 0 1 2 \
        --out benchmarks/results/user_recipes/s64_decayed_groups/records.json
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_user_recipes_s54 as s54  # noqa: E402
import bench_user_recipes_s64w as round64  # noqa: E402

from hypertorch_sid import LearnedWeightDecay  # noqa: E402


class Setup(round64.Setup):
    """The round's set-up; its decay arm keeps the optimizer's groups and their decay."""

    def drop_ins(self, arm: str) -> list:
        if not arm.startswith("decay"):
            return []
        decoupled = self.name in round64.DECOUPLED and arm == "decay"
        return [LearnedWeightDecay(self.own, decoupled=decoupled, apply_to="decayed_groups")]

    def run(self, arm: str) -> dict[str, Any]:
        """As the round's, but the decay arm's optimizer keeps its own ``weight_decay``."""
        with round64.package_logs() as logs:
            wd = self.own if arm in ("own", "decay", "decay_c") else 0.0
            cbs = self.drop_ins(arm)
            record: dict[str, Any] = {"recipe": self.name, "arm": arm, "seed": self.seed, "wd": wd}
            model = round64.timed_fit(record, lambda: self.fit(cbs, wd), 600)
        return round64.scored_record(self, record, model, logs, cbs, None, False)


bench = types.SimpleNamespace(RECIPES=["tf_news"], Setup=Setup, table=round64.table,
                              __doc__=__doc__)  # fmt: skip

if __name__ == "__main__":
    s54.run_cli(None, bench, "s64w", seeds=[0], shown=("steps",))
