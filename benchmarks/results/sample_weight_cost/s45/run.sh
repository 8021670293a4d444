#!/usr/bin/env bash
# Session 45 (issue 27, item 1): the cost of a hyper step against n = 10^3 ... 10^6 with the
# outer step of the mean-logit gauge (SampleWeights(gauge="mean_logit"), sigmoid) and of softmax
# weights, both LazyAdam on row-sparse gradients, before and after their statistic of all n rows
# (the mean logit, log Z) is kept from the rows moved (hypertorch_sid.core.sample_weights.
# Normaliser, eq. keptsum). The same benchmark script both times: "before" runs it on the library
# of BASE (the commit before the change), "after" on this checkout. From the repository root:
#
#     bash benchmarks/results/sample_weight_cost/s45/run.sh
#
# 1 thread; medians over 20 steps after 3 warm-up steps, each n in its own process. The 2-core
# machine was shared with other jobs when the committed numbers were taken: compare the slope in
# n (10^6 against 10^3), not the absolute times.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=benchmarks/results/sample_weight_cost/s45
BASE=${BASE:-7d2d790}
export OMP_NUM_THREADS=1

base=$(mktemp -d)
git worktree add --detach "$base/tree" "$BASE"
cp benchmarks/bench_sample_weight_cost.py "$base/tree/benchmarks/"
# beyond the range: n = 10^7 (0.2 GB of weights and LazyAdam state) for the three LazyAdam runs
BIG=(--optimizers lazy_adam mean_logit softmax --sizes 1000 10000000)
(cd "$base/tree" && nice -n 5 "$PYTHON" benchmarks/bench_sample_weight_cost.py --out before.json)
(cd "$base/tree" && nice -n 5 "$PYTHON" benchmarks/bench_sample_weight_cost.py "${BIG[@]}" \
    --out before_1e7.json)
cp "$base/tree"/before{,_1e7}.{json,png} "$OUT/"
git worktree remove --force "$base/tree"

nice -n 5 "$PYTHON" benchmarks/bench_sample_weight_cost.py --out "$OUT/after.json"
nice -n 5 "$PYTHON" benchmarks/bench_sample_weight_cost.py "${BIG[@]}" --out "$OUT/after_1e7.json"
