#!/usr/bin/env bash
# Held-out seeds 9-17, both outer steps at once (two processes, same load), on a setting S
# (default fashion_mlp: the one setting whose mean moved the wrong way, +0.0068 +- 0.0083 against
# the stored Adam runs; also mnist_mlp, digits_small). usage: bash run.sh [S]
#   adam:  outer_optimizer = torch.optim.Adam(lr=0.3)  (the previous default)
#   trust: the drop-in's default (TrustRprop)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../../.."
S=${1:-fashion_mlp}
run() {
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_weight_decay.py --settings "$S" \
    --seeds 9 10 11 12 13 14 15 16 17 --methods learned_per_layer --optuna-trials 0 --threads 1 \
    --learned-kwargs "$2" --out "benchmarks/results/weight_decay/runs/outer_flip/more/${S}_$1.json"
}
run adam '{"outer_optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.3}}}' &
run trust '{}' &
wait
