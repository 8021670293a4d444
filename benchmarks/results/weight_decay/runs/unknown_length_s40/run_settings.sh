#!/usr/bin/env bash
# Three benchmark settings as fits of unknown length, seeds 0-4, after (this tree) and before
# (a checkout of 425f7a1 in BEFORE); then table_settings.py. Run from the repository root.
set -euo pipefail
HERE=benchmarks/results/weight_decay/runs/unknown_length_s40
PY=${PY:-.venv/bin/python}
for S in mnist_mlp fashion_mlp news_mlp; do
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD $PY $HERE/probe_settings.py $S $HERE/settings_after_$S.json 0 1 2 3 4
  OMP_NUM_THREADS=1 PYTHONPATH=$BEFORE $PY $HERE/probe_settings.py $S $HERE/settings_before_$S.json 0 1 2 3 4
done
$PY $HERE/table_settings.py
