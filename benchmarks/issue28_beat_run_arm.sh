#!/usr/bin/env bash
# One learned-decay variant (ARM, its LearnedWeightDecay keywords as JSON) on one benchmark
# setting, seeds 0-8, learned per layer only; the grid's and no decay's trainings are taken from
# the stored runs of the same setting and seed (--reuse; nothing but the learned run is trained).
# Writes OUT/weight_decay_<ARM>_<SETTING>_<base>_seed<N>.json (base: rerun 0-2, heldout 3-5,
# heldout2 6-8), paired with the stored picks by benchmarks/issue28_beat_table.py.
# usage (from anywhere): [OUT=folder] [PYTHON=python] bash benchmarks/issue28_beat_run_arm.sh SETTING ARM KWARGS_JSON
#   (BENCH=a script taking bench_weight_decay.py's arguments, e.g. a probe that patches it;
#    METHOD=learned_per_element or learned_global: another granularity, its own defaults)
#   e.g. bash benchmarks/issue28_beat_run_arm.sh fashion_cnn held '{"invariant": "held"}'
set -euo pipefail
S=$1; ARM=$2; KW=$3
cd "$(dirname "$0")/.."
R=benchmarks/results/weight_decay/runs
OUT=${OUT:-$R/issue28_beat}
mkdir -p "$OUT"
for pair in "rerun:0 1 2" "heldout:3 4 5" "heldout2:6 7 8"; do
  base=${pair%%:*}; seeds=${pair#*:}
  case $S in
    news_mlp) reuse="$R/news_mlp/news_mlp_seed{seed}.json" ;;
    digits_small) reuse="$R/digits_small/digits_small_seed{seed}.json" ;;
    *) reuse="$R/weight_decay_${base}_seed{seed}.json" ;;
  esac
  # shellcheck disable=SC2086  # $seeds: one word per seed
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} "${BENCH:-benchmarks/bench_weight_decay.py}" \
    --settings "$S" --seeds $seeds --methods "${METHOD:-learned_per_layer}" --optuna-trials 0 \
    --learned-kwargs "$KW" --threads 1 --reuse "$reuse" \
    --out "$OUT/weight_decay_${ARM}_${S}_${base}.json"
done
