#!/usr/bin/env bash
# Session 59 (rule: ../../rules_s59/horizon-rule.txt): ctl and horizon alternating run by run.
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s59_horizon/run.sh
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s59_horizon
py=${PYTHON:-.venv/bin/python}
for k in 18 19 20 21 22 23 24 25 26 27 28 29; do
  for a in ctl horizon; do
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py $D/mainjob.py $a --runs 1 --seeds $k \
      --out $D/mainjob_${a}_seed$k.json
  done
done
for seed in 54 55 56 57 58 59 60 61 62; do
  for arm in ctl horizon; do
    kw=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))" $D/arms.json $arm)
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
      --settings digits_small --seeds $seed --methods learned_per_layer --optuna-trials 0 \
      --learned-kwargs "$kw" --threads 1 --out $D/weight_decay_${arm}_digits_small.json
    rm -f $D/weight_decay_${arm}_digits_small_*.png $D/weight_decay_${arm}_digits_small_seeds.{json,md}
  done
done
