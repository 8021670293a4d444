#!/usr/bin/env bash
# cProfile of one seed of mnist_mlp per method, no budget for per element (its default) and the
# per-layer default; prints the callback's hyper-step and logging time (profile.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
gk='{"per_element": {"elements": "layer_then_shrunk"}}'
for m in learned_per_layer learned_per_element; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 15 ${PYTHON:-python} -m cProfile -o "/tmp/elem40_$m${TAG:-}.prof" \
    benchmarks/bench_weight_decay.py --settings mnist_mlp --seeds 0 --methods $m --optuna-trials 0 \
    --threads 1 --granularity-kwargs "$gk" --out "/tmp/elem40_$m${TAG:-}.json" > "/tmp/elem40_$m${TAG:-}.log"
done
