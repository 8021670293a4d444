# The callback's per-step work charged to the budget (this change) against the default before it, 9 seeds of
# digits_small and the MNIST MLP: this code (arm "charged") and, at the same time in another process, main at
# 72865ef (arm "rerun", run from a checkout of that commit), one process each on the 2-core CPU.
R=benchmarks/results/weight_decay/runs/charged
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
ARM=${ARM:-charged}
for S in digits_small mnist_mlp; do
  $PY benchmarks/bench_weight_decay.py --settings $S --seeds 0 1 2 3 4 5 6 7 8 --methods learned_per_layer \
    --optuna-trials 0 --threads 1 --out $R/${S}_$ARM.json
done
# then 9 more seeds of the MNIST MLP, both arms at once (ARM=charged here, ARM=rerun on 72865ef):
# $PY benchmarks/bench_weight_decay.py --settings mnist_mlp --seeds 9 10 11 12 13 14 15 16 17 --methods learned_per_layer \
#   --optuna-trials 0 --threads 1 --out $R/mnist_mlp_${ARM}_more.json
