#!/usr/bin/env bash
# Session 52, issue 28: the first fall of λ sized by the decay's own shrink of the weights
# (ShrinkFallRprop, eq. shrinkfall) against the default rerun in the same hour (ctl). Learned per
# layer only; seeds 0-8 with grid/no decay reused from the stored runs
# (benchmarks/issue28_beat_run_arm.sh); rule: rule.md; tables: table.py here.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: ctl (today's default) | fall (outer_optimizer=ShrinkFallRprop(), its defaults)
#      | fctl, ffall (the confirmation on fresh seeds 9-17, rule.md: ctl and fall without
#        --reuse, bench_weight_decay.py called directly, only the learned trainings; run fctl
#        then ffall per setting)
#      | nctl, nfall (rule_fair.md a: ctl and fall with "max_overhead": null, no clock; seeds
#        18-20, one call per arm and setting)
#      | alt (rule_fair.md b: ctl and fall as they are, fresh seeds 18-26, arms actl and afall
#        run alternately seed by seed: actl 18, afall 18, actl 19, ...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  ctl | ctlb | fctl | actl) kw='{}' ;;
  nctl) kw='{"max_overhead": null}' ;;
  nfall) kw='{"max_overhead": null, "outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.ShrinkFallRprop", "init_args": {}}}' ;;
  alt) kw= ;;
  fall | ffall | afall) kw='{"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.ShrinkFallRprop", "init_args": {}}}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
out=benchmarks/results/weight_decay/runs/s52_shrinkfall
fit() {  # ARM KWARGS SETTING SEED...: the learned per-layer training only, fresh seeds
  local a=$1 k=$2 s=$3; shift 3
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
    --settings "$s" --seeds "$@" --methods learned_per_layer --optuna-trials 0 \
    --learned-kwargs "$k" --threads 1 --out "$out/weight_decay_${a}_${s}_fair.json"
  rm -f "$out"/weight_decay_"${a}_${s}"_*.png  # per-seed plots: not kept
}
if [ "$arm" = nctl ] || [ "$arm" = nfall ]; then
  cd "$here/../../../../.."
  for setting in "$@"; do fit "$arm" "$kw" "$setting" 18 19 20; done
  exit 0
fi
if [ "$arm" = alt ]; then
  cd "$here/../../../../.."
  fall='{"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.ShrinkFallRprop", "init_args": {}}}'
  for setting in "$@"; do
    for seed in 18 19 20 21 22 23 24 25 26; do
      fit actl '{}' "$setting" "$seed"
      fit afall "$fall" "$setting" "$seed"
    done
    rm -f "$out"/weight_decay_a{ctl,fall}_"${setting}"_fair_seeds.{json,md}  # one seed each: no summary
  done
  exit 0
fi
if [ "$arm" = fctl ] || [ "$arm" = ffall ]; then
  cd "$here/../../../../.."
  for setting in "$@"; do
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
      --settings "$setting" --seeds 9 10 11 12 13 14 15 16 17 --methods learned_per_layer \
      --optuna-trials 0 --learned-kwargs "$kw" --threads 1 \
      --out "$out/weight_decay_${arm}_${setting}_heldout2.json"
    rm -f "$out"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
  done
  exit 0
fi
for setting in "$@"; do
  OUT=$out bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
