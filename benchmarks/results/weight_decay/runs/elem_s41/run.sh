#!/usr/bin/env bash
# Issue 28 item 3, session 41: per element (LayerThenShrunk) under the per-layer default's budget
# (OverheadBudget(0.5), both methods) after the per-element hyper step's quantile bands were read
# from a fixed sample of 2^14 values (metrics.spread; exact bands cost ~16 ms a hyper step, charged
# to the budget), against the per-layer default rerun in the same process; 9 seeds, held-out test
# loss paired by seed, hyper steps and the budget's accounting per arm (table.py).
# usage: bash run.sh SETTING...   (profile.sh: where a budgeted hyper step's time goes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
gk='{"per_element": {"elements": "layer_then_shrunk"}}'
lk='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.OverheadBudget", "init_args": {"max_overhead": 0.5}}}'
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 15 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer learned_per_element \
    --optuna-trials 0 --threads 1 --granularity-kwargs "$gk" \
    --learned-kwargs "$lk" --out "benchmarks/results/weight_decay/runs/elem_s41/${setting}_budget.json"
done
