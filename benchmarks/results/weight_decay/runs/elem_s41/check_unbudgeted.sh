#!/usr/bin/env bash
# Per element's default (no budget) is bit-for-bit repeatable: seed 0 of SETTING rerun on this code,
# to compare with session 39's stored run (../elem_s39/SETTING_seed0.json), which table.py uses as
# per element's default arm.   usage: bash check_unbudgeted.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
gk='{"per_element": {"elements": "layer_then_shrunk"}}'
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 15 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds 0 --methods learned_per_element --optuna-trials 0 --threads 1 \
    --granularity-kwargs "$gk" --out "benchmarks/results/weight_decay/runs/elem_s41/${setting}_nobudget.json"
done
