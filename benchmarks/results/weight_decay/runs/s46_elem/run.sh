#!/usr/bin/env bash
# Session 46, issue 28 item 3: granularity="per_element" against the per-layer default of
# session 45 (s45_fastfall's ctl arm, the same seeds, rerun then in the same hour; its
# OverheadBudget(0.5) reads the clock, so a per-layer rerun is not bit-reproducible and is not
# repeated here). Per element has no budget: its runs are bit-reproducible, and elem here
# re-makes s45_fastfall's elem arm at this tree (table.py checks they are equal).
# Seeds 0-8; the grid's and no decay's runs are reused from the stored files
# (benchmarks/issue28_beat_run_arm.sh). Table: table.py in this folder.
# usage (from anywhere): [PYTHON=python] bash run.sh ARM SETTING...
#   ARM: elem (per element with its defaults, elements="layer_then_shrunk", no budget)
#        | layernone (per layer without a budget, max_overhead=None: per element whose deviations
#          never move; a diagnostic of how much of per element − per layer is the budget)
#        | strict4 (per element, eq. shrink's noise counted 4 s.d. high: strict_shrink.py; rule.md)
#        | confirm (fresh seeds 9-17: per layer and per element's default in one process, then
#          strict4 on the same seeds with --reuse of that file, arm strict4c; rule.md)
#        | fresh (fresh seeds 9-17: per layer and per element's default in one process only:
#          item 3 on seeds that chose nothing, per layer paired in the same process)
#        | freshnone (fresh seeds 9-17: per layer without a budget, as layernone)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arm=$1; shift
case $arm in
  elem) kw='{}'; export METHOD=learned_per_element ;;
  layernone) kw='{"max_overhead": null}'; export METHOD=learned_per_layer ;;
  strict4) kw='{}'; export METHOD=learned_per_element BENCH="$here/strict_shrink.py" ;;
  confirm | fresh) kw='{}' ;;
  freshnone) kw='{"max_overhead": null}' ;;
  *) echo "unknown arm $arm" >&2; exit 2 ;;
esac
if [ "$arm" = confirm ] || [ "$arm" = fresh ] || [ "$arm" = freshnone ]; then
  cd "$here/../../../../.."
  out=benchmarks/results/weight_decay/runs/s46_elem
  steps=("$arm:benchmarks/bench_weight_decay.py:learned_per_layer learned_per_element")
  [ "$arm" = freshnone ] && steps=("$arm:benchmarks/bench_weight_decay.py:learned_per_layer")
  [ "$arm" = confirm ] && steps+=("strict4c:$out/strict_shrink.py:learned_per_element")
  for setting in "$@"; do
    for step in "${steps[@]}"; do
      name=${step%%:*}; rest=${step#*:}; bench=${rest%%:*}; methods=${rest#*:}
      reuse=(); [ "$name" = strict4c ] && reuse=(--reuse "$out/weight_decay_confirm_${setting}_heldout2_seed{seed}.json")
      # shellcheck disable=SC2086  # $methods: one word per method
      PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} "$bench" --settings "$setting" \
        --seeds 9 10 11 12 13 14 15 16 17 --methods $methods --optuna-trials 0 \
        --learned-kwargs "$kw" --threads 1 "${reuse[@]}" --out "$out/weight_decay_${name}_${setting}_heldout2.json"
      rm -f "$out"/weight_decay_"${name}_${setting}"_*.png
    done
  done
  exit 0
fi
for setting in "$@"; do
  OUT=benchmarks/results/weight_decay/runs/s46_elem bash "$here/../../../../issue28_beat_run_arm.sh" "$setting" "$arm" "$kw"
  rm -f "$here"/weight_decay_"${arm}_${setting}"_*.png  # per-seed plots: not kept
done
