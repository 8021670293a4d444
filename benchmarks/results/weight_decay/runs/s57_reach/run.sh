#!/usr/bin/env bash
# Session 57, issue 28 item 4: ReachRprop (eqs. reachstep, reachpace: Rprop's step on log λ held
# at or above what can still cross ln 100 with the hyper steps left) against today's default
# (ShrinkFallRprop), learned per layer, the default budget. Rule: ../../rules_s57/wd57-rule.txt.
# The two arms run alternately seed by seed in one session (ctl N, reach N, ctl N+1, ...), each a
# fresh process with the learned training only; grid/Optuna/no decay are not trained.
# ctl is {} (the default of the time): ShrinkFallRprop when these runs were made, before the
# default-change commit that follows them on branch wd57; after it, pass the old default explicitly.
# usage (from anywhere): [PYTHON=python] bash run.sh SETTING SEED...
#   screen: bash run.sh digits_small 0 1 2 3 4 5 6 7 8
#   confirmation: bash run.sh digits_small 36 ... 44; bash run.sh mnist_mlp 36 ... 44; fashion_mlp
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
setting=$1; shift
py=${PYTHON:-python}
cd "$here/../../../../.."
out=benchmarks/results/weight_decay/runs/s57_reach
for seed in "$@"; do
  for arm in ctl reach; do
    kw=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))" \
      "$here/arms.json" "$arm")
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
      --settings "$setting" --seeds "$seed" --methods learned_per_layer --optuna-trials 0 \
      --learned-kwargs "$kw" --threads 1 --out "$out/weight_decay_${arm}_${setting}.json"
    rm -f "$out"/weight_decay_"${arm}_${setting}"_*.png "$out"/weight_decay_"${arm}_${setting}"_seeds.{json,md}
  done
done
