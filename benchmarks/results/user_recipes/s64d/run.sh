# Session 64 (helper recdw64): round 18 of user recipes for LearnedDataWeights.
# One thread, nice -n 5, from the repository root. "before" = the session's start (13303447):
#   git archive 13303447 hypertorch_sid | tar -x -C /tmp/recdw64_before
set -e
B=benchmarks/results/user_recipes/s64d
run() { OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/bench_user_recipes_s64d.py \
    --data ../shared/data "$@"; }
# before the fixes (hinge dw refused; trusted's flags message; two_view's labels unsaid)
PYTHONPATH=/tmp/recdw64_before run --recipes tagger hinge two_view trusted --seeds 0 1 2 \
    --out $B/before_fix.json
# after: every recipe and arm, seeds 0-2, then the fresh seeds 3-5
PYTHONPATH=$PWD run --recipes all --seeds 0 1 2 --out $B/records.json
PYTHONPATH=$PWD run --recipes all --seeds 3 4 5 --out $B/records_fresh.json
PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_user_recipes_s64d.py --table --out $B/records.json > $B/table.md
PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_user_recipes_s64d.py --table --out $B/records_fresh.json > $B/table_fresh.md
# flagged() on the hinge and trusted recipes (split / split_misfit precision, seed 0-2)
PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python $B/flags_probe.py > $B/flags_probe.txt
PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python $B/signal_probe.py > $B/signal_probe.txt
