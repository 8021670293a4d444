"""Run a benchmark script's main() with both drop-ins at max_overhead=None (no clock decides).

python equal.py SRC_DIR MODULE -- ARGS...
"""

import importlib
import sys

import hypertorch_sid

src, module, *rest = sys.argv[1:]
rest = [a for a in rest if a != "--"]


def unclocked(base):
    class Patched(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("max_overhead", None)
            super().__init__(*args, **kwargs)

    Patched.__name__ = Patched.__qualname__ = base.__name__
    return Patched


hypertorch_sid.LearnedDataWeights = unclocked(hypertorch_sid.LearnedDataWeights)
hypertorch_sid.LearnedWeightDecay = unclocked(hypertorch_sid.LearnedWeightDecay)
sys.path.insert(0, src)
sys.argv = [f"{src}/{module}.py", *rest]
importlib.import_module(module).main(rest)
