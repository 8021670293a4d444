#!/usr/bin/env bash
# A fit of unknown length (max_epochs=-1, stopped at step 400 by a callback) against the same fit
# with its length known, main job's recipe, seeds 0-8: before (main at 425f7a1, checked out in
# BEFORE) and after the horizon estimate; then table.py. Run from the repository root.
set -euo pipefail
HERE=benchmarks/results/weight_decay/runs/unknown_length_s40
PY=${PY:-.venv/bin/python}
SEEDS="0 1 2 3 4 5 6 7 8"
if [ -n "${BEFORE:-}" ]; then
  (cd "$BEFORE" && PYTHONPATH=$PWD "$OLDPWD/$PY" "$OLDPWD/$HERE/probe.py" "$OLDPWD/$HERE/before_none.json" none $SEEDS)
fi
PYTHONPATH=$PWD $PY $HERE/probe.py $HERE/after_none.json none $SEEDS
PYTHONPATH=$PWD $PY $HERE/probe.py $HERE/after_default.json default $SEEDS
$PY $HERE/table.py
