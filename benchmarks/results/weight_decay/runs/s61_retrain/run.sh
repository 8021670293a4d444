#!/usr/bin/env bash
# Session 61: learn once, retrain at the effective λ (rule: ../../rules_s61/retrain61-rule.txt).
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s61_retrain/run.sh [settings...]
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s61_retrain
py=${PYTHON:-.venv/bin/python}
settings=${*:-digits_small mnist_mlp fashion_mlp}
run() {
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py "$@" \
    --optuna-trials 0 --threads 1
}
for seed in 0 1 2 3 4 5 6 7 8; do
  for s in $settings; do
    if [ ! -f $D/learned_${s}_seed$seed.json ]; then
      run --settings $s --seeds $seed --methods learned_per_layer --learned-kwargs '{}' \
        --out $D/learned_$s.json
    fi
    lam=$($py -c "import json,sys; r=json.load(open('$D/learned_${s}_seed$seed.json'))['settings']['$s']['runs']['learned_per_layer']; print(repr(r['effective_all']))")
    if [ ! -f $D/retrain_${s}_seed$seed.json ]; then
      run --settings $s --seeds $seed --methods grid --grid $lam --out $D/retrain_$s.json
    fi
    rm -f $D/*_${s}_*.png $D/*_${s}_seeds.{json,md} $D/*_${s}_seed*.md
  done
done
