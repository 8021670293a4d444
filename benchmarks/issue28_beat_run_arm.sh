#!/bin/bash
# usage: run_arm.sh SETTING ARM KWARGS_JSON
S=$1; ARM=$2; KW=$3
cd /work/wt-28-beat
R=benchmarks/results/weight_decay/runs
for pair in "rerun:0 1 2" "heldout:3 4 5" "heldout2:6 7 8"; do
  base=${pair%%:*}; seeds=${pair#*:}
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 /work/main/.venv/bin/python benchmarks/bench_weight_decay.py --settings $S --seeds $seeds --methods learned_per_layer --optuna-trials 0 --learned-kwargs "$KW" --threads 1 --data /work/shared/data/mnist --fashion-data /work/shared/data/fashion-mnist --reuse "$R/weight_decay_${base}_seed{seed}.json" --out $R/issue28_beat/weight_decay_${ARM}_${S}_${base}.json
done
