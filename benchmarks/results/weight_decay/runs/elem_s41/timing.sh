#!/usr/bin/env bash
# timing.py for both methods on mnist_mlp and news_mlp, seed 0, into timing.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
for s in mnist_mlp news_mlp; do
  for m in learned_per_layer learned_per_element; do
    echo "== $s"
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 15 ${PYTHON:-python} "$here/timing.py" $m "elem_s41_timing_${s}_$m" $s 2>&1 \
      | sed -n '/^HYPER/,$p'
  done
done > "$here/timing.txt"
