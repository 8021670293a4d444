#!/usr/bin/env bash
# The network matrix with the TrustRprop default outer step (issue 28 check, helper i28-check):
# plain vs LearnedWeightDecay(1e-4) with every default, CPU-time ratio in one run, 1 thread.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_network_cost.py \
  --repeats "${REPEATS:-2}" --configs plain default --threads 1 \
  --out benchmarks/results/network_cost/runs/trust_rprop/network_cost.json
# The two networks at or above 1.5x in the run above, again, 3 repeats:
# PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_network_cost.py --networks Transformer MLP \
#   --repeats 3 --configs plain default --threads 1 \
#   --out benchmarks/results/network_cost/runs/trust_rprop/network_cost_transformer_mlp.json
