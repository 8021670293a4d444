#!/usr/bin/env bash
# Issue 28 item 3: per element as LayerThenShrunk (λ_layer stepped as the per-layer default, TrustRprop; deviations
# shrunk, eq. shrink; per element's own budget: none) against the per-layer default (TrustRprop, OverheadBudget(0.5))
# rerun in the same process (CNNs: METHODS=learned_per_element, per layer from ../final_s38_overhead), 9 seeds,
# held-out test loss paired by seed. usage: [METHODS=...] bash run.sh SETTING...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
gk='{"per_element": {"elements": "layer_then_shrunk"}}'
lk='{}'; tag=''
if [ -n "${BUDGET:-}" ]; then
  lk='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.OverheadBudget", "init_args": {"max_overhead": 0.5}}}'
  tag=_budget
fi
lk=${LK:-$lk}; tag=${TAG:-$tag}  # e.g. per layer without a budget: LK='{"max_overhead": null}' TAG=_layernone
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods ${METHODS:-learned_per_layer learned_per_element} \
    --optuna-trials 0 --threads 1 --granularity-kwargs "$gk" \
    --learned-kwargs "$lk" --out "benchmarks/results/weight_decay/runs/elem_s39/${setting}${tag}.json"
done
# the budget arm (per element under per layer's OverheadBudget(0.5)): BUDGET=1 METHODS=learned_per_element bash run.sh S
