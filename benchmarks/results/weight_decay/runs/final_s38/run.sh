#!/usr/bin/env bash
# Issue 28: the drop-in with this version's defaults (TrustRprop outer step, PlannedBudget(0.5), the callback's
# per-step work charged), 9 seeds per setting, learned per layer only; summarised against the stored no-WD, grid and
# Optuna runs by the deployment summary (command in the summary JSON). usage: bash run.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --out "benchmarks/results/weight_decay/runs/final_s38/${setting}.json"
done
