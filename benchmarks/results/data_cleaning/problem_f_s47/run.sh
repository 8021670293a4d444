#!/bin/bash
# Session 47 (issue 27 item 4): SID on the benchmark's own problem. SID (defaults) minimises the
# benchmark's f (outer_objective=f, the solver's default since this session: the mean validation
# cross-entropy, which every peer minimises) with every solver setting from LearnedDataWeights'
# defaults; SID (defaults, E=drop-in's default) keeps the drop-in's own objective
# (outer_objective=drop_in: ExpectedError(q=0.5), the row "SID (defaults)" of sessions 41-46).
# Beside SRBA, SOBA, AmIGO (their best parameters), 3 seeds, 35 s, p = 0.5 / 0.7 / 0.9, one
# benchopt run per p, all methods in the same run. Run from the repository root with the
# environment of benchmarks/benchopt/setup_env.sh (PYTHON=<its python>) and the benchmark fetched
# by get_benchmark.sh beside the repository (or BENCH_BILEVEL_DIR). The load average is logged
# every minute into load.log (the machine is shared).
set -euo pipefail
export BENCH_DC_OUT=$PWD/benchmarks/results/data_cleaning/problem_f_s47
PY=${PYTHON:-python}
(while true; do echo "$(date -u +%H:%M:%S) $(uptime)"; sleep 60; done) > "$BENCH_DC_OUT/load.log" &
LOAD=$!
trap 'kill $LOAD' EXIT
nice -n 5 $PY benchmarks/bench_data_cleaning.py run --no-cache --timeout 35 --seeds 1 2 3 \
  --peers SRBA SOBA AmIGO --sid regime=drop_in regime=drop_in,outer_objective=drop_in
nice -n 5 $PY benchmarks/bench_data_cleaning.py summarise --timeout 35 --seeds 1 2 3 \
  --peers SRBA SOBA AmIGO --sid regime=drop_in regime=drop_in,outer_objective=drop_in
