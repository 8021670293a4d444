#!/usr/bin/env bash
# Session 45, issue 28 item 4: a TrustRprop whose step grows faster while the sign holds, so
# that λ leaves the user's 1e-4 sooner where decay does not pay (20 Newsgroups), against the
# default rerun in the same hour (ctl: the budget decides by the clock, a rerun moves).
# Learned per layer only, seeds 0-8, grid/no decay reused from the stored runs
# (benchmarks/issue28_beat_run_arm.sh); tables: table.py in this folder.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: ctl, ctl2 (today's default; ctl2 beside ff10) | eta15 (etas 0.5, 1.5) | eta20 (etas 0.5, 2.0) | fall20 (η₊ = 2.0 for falls of λ only)
#        | ff10 (the default with a first step of 1.0 where it is a fall: first_fall.py, a probe)
#        | elem (granularity="per_element" with its defaults: issue 28 item 3 against ctl, per layer)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
trp='"class_path": "hypertorch_sid.core.outer_step.TrustRprop"'
case $arm in
  ctl | ctl2) kw='{}' ;;
  eta15) kw="{\"outer_optimizer\": {$trp, \"init_args\": {\"etas\": [0.5, 1.5]}}}" ;;
  eta20) kw="{\"outer_optimizer\": {$trp, \"init_args\": {\"etas\": [0.5, 2.0]}}}" ;;
  fall20) kw="{\"outer_optimizer\": {$trp, \"init_args\": {\"fall_eta\": 2.0}}}" ;;
  elem) kw='{}'; export METHOD=learned_per_element ;;
  ff10) kw='{}'; export BENCH=benchmarks/results/weight_decay/runs/s45_fastfall/first_fall.py ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
for setting in "$@"; do
  OUT=benchmarks/results/weight_decay/runs/s45_fastfall bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
