#!/bin/bash
# The session-55 equality check of benchmarks/recipe_harness.py (docs/benchmarks.md, "Session 55:
# one harness for the recipe benchmarks"): one cheap recipe / seed per script, both drop-ins at
# max_overhead=None (equal.py), from a copy of benchmarks/ before the change (SRC=benchmarks_before,
# e.g. `git show 4fc68172:benchmarks/...`) and after it (SRC=benchmarks_after), then
# `python compare.py before after`. Usage, from the repository root:
#   SRC=benchmarks_before OUT=.../before bash benchmarks/results/user_recipes/s55_harness/run.sh
HERE=benchmarks/results/user_recipes/s55_harness
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY="nice -n 5 python $HERE/equal.py $SRC"
D=../shared/data
set -e -x
$PY bench_user_recipes_s51 --data $D --recipes small_data --seeds 0 --arms own decay plain dw --out $OUT/s51.json
$PY bench_user_recipes_s53 --data $D --recipes diabetes_mse --seeds 0 --arms own decay plain dw --out $OUT/s53.json
$PY bench_user_recipes_s54 --data $D --recipes reg_b1 --seeds 0 --arms own decay plain dw --out $OUT/s54.json
$PY bench_user_recipes_s50 --data $D --recipes digit_mse --seeds 0 --arms none own decay plain dw --out $OUT/s50.json
$PY bench_dw_accuracy_s52 --data $D --recipes small_data --seeds 0 --arms plain dw --out $OUT/s52acc.json
$PY bench_hard_rows_s53 --data $D --recipes small_data --seeds 0 --arms plain dw --out $OUT/hard.json
$PY bench_imbalanced_s53 --data $D --recipes two20 --seeds 0 --arms plain invfreq dw sampler --out $OUT/imb.json
$PY bench_news_weights_s51 --data $D --arms plain dw --seeds 0 --out $OUT/news.json
