#!/usr/bin/env bash
# Session 59 (rule: ../../rules_s59/tailhold59-rule.txt; code at git tag s59-tail-hold-unmerged):
# ctl and tail alternating run by run, the
# two protocols interleaved pair by pair (so an early stop leaves pairs of both).
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s59_tail/run.sh
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s59_tail
py=${PYTHON:-.venv/bin/python}
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
  k=$((18 + i))
  for a in ctl tail; do
    [ -f $D/mainjob_${a}_seed$k.json ] && continue
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py $D/mainjob.py $a --runs 1 --seeds $k \
      --out $D/mainjob_${a}_seed$k.json
  done
  [ $i -ge 9 ] && continue
  seed=$((54 + i))
  for arm in ctl tail; do
    [ -f $D/weight_decay_${arm}_digits_small_seed$seed.json ] && continue
    kw=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))" $D/arms.json $arm)
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
      --settings digits_small --seeds $seed --methods learned_per_layer --optuna-trials 0 \
      --learned-kwargs "$kw" --threads 1 --out $D/weight_decay_${arm}_digits_small.json
    rm -f $D/weight_decay_${arm}_digits_small_*.png $D/weight_decay_${arm}_digits_small_seeds.{json,md}
  done
done
