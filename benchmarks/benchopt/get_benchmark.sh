#!/usr/bin/env bash
# Obtain the peers' benchmark at the pinned commit, outside our repository, and prepare it to run
# offline. Their code is never committed here.
#   bash benchmarks/benchopt/get_benchmark.sh [DEST]     (default /work/benchmark_bilevel)
# Source: https://github.com/benchopt/benchmark_bilevel, commit below (2025-05-22, "ENH improve
# benchmark documentation (#40)"). Set BENCH_SRC to a local git clone/mirror when offline.
set -euo pipefail
COMMIT=3ad65dccff5cce27a656630a4f98be52920850b4
DEST=${1:-/work/benchmark_bilevel}
SRC=${BENCH_SRC:-https://github.com/benchopt/benchmark_bilevel}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$DEST/.git" ]; then
  git clone -q "$SRC" "$DEST"
fi
git -C "$DEST" checkout -q "$COMMIT"
git -C "$DEST" checkout -q -- .   # undo an earlier patch before re-applying it
# The one change to their code: block on the epoch's results before benchopt's callback stops the
# clock (JAX dispatches asynchronously, so otherwise the epoch's work is timed as evaluation).
python3 - "$DEST/benchmark_utils/stochastic_jax_solver.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = "carry = self.one_epoch(carry, self.eval_freq)\n"
new = "carry = jax.block_until_ready(self.one_epoch(carry, self.eval_freq))\n"
assert s.count(old) == 1, "upstream changed: review the timing patch"
open(p, "w").write(s.replace(old, new))
PY
# Our solver (SID through hypertorch_sid) next to theirs, so one benchopt run holds all methods.
cp "$HERE/solvers/sid.py" "$DEST/solvers/sid.py"
echo "benchmark_bilevel at $(git -C "$DEST" rev-parse HEAD) in $DEST (patched: block_until_ready; + solvers/sid.py)"
