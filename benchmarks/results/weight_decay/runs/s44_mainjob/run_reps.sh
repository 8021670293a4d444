#!/usr/bin/env bash
# Session 44 (mainjob44): digits_small (the main job's recipe, best validation epoch deployed),
# 9 seeds, repeated: the budget's timing alone moves single seeds by 0.04-0.08 there.
# usage: BEFORE=<checkout of aabbe5a> bash run_reps.sh REP...   (outputs rep<R>_{after,before}/)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../../../.." && pwd)
for rep in "$@"; do
  for arm in after before; do
    code=$after; [ "$arm" = before ] && code=$BEFORE
    mkdir -p "$here/rep${rep}_$arm"
    CODE=$code OUT=$here/rep${rep}_$arm PYTHON=${PYTHON:-python} bash "$after/benchmarks/results/weight_decay/runs/final_s43/run.sh" digits_small
  done
done
