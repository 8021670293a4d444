#!/usr/bin/env bash
# The same as ../final_s38/run.sh (this version's defaults) but with the previous budget rule,
# max_overhead=OverheadBudget(0.5): is PlannedBudget still the better budget under TrustRprop?
# usage: bash run.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
kw='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.OverheadBudget", "init_args": {"max_overhead": 0.5}}}'
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --learned-kwargs "$kw" \
    --out "benchmarks/results/weight_decay/runs/final_s38_overhead/${setting}.json"
done
