# Session 44: fashion symmetric 40 %, seeds 11-15, the two arms of run.sh (the setting whose 10-seed paired
# difference was the largest, -0.23 +- 0.17 points). No stored oracle for these seeds: table.py pairs them by seed only.
R=benchmarks/results/noisy_labels/runs/s44_each
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
PY=${PYTHON:-python}
B="$PY benchmarks/bench_noisy_labels.py --epochs 12 --clip 1 --threads 1"
C='"batches": 2, "iters": 10, "every": 10'
for ARM in mean each; do
$B --datasets fashion --noise symmetric --seeds 11 12 13 14 15 --methods plain drop_in \
  --drop-in-kwargs "{\"curvature\": {$C, \"minibatches\": \"$ARM\"}}" \
  --out $R/${ARM}_fashion_symmetric_seeds1112131415.json > $R/${ARM}_fashion_symmetric_seeds1112131415.log 2>&1
done
