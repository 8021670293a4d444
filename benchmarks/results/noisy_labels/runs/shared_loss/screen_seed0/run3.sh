# screen 3, symmetric noise, extra screening seeds 6 7 (held out stays 1-5): default, SharedLossWeights hinge lr 0.005, biased hinge lr 0.005 (also seed 0)
cd /work/wt-i27-sym
R=benchmarks/results/noisy_labels/runs/shared_loss/screen_seed0
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
for DS in mnist fashion; do
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 6 7 --clip 1 --methods drop_in --out $R/${DS}_default_s67.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 6 7 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.005}}' --out $R/${DS}_shared_lr0005_s67.json
$PY benchmarks/bench_noisy_labels.py --datasets $DS --noise symmetric --epochs 12 --seeds 0 6 7 --clip 1 --methods drop_in --drop-in-kwargs '{"parameterization": {"lr": 0.005, "basis": "biased_hinge"}}' --out $R/${DS}_biased_lr0005_s067.json
done
