#!/bin/sh
# Issue 27: the imbalanced-classes example under the default outer objective ExpectedError(q=0.5)
# (per_class, drop_in) against objective="mean_loss" (per_class_mean_loss, drop_in_mean_loss), one process.
cd "$(dirname "$0")/../../../../.." && OMP_NUM_THREADS=1 python benchmarks/bench_noisy_labels.py \
  --noise --imbalance --epochs 12 --seeds 0 1 2 3 4 5 6 7 8 9 --lr 0.02 --clip 0 \
  --imbalance-methods plain inverse_freq per_class per_class_mean_loss drop_in drop_in_mean_loss \
  --out benchmarks/results/noisy_labels/runs/imbalance_q05/imbalance.json
