#!/usr/bin/env bash
# Session 46, issue 28 item 4, a diagnostic: on the Fashion-MNIST CNN the grid's pick is most
# often its largest value (2.5e-3); does the default start there do better than at the user's
# 1e-4? (the scale-invariant groups are held at the start value: invariant="held").
# Learned per layer only, seeds 0-8; grid and no decay reused from the stored runs.
# usage (from anywhere): [PYTHON=python] bash run.sh; then python compare.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
R=benchmarks/results/weight_decay/runs
for pair in "rerun:0 1 2" "heldout:3 4 5" "heldout2:6 7 8"; do
  base=${pair%%:*}; seeds=${pair#*:}
  # shellcheck disable=SC2086  # $seeds: one word per seed
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings fashion_cnn --seeds $seeds --methods learned_per_layer --optuna-trials 0 \
    --learned-init 2.5e-3 --threads 1 --reuse "$R/weight_decay_${base}_seed{seed}.json" \
    --out "$here/init2.5e-3_fashion_cnn_${base}.json"
done
rm -f "$here"/init2.5e-3_fashion_cnn_*.png
