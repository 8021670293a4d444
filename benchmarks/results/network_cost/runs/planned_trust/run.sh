#!/usr/bin/env bash
# The network matrix with the defaults of main at 1eefc9f (PlannedBudget(0.5) as the budget,
# TrustRprop as the outer step): plain vs LearnedWeightDecay(1e-4) with every default, CPU-time
# ratios in one run, 1 thread (issue 28 check, helper i28-check).
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_network_cost.py \
  --repeats "${REPEATS:-2}" --configs plain default --threads 1 \
  --out benchmarks/results/network_cost/runs/planned_trust/network_cost.json
