#!/usr/bin/env bash
# The drop-in's outer objective on benchopt's data cleaning (seed 1, 35 s of CPU each, one thread):
# ExpectedError(q=0.25), the default ExpectedError(q=0.5), and the mean loss (the benchmark's f).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
for p in 0.5 0.9; do
  BENCH_DC_OUT=$here PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-../venv-benchopt/bin/python} \
    benchmarks/benchopt/probe_drop_in.py $p 35 '{"objective": {"q": 0.25}}' '{}' \
    '{"objective": "mean_loss"}' > "$here/p$p.log" 2>&1 &
done
wait
