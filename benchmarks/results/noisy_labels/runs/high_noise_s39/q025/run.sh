#!/usr/bin/env bash
# ExpectedError(q=0.25), the drop-in only, on the symmetric-noise CNN settings at 40 % (seeds 1-5;
# compare with ../../outer_objective/q05/*.json, the same seeds) and 70 % (seeds 1-4; compare with
# ../*_r07.json). The runs are deterministic per seed, so the arms pair across processes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../../.."
for DS in mnist fashion; do
  for RATE in 0.4 0.7; do
    tag=r0${RATE#0.}; seeds="1 2 3 4 5"; [ "$RATE" = 0.7 ] && seeds="1 2 3 4"
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} benchmarks/bench_noisy_labels.py --datasets $DS \
      --noise symmetric --rate $RATE --epochs 12 --clip 1 --seeds $seeds --methods drop_in \
      --drop-in-kwargs '{"objective": {"q": 0.25}}' --out "$here/${DS}_${tag}.json" > "$here/${DS}_${tag}.log" 2>&1
  done
done
