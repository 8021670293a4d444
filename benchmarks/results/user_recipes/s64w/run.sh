#!/bin/bash
# Round 18 of user recipes, weight decay (session 64, helper recwd64). From the repository root.
# records_before.json: the package before this round's fixes (commit 13303447), seeds 0-2, every arm;
# records.json: the same records with the decay arms the fixes touch run again on the fixed code;
# records_fresh.json: fresh seeds 3-5.
set -e
B="env PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_user_recipes_s64w.py --data ../shared/data --threads 1"
R=benchmarks/results/user_recipes/s64w
# before the fixes (run from a copy of commit 13303447 with this script added):
#   $B --recipes lookahead_mnist lion_fmnist moe_fmnist maxnorm_news svm_news tf_news --seeds 0 1 2 --out $R/records_before.json
# after: the arms the fixes touch, merged into a copy of the records before
cp $R/records_before.json $R/records.json
$B --recipes lookahead_mnist svm_news maxnorm_news --arms decay --seeds 0 1 2 --out $R/records.json
$B --recipes lookahead_mnist svm_news maxnorm_news lion_fmnist moe_fmnist --seeds 3 4 5 --out $R/records_fresh.json
$B --recipes lm_news --seeds 0 1 2 --out $R/records.json
$B --recipes lm_news --seeds 3 4 5 --out $R/records_fresh.json  # borderline on seeds 0-2
python benchmarks/bench_user_recipes_s64w.py --table --out $R/records.json > $R/table.md
python benchmarks/bench_user_recipes_s64w.py --table --out $R/records_before.json > $R/table_before.md
python benchmarks/bench_user_recipes_s64w.py --table --out $R/records_fresh.json > $R/table_fresh.md
