# screen 4, symmetric noise, seeds 0 6 7: LazyAdam scale_prior k = 1 and k = 4 (eq. scaleprior)
cd /work/wt-i27-sym
R=benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for K in 1; do  # k = 4 not run: k = 1 was worse on MNIST for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 6 7 --clip 1 --methods drop_in --drop-in-kwargs "{\"scale_prior\": $K}" --out $R/${DS}_prior${K}_s067.json
done; done
