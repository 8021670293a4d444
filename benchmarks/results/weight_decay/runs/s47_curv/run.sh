#!/usr/bin/env bash
# Session 47, issue 28: warm-started curvature refreshes (EstimatedCurvature(warm_start=True,
# tol=0.05): re-estimates start Lanczos from the last estimate's extreme Ritz vectors, eq.
# lanczoswarm, and stop once both ends are settled, eq. lanczosstop) against the default rerun in
# the same hour (ctl). Learned per layer only, seeds 0-8, grid/no decay reused from the stored runs
# (benchmarks/issue28_beat_run_arm.sh); rule: rule.md; tables: table.py here.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: ctl (today's default), ctlb (ctl again: how far a rerun moves) | warm (the default's curvature, batches=2, iters=10, every=10,
#        with warm_start=True, tol=0.05)
#      | fctl, fwarm (the confirmation on fresh seeds 9-17, rule.md: ctl and warm without --reuse,
#        bench_weight_decay.py called directly, only the learned trainings; run fctl then fwarm
#        per setting)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  ctl | ctlb | fctl) kw='{}' ;;
  warm | fwarm) kw='{"curvature": {"class_path": "hypertorch_sid.core.estimation.EstimatedCurvature", "init_args": {"batches": 2, "iters": 10, "every": 10, "warm_start": true, "tol": 0.05}}}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
if [ "$arm" = fctl ] || [ "$arm" = fwarm ]; then
  cd "$here/../../../../.."
  out=benchmarks/results/weight_decay/runs/s47_curv
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
  OUT=benchmarks/results/weight_decay/runs/s47_curv bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
