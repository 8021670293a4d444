#!/usr/bin/env bash
# Session 48 (the s47_both run after the fix): both drop-ins in one fit, the decay's budget counting
# the data weights' work as hyper work, not training (drop_in_decay), against the data
# weights alone (drop_in), the decay alone (decay), plain and the clean-only oracle; 40 %
# symmetric noise, MNIST and Fashion-MNIST, seeds 1-3, the drop-in benchmark's recipe (12 epochs,
# clip 1), one process per data set, one thread. Then:
# python benchmarks/results/noisy_labels/runs/s47_both/table.py benchmarks/results/noisy_labels/runs/s48_both
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
OUT=benchmarks/results/noisy_labels/runs/s48_both
for DS in ${DATASETS:-mnist fashion}; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 ${PYTHON:-python} benchmarks/bench_noisy_labels.py \
    --datasets "$DS" --noise symmetric --epochs 12 --clip 1 --seeds 1 2 3 \
    --methods plain drop_in drop_in_decay decay oracle --out "$OUT/${DS}.json"
done
