#!/usr/bin/env bash
# Session 46, issue 28 item 4: the budget paced over the fit (PacedBudget, eq. budgetpace: the
# first hyper step's excess over a typical one amortised to the end of the fit instead of paid
# back before the second hyper step runs), against the default rerun in the same hour (ctl: the
# budget decides by the clock, a rerun moves). Learned per layer only, seeds 0-8, grid/no decay
# reused from the stored runs (benchmarks/issue28_beat_run_arm.sh); tables: table.py here.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: ctl (today's default) | pace (max_overhead=PacedBudget(0.5))
#        | pacemin (pace and TrustRprop(step_sizes=(0.05, 2.0)): Δ_min 0.05, not 0.01)
#        | ctlb, paceminb: ctl and pacemin again (after the rule: how far a rerun moves)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  ctl | ctlb) kw='{}' ;;
  pace) kw='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.PacedBudget", "init_args": {"max_overhead": 0.5}}}' ;;
  pacemin | paceminb) kw='{"max_overhead": {"class_path": "hypertorch_sid.core.budget.PacedBudget", "init_args": {"max_overhead": 0.5}}, "outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.TrustRprop", "init_args": {"step_sizes": [0.05, 2.0]}}}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
for setting in "$@"; do
  OUT=benchmarks/results/weight_decay/runs/s46_pace bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
