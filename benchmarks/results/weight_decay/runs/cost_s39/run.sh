#!/usr/bin/env bash
# The default (OverheadBudget(0.5)) after its change "the first step after a hyper step pays its
# excess over the mean step": held-out test loss, 9 seeds, against ../final_s38_overhead (table.py),
# and the cost pairs in one process (cost_pairs_before.log: main before, cost_pairs_after.log).
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
for setting in digits_small mnist_mlp; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --out "benchmarks/results/weight_decay/runs/cost_s39/${setting}.json"
done
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/issue28_budget_cost_pairs.py digits_small 0 1 2 3 4 5
# (the line above was run twice: cost_pairs_after.log, cost_pairs_after_repeat2.log)
# The two networks of the matrix nearest 1.5x:
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_network_cost.py --networks Transformer MLP --repeats 2 \
  --configs plain default --threads 1 --out benchmarks/results/network_cost/runs/cost_s39/network_cost_transformer_mlp.json
