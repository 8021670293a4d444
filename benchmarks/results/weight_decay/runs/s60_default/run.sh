#!/usr/bin/env bash
# Session 60: the README table's learned column rerun with the new default (ReachRprop, by
# ../../rules_s60/reach60-rule.txt), seeds 0-8, against session 43's stored picks (table.py).
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s60_default/run.sh
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s60_default
py=${PYTHON:-.venv/bin/python}
for seed in 0 1 2 3 4 5 6 7 8; do
  for s in digits_small mnist_mlp fashion_mlp mnist_cnn fashion_cnn news_mlp digits_mlp; do
    [ -f $D/weight_decay_default_${s}_seed$seed.json ] && continue
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
      --settings $s --seeds $seed --methods learned_per_layer --optuna-trials 0 \
      --learned-kwargs '{}' --threads 1 --out $D/weight_decay_default_$s.json
    rm -f $D/weight_decay_default_${s}_*.png $D/weight_decay_default_${s}_seeds.{json,md}
  done
done
