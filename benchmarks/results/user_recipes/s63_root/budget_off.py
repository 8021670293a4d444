"""``bench_user_recipes_s62.py`` with the decay arm's budget off (``max_overhead=None``): every
due hyper step runs (16 of 16), so two versions' fits differ by their code alone, not by which
hyper steps the clock-read budget let run (9–13 of 16 under the default, from run to run).
``--apply-to weights``: the decay arm with ``apply_to="weights"`` (no tensor of < 2 dimensions
decayed: the logit scale and the biases). Other arguments go to the benchmark. Run from the
repository root with ``PYTHONPATH`` set to the version measured (session 63, helper root63)."""

import sys

sys.path.insert(0, "benchmarks")
import bench_user_recipes_s62 as bench  # noqa: E402

APPLY_TO = "all"
if "--apply-to" in sys.argv:
    at = sys.argv.index("--apply-to")
    APPLY_TO = sys.argv[at + 1]
    del sys.argv[at : at + 2]
_drop_ins = bench.Setup.drop_ins


def drop_ins(self, arm):
    if arm.startswith("decay"):
        return [bench.LearnedWeightDecay(self.own, max_overhead=None, apply_to=APPLY_TO)]
    return _drop_ins(self, arm)


bench.Setup.drop_ins = drop_ins
if __name__ == "__main__":
    bench.main()
