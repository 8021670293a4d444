#!/usr/bin/env bash
# Issue 27: KeptEvidenceError (q* = the largest q <= 0.5 keeping ESS >= |V|/2) on the noisy-label
# CNNs, 70 % symmetric seeds 1-4 (pair with runs/high_noise_s39: the default and the mean loss),
# every validation batch's q* recorded (q_<ds>_r07.json). Table: python table.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../../.."
for DS in mnist fashion; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} "$here/qtrace.py" "$here/q_${DS}_r07.json" \
    --datasets $DS --noise symmetric --rate 0.7 --epochs 12 --clip 1 --seeds ${SEEDS:-1 2 3 4} \
    --methods drop_in --drop-in-kwargs '{"objective": "kept_evidence"}' --out "$here/${DS}_r07.json" > "$here/${DS}_r07.log" 2>&1 &
done
wait
# 40 % symmetric and pair-flip, seeds 1-5: the q* it chooses there (and the accuracy, for the record)
for DS in mnist fashion; do
  PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} "$here/qtrace.py" "$here/q_${DS}_r04.json" \
    --datasets $DS --noise symmetric pair --rate 0.4 --epochs 12 --clip 1 --seeds 1 2 3 4 5 \
    --methods drop_in --drop-in-kwargs '{"objective": "kept_evidence"}' --out "$here/${DS}_r04.json" > "$here/${DS}_r04.log" 2>&1 &
done
wait
# 20 Newsgroups data weights, seeds 0-2 (pairs with ../outer_objective/news20_seeds012345_q0.5.json)
PYTHONPATH=$PWD OMP_NUM_THREADS=1 ${PYTHON:-python} "$here/news20.py" 0 1 2 > "$here/news20.log" 2>&1
