#!/usr/bin/env bash
# Session 41: the benchmark's CNN settings as fits of unknown length (max_epochs=-1, stopped by a callback
# after the setting's epochs) against the known length, seeds 0-4, every default; the s40 probe reused.
# Run from the repository root; then python .../unknown_length_s41/table_cnn.py
set -euo pipefail
H=benchmarks/results/weight_decay/runs/unknown_length_s41
P=benchmarks/results/weight_decay/runs/unknown_length_s40/probe_settings.py
PY=${PY:-.venv/bin/python}
for S in mnist_cnn fashion_cnn; do
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD $PY $P $S $H/settings_$S.json ${SEEDS:-0 1 2 3 4} > $H/$S.log 2>&1 &
done
wait
