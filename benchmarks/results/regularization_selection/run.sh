#!/bin/bash
# benchopt run of the seed paper's problem (datasets/mnist_oddeven.py) with SID and the peers at their
# best parameters for ijcnn1 (config/ijcnn1_best_params.yml, eval_freq scaled to n = 5000, the numba
# framework dropped: the dataset gives jax oracles). Run from the repository root after
#   bash benchmarks/benchopt/get_benchmark.sh
#   python benchmarks/benchopt/make_mnist_oddeven.py --out ../benchmark_bilevel/mnist_oddeven.npz
set -e
R=$PWD/benchmarks/results/regularization_selection
CFG=${1:-$R/config.yml}
cd ../benchmark_bilevel
NAME=$(basename "$CFG" .yml)  # config.yml: runs/sid; config_long.yml: runs/sid_long
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 JAX_PLATFORMS=cpu \
XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
SID_BENCH_OUT=$R/runs/sid${NAME#config} PYTHONPATH=$OLDPWD \
nice -n 15 ../venv-benchopt/bin/python -m benchopt run . --config "$CFG" --no-plot --no-html --no-cache \
  --output "$R/runs/$NAME"
