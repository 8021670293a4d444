#!/usr/bin/env bash
# Issue 27: KeptEvidenceError (objective="kept_evidence": q* = the largest q <= 0.5 keeping
# ESS >= |V|/2) against the default ExpectedError(q=0.5) and the mean loss (the benchmark's f) on
# benchopt's data cleaning, seed 1, 35 s of CPU each, one thread; then the q* of every validation
# batch in a 10 s run (q_p<p>.json; its probe output goes to a scratch folder). Table: python table.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
PY=${PYTHON:-../venv-benchopt/bin/python}
for p in 0.9 0.7 0.5; do
  BENCH_DC_OUT=$here PYTHONPATH=$PWD OMP_NUM_THREADS=1 $PY benchmarks/benchopt/probe_drop_in.py $p 35 \
    '{"objective": "kept_evidence"}' '{}' '{"objective": "mean_loss"}' > "$here/p$p.log" 2>&1
done
scratch=$(mktemp -d)
for p in 0.9 0.5; do
  BENCH_DC_OUT=$scratch PYTHONPATH=$PWD OMP_NUM_THREADS=1 $PY "$here/qtrace.py" "$here/q_p$p.json" $p 10 > /dev/null 2>&1
done
