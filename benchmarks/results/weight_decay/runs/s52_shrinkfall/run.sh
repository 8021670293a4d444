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
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  ctl | ctlb | fctl) kw='{}' ;;
  fall | ffall) kw='{"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.ShrinkFallRprop", "init_args": {}}}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
out=benchmarks/results/weight_decay/runs/s52_shrinkfall
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
