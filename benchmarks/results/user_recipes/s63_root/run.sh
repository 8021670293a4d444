# Session 63 (helper root63): per-layer λ for tensors no layer owns, before / after.
# "before" = main at 965dcff6 (git archive into /tmp/root63_before, PYTHONPATH there);
# "after" = this branch (PYTHONPATH=$PWD). One thread, nice -n 5, from the repository root.
set -e
B=benchmarks/results/user_recipes/s63_root
run() { OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python "$@"; }
# the drop-in as README.md writes it (every default; the clock-read budget on)
PYTHONPATH=/tmp/root63_before run benchmarks/bench_user_recipes_s62.py --data ../shared/data \
    --recipes cosine_head kendall_mt --arms own decay --seeds 0 1 2 3 4 5 --out $B/before.json
PYTHONPATH=$PWD run benchmarks/bench_user_recipes_s62.py --data ../shared/data \
    --recipes cosine_head kendall_mt --arms decay --seeds 0 1 2 3 4 5 --out $B/after.json
# the budget off: every hyper step runs, the fits differ by the code alone
PYTHONPATH=/tmp/root63_before run $B/budget_off.py --data ../shared/data \
    --recipes cosine_head kendall_mt --arms decay --seeds 0 1 2 3 4 5 --out $B/before_det.json
PYTHONPATH=$PWD run $B/budget_off.py --data ../shared/data \
    --recipes cosine_head kendall_mt --arms decay --seeds 0 1 2 3 4 5 --out $B/after_det.json
PYTHONPATH=/tmp/root63_before run $B/budget_off.py --data ../shared/data \
    --recipes cosine_head --arms own decay --seeds 6 7 8 9 10 11 --out $B/before_det2.json
PYTHONPATH=$PWD run $B/budget_off.py --data ../shared/data \
    --recipes cosine_head --arms decay --seeds 6 7 8 9 10 11 --out $B/after_det2.json
PYTHONPATH=$PWD run $B/budget_off.py --apply-to weights --data ../shared/data \
    --recipes cosine_head --arms decay --seeds 0 1 2 3 4 5 6 7 8 9 10 11 \
    --out $B/after_det_weights.json
python3 $B/compare.py > $B/compare.txt
