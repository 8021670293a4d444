#!/usr/bin/env bash
# Obtain the peers' benchmark at the pinned commit, outside our repository, and prepare it to run
# offline. Their code is never committed here.
#   bash benchmarks/benchopt/get_benchmark.sh [DEST]     (default: benchmark_bilevel beside the repository)
# Source: https://github.com/benchopt/benchmark_bilevel, commit below (2025-05-22, "ENH improve
# benchmark documentation (#40)"). Set BENCH_SRC to a local git clone/mirror when offline.
set -euo pipefail
COMMIT=3ad65dccff5cce27a656630a4f98be52920850b4
DEST=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/benchmark_bilevel}
SRC=${BENCH_SRC:-https://github.com/benchopt/benchmark_bilevel}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$DEST/.git" ]; then
  git clone -q "$SRC" "$DEST"
fi
git -C "$DEST" checkout -q "$COMMIT"
git -C "$DEST" checkout -q -- .   # undo an earlier patch before re-applying it
# The one change to their code: every solver's epoch blocks on its results before benchopt's
# callback stops the clock (JAX dispatches asynchronously, so otherwise the epoch's work is timed
# as evaluation). Wrapping self.one_epoch where the base class builds it covers the solvers that
# override run() (SABA, SRBA, VRBO) as well as those that inherit it.
python3 - "$DEST/benchmark_utils/stochastic_jax_solver.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """        self.one_epoch = self.get_one_epoch_jitted(
            inner_sampler, outer_sampler
        )
"""
new = old + """        _epoch = self.one_epoch  # timing patch: wait for the epoch's results
        self.one_epoch = lambda *args: jax.block_until_ready(_epoch(*args))
"""
assert s.count(old) == 1, "upstream changed: review the timing patch"
open(p, "w").write(s.replace(old, new))
PY
# Our solver (SID through hypertorch_sid) next to theirs, so one benchopt run holds all methods.
cp "$HERE/solvers/sid.py" "$DEST/solvers/sid.py"
# The seed paper's problem (MNIST odd/even, one L2 coefficient per pixel) as one of its datasets;
# its data file: python benchmarks/benchopt/make_mnist_oddeven.py --out "$DEST/mnist_oddeven.npz"
cp "$HERE/datasets/mnist_oddeven.py" "$DEST/datasets/mnist_oddeven.py"
echo "benchmark_bilevel at $(git -C "$DEST" rev-parse HEAD) in $DEST (patched: epochs block_until_ready; + solvers/sid.py, datasets/mnist_oddeven.py)"
