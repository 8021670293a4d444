#!/usr/bin/env bash
# Session 49: the data weights' cross term at every training step (the default) against
# cross_term="hyper_step", CPU, seeds 1-3, both noises, both data sets. Run from the repository root.
set -eu
for ct in training hyper_step; do
  ${PYTHON:-python} benchmarks/bench_noisy_labels.py --datasets fashion mnist --noise symmetric pair \
    --epochs 12 --seeds 1 2 3 --methods plain drop_in oracle \
    --drop-in-kwargs "{\"cross_term\": \"$ct\"}" --data ../shared/data \
    --out benchmarks/results/noisy_labels/runs/s49_cross_term/$ct.json
done
