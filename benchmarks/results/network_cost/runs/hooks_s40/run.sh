#!/bin/bash
# Issue 28 item 1, hooks_s40: the drop-in's every-step hooks before (main 153be55, unpacked to
# $BASE = /tmp/hk_base by `git archive 153be55 hypertorch_sid | tar -x -C /tmp/hk_base`) and after
# (this branch), un-niced, one process at a time, base and new alternating. From the repo root.
set -u
BASE=${BASE:-/tmp/hk_base}; NEW=$PWD; PY=/work/main/.venv/bin/python
D=benchmarks/results/network_cost/runs/hooks_s40; S=benchmarks/results/network_cost/runs/slowdown_s40
export OMP_NUM_THREADS=1
for r in 1 2; do  # 1. hooks with no hyper step (every_n_steps=100000) against a plain fit
  for v in base new; do
    P=$BASE; [ $v = new ] && P=$NEW
    echo "== empty_callback $v repeat $r"; PYTHONPATH=$P $PY $S/empty_callback.py 2>/dev/null | grep median
  done
done > $D/empty_callback.log
for v in base new; do  # 2. the default's cost on digits_small, seeds 0-5
  P=$BASE; [ $v = new ] && P=$NEW
  echo "== cost pairs $v"; PYTHONPATH=$P $PY benchmarks/issue28_budget_cost_pairs.py digits_small 0 1 2 3 4 5 2>/dev/null | grep "seed\|median"
done > $D/cost_pairs.log
for r in 1 2 3; do  # 3. the main job (it rewrites results/lightning_digits*.png: git checkout results/ after)
  for v in base new; do
    P=$BASE; [ $v = new ] && P=$NEW
    echo "== main job $v repeat $r"; PYTHONPATH=$P $PY examples/lightning_digits.py --out /tmp/hk/mj_${v}_$r.json 2>/dev/null | grep -v "^\`\`\`"
  done
done > $D/main_job.log
git checkout results/
