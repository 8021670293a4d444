#!/usr/bin/env bash
# fashion_mlp only (the first run_settings.sh read MNIST's files for it: rerun on Fashion-MNIST)
set -euo pipefail
HERE=benchmarks/results/weight_decay/runs/unknown_length_s40
PY=${PY:-.venv/bin/python}
OMP_NUM_THREADS=1 PYTHONPATH=$PWD $PY $HERE/probe_settings.py fashion_mlp $HERE/settings_after_fashion_mlp.json 0 1 2 3 4
OMP_NUM_THREADS=1 PYTHONPATH=$BEFORE $PY $HERE/probe_settings.py fashion_mlp $HERE/settings_before_fashion_mlp.json 0 1 2 3 4
$PY $HERE/table_settings.py
