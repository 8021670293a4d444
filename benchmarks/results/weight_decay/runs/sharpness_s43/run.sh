#!/usr/bin/env bash
# Session 43: Recover's doubling of L kept as `sharpness` (constants.py, eq. sharpness) against
# today's default (../final_s43), the default's every other setting; 9 seeds per setting.
# usage: CODE=<checkout with the change> bash run.sh SETTING...   (results into this folder)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
code=${CODE:-$(cd "$here/../../../../.." && pwd)}
cd "$code"
for setting in "$@"; do
  PYTHONPATH=$code OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --out "$here/${setting}.json"
done
