#!/usr/bin/env bash
# Issue 28, the outer step (docs/weight_decay_budget.md, "The outer step without memory: TrustRprop").
# One arm on one setting, 9 seeds, learned per layer only; paired against the stored default runs by
#   python benchmarks/issue28_look_ahead_table.py --runs benchmarks/results/weight_decay/runs/outer_flip --arm ARM --out ...
# usage: bash run.sh ARM SETTING
#   trR10: TrustRprop(trust=0.1) (the library's; the screen's digits_small/news_mlp runs were made
#          with variants.TrustRpropR, the same rule, before it moved into the library)
#   trN05: variants.TrustRpropN(trust=0.05): the rise bounded by δ/(ηN), N the steps since the
#          last hyper step (tried first, not kept)
#   rprop: torch.optim.Rprop(lr=0.3, step_sizes=(0.01, 2.0)) (no bound)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
arm=$1 setting=$2
case $arm in
  trR10) kw='{"outer_optimizer": {"class_path": "hypertorch_sid.core.outer_step.TrustRprop", "init_args": {"trust": 0.1}}}' ;;
  trN05) kw='{"outer_optimizer": {"class_path": "variants.TrustRpropN", "init_args": {"trust": 0.05}}}' ;;
  rprop) kw='{"outer_optimizer": {"class_path": "torch.optim.Rprop", "init_args": {"lr": 0.3, "step_sizes": [0.01, 2.0]}}}' ;;
  *) echo "unknown arm $arm"; exit 2 ;;
esac
PYTHONPATH=$PWD:$here OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py \
  --settings "$setting" --seeds ${SEEDS:-0 1 2 3 4 5 6 7 8} --methods learned_per_layer --optuna-trials 0 \
  --threads 1 --learned-kwargs "$kw" \
  --out "${OUT:-benchmarks/results/weight_decay/runs/outer_flip/${setting}_${arm}.json}"
