#!/usr/bin/env bash
# Session 55, issue 28: ForwardSensitivity (arm fwd) against today's default (arm ctl), both
# without a budget, alternately seed by seed (ctl 0, fwd 0, ctl 1, ...), learned per layer only;
# the grid's and no decay's trainings reused from the stored runs of the same seed. Rule: rule.md.
# usage (repo root): [PYTHON=python] [SEEDS="0 1 ..."] bash benchmarks/results/weight_decay/runs/s55_forward/run.sh SETTING...
set -euo pipefail
py=${PYTHON:-python}
R=benchmarks/results/weight_decay/runs
out=$R/s55_forward
fwd='{"max_overhead": null, "hypergradient": {"class_path": "hypertorch_sid.core.forward_sensitivity.ForwardSensitivity"}}'
ctl='{"max_overhead": null}'
base_of() { if (($1 < 3)); then echo rerun; elif (($1 < 6)); then echo heldout; else echo heldout2; fi; }
for S in "$@"; do
  for n in ${SEEDS:-0 1 2 3 4 5 6 7 8}; do
    b=$(base_of "$n")
    case $S in
      news_mlp) reuse="$R/news_mlp/news_mlp_seed{seed}.json" ;;
      digits_small) reuse="$R/digits_small/digits_small_seed{seed}.json" ;;
      *) reuse="$R/weight_decay_${b}_seed{seed}.json" ;;
    esac
    for arm in ctl fwd; do
      kw=$ctl; [[ $arm == fwd ]] && kw=$fwd
      PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
        --settings "$S" --seeds "$n" --methods learned_per_layer --optuna-trials 0 \
        --learned-kwargs "$kw" --threads 1 --reuse "$reuse" \
        --out "$out/${arm}_${S}_s${n}.json"
      rm -f "$out/${arm}_${S}_s${n}"*.png "$out/${arm}_${S}_s${n}_seeds".{json,md}
    done
  done
done
