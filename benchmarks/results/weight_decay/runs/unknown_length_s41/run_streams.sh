#!/usr/bin/env bash
# Session 41: two benchmark settings with the training data as a stream (IterableDataset), without
# __len__ (unknown length) against with __len__ (known), seeds 0-4, every default. Run from the
# repository root; then python .../unknown_length_s41/table_cnn.py (it reads streams_*.json too).
set -euo pipefail
H=benchmarks/results/weight_decay/runs/unknown_length_s41
PY=${PY:-.venv/bin/python}
for S in mnist_mlp fashion_cnn; do
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD $PY $H/probe_streams.py $S $H/streams_$S.json ${SEEDS:-0 1 2 3 4} > $H/streams_$S.log 2>&1 &
done
wait
