#!/usr/bin/env bash
# Session 53, issue 28: LateBudget (eq. budgetlate: the budget's credit saved in the first half
# of the fit, spent in the second) with every_n_steps=10, against the default. Learned per layer
# only; rule: rule.md; arms' keywords: arms.json; tables: table.py here.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: late (the screen, seeds 0-8, grid/no decay reused from the stored runs,
#        benchmarks/issue28_beat_run_arm.sh; control: the stored s52_shrinkfall runs)
#      | ctl53 (record only, after the failed screen: today's default rerun on seeds 0-8 in this
#        session, grid/no decay reused, to tell the option from the load; rule.md's addendum)
#      | alt (the confirmation, fresh seeds 27-35: actl (the default) and alate run
#        alternately seed by seed: actl 27, alate 27, actl 28, ...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
py=${PYTHON:-python}
late=$($py -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['late']))" "$here/arms.json")
out=benchmarks/results/weight_decay/runs/s53_late
fit() {  # ARM KWARGS SETTING SEED: the learned per-layer training only, one fresh seed
  local a=$1 k=$2 s=$3 n=$4
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 $py benchmarks/bench_weight_decay.py \
    --settings "$s" --seeds "$n" --methods learned_per_layer --optuna-trials 0 \
    --learned-kwargs "$k" --threads 1 --out "$out/weight_decay_${a}_${s}_fresh.json"
  rm -f "$out"/weight_decay_"${a}_${s}"_*.png "$out"/weight_decay_"${a}_${s}"_fresh_seeds.{json,md}
}
case $arm in
  late)
    for setting in "$@"; do
      OUT=$out bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" late "$late"
      rm -f "$here"/weight_decay_late_"${setting}"_*.png  # per-seed plots: not kept
    done ;;
  ctl53)
    for setting in "$@"; do
      OUT=$out bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" ctl53 '{}'
      rm -f "$here"/weight_decay_ctl53_"${setting}"_*.png  # per-seed plots: not kept
    done ;;
  alt)
    cd "$here/../../../../.."
    for setting in "$@"; do
      for seed in 27 28 29 30 31 32 33 34 35; do
        fit actl '{}' "$setting" "$seed"
        fit alate "$late" "$setting" "$seed"
      done
    done ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
