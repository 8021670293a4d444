#!/usr/bin/env bash
# 20 Newsgroups recipe nobody tuned, weight-decay check only, with the defaults of main at 1eefc9f (PlannedBudget(0.5), TrustRprop)
# and, in the same run, the previous default (Adam lr 0.3 on log λ: --adam-arm). Issue 28 check.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/check_20news_recipe.py \
  --checks weight_decay --adam-arm --seeds ${SEEDS:-0 1 2} \
  --out benchmarks/results/check_20news/runs/planned_trust/check_20news_seeds${TAG:-012}.json
