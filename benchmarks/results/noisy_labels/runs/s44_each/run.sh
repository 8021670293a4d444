# Session 44 (docs/data_weights.md, "Session 44: the per-minibatch curvature estimate"): LearnedDataWeights with
# EstimatedCurvature(minibatches="each") (L, lambda_min = the ends of the union of the minibatches' Hessian spectra)
# against minibatches="mean" (their mean Hessian's: LearnedDataWeights' choice at the start of session 44),
# the rest of the curvature estimate as CALLBACK_CONFIG.curvature (batches=2, iters=10, every=10).
# The stored recipe: 12 epochs, clip 1, lr 0.05, batch 64, 2000 / 1000 / 5000 examples, 1 thread, AVX2 kernels
# (as ../refresh_s42/avx2 and ../s43_margin). ONE process at a time.
# Usage: bash run.sh (seeds 1-5) or SEEDS="6 7 8 9 10" TAG=seeds678910 bash run.sh; table: python $R/table.py
R=benchmarks/results/noisy_labels/runs/s44_each
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
PY=${PYTHON:-python}
B="$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --threads 1"
SEEDS=${SEEDS:-1 2 3 4 5}
TAG=${TAG:-seeds12345}
C='"batches": 2, "iters": 10, "every": 10'
for NOISE in symmetric pair; do
for DS in mnist fashion; do
for ARM in mean each; do
$B --datasets $DS --noise $NOISE --seeds $SEEDS --methods plain drop_in \
  --drop-in-kwargs "{\"curvature\": {$C, \"minibatches\": \"$ARM\"}}" \
  --out $R/${ARM}_${DS}_${NOISE}_${TAG}.json > $R/${ARM}_${DS}_${NOISE}_${TAG}.log 2>&1
done
done
done
