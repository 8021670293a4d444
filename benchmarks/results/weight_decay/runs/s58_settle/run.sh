#!/usr/bin/env bash
# Session 58 (rule: ../../rules_s58/settle58-rule.txt): ctl and settle alternating run by run.
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s58_settle/run.sh
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s58_settle
py=${PYTHON:-.venv/bin/python}
for k in 6 7 8 9 10 11 12 13 14 15 16 17; do
  for a in ctl settle; do
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py $D/mainjob.py $a --runs 1 --seeds $k \
      --out $D/mainjob_${a}_seed$k.json
  done
done
for seed in 45 46 47 48 49 50 51 52 53; do
  for arm in ctl settle; do
    kw=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))" $D/arms.json $arm)
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
      --settings digits_small --seeds $seed --methods learned_per_layer --optuna-trials 0 \
      --learned-kwargs "$kw" --threads 1 --out $D/weight_decay_${arm}_digits_small.json
    rm -f $D/weight_decay_${arm}_digits_small_*.png $D/weight_decay_${arm}_digits_small_seeds.{json,md}
  done
done
