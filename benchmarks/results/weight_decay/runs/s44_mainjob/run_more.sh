#!/usr/bin/env bash
# Session 44 (mainjob44), second batch, after run.sh: the other five settings of the benchmark
# (9 seeds, after then before per setting), and more main-job draws (16 more runs, sampling
# seeds 6-11) per arm. usage: BEFORE=<checkout of aabbe5a> bash run_more.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../../../.." && pwd)
spread=$after/benchmarks/results/main_job_spread/s44
py=${PYTHON:-python}
for arm in after before; do
  code=$after; [ "$arm" = before ] && code=$BEFORE
  cd "$code"
  PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs 16 --out "$spread/default16_$arm.json"
  PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs 1 --seeds 6 7 8 9 10 11 --out "$spread/default_seeds6-11_$arm.json"
done
for setting in digits_small digits_mlp fashion_mlp mnist_cnn fashion_cnn; do
  for arm in after before; do
    code=$after; [ "$arm" = before ] && code=$BEFORE
    mkdir -p "$here/$arm"
    CODE=$code OUT=$here/$arm PYTHON=$py bash "$after/benchmarks/results/weight_decay/runs/final_s43/run.sh" "$setting"
  done
done
