#!/usr/bin/env bash
# Session 43: the default (LearnedWeightDecay(1e-4), every default) retrained with today's code
# on the seven settings, 9 seeds, to check the deployment table still holds (nothing but the
# code changed since final_s38_overhead: invariant="held" (s41), the 16-sample probe (s42)). Session 43 ran fashion_cnn with CODE=a checkout of main
# at 24e0c3b (the others from the lead's worktree at the same code).
# usage: [CODE=<checkout>] [OUT=<folder>] bash run.sh SETTING...   then: bash ../final_s38/table.sh final_s43 final_s43
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
code=${CODE:-$(cd "$here/../../../../.." && pwd)}
cd "$code"
for setting in "$@"; do
  PYTHONPATH=$code OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer --optuna-trials 0 \
    --threads 1 --out "${OUT:-$here}/${setting}.json"
done
