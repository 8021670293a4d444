#!/usr/bin/env bash
# Issue 28, item 4 (lead, this version): is the 20 Newsgroups miss the early phase at the user's
# lambda_0 = 1e-4? Two screens, learned per layer only, 9 seeds, paired by seed (table.py):
#   ARM=lr1: TrustRprop(lr=1.0) (the first step on log lambda 1.0 instead of 0.3), every setting;
#   ARM=ctl: the default, rerun at the same time (the budget decides by the clock, so a rerun of
#            the same default moves: this is the reference for lr1).
# And probe_news.py (3 seeds): no WD; lambda = 1e-4 for the first 100 steps, then 0; the learned
# default started at 1e-6.
# usage: bash run.sh ARM SETTING...      python probe_news.py {0|until100|init1e-6} 0 1 2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
arm=$1; shift
case $arm in
  lr1) kw='{"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.TrustRprop", "init_args": {"lr": 1.0}}}' ;;
  ctl) kw='{}' ;;
  *) echo "unknown arm $arm"; exit 2 ;;
esac
for setting in "$@"; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer \
    --optuna-trials 0 --threads 1 --learned-kwargs "$kw" --out "$here/${setting}_${arm}.json"
done
