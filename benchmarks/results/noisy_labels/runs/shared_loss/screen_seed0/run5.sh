# screen 5, symmetric noise, seeds 0 6 7: initial weight 0.8 and 0.9 (x0 = 1.39, 2.20)
cd /work/wt-i27-sym
R=benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for I in 0.8; do for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 6 7 --clip 1 --methods drop_in --drop-in-kwargs "{\"initial\": $I}" --out $R/${DS}_initial${I}_s067.json
done; done
