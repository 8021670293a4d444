#!/usr/bin/env bash
# Session 44 (mainjob44): the curvature estimate's L, λ_min over the union of its batches' spectra
# (EstimatedCurvature(minibatches="each"), then the default; now an option) against their mean's.
# Before (BEFORE=<a checkout of aabbe5a>) and after (a checkout where "each" is the default, e.g.
# 526dad0), back to back, one job at a time, OMP_NUM_THREADS=1:
#   the main job's spread (benchmarks/main_job_spread.py: RUNS runs as RUN_TAG; one run per
#   sampling seed of SPREAD_SEEDS as SEED_TAG; RUNS=0 skips it), then the weight-decay benchmark's
#   default on SETTINGS (9 seeds, as final_s43/run.sh) into after/ and before/ (or, with REPS,
#   digits_small only, into rep<R>_{after,before}/).
# The three batches as run:
#   BEFORE=... bash run.sh                                                  # 8 runs, seeds 0-5; news_mlp mnist_mlp
#   BEFORE=... RUNS=16 RUN_TAG=default16 SPREAD_SEEDS="6 7 8 9 10 11" SEED_TAG=default_seeds6-11 \
#     SETTINGS="digits_small digits_mlp fashion_mlp mnist_cnn fashion_cnn" bash run.sh
#   BEFORE=... RUNS=0 REPS="2 3 4 5" bash run.sh                            # digits_small repeated
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../../../.." && pwd)
spread=$after/benchmarks/results/main_job_spread/s44
py=${PYTHON:-python}
RUNS=${RUNS:-8} RUN_TAG=${RUN_TAG:-default}
SPREAD_SEEDS=${SPREAD_SEEDS:-0 1 2 3 4 5} SEED_TAG=${SEED_TAG:-default_seeds}
SETTINGS=${SETTINGS:-news_mlp mnist_mlp}
checkout() { if [ "$1" = before ]; then echo "$BEFORE"; else echo "$after"; fi; }
if [ "$RUNS" -gt 0 ]; then
  for arm in after before; do
    code=$(checkout $arm)
    cd "$code"
    PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs "$RUNS" --out "$spread/${RUN_TAG}_$arm.json"
    PYTHONPATH=$code OMP_NUM_THREADS=1 $py benchmarks/main_job_spread.py --runs 1 --seeds $SPREAD_SEEDS --out "$spread/${SEED_TAG}_$arm.json"
  done
fi
bench() {  # bench ARM OUTDIR SETTING
  mkdir -p "$2"
  CODE=$(checkout "$1") OUT=$2 PYTHON=$py bash "$after/benchmarks/results/weight_decay/runs/final_s43/run.sh" "$3"
}
if [ -n "${REPS:-}" ]; then
  for rep in $REPS; do for arm in after before; do bench $arm "$here/rep${rep}_$arm" digits_small; done; done
else
  for setting in $SETTINGS; do for arm in after before; do bench $arm "$here/$arm" "$setting"; done; done
fi
