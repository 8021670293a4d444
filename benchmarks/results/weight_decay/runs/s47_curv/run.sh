#!/usr/bin/env bash
# Session 47, issue 28: warm-started curvature refreshes (EstimatedCurvature(warm_start=True,
# tol=0.05): re-estimates start Lanczos from the last estimate's extreme Ritz vectors, eq.
# lanczoswarm, and stop once both ends are settled, eq. lanczosstop) against the default rerun in
# the same hour (ctl). Learned per layer only, seeds 0-8, grid/no decay reused from the stored runs
# (benchmarks/issue28_beat_run_arm.sh); rule: rule.md; tables: table.py here.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: ctl (today's default), ctlb (ctl again: how far a rerun moves) | warm (the default's curvature, batches=2, iters=10, every=10,
#        with warm_start=True, tol=0.05)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  ctl | ctlb) kw='{}' ;;
  warm) kw='{"curvature": {"class_path": "hypertorch_sid.core.estimation.EstimatedCurvature", "init_args": {"batches": 2, "iters": 10, "every": 10, "warm_start": true, "tol": 0.05}}}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
for setting in "$@"; do
  OUT=benchmarks/results/weight_decay/runs/s47_curv bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
