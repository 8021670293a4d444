#!/usr/bin/env bash
# Session 44 (mainjob44): the curvature estimate's L, λ_min over the union of its batches' spectra
# (per-minibatch Lanczos on diag(H_1, …, H_B)) instead of their mean's. Before (CODE=<a checkout of
# the branch's base, aabbe5a>) and after, back to back, one job at a time, OMP_NUM_THREADS=1:
#   the main job's spread (benchmarks/main_job_spread.py: 8 runs; 6 sampling seeds) and the
#   weight-decay benchmark's default on news_mlp and mnist_mlp (9 seeds, as final_s43/run.sh).
# usage: BEFORE=<checkout of aabbe5a> bash run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../../../.." && pwd)
spread=$after/benchmarks/results/main_job_spread/s44
py=${PYTHON:-python}
for arm in after before; do
  code=$after; [ "$arm" = before ] && code=$BEFORE
  cd "$code"
  PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs 8 --out "$spread/default_$arm.json"
  PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs 1 --seeds 0 1 2 3 4 5 --out "$spread/default_seeds_$arm.json"
done
for setting in news_mlp mnist_mlp; do
  for arm in after before; do
    code=$after; [ "$arm" = before ] && code=$BEFORE
    mkdir -p "$here/$arm"
    CODE=$code OUT=$here/$arm PYTHON=$py bash "$after/benchmarks/results/weight_decay/runs/final_s43/run.sh" "$setting"
  done
done
