#!/usr/bin/env bash
# Round s41 of the unknown-length fit, seeds 0-4, each probe with the known-length arm in the same
# command (paired by seed); then table.py (reads the logs). Run from the repository root.
# A stream (probe_stream.py) with the default LearnedWeightDecay; the three budget_horizon runs: the
# budget planning with callback.horizon (this tree); before_digits_small: the same probe on a
# checkout before that change (BEFORE=<checkout>). The CNNs: run_cnn.sh.
set -euo pipefail
HERE=benchmarks/results/weight_decay/runs/unknown_length_s41
P=benchmarks/results/weight_decay/runs/unknown_length_s40/probe_settings.py
PY=${PY:-/work/main/.venv/bin/python}
run() { OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 15 $PY "$@"; }
run $HERE/probe_stream.py mnist_mlp $HERE/stream_mnist_mlp.json 0 1 2 3 4 > $HERE/log_stream_mnist_mlp.txt 2>&1
for S in news_mlp mnist_mlp digits_small fashion_mlp fashion_cnn; do  # the Fashion pair: lead, after the change
  run $P $S $HERE/budget_horizon_$S.json 0 1 2 3 4 > $HERE/log_bh_$S.txt 2>&1
done
for S in news_mlp digits_small; do  # seeds 5-9 (pooled by table.py)
  run $P $S /dev/null 5 6 7 8 9 > $HERE/log_bh_${S}_s5-9.txt 2>&1
done
if [ -n "${BEFORE:-}" ]; then
  (cd $BEFORE && OMP_NUM_THREADS=1 PYTHONPATH=$BEFORE nice -n 15 $PY $P \
    digits_small /dev/null 0 1 2 3 4) > $HERE/log_before_digits_small.txt 2>&1
  (cd $BEFORE && OMP_NUM_THREADS=1 PYTHONPATH=$BEFORE nice -n 15 $PY $P \
    digits_small /dev/null 5 6 7 8 9) > $HERE/log_before_digits_small_s5-9.txt 2>&1
fi
$PY $HERE/table.py
