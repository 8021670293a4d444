#!/usr/bin/env bash
# Fashion MLP, held-out seeds 18-35, both outer steps at once (two processes, same load), as
# ../more/run.sh does for seeds 9-17 (issue 28 check, helper i28-check). usage: bash run.sh [S]
#   adam:  outer_optimizer = torch.optim.Adam(lr=0.3)  (the previous default)
#   trust: the drop-in's default (TrustRprop)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../../.."
S=${1:-fashion_mlp}
SEEDS=${SEEDS:-18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35}
run() {
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py --settings "$S" \
    --seeds $SEEDS --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --learned-kwargs "$2" --out "benchmarks/results/weight_decay/runs/outer_flip/more2/${S}_$1.json"
}
run adam '{"outer_optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.3}}}' &
run trust '{}' &
wait
