#!/usr/bin/env bash
# Session 41: invariant="held" became LearnedWeightDecay's default (a Linear -> LayerNorm/GroupNorm layer's
# λ ran away under "implicit"). Does it change the benchmark's CNN settings? Per seed, back to back: the new
# default (no kwargs) and the old one (invariant="implicit"), both under the default budget; held-out test loss
# paired by seed (table.py). usage: bash run.sh SETTING...   (SEEDS to override 0-8)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
for setting in "$@"; do
  for seed in ${SEEDS:-0 1 2 3 4 5 6 7 8}; do
    for arm in held implicit; do
      kw='{}'; [ "$arm" = implicit ] && kw='{"invariant": "implicit"}'
      PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
        --settings "$setting" --seeds "$seed" --methods learned_per_layer --optuna-trials 0 \
        --threads 1 --learned-kwargs "$kw" \
        --out "benchmarks/results/weight_decay/runs/held_default_s41/${setting}_${arm}.json"
    done
  done
done
