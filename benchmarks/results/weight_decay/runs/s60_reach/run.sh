#!/usr/bin/env bash
# Session 60 (rule: ../../rules_s60/reach60-rule.txt): ctl and reach alternating run by run;
# conditions interleaved pair by pair so an early stop leaves pairs of each.
# usage (from the repository root): bash benchmarks/results/weight_decay/runs/s60_reach/run.sh
set -euo pipefail
D=benchmarks/results/weight_decay/runs/s60_reach
py=${PYTHON:-.venv/bin/python}
bench() {  # arm setting seed
  [ -f $D/weight_decay_$1_$2_seed$3.json ] && return 0
  kw=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))" $D/arms.json $1)
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
    --settings $2 --seeds $3 --methods learned_per_layer --optuna-trials 0 \
    --learned-kwargs "$kw" --threads 1 --out $D/weight_decay_$1_$2.json
  rm -f $D/weight_decay_$1_$2_*.png $D/weight_decay_$1_$2_seeds.{json,md}
}
main() {  # arm sampling-seed
  [ -f $D/mainjob_$1_seed$2.json ] && return 0
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py $D/mainjob.py $1 --runs 1 --seeds $2 \
    --out $D/mainjob_$1_seed$2.json
}
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
  for a in ctl reach; do main $a $((30 + i)); done
  [ $i -ge 9 ] && continue
  s=$((63 + i))
  for a in ctl reach; do bench $a digits_small $s; done
  for a in ctl reach; do bench $a mnist_cnn $s; done
  for a in ctl reach; do bench $a fashion_cnn $s; done
done
for s in 63 64 65 66 67 68; do
  for a in ctl reach; do bench $a mnist_mlp $s; done
  for a in ctl reach; do bench $a fashion_mlp $s; done
done
