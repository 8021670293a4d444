#!/usr/bin/env bash
# Session 62: the main job's recipe (digits_small) over a finer λ grid, seeds 0 1 3 4 8
# (1 3 8: the seeds where the learned λ fell below λ₀ in session 61). From the repository root:
#   bash benchmarks/results/weight_decay/runs/s62_fine_grid/run.sh
set -euo pipefail
here=benchmarks/results/weight_decay/runs/s62_fine_grid
OMP_NUM_THREADS=1 python benchmarks/bench_weight_decay.py --settings digits_small \
  --seeds 0 1 3 4 8 --methods grid --optuna-trials 0 \
  --grid 1e-5 3e-5 1e-4 3e-4 1e-3 2.5e-3 6e-3 1.6e-2 --threads 1 --out "$here/g.json"
